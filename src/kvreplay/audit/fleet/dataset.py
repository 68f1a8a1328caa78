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
  A value whose encoding is longer than MAX_VALUE characters (a folder name has at most
  255 bytes) is cut and ends with `~` and a hash of the whole value (`_enc`); the record's
  own `model` column keeps the whole value.
- a file is written under a hidden temporary name in its folder (the writer's host and
  pid in it) and renamed into place (os.replace is atomic): a killed writer leaves no
  partial `.parquet`. A later run removes a temporary only when it is stale: its writer
  was on this host and is gone, or it is older than STALE_TMP_S; so runs on one dataset
  at the same time never delete each other's work. Of a log found twice (killed between
  writing a new file and removing the one it replaces) the newest is kept (`scan`).
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
_TMP = re.compile(r"^\.(part|error)-[0-9a-f]{24}-\w+\.parquet\.([0-9]+)(?:\.([0-9a-f]{8}))?\.tmp$")
MAX_VALUE = 120  # characters of an encoded partition value (folder names: 255 bytes at most)
STALE_TMP_S = 24 * 3600  # a temporary of another host's (or an unknown) writer this old is stale


def _host() -> str:
    import hashlib
    import socket

    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def _stale(path: str, pid: str, host: str | None) -> bool:
    """May a temporary file be removed: its writer (pid on host) is gone?"""
    import time

    if host is None or host == _host():  # (no host: the naming of one-host versions)
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return True
        except (PermissionError, OverflowError, ValueError):
            pass  # alive (another user's), or not a pid
        else:
            return False
    try:
        return time.time() - os.stat(path).st_mtime > STALE_TMP_S
    except OSError:
        return False


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
    e = quote(v, safe="-_.+@")
    if e in (".", ".."):
        e = e.replace(".", "%2E")
    if len(e) > MAX_VALUE:
        import hashlib

        cut = e[: MAX_VALUE - 18]
        if "%" in cut[-2:]:  # not inside a %XX escape
            cut = cut[: cut.rindex("%")]
        e = f"{cut}~{hashlib.sha256(v.encode('utf-8', 'surrogatepass')).hexdigest()[:16]}"
    return e


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
            else:
                t = _TMP.match(n)
                if t is not None and _stale(os.path.join(d, n), t.group(2), t.group(3)):
                    _remove(os.path.join(d, n))
    out = {}
    for log, parts in found.items():
        parts.sort(key=lambda p: (_mtime(p.path), p.kind == "part", p.path))
        for old in parts[:-1]:
            _remove(old.path)
        out[log] = parts[-1]
    return out


def _mtime(path: str) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:  # (removed by a run at the same time)
        return -1


def _remove(path: str) -> None:
    """Remove a file another run may have removed first."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def write_part(root: str, log: str, key: str | None, records: list[dict[str, Any]],
               path: str, *, error: bool, replaces: Part | None = None) -> Part:
    """Write one log's rows atomically, then remove the file it `replaces` (the log's
    earlier file, when that is elsewhere: another key, day or deployment)."""
    import polars as pl

    kind = "error" if error else "part"
    key = key or NO_KEY
    dest = part_path(root, partition_of(records, path), log, key, kind)
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    tmp = os.path.join(os.path.dirname(dest), f".{os.path.basename(dest)}.{os.getpid()}.{_host()}.tmp")
    rows = [{"input_key": None if key == NO_KEY else key, **r} for r in records]
    try:
        pl.DataFrame(rows, schema=schema()).write_parquet(tmp)
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            _remove(tmp)
    if replaces is not None and replaces.path != dest:
        _remove(replaces.path)
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
