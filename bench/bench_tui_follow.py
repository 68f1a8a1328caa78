"""`kvreplay tui --follow`: seconds from an append to the log until the timeline on screen
has its lines (headless app; the first 300 lines written before it starts).

    python -m bench.bench_tui_follow tests/data/logcases/b_fcfs_heavy/server.iter.reqbody.log 100
"""
import asyncio
import sys
import tempfile
import time
from pathlib import Path

from kvreplay.tui.app import ReplayApp

SRC = Path(sys.argv[1])
CHUNK = int(sys.argv[2]) if len(sys.argv) > 2 else 100
lines = SRC.read_text().splitlines(keepends=True)
log = Path(tempfile.mkdtemp()) / "server.log"
log.write_text("".join(lines[:300]))


async def main() -> None:
    app = ReplayApp([str(log)], follow=True, year=2026)
    lags = []
    async with app.run_test(size=(130, 40)) as pilot:
        n = 300
        while n < len(lines):
            while app.tl is None:
                await pilot.pause(0.02)
            m = min(len(lines), n + CHUNK)
            with open(log, "a") as f:
                f.write("".join(lines[n:m]))
            t0 = time.monotonic()
            n = m
            while not (app.tl is not None and app.tl.replay is app.session.replay
                       and app.session.replay_lines >= n):
                await pilot.pause(0.02)
            lags.append(time.monotonic() - t0)
        print(f"{SRC.name}: {len(lines)} lines appended {CHUNK} at a time: steps "
              f"{app.tl.num_steps}, preemptions {len(app.tl.preemptions)}; append -> timeline on screen: median "
              f"{sorted(lags)[len(lags)//2]:.2f} s, max {max(lags):.2f} s over {len(lags)} appends")
        app.exit()


if __name__ == "__main__":
    asyncio.run(main())
