"""The TUI's own widgets: the timeline bar (click to move) and a panel that keeps its
plain text (for tests and the tmux check)."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual import events
from textual.widgets import Static

from kvreplay.tui import panel_text


class TimelineBar(Static):
    """KV usage, running and waiting over the steps; preemptions marked; click to move."""

    LABEL_W = 6

    def render_for(self, app: Any) -> None:
        """`app`: the ReplayApp (its timeline, window, cursor and bookmarks)."""
        lo, hi = app.window()
        self._window = (lo, hi)
        self.update(panel_text.timeline_text(app.tl, lo, hi, self.size.width or 80, app.cursor,
                                         app.bookmarks))

    def on_click(self, event: events.Click) -> None:
        app: Any = self.app
        if getattr(app, "tl", None) is None:
            return
        lo, hi = getattr(self, "_window", (0, 0))
        width = max(1, (self.size.width or 80) - self.LABEL_W)
        span = min(hi, app.tl.num_steps) - lo
        x = event.x - self.LABEL_W
        if span <= 0 or x < 0:
            return
        col = min(x, width - 1)
        app.move_to(lo + span * col // width + (span // width) // 2)


class Panel(Static):
    """A Static that remembers its plain text (for tests and the tmux check)."""

    plain: str = ""

    def show(self, text: Text) -> None:
        self.plain = text.plain
        self.update(text)

