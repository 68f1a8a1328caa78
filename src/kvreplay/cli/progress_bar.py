"""The console script's progress bar: rich, on stderr, only when stderr is a terminal (a
pipe or a CI log gets no bar and no escape codes)."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Iterator

from kvreplay import progress


class RichSink:
    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn,
                                   TextColumn, TimeElapsedColumn)

        self.bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                            MofNCompleteColumn(), TimeElapsedColumn(),
                            TextColumn("{task.fields[status]}"),
                            console=Console(stderr=True), transient=True,
                            redirect_stdout=False, redirect_stderr=False)  # (stdout: the report)
        self.bar.start()

    def start(self, name: str, total: int | None) -> object:
        return self.bar.add_task(name, total=total, status="")

    def status(self, handle: object, text: str) -> None:
        self.bar.update(handle, status=text)  # type: ignore[arg-type]

    def advance(self, handle: object, n: int) -> None:
        self.bar.advance(handle, n)  # type: ignore[arg-type]

    def finish(self, handle: object) -> None:
        self.bar.remove_task(handle)  # type: ignore[arg-type]

    def stop(self) -> None:
        self.bar.stop()


@contextmanager
def progress_bar(enabled: bool | None = None) -> Iterator[None]:
    """A bar for the work inside, if stderr is a terminal (or `enabled`)."""
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        yield
        return
    sink = RichSink()
    old = progress.set_sink(sink)
    try:
        yield
    finally:
        progress.set_sink(old)
        sink.stop()
