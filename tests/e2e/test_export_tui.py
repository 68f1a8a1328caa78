"""The TUI's `e` key: exports the timeline's steps (all of them, or the zoomed window) and
says where the file went; the file decodes and holds the replay's preemptions."""

from __future__ import annotations

import asyncio
from pathlib import Path

from helpers.trace_read import read_trace

from kvreplay.cli.tui import default_paths
from kvreplay.tui.app import ReplayApp


def test_e_exports_the_whole_replay_then_the_zoomed_window(tmp_path: Path) -> None:
    async def body():
        app = ReplayApp(default_paths())
        app.export_dir = tmp_path
        async with app.run_test(size=(150, 48)) as pilot:
            await app.workers.wait_for_complete()
            await pilot.pause()
            tl = app.tl
            n = tl.num_steps
            await pilot.press("e")
            await app.workers.wait_for_complete()
            await pilot.pause()
            whole = app.exported
            assert whole is not None and whole.exists()
            assert whole.name.endswith(f".steps0-{n - 1}.pftrace")
            notes = [m.message for m in app._notifications]
            assert any(str(whole) in m for m in notes), notes
            got = read_trace(whole)
            pre = [i for i in got.instants if i["name"] == "preemption" and i["track"] == 1]
            assert len(pre) == len(tl.preemptions) == 5
            # zoom in around the second preemption: only the window's steps
            await pilot.press("n", "n", "plus", "plus", "e")
            await app.workers.wait_for_complete()
            await pilot.pause()
            lo, hi = app.window()
            part = app.exported
            assert part is not None and part != whole and part.name.endswith(
                f".steps{lo}-{hi - 1}.pftrace")
            steps = sorted(s["args"]["step"] for s in read_trace(part).slices if s["track"] == 1)
            assert steps[0] == lo and steps[-1] == hi - 1

    asyncio.run(body())
