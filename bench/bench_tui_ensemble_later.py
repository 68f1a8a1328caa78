#!/usr/bin/env python3
"""How soon `kvreplay tui` lets one walk the steps of a log whose replay has an
uncertainty ensemble (tui/later.py):

    python -m bench.bench_tui_ensemble_later [LOG]   (default: p1's 200-request log)

Headless, in this process: the time from start to the first frame that shows a replayed
step and to the ensemble's figures being in, with the ensemble computed after the steps
are shown (now), against the baseline measured in the same run: the ensemble computed
before anything is shown (`ensemble_later=False`, as before).
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

from kvreplay.tui.app import ReplayApp

DEFAULT = Path(__file__).parents[1] / "tests" / "data" / "logcases" / "p1_poisson_fcfs_200" / "server.log"


async def _measure(path: str, later: bool) -> tuple[float, float]:
    app = ReplayApp([path], ensemble_later=later)
    t0 = time.perf_counter()
    first = None
    async with app.run_test(size=(150, 48)) as pilot:
        while True:
            if first is None and app.view is not None:
                first = time.perf_counter() - t0
            done = app.loaded and (app.ensemble in (None, "done") or not later)
            if done and first is not None:
                break
            if app.load_error or app.load_exception:
                raise SystemExit(f"could not open {path}: {app.load_error or app.load_exception}")
            await pilot.pause(0.05)
        await app.workers.wait_for_complete()
        full = time.perf_counter() - t0
        assert app.tl is not None and app.tl.replay.uncertainty is not None
    return first, full


def main() -> int:
    path = sys.argv[1] if len(sys.argv) > 1 else str(DEFAULT)
    base_first, base_full = asyncio.run(_measure(path, later=False))
    first, full = asyncio.run(_measure(path, later=True))
    print(f"{Path(path).name}: first step shown after {first:.1f} s (ensemble later) vs "
          f"{base_first:.1f} s (ensemble first, the baseline): {first / base_first:.2f}x; "
          f"ensemble in after {full:.1f} s vs {base_full:.1f} s ({full / base_full:.2f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
