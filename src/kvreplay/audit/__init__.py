"""kvreplay.audit: batch audit of vLLM logs and what-if sweeps (`kvreplay audit`, `kvreplay whatif`).

Public API:
    audit_log(path, *, profile=None, replay=True) -> polars.DataFrame   # one log, pure
    audit_many(paths, *, jobs=None, ...) -> polars.DataFrame             # a fleet, in processes
    records_to_frame(records) -> polars.DataFrame                        # fixed schema
    SCHEMA (column -> polars dtype), status classes in kvreplay.audit.status

`audit_log` is a pure function of its input: the same log gives the same row(s), so its
results can be cached, compared across runs and written to Parquet one file per log.

Fleets: `kvreplay audit LOGS --executor local|dask[:ADDRESS] -o DIR/` (kvreplay.audit.fleet)
audits on this machine's processes or a dask.distributed cluster into a hive-partitioned
Parquet dataset keyed by each input's content hash: a rerun skips what is there, a failed
input is an error row, `kvreplay audit --summarize DIR/` prints the fleet tables.
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Sequence

__all__ = ["audit_log", "audit_many", "records_to_frame", "schema", "expand_paths"]


def schema():
    from kvreplay.audit.record import polars_schema

    return polars_schema()


def records_to_frame(records: list[dict[str, Any]]):
    """Records -> a polars DataFrame with the fixed audit schema (empty list -> 0 rows)."""
    import polars as pl

    return pl.DataFrame(records, schema=schema())


def audit_log(path: str | Sequence[str], *, profile: str | None = None, replay: bool = True,
              year: int | None = None):
    """Audit one vLLM log (or several files of one server) or one Prometheus scrape series:
    a polars DataFrame with one row per engine."""
    from kvreplay.audit.record import audit_records

    return records_to_frame(audit_records(path, profile=profile, replay=replay, year=year))


def audit_many(paths: Iterable[str], *, jobs: int | None = None, profile: str | None = None,
               replay: bool = True, year: int | None = None, on_error=None, executor=None,
               metrics=()):
    """Audit many logs in parallel (local processes, or `executor`: kvreplay.audit.fleet);
    rows come out in input order (deterministic).

    A log that cannot be audited gives an error row (status 'not established', the reason
    in `error` and `null_reasons`; `on_error(path, message)` is called), so one bad file
    does not hide the fleet."""
    from kvreplay.audit.fleet import Options, make_executor, run

    paths = list(paths)
    own = executor is None
    if own:
        executor = make_executor("local", jobs or min(len(paths), os.cpu_count() or 1) or 1)
    try:
        fr = run(paths, executor, options=Options(profile, replay, year, tuple(metrics)))
    finally:
        if own:
            executor.close()
    rows: list[dict[str, Any]] = []
    for p, res in zip(paths, fr.results):
        assert res is not None
        if res.error is not None and on_error is not None:
            on_error(p, res.error)
        rows.extend(res.records)
    return records_to_frame(rows)


def expand_paths(args: Sequence[str]) -> list[str]:
    """CLI arguments -> logs: a file is a log; a folder of .prom files is one scrape series;
    any other folder contributes its *.log, *.log.gz, *.txt, *.prom and *.prom.gz files (or query_range JSON) (sorted) and
    those of its subfolders (a per-host layout: DIR/HOST/*.log), hidden ones skipped; a
    glob that is not a file's name ('logs/**/*.log.gz', quoted past the shell) its matches."""
    out: list[str] = []
    seen: set[str] = set()
    for p in _expand(args):  # one input per resolved path ("logs/a.log" and "/abs/logs/a.log")
        real = p if p == "-" else os.path.realpath(p)
        if real not in seen:
            seen.add(real)
            out.append(p)
    return out


def _in_folder(folder: str, name: str) -> str:
    """`folder/name`, or a fleet.task.Skipped with the reason it is not read: a link whose
    target is outside the folder, or anything that is not a regular file (a FIFO, a
    device, a socket: reading one blocks or never ends)."""
    import stat

    from kvreplay.audit.fleet.task import Skipped

    p = os.path.join(folder, name)
    try:
        real = os.path.realpath(p)
        if os.path.commonpath([real, os.path.realpath(folder)]) != os.path.realpath(folder):
            return Skipped(p, f"a link to {real}, outside {folder}: not followed")
        st = os.stat(p)
    except (OSError, ValueError) as exc:
        return Skipped(p, f"cannot stat: {exc}")
    if not stat.S_ISREG(st.st_mode):
        kind = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "not a regular file"
        return Skipped(p, f"{kind}: not read")
    return p


def _expand(args: Sequence[str]) -> list[str]:
    import glob

    from kvreplay.errors import UserError

    out: list[str] = []
    for a in args:
        if any(c in a for c in "*?[") and not os.path.exists(a):
            hits = sorted(glob.glob(a, recursive=True))
            if not hits:
                raise UserError(f"{a}: no file matches")
            out.extend(_expand(hits))
        elif os.path.isdir(a):
            found = _walk(a)
            if not found:
                raise UserError(f"{a}: no .log / .prom files in this folder or its subfolders")
            out.extend(found)
        elif a == "-" or os.path.exists(a):
            out.append(a)
        else:
            raise UserError(f"{a}: no such file")
    return out


def _walk(folder: str) -> list[str]:
    """A folder's logs, its subfolders' after its own files (sorted; hidden names skipped);
    a folder holding only .prom files is one scrape series."""
    names = sorted(n for n in os.listdir(folder) if not n.startswith("."))
    files = [n for n in names if not os.path.isdir(os.path.join(folder, n))]
    if files and len(files) == len(names) and all(
            n.endswith((".prom", ".prom.gz", ".json", ".json.gz")) for n in files):
        return [folder]
    out = [_in_folder(folder, n) for n in files
           if n.endswith((".log", ".log.gz", ".txt", ".prom", ".prom.gz", ".metrics"))]
    for n in names:  # a link to a folder is not walked (it may lead out of the tree)
        sub = os.path.join(folder, n)
        if os.path.isdir(sub) and not os.path.islink(sub):
            out.extend(_walk(sub))
    return out
