"""The console script's progress on stderr: a rich bar when stderr is a terminal; else
(a pipe, a CI log, nohup) plain lines, no escape codes: a stage that runs LINE_AFTER_S
seconds or more gets a line with its elapsed time as it goes (at most one line every
LINE_EVERY_S seconds) and one when it ends. KVREPLAY_PROGRESS=0 turns both off."""

from __future__ import annotations

import os
import sys
import time
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


LINE_AFTER_S = 2.0  # a stage shorter than this prints nothing
LINE_EVERY_S = 5.0  # at most one line this often while a stage runs


class _Stage:
    __slots__ = ("name", "total", "done", "t0", "said", "status")

    def __init__(self, name: str, total: int | None, t0: float) -> None:
        self.name, self.total, self.done, self.t0 = name, total, 0, t0
        self.said = False
        self.status = ""


class LineSink:
    """Plain progress lines for a stderr that is not a terminal. With `heartbeat`, a
    daemon thread says which stage is running when nothing was said for LINE_EVERY_S (a
    stage that counts nothing, such as a fit, is then not silent). Only the process that
    made the sink writes (a forked pool worker inherits it and stays quiet)."""

    def __init__(self, prog: str = "kvreplay", clock=time.monotonic, out=None,
                 heartbeat: bool = False) -> None:
        import threading

        self.prog, self.clock = prog, clock
        self.out = out if out is not None else sys.stderr
        self.last = clock()
        self.pid = os.getpid()
        self.open: list[_Stage] = []
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        if heartbeat:
            threading.Thread(target=self._beat, daemon=True).start()

    def _beat(self) -> None:
        while not self.stopped.wait(1.0):
            with self.lock:
                if self.open and os.getpid() == self.pid:
                    self._maybe(self.open[-1], locked=True)

    def start(self, name: str, total: int | None) -> object:
        st = _Stage(name, total, self.clock())
        with self.lock:
            self.open.append(st)
        return st

    def status(self, handle: object, text: str) -> None:
        handle.status = text  # type: ignore[attr-defined]
        self._maybe(handle)  # type: ignore[arg-type]

    def advance(self, handle: object, n: int) -> None:
        handle.done += n  # type: ignore[attr-defined]
        self._maybe(handle)  # type: ignore[arg-type]

    def finish(self, handle: object) -> None:
        st: _Stage = handle  # type: ignore[assignment]
        with self.lock:
            if st in self.open:
                self.open.remove(st)
            now = self.clock()
            if st.said or now - st.t0 >= LINE_AFTER_S:
                self._say(st, now, "stopped" if st.total and st.done < st.total else "done")

    def _maybe(self, st: _Stage, locked: bool = False) -> None:
        now = self.clock()
        if now - st.t0 >= LINE_AFTER_S and now - self.last >= LINE_EVERY_S:
            if locked:
                self._say(st, now, None)
            else:
                with self.lock:
                    self._say(st, now, None)

    def _say(self, st: _Stage, now: float, end: str | None) -> None:
        if os.getpid() != self.pid:
            return
        count = f" {st.done}/{st.total}" if st.total else (f" {st.done}" if st.done else "")
        extra = f" ({st.status})" if st.status else ""
        self.out.write(f"{self.prog}: {st.name}:{count} {end + ' ' if end else ''}"
                       f"{now - st.t0:.0f} s{extra}\n")
        self.out.flush()
        st.said = True
        self.last = now

    def stop(self) -> None:
        self.stopped.set()


@contextmanager
def progress_bar(enabled: bool | None = None, prog: str = "kvreplay") -> Iterator[None]:
    """Progress for the work inside: a bar if stderr is a terminal (or `enabled`), plain
    lines otherwise; nothing when `enabled` is False or KVREPLAY_PROGRESS=0."""
    if enabled is False or os.environ.get("KVREPLAY_PROGRESS") == "0":
        yield
        return
    if enabled is None:
        enabled = sys.stderr.isatty()
    sink = RichSink() if enabled else LineSink(prog, heartbeat=True)
    old = progress.set_sink(sink)
    try:
        yield
    finally:
        progress.set_sink(old)
        sink.stop()
