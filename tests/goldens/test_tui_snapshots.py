"""Screenshots of `kvreplay tui` at a fixed terminal size (pytest-textual-snapshot).

Stable by construction: the replay is deterministic, every screenshot is taken after the
load finished (no progress bar, no timing text), no toast is on screen, no input cursor.
Update with `python -m pytest tests/goldens/test_tui_snapshots.py --snapshot-update` and look at
the SVGs before committing them.
"""

from __future__ import annotations

from pathlib import Path

from kvreplay.tui.app import ReplayApp
from kvreplay.cli.tui import default_paths

SIZE = (130, 40)
PREFIX = Path(__file__).parents[1] / "data" / "conformance" / "cases" / "f_prefix_caching" / "workload.json"


def after_load(*keys: str):
    async def run_before(pilot) -> None:
        app = pilot.app
        await app.workers.wait_for_complete()
        await pilot.pause()
        for key in keys:
            await pilot.press(key)
            await pilot.pause()
        app.clear_notifications()
        await pilot.pause()

    return run_before


def test_snapshot_opening_screen(snap_compare) -> None:
    assert snap_compare(ReplayApp(default_paths()), terminal_size=SIZE, run_before=after_load())


def test_snapshot_why_panel_at_a_preemption(snap_compare) -> None:
    assert snap_compare(ReplayApp(default_paths()), terminal_size=SIZE,
                        run_before=after_load("n", "n"))


def test_snapshot_block_map_with_shared_prefix(snap_compare) -> None:
    assert snap_compare(ReplayApp([str(PREFIX)]), terminal_size=SIZE,
                        run_before=after_load("n", "2", "t"))


def test_snapshot_request_view(snap_compare) -> None:
    assert snap_compare(ReplayApp(default_paths()), terminal_size=SIZE,
                        run_before=after_load("n", "n", "n", "3"))


def test_snapshot_help(snap_compare) -> None:
    assert snap_compare(ReplayApp(default_paths()), terminal_size=SIZE,
                        run_before=after_load("question_mark"))
