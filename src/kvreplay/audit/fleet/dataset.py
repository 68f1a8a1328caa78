"""The fleet dataset: a folder of Parquet files, hive-partitioned, one file per input.

    DIR/day=2026-05-07/deployment=meta-llama%2FLlama-3.1-8B-Instruct/part-<key>.parquet
    DIR/day=unknown/deployment=file%3Abroken.log/error-<key>.parquet

- one file per input, named by its key (task.input_key: the bytes and the options), holding
  its rows (one per engine) with the record's fields plus `input_key`; `part-` for an
  audited input, `error-` for an error row. A key has at most one file: that is what makes
  a rerun skip what is done and never double a row.
- `day`: the date of the log's first request / stats line (`log_start`), `unknown` when
  the input has no time; `deployment`: the model the log serves, else `file:<name>`.
  Values are percent-encoded as Hive does ('/' -> %2F); polars decodes them on read.
- a file is written under a hidden temporary name in its folder and renamed into place
  (os.replace is atomic): a killed writer leaves no partial `.parquet`; a stale temporary
  is removed by the next run (`scan`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

KEY_COLUMNS = {"input_key": str}
PARTITIONS = ("day", "deployment")
_NAME = re.compile(r"^(part|error)-([0-9a-f]{16,64})\.parquet$")
_TMP = re.compile(r"^\.(part|error)-[0-9a-f]{16,64}\.parquet\.[0-9]+\.tmp$")


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
    key: str
    kind: str  # "part" | "error"
    path: str


def part_path(root: str, partition: dict[str, str], key: str, kind: str) -> str:
    dirs = [f"{k}={_enc(partition[k])}" for k in PARTITIONS]
    return os.path.join(root, *dirs, f"{kind}-{key}.parquet")


def scan(root: str) -> dict[str, Part]:
    """key -> its file. Repairs what an interrupted run can leave: stale temporaries are
    removed; a key found twice (killed between a rename and the removal of the file it
    replaces) keeps its newest file."""
    found: dict[str, list[Part]] = {}
    if not os.path.isdir(root):
        return {}
    for d, subdirs, names in os.walk(root):
        subdirs.sort()
        for n in sorted(names):
            m = _NAME.match(n)
            if m:
                found.setdefault(m.group(2), []).append(Part(m.group(2), m.group(1), os.path.join(d, n)))
            elif _TMP.match(n):
                os.unlink(os.path.join(d, n))
    out = {}
    for key, parts in found.items():
        parts.sort(key=lambda p: (os.stat(p.path).st_mtime_ns, p.kind == "part"))
        for old in parts[:-1]:
            os.unlink(old.path)
        out[key] = parts[-1]
    return out


def write_part(root: str, key: str, records: list[dict[str, Any]], path: str, *,
               error: bool, replaces: list[Part] = ()) -> Part:
    """Write one input's rows atomically; then remove the files it `replaces` (the same
    key's earlier file under --force / --retry-errors, or its unreadable-path key)."""
    import polars as pl

    kind = "error" if error else "part"
    dest = part_path(root, partition_of(records, path), key, kind)
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    tmp = os.path.join(os.path.dirname(dest), f".{os.path.basename(dest)}.{os.getpid()}.tmp")
    rows = [{"input_key": key, **r} for r in records]
    try:
        pl.DataFrame(rows, schema=schema()).write_parquet(tmp)
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    for old in replaces:
        if old.path != dest and os.path.exists(old.path):
            os.unlink(old.path)
    return Part(key, kind, dest)


def scan_dataset(root: str):
    """The dataset as a polars LazyFrame (partition columns from the paths, as strings)."""
    import polars as pl

    from kvreplay.errors import UserError

    if not os.path.isdir(root):
        raise UserError(f"{root}: no such folder (an audit dataset is written by "
                        "`kvreplay audit LOGS -o DIR/`)")
    if not scan_names(root):
        raise UserError(f"{root}: no audit files (part-*.parquet / error-*.parquet) in it")
    return pl.scan_parquet(os.path.join(root, "**", "*.parquet"), hive_partitioning=True,
                           hive_schema={k: pl.String for k in PARTITIONS})


def scan_names(root: str) -> list[str]:
    out = []
    for d, subdirs, names in os.walk(root):
        subdirs.sort()
        out += [os.path.join(d, n) for n in sorted(names) if _NAME.match(n)]
    return out
