"""What the TUI shows while it opens a log: the stage the replay is in, how far, and for
how long (kvreplay.progress stages, relayed from the loading thread as messages)."""

from __future__ import annotations

import os
import time
from typing import Any

from textual.message import Message

EVERY_S = 0.25  # at most this often a message per stage's advance


class Opening(Message):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text


class Computing(Message):
    """A stage of the uncertainty ensemble, computed while the point replay is shown."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text


class OpeningSink:
    """A kvreplay.progress sink that posts `Opening(text)` to the app (thread-safe); with
    `later=True`, `Computing(text)` for work done after the steps are shown."""

    def __init__(self, app: Any, clock=time.monotonic, later: bool = False) -> None:
        self.app, self.clock, self.later = app, clock, later
        self.pid = os.getpid()  # a forked worker (the ensemble's pool) posts nothing
        self.t0 = clock()
        self.last = 0.0

    def start(self, name: str, total: int | None) -> object:
        h = [name, total, 0]
        self._post(h, force=True)
        return h

    def advance(self, handle: object, n: int) -> None:
        handle[2] += n  # type: ignore[index]
        self._post(handle)

    def status(self, handle: object, text: str) -> None:
        pass

    def finish(self, handle: object) -> None:
        pass

    def _post(self, h: Any, force: bool = False) -> None:
        now = self.clock()
        if os.getpid() != self.pid or (not force and now - self.last < EVERY_S):
            return
        self.last = now
        name, total, done = h
        count = f" {done}/{total}" if total else ""
        if self.later:
            self.app.post_message(Computing(f"{name}{count} · {now - self.t0:.0f} s"))
            return
        self.app.post_message(Opening(f"opening: {name}{count} · {now - self.t0:.0f} s "
                                      "(Esc stops once steps come in)"))
