"""The TUI's status bar while a log opens: the replay's stages, counts and elapsed time."""

from __future__ import annotations

from kvreplay import progress
from kvreplay.tui.opening import Opening, OpeningSink


class _App:
    def __init__(self) -> None:
        self.got: list[str] = []

    def post_message(self, m: Opening) -> None:
        self.got.append(m.text)


def test_stages_reach_the_status_bar_at_most_every_quarter_second() -> None:
    now = [0.0]
    app = _App()
    old = progress.set_sink(OpeningSink(app, clock=lambda: now[0]))
    try:
        with progress.stage("parse server.log"):
            now[0] = 3.0
        with progress.stage("uncertainty ensemble, round 1", 32) as st:
            for _ in range(32):
                now[0] += 0.1
                st.advance()
    finally:
        progress.set_sink(old)
    assert app.got[0] == "opening: parse server.log · 0 s (Esc stops once steps come in)"
    assert app.got[1].startswith("opening: uncertainty ensemble, round 1 0/32 · 3 s")
    assert 10 <= len(app.got) <= 15  # 3.2 s of advances, one message per 0.25 s at most
    assert app.got[-1].startswith("opening: uncertainty ensemble, round 1 3")
