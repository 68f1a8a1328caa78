"""Export a `Replay` as a timeline trace: Perfetto's protobuf (`.pftrace`, with the optional
`perfetto` package) or Chrome's JSON trace-event format (no extra dependency).

`model.build_trace` reads the replay once (its records and a checked re-run) into tracks,
slices, instants, counters and flows; `chrome.py` and `perfetto.py` write that same trace.
Core side: imports the model and inference types, never a UI.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvreplay.errors import UserError
from kvreplay.export.model import Trace, build_trace

FORMATS = ("perfetto", "chrome")


def write_trace(trace: Trace, path: str | Path, fmt: str) -> int:
    """Write `trace` to `path` as `fmt` ("perfetto" | "chrome"); returns the file's size."""
    if fmt == "perfetto":
        from kvreplay.export.perfetto import build_proto

        data = build_proto(trace)  # before opening: a missing package leaves no file
    elif fmt == "chrome":
        from kvreplay.export.chrome import chrome_json

        data = chrome_json(trace)
    else:
        raise ValueError(f"unknown trace format {fmt!r}")
    try:
        with open(path, "wb") as f:
            f.write(data)
    except OSError as exc:
        raise UserError(f"{path}: cannot write: {exc.strerror}") from None
    return len(data)


def export(replay: Any, outputs: dict[str, str | Path],
           steps: tuple[int, int] | None = None) -> dict[str, int]:
    """Write `replay` (steps lo..hi, default all) to each {format: path}; returns
    {path: bytes}."""
    trace = build_trace(replay, steps)
    return {str(path): write_trace(trace, path, fmt) for fmt, path in outputs.items()}


__all__ = ["FORMATS", "Trace", "build_trace", "export", "write_trace"]
