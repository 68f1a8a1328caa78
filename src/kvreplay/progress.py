"""Progress of long work. The core reports stages through `stage()`; it prints nothing
itself. A front end installs a sink (`set_sink`): the console script shows a progress bar
on stderr when it is a terminal (cli/progress_bar.py). No sink: every call is a no-op.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Protocol


class Sink(Protocol):
    def start(self, name: str, total: int | None) -> object: ...
    def advance(self, handle: object, n: int) -> None: ...
    def finish(self, handle: object) -> None: ...
    # optional: `status(handle, text)`, a line of counts shown beside the bar


_sink: Sink | None = None


def set_sink(sink: Sink | None) -> Sink | None:
    """Install `sink` (None: none); returns the one it replaces."""
    global _sink
    old, _sink = _sink, sink
    return old


class Stage:
    __slots__ = ("_handle",)

    def __init__(self, handle: object) -> None:
        self._handle = handle

    def advance(self, n: int = 1) -> None:
        if _sink is not None and self._handle is not None:
            _sink.advance(self._handle, n)

    def status(self, text: str) -> None:
        """Counts beside the bar (e.g. done / failed / skipped, rate), if the sink shows them."""
        if _sink is not None and self._handle is not None and hasattr(_sink, "status"):
            _sink.status(self._handle, text)


@contextmanager
def stage(name: str, total: int | None = None) -> Iterator[Stage]:
    """`with stage("replay: ensemble", 32) as s: ... s.advance()`."""
    sink = _sink
    handle = sink.start(name, total) if sink is not None else None
    try:
        yield Stage(handle)
    finally:
        if sink is not None:
            sink.finish(handle)
