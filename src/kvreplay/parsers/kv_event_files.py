"""Files of vLLM's KV-cache events written by `kvreplay record-kv-events` (JSON Lines, one
batch per line: {"seq", "ts", "rank", "events": [BlockStored | BlockRemoved |
AllBlocksCleared ...]}; `.gz` ok)."""

from __future__ import annotations

import gzip
import io
import json
import zlib
from typing import Any

from kvreplay.errors import UserError


def _open(path: str):
    if str(path).endswith(".gz"):  # (bounded as a log is: reader._Bounded)
        from kvreplay.parsers.reader import _Bounded, _Counted

        counted = _Counted(open(path, "rb"))
        return io.TextIOWrapper(_Bounded(gzip.GzipFile(fileobj=counted), counted), encoding="utf-8")
    return open(path, "rt", encoding="utf-8")


SNIFF_CHARS = 16 << 20  # of a file's first line, read to tell a KV-events file


def read_kv_events(path: str) -> list[dict[str, Any]]:
    """The batches of a KV-events file, in seq order. A line that is not a batch is a
    `UserError` naming the file and line."""
    recs = []
    try:
        with _open(path) as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    d = json.loads(line)
                except ValueError as exc:
                    raise UserError(f"{path}:{n}: not a KV-event batch (JSON: {exc})") from None
                if not isinstance(d, dict) or "events" not in d:
                    raise UserError(f"{path}:{n}: not a KV-event batch (no 'events')")
                recs.append(d)
    except (OSError, EOFError, zlib.error) as exc:  # (a corrupt or cut .gz too)
        raise UserError(f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    except (UnicodeDecodeError, RecursionError) as exc:
        raise UserError(f"{path}: not a KV-events file ({type(exc).__name__})") from None
    recs.sort(key=lambda r: r.get("seq", 0))
    return recs


def is_kv_events_file(path: str) -> bool:
    """Cheap sniff: the first line is a JSON object with "seq" and "events"."""
    try:
        with _open(path) as f:
            first = f.readline(SNIFF_CHARS)  # (a line without end is not read through)
        d = json.loads(first)
    except (OSError, ValueError, UnicodeDecodeError, EOFError, zlib.error, RecursionError):
        return False
    return isinstance(d, dict) and "seq" in d and "events" in d
