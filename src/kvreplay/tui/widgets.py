"""The TUI's own widgets: the timeline bar (click to move) and a panel that keeps its
plain text (for tests and the tmux check)."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual import events
from textual.widgets import Static

SPARK = " ▁▂▃▄▅▆▇█"


class TimelineBar(Static):
    """KV usage, running and waiting over the steps; preemptions marked; click to move."""

    LABEL_W = 6

    def render_for(self, app: Any) -> None:
        """`app`: the ReplayApp (its timeline, window, cursor and bookmarks)."""
        lo, hi = app.window()
        self._window = (lo, hi)
        self.update(timeline_text(app.tl, lo, hi, self.size.width or 80, app.cursor,
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


def timeline_text(tl: Any, lo: int, hi: int, width: int, cursor: int,
                  bookmarks: set[int]) -> Text:
    label_w = 6
    cols = tl.columns(lo, hi, max(1, width - label_w))
    t = Text()
    if not cols:
        t.append("loading…")
        return t
    max_run = max(max(c[3] for c in cols), 1)
    max_wait = max(max(c[4] for c in cols), 1)
    cur_col = next((i for i, c in enumerate(cols) if c[0] <= cursor <= c[1]), None)
    rows = (("KV   ", lambda c: c[2], 1.0, "green"), ("run  ", lambda c: c[3], max_run, "cyan"),
            ("wait ", lambda c: c[4], max_wait, "yellow"))
    for label, get, top, style in rows:
        t.append(label, style="bold")
        t.append(" ")
        for i, c in enumerate(cols):
            v = get(c)
            k = 0 if v <= 0 else max(1, min(8, round(v / top * 8)))
            t.append(SPARK[k], style=style + (" reverse" if i == cur_col else ""))
        t.append("\n")
    t.append("pre  ", style="bold").append(" ")
    for i, c in enumerate(cols):
        has_mark = any(c[0] <= b <= c[1] for b in bookmarks) if bookmarks else False
        if c[5]:
            t.append("▲" if c[5] == 1 else ("▲" if c[5] < 10 else "◆"), style="bold red")
        elif has_mark:
            t.append("◇", style="magenta")
        else:
            t.append(" ")
    t.append("\n")
    t.append("step ", style="bold").append(" ")
    line = [" "] * len(cols)
    if cur_col is not None:
        line[cur_col] = "▲"
    t.append("".join(line), style="bold white")
    t.append("\n")
    left = f"{cols[0][0]}"
    right = f"{cols[-1][1]}"
    mid = f"step {cursor}"
    span = len(cols)
    pad = max(1, span - len(left) - len(right) - len(mid))
    t.append(" " * label_w + left + " " * (pad // 2) + mid + " " * (pad - pad // 2) + right,
             style="dim")
    return t
