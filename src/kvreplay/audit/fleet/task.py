"""The unit of fleet work: one input (a log file, or a folder of Prometheus scrapes), keyed
by a hash of its bytes and of the audit options (`input_key`), audited where the executor
runs it.

Everything here runs on a worker: it must be importable there (kvreplay installed) and
the input readable there (a shared file system). A task never raises for a bad input or a
kvreplay bug: it returns an error row with the reason, so no input is lost.
"""

from __future__ import annotations

import hashlib
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any

KEY_HEX = 24  # 96 bits of sha256: `input_key` and the dataset's file names


@dataclass(frozen=True, slots=True)
class Options:
    """The audit options a row depends on (part of the key: --no-replay rows differ)."""

    profile: str | None = None
    replay: bool = True
    year: int | None = None
    # log -> the Prometheus inputs of the same server, audited with it (one joined record)
    metrics: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def metrics_of(self, path: str) -> tuple[str, ...]:
        return dict(self.metrics).get(path, ())

    def token(self) -> bytes:
        return f"kvreplay-audit/1 profile={self.profile} replay={self.replay} year={self.year}\n".encode()


@dataclass(slots=True)
class Result:
    """What a task sends back: the rows of one input and where / how it ran."""

    index: int
    key: str | None
    records: list[dict[str, Any]]
    error: str | None = None
    worker: str = ""
    peak_rss_kb: int = 0
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


class Skipped(str):
    """An input found in a given folder that is not read (a FIFO, a device, a link out of
    the folder): the path, with the `reason` its error row gives."""

    reason: str

    def __new__(cls, path: str, reason: str) -> "Skipped":
        s = super().__new__(cls, path)
        s.reason = reason
        return s

    def __reduce__(self):
        return (Skipped, (str(self), self.reason))


def check_regular(path: str) -> None:
    """OSError unless `path` is a regular file or a folder (of scrapes): a FIFO or a device
    would block the reader forever or never end."""
    import stat

    st = os.stat(path)  # (follows a link: its target decides)
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
        kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)
                else "a socket" if stat.S_ISSOCK(st.st_mode) else "not a regular file")
        raise OSError(f"{kind}, not a regular file: not read")


def _files_of(path: str) -> list[str]:
    check_regular(path)
    if os.path.isdir(path):  # a folder of .prom scrapes: one series
        out = [os.path.join(path, n) for n in sorted(os.listdir(path)) if not n.startswith(".")]
        for f in out:
            check_regular(f)
        return out
    return [path]


def input_key(path: str, options: Options) -> str:
    """sha256 of the options and the input's bytes (a folder: each file's name and bytes)."""
    h = hashlib.sha256(options.token())
    for f in [f for p in (path, *options.metrics_of(path)) for f in _files_of(p)]:
        if f != path:
            h.update(os.path.basename(f).encode() + b"\0")
        with open(f, "rb") as fh:
            while chunk := fh.read(1 << 20):
                h.update(chunk)
        h.update(b"\0")
    return h.hexdigest()[:KEY_HEX]


def log_id(path: str) -> str:
    """The identity of an input in a dataset: its resolved path (links and `..` resolved,
    made absolute: `logs/a.log` and `/abs/logs/a.log` are one input). One file per log; the
    content key says if it is current."""
    return hashlib.sha256(os.path.realpath(path).encode()).hexdigest()[:KEY_HEX]


def keys_task(paths: list[str], options: Options) -> list[str | None]:
    """Keys of several inputs (None: unreadable; the audit task then gives its error row)."""
    out: list[str | None] = []
    for p in paths:
        if isinstance(p, Skipped):
            out.append(None)
            continue
        try:
            out.append(input_key(p, options))
        except OSError:
            out.append(None)
    return out  # (a Skipped input: None, as it cannot be read)


def _peak_rss_kb() -> int:
    try:
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)  # KiB on Linux
    except (ImportError, OSError):
        return 0


def audit_task(index: int, path: str, options: Options) -> Result:
    """Audit one input: its key and its records, or its error row (never raises)."""
    from kvreplay.audit.record import audit_records, error_record
    from kvreplay.errors import UserError

    t = time.perf_counter()
    key = None
    error = None
    if isinstance(path, Skipped):
        error = f"{path}: skipped: {path.reason}"
        return Result(index, None, [error_record(str(path), error, "input")], error)
    try:
        key = input_key(path, options)
        extra = options.metrics_of(path)
        records = audit_records([path, *extra] if extra else path, profile=options.profile,
                                replay=options.replay, year=options.year)
        for r in records:  # the dataset's row is the log's: its label stays the log's path
            r["log"] = path
    except UserError as exc:  # unreadable, empty, not a log: the reason is for the user
        error = str(exc)
        records = [error_record(path, error, "input")]
    except OSError as exc:
        error = f"{path}: cannot read: {exc.strerror or exc}"
        records = [error_record(path, error, "input")]
    except Exception as exc:  # a kvreplay bug: keep the row, say where
        import traceback

        tb = traceback.extract_tb(exc.__traceback__)
        where = f" (at {os.path.basename(tb[-1].filename)}:{tb[-1].lineno})" if tb else ""
        error = f"{type(exc).__name__}: {exc}{where}"
        records = [error_record(path, error, "bug")]
    return Result(index, key, records, error, f"{socket.gethostname()}:{os.getpid()}",
                  _peak_rss_kb(), time.perf_counter() - t)
