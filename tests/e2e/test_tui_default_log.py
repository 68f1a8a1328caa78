"""A default log (no request lines) in the TUI (issue 30): a summary screen of its answer
(intervals, no victims) instead of a refusal; q quits with exit 0."""

from __future__ import annotations

import asyncio
from pathlib import Path

from kvreplay.tui.app import ReplayApp
from kvreplay.tui.default_screen import DefaultLogScreen

B_LOG = Path(__file__).parents[1] / "data" / "logcases" / "b_fcfs_heavy" / "server.log"


def test_a_default_log_opens_on_its_answer(tmp_path: Path) -> None:
    assert B_LOG.is_file()
    log = tmp_path / "b.default.log"
    log.write_text("".join(x for x in B_LOG.read_text().splitlines(True)
                           if "Received request" not in x and "request_logger" not in x))

    async def body():
        app = ReplayApp([str(log)], year=2026)
        async with app.run_test(size=(150, 48)) as pilot:
            await app.workers.wait_for_complete()
            await pilot.pause()
            assert app.load_error is None and app.load_exception is None
            assert isinstance(app.screen, DefaultLogScreen)
            text = app.screen.query_one("#default-summary").plain
            assert "HEADLINE: default log (no request lines): " in text
            assert "no victim can be named" in text and "--enable-log-requests" in text
            assert "preemptions: median" in text and "(interval)" in text
            iv = app.default_answer.preemptions
            assert iv.low <= 5 <= iv.high  # b's truth: 5 preemptions
            assert app.tl is None  # no steps to walk
            await pilot.press("q")
            await pilot.pause()
        assert app.return_code in (0, None)
    asyncio.run(body())
