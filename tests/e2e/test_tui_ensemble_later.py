"""The TUI is interactive on the point replay while the uncertainty ensemble computes
(tui/later.py, issue 31): the steps can be walked before the ensemble is in, the status
line says it is still computing, and once in, the shown timeline carries the same figures
`kvreplay replay` gives (interval, per-row probabilities). Esc stops it."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from kvreplay.sources import open_replay
from kvreplay.tui.app import ReplayApp

B_LOG = Path(__file__).parents[1] / "data" / "logcases" / "b_fcfs_heavy" / "server.log"
SIZE = (150, 48)


class GatedApp(ReplayApp):
    """The ensemble waits for the test's go: the test acts while it is 'still computing'."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.go = threading.Event()

    def compute_full_replay(self):
        assert self.go.wait(120)
        return super().compute_full_replay()


async def until(pilot, cond, tries: int = 2400) -> None:
    for _ in range(tries):
        if cond():
            return
        await pilot.pause(0.05)
    raise AssertionError("condition never held")


@pytest.mark.slow
def test_steps_usable_before_the_ensemble_then_its_figures_fill_in() -> None:
    assert B_LOG.is_file()
    full = open_replay([str(B_LOG)])  # what `kvreplay replay` shows for this log
    assert full.uncertainty is not None
    lo, hi = full.uncertainty.preemptions["low"], full.uncertainty.preemptions["high"]
    assert lo < hi  # b's stats-line log leaves the count open (5-9 in its README example)

    async def body():
        app = GatedApp([str(B_LOG)])
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.loaded and app.tl is not None and app.tl.done)
            tl = app.tl
            assert app.ensemble == "computing" and tl.replay.uncertainty is None
            status = str(app.query_one("#status-label").render())
            assert "uncertainty still computing" in status
            # the steps are there to walk: next step, next preemption, its why panel
            await pilot.press("right")
            await pilot.pause()
            assert app.cursor == 1
            await pilot.press("n")
            await pilot.pause()
            first = tl.preemptions[0]
            assert app.cursor == first.step and app.selected == first.victim
            assert "probability:" not in app.query_one("#why-panel").plain
            app.go.set()
            await until(pilot, lambda: app.ensemble == "done")
            await pilot.pause()
            shown = app.tl
            assert shown.replay.uncertainty is not None
            assert shown.replay.uncertainty.preemptions == full.uncertainty.preemptions
            assert [(p.step, p.victim, p.probability) for p in shown.preemptions] == \
                [(p.step, p.victim, p.probability) for p in full.preemptions]
            assert app.cursor == first.step  # where the user was
            status = str(app.query_one("#status-label").render())
            assert "still computing" not in status
            assert f"{lo}-{hi} preemptions (90%; this replay {len(full.preemptions)})" in status
            assert "probability:" in app.query_one("#why-panel").plain
    asyncio.run(body())


@pytest.mark.slow
def test_esc_stops_the_ensemble_and_the_point_replay_stays() -> None:
    assert B_LOG.is_file()

    async def body():
        app = GatedApp([str(B_LOG)])
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.loaded and app.ensemble == "computing")
            await pilot.press("escape")
            await pilot.pause()
            assert app.ensemble == "stopped"
            app.go.set()
            await app.workers.wait_for_complete()
            await pilot.pause()
            assert app.ensemble == "stopped" and app.tl.replay.uncertainty is None
            assert "uncertainty stopped" in str(app.query_one("#status-label").render())
    asyncio.run(body())
