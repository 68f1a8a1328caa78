"""kvreplay.audit: batch audit of vLLM logs and what-if sweeps (`kvreplay audit`, `kvreplay whatif`).

Public API:
    audit_log(path, *, profile=None, replay=True) -> polars.DataFrame   # one log, pure
    audit_many(paths, *, jobs=None, ...) -> polars.DataFrame             # a fleet, in processes
    records_to_frame(records) -> polars.DataFrame                        # fixed schema
    SCHEMA (column -> polars dtype), status classes in kvreplay.audit.status

`audit_log` is a pure function of its input: the same log gives the same row(s), so its
results can be cached, compared across runs and written to Parquet one file per log.

Fleets too large for one machine: map `audit_log` over an engine you already run and
concatenate the Parquet parts; nothing in kvreplay schedules work across machines.

Ray::

    import ray, polars as pl
    from kvreplay.audit import audit_log

    @ray.remote
    def audit_one(path: str, out_dir: str) -> str:
        out = f"{out_dir}/{abs(hash(path)):x}.parquet"
        audit_log(path).write_parquet(out)
        return out

    parts = ray.get([audit_one.remote(p, "s3://bucket/audit") for p in paths])
    fleet = pl.read_parquet("s3://bucket/audit/*.parquet")

Dask::

    import dask.bag as db, polars as pl
    from kvreplay.audit import audit_log

    frames = db.from_sequence(paths, npartitions=256).map(audit_log).compute()
    fleet = pl.concat(frames, how="vertical")
    fleet.write_parquet("fleet.parquet")

(`audit_log` needs the log readable where it runs: a shared file system or object store
paths that the worker can open; each call is independent and holds no global state.)
"""

from __future__ import annotations

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


def _audit_worker(args: tuple) -> tuple[list[dict[str, Any]] | None, str | None]:
    path, profile, replay, year = args
    from kvreplay.audit.record import audit_records
    from kvreplay.errors import UserError

    try:
        return audit_records(path, profile=profile, replay=replay, year=year), None
    except UserError as exc:
        return None, str(exc)


def audit_many(paths: Iterable[str], *, jobs: int | None = None, profile: str | None = None,
               replay: bool = True, year: int | None = None, on_error=None):
    """Audit many logs in parallel processes; rows come out in input order (deterministic).

    A log that cannot be read at all gives a row with status 'not established' and the
    error in `null_reasons` (and `on_error(path, message)` is called), so one bad file does
    not hide the fleet."""
    import os
    from concurrent.futures import ProcessPoolExecutor

    from kvreplay.audit.record import empty_record
    from kvreplay.progress import stage

    paths = list(paths)
    work = [(p, profile, replay, year) for p in paths]
    jobs = jobs or min(len(paths), os.cpu_count() or 1)
    results = []
    with stage(f"audit {len(paths)} log{'s' if len(paths) != 1 else ''}", len(paths)) as bar:
        if jobs <= 1 or len(paths) <= 1:
            for w in work:
                results.append(_audit_worker(w))
                bar.advance()
        else:
            import multiprocessing as mp

            ctx = mp.get_context("spawn" if os.name == "nt" else "fork")
            with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as ex:
                for r in ex.map(_audit_worker, work, chunksize=1):
                    results.append(r)
                    bar.advance()
    rows: list[dict[str, Any]] = []
    for p, (recs, err) in zip(paths, results):
        if recs is None:
            if on_error is not None:
                on_error(p, err)
            rec = empty_record(p)
            rec["status"] = "not established"
            rec["status_evidence"] = f"could not audit: {err}"
            rec["replay"] = "skipped"
            rec["null_reasons"] = [f"all fields: {err}"]
            rows.append(rec)
        else:
            rows.extend(recs)
    return records_to_frame(rows)


def expand_paths(args: Sequence[str]) -> list[str]:
    """CLI arguments -> logs: a file is a log; a folder of .prom files is one scrape series;
    any other folder contributes its *.log, *.log.gz, *.txt and *.prom files (sorted)."""
    import os

    from kvreplay.errors import UserError

    out: list[str] = []
    for a in args:
        if os.path.isdir(a):
            names = sorted(os.listdir(a))
            if names and all(n.endswith(".prom") for n in names if not n.startswith(".")):
                out.append(a)
                continue
            found = [os.path.join(a, n) for n in names
                     if n.endswith((".log", ".log.gz", ".txt", ".prom", ".metrics"))]
            if not found:
                raise UserError(f"{a}: no .log / .prom files in this folder")
            out.extend(found)
        elif a == "-" or os.path.exists(a):
            out.append(a)
        else:
            raise UserError(f"{a}: no such file")
    return out
