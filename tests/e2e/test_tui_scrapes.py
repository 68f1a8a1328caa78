"""`kvreplay tui LOG metrics.prom.gz`: the log and the Prometheus scrapes of one server open
as `kvreplay replay LOG metrics.prom.gz` does (the log's replay, the scrapes checked against
it), and the Check tab shows each scrape window's counters, replayed against counted."""

from __future__ import annotations

import asyncio
import gzip
import json
from pathlib import Path

from kvreplay.sources import open_replay
from kvreplay.tui.app import ReplayApp

P1 = Path(__file__).parents[1] / "data" / "logcases" / "p1_poisson_fcfs_200"
LOG = P1 / "server.iter.reqbody.log"
PROM = P1 / "metrics.prom.gz"
SIZE = (130, 40)


def test_log_and_scrapes_open_the_logs_replay_and_check_each_scrape_window() -> None:
    assert LOG.exists() and PROM.exists()
    truth = json.loads((P1 / "truth.json").read_text())["total_preemptions"]
    # the scrape file's own counter at its last scrape (read here, not by kvreplay)
    last = [ln for ln in gzip.open(PROM, "rt") if ln.startswith("vllm:num_preemptions_total")]
    assert last and float(last[-1].split()[-1]) == truth
    alone = open_replay([str(LOG)], year=2026)

    async def body():
        app = ReplayApp([str(LOG), str(PROM)], year=2026)
        async with app.run_test(size=SIZE) as pilot:
            await app.workers.wait_for_complete()
            await pilot.pause()
            assert app.load_error is None and app.tl is not None and app.tl.done
            # the log's replay, the scrapes beside it (not read as log lines)
            assert app.tl.replay.steps == alone.steps
            assert app.tl.replay.paths == [str(LOG)]
            chk = app.scrapes
            assert chk.counted == chk.replayed == truth
            assert len(chk.windows) >= 2
            assert sum(w.preemptions_logged for w in chk.windows) == truth
            await pilot.press("6")
            await pilot.pause()
            shown = app.query_one("#check-panel").plain
            assert "Prometheus scrapes" in shown
            assert f"({truth} replayed, {truth} counted)" in shown
            # the window holding the shown step's time is marked
            await pilot.press("n")
            await pilot.pause()
            at = app.tl.step_time(app.cursor)
            w = next(w for w in chk.windows if w.t0 <= at < w.t1)
            marked = [ln for ln in app.query_one("#check-panel").plain.splitlines()
                      if ln.startswith("▶")]
            assert len(marked) == 1
            assert (f"preemptions {w.preemptions_replayed} replayed / "
                    f"{w.preemptions_logged} counted") in marked[0]
            app.exit()

    asyncio.run(body())


def test_scrapes_without_their_log_one_line_exit_2() -> None:
    app = ReplayApp([str(PROM)], year=2026)

    async def body():
        async with app.run_test(size=SIZE) as pilot:
            while app.return_code is None:
                await pilot.pause(0.05)

    asyncio.run(body())
    assert app.return_code == 2
    assert "give the log too" in (app.load_error or "")


V0_SWAP = Path(__file__).parents[1] / "data" / "v0_logs" / "v066_swap_1s.log"
TRACE = P1 / "server.trace.log.gz"


def _check_tab(path: Path, year: int) -> tuple[str, object]:
    app = ReplayApp([str(path)], year=year)
    shown: list[str] = []

    async def body():
        async with app.run_test(size=SIZE) as pilot:
            await app.workers.wait_for_complete()
            await pilot.pause()
            await pilot.press("6")
            await pilot.pause()
            shown.append(app.query_one("#check-panel").plain)
            app.exit()

    asyncio.run(body())
    return shown[0], app.tl.replay


def test_check_tab_v0_warnings_and_stats_lines() -> None:
    """The Check tab says what the report says of the same replay (its typed checks)."""
    assert V0_SWAP.exists()
    shown, rep = _check_tab(V0_SWAP, 2025)
    w, v = rep.warnings, rep.verification
    assert w.warnings_logged >= 1
    assert (f"{w.warnings_matched} of {w.warnings_logged} match the replay (victim, mode, "
            "cumulative count, time)") in shown
    assert f"{v.agreeing_lines} of {v.stats_lines} agree with the replay" in shown
    assert "Prometheus scrapes" not in shown  # none given


def test_check_tab_step_trace() -> None:
    assert TRACE.exists()
    shown, rep = _check_tab(TRACE, 2026)
    c = rep.step_check
    assert c.steps_checked == c.steps_logged > 0 and c.first_divergence is None
    assert f"{c.steps_checked} of {c.steps_logged} logged steps checked" in shown
    assert "every step agrees with the log" in shown
