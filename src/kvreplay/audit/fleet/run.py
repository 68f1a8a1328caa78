"""The fleet driver: submit one task per input to an executor, take the results as they
complete, and either write each input's file into the dataset or collect the rows.

Invariants: every input ends as exactly one result (rows, or an error row with its
reason); in a dataset, exactly one file per log; a file appears whole or not at all.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from kvreplay.audit.fleet import dataset as ds
from kvreplay.audit.fleet.task import Options, Result, audit_task, keys_task, log_id

KEY_CHUNK = 64  # inputs hashed per task when looking for what a dataset already has


@dataclass(slots=True)
class FleetRun:
    """What a run did. `results` (collect mode): per input, in input order."""

    inputs: int = 0
    audited: int = 0
    failed: int = 0
    skipped: int = 0
    written: list[str] = field(default_factory=list)
    results: list[Result | None] = field(default_factory=list)
    errors: list[tuple[str, str]] = field(default_factory=list)  # (input, reason)
    seconds: float = 0.0
    executor: str = ""
    peak_rss_kb: dict[str, int] = field(default_factory=dict)  # worker -> peak RSS

    def status(self) -> str:
        rate = (self.audited + self.failed) / self.seconds if self.seconds > 0 else 0.0
        return (f"{self.audited} done, {self.failed} failed, {self.skipped} skipped, "
                f"{rate:.1f} logs/s")


def _lost(path: str, exc: BaseException) -> Result:
    """The result of a task the executor lost (its worker died every time it ran it)."""
    from kvreplay.audit.record import error_record

    msg = f"{path}: the worker auditing it died ({type(exc).__name__}: {exc})"
    return Result(-1, None, [error_record(path, msg, "worker")], msg)


def _known_keys(executor, paths: Sequence[str], options: Options,
                token: str) -> list[str | None]:
    futs = [executor.submit(keys_task, list(paths[i:i + KEY_CHUNK]), options,
                            key=f"kvreplay-keys-{token}-{i}")
            for i in range(0, len(paths), KEY_CHUNK)]
    out: list[str | None] = []
    for f in futs:
        out += executor.result(f)
    return out


def run(paths: Sequence[str], executor, *, options: Options = Options(),
        out_dir: str | None = None, force: bool = False, retry_errors: bool = False,
        on_result: Callable[[Result, FleetRun], None] | None = None) -> FleetRun:
    """Audit `paths` on `executor`. With `out_dir`: write the dataset (skip the inputs
    whose key has a file, unless `force`; `retry_errors`: redo the error rows); without:
    collect the results in input order. `on_result(result, run)` after each one."""
    from kvreplay.progress import stage

    import uuid

    paths = list(paths)
    token = uuid.uuid4().hex[:12]  # task keys unique on a shared scheduler
    fr = FleetRun(inputs=len(paths), results=[None] * len(paths), executor=executor.describe())
    t0 = time.perf_counter()
    have: dict[str, ds.Part] = ds.scan(out_dir) if out_dir is not None else {}
    todo = list(range(len(paths)))
    noun = f"log{'s' if len(paths) != 1 else ''}"
    with stage(f"audit {len(paths)} {noun} ({fr.executor})", len(paths)) as bar:
        if have and not force:
            keys = _known_keys(executor, paths, options, token)
            todo = [i for i in todo if not _current(have.get(log_id(paths[i])), keys[i],
                                                    retry_errors)]
            fr.skipped = len(paths) - len(todo)
            bar.advance(fr.skipped)
            bar.status(fr.status())
        pending = {}
        for i in todo:
            f = executor.submit(audit_task, i, paths[i], options,
                                key=f"kvreplay-audit-{token}-{i}")
            pending[f] = i
        try:
            for f in executor.as_completed(list(pending)):
                i = pending.pop(f)
                try:
                    res = executor.result(f)
                except executor.lost_errors as exc:
                    res = _lost(paths[i], exc)
                res.index = i
                _take(fr, res, paths[i], out_dir, have)
                fr.seconds = time.perf_counter() - t0
                bar.advance()
                bar.status(fr.status())
                if on_result is not None:
                    on_result(res, fr)
        except BaseException:  # Ctrl-C, a lost scheduler: what is written stays whole
            executor.cancel(list(pending))
            raise
    fr.seconds = time.perf_counter() - t0
    return fr


def _current(part: ds.Part | None, key: str | None, retry_errors: bool) -> bool:
    """The dataset has this log as it is now (same bytes and options)."""
    if part is None or key is None or part.key != key:
        return False
    return not (retry_errors and part.kind == "error")


def _take(fr: FleetRun, res: Result, path: str, out_dir: str | None,
          have: dict[str, ds.Part]) -> None:
    if res.error is None:
        fr.audited += 1
    else:
        fr.failed += 1
        fr.errors.append((path, res.error))
    if res.worker:
        fr.peak_rss_kb[res.worker] = max(fr.peak_rss_kb.get(res.worker, 0), res.peak_rss_kb)
    if out_dir is None:
        fr.results[res.index] = res
        return
    lid = log_id(path)
    try:
        part = ds.write_part(out_dir, lid, res.key, res.records, path, error=res.error is not None,
                             replaces=have.get(lid))
    except OSError:
        raise  # (the dataset's disk: every later write would fail the same way)
    except Exception as exc:  # a value the dataset's schema cannot hold: that log's error row
        from kvreplay.audit.record import error_record

        msg = f"{path}: its record cannot be stored ({type(exc).__name__}: {str(exc)[:200]})"
        if res.error is None:
            fr.audited -= 1
            fr.failed += 1
            fr.errors.append((path, msg))
        part = ds.write_part(out_dir, lid, res.key, [error_record(path, msg, "input")], path, error=True,
                             replaces=have.get(lid))
    have[lid] = part
    fr.written.append(part.path)
