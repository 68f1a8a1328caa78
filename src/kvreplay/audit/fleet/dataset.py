"""The fleet dataset: a folder of Parquet files, hive-partitioned, one file per log.

    DIR/day=2026-05-07/deployment=meta-llama%2FLlama-3.1-8B-Instruct/part-<log id>-<key>.parquet
    DIR/day=unknown/deployment=file%3Abroken.log/error-<log id>-<key>.parquet

- one file per log (task.log_id: its label, the `log` column), holding its rows (one per
  engine): `input_key` (task.input_key: a hash of the bytes and the audit options) then
  the record's fields; `part-` for an audited log, `error-` for an error row. A rerun skips
  a log whose file has the same key, and replaces it when the key differs (the log grew,
  other options): one file per log, so no row is ever doubled, and two copies of a log
  under two names are two logs.
- `day`: the date of the log's first request / stats line (`log_start`), `unknown` when
  the input has no time; `deployment`: the model the log serves, else `file:<name>`.
  Values are percent-encoded as Hive does ('/' -> %2F); polars decodes them on read.
- a file is written under a hidden temporary name in its folder and renamed into place
  (os.replace is atomic): a killed writer leaves no partial `.parquet`; the next run
  removes a stale temporary, and of a log found twice (killed between writing a new file
  and removing the one it replaces) keeps the newest (`scan`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

PARTITIONS = ("day", "deployment")
NO_KEY = "unreadable"  # the key of an input whose bytes could not be read
_NAME = re.compile(r"^(part|error)-([0-9a-f]{24})-([0-9a-f]{24}|unreadable)\.parquet$")
_TMP = re.compile(r"^\.(part|error)-[0-9a-f]{24}-\w+\.parquet\.[0-9]+\.tmp$")


def schema():
    """The dataset files' columns: the key, then the record's fixed schema."""
    import polars as pl

    from kvreplay.audit.record import polars_schema

    return {"input_key": pl.String, **polars_schema()}


def partition_of(records: list[dict[str, Any]], path: str) -> dict[str, str]:
    first = records[0] if records else {}
    start = first.get("log_start")
    day = start[:10] if start else "unknown"
    model = first.get("model")
    deployment = model if model else "file:" + os.path.basename(path.rstrip("/"))
    return {"day": day, "deployment": deployment}


def _enc(v: str) -> str:
    return quote(v, safe="-_.+@")


@dataclass(slots=True)
class Part:
    log: str  # log id
    key: str  # input key, or NO_KEY
    kind: str  # "part" | "error"
    path: str


def part_path(root: str, partition: dict[str, str], log: str, key: str, kind: str) -> str:
    dirs = [f"{k}={_enc(partition[k])}" for k in PARTITIONS]
    return os.path.join(root, *dirs, f"{kind}-{log}-{key}.parquet")


def scan(root: str) -> dict[str, Part]:
    """log id -> its file, repairing what an interrupted run can leave (module docstring)."""
    found: dict[str, list[Part]] = {}
    if not os.path.isdir(root):
        return {}
    for d, subdirs, names in os.walk(root):
        subdirs.sort()
        for n in sorted(names):
            m = _NAME.match(n)
            if m:
                found.setdefault(m.group(2), []).append(
                    Part(m.group(2), m.group(3), m.group(1), os.path.join(d, n)))
            elif _TMP.match(n):
                os.unlink(os.path.join(d, n))
    out = {}
    for log, parts in found.items():
        parts.sort(key=lambda p: (os.stat(p.path).st_mtime_ns, p.kind == "part", p.path))
        for old in parts[:-1]:
            os.unlink(old.path)
        out[log] = parts[-1]
    return out


def write_part(root: str, log: str, key: str | None, records: list[dict[str, Any]],
               path: str, *, error: bool, replaces: Part | None = None) -> Part:
    """Write one log's rows atomically, then remove the file it `replaces` (the log's
    earlier file, when that is elsewhere: another key, day or deployment)."""
    import polars as pl

    kind = "error" if error else "part"
    key = key or NO_KEY
    dest = part_path(root, partition_of(records, path), log, key, kind)
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    tmp = os.path.join(os.path.dirname(dest), f".{os.path.basename(dest)}.{os.getpid()}.tmp")
    rows = [{"input_key": None if key == NO_KEY else key, **r} for r in records]
    try:
        pl.DataFrame(rows, schema=schema()).write_parquet(tmp)
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    if replaces is not None and replaces.path != dest and os.path.exists(replaces.path):
        os.unlink(replaces.path)
    return Part(log, key, kind, dest)


def files(root: str) -> list[str]:
    """The dataset's files, sorted (temporaries are not among them)."""
    out = []
    for d, subdirs, names in os.walk(root):
        subdirs.sort()
        out += [os.path.join(d, n) for n in sorted(names) if _NAME.match(n)]
    return out


def scan_dataset(root: str):
    """The dataset as a polars LazyFrame (partition columns from the paths, as strings)."""
    import polars as pl

    from kvreplay.errors import UserError

    if not os.path.isdir(root):
        raise UserError(f"{root}: no such folder (an audit dataset is written by "
                        "`kvreplay audit LOGS -o DIR/`)")
    found = files(root)
    if not found:
        raise UserError(f"{root}: no audit files (part-*.parquet / error-*.parquet) in it")
    return pl.scan_parquet(found, hive_partitioning=True,
                           hive_schema={k: pl.String for k in PARTITIONS})
