#!/usr/bin/env python3
"""Latency and memory of `kvreplay watch` on a log appended as a server writes it.

    python -m bench.bench_watch [--log PATH] [--speeds 1,10,100] [--synthetic N] [--long 10,40]

A writer appends the log to a file line by line at the pace its time stamps give (lines of
one second spread evenly over it; gaps over a second, such as model loading, cut to one
second), sped up 10x and 100x, while `kvreplay watch FILE --format jsonl` follows it. For
each preemption watch prints: the time from the write of the line that decides it (the
Iteration line of its step + 1, watch's --settle 1) to the row on watch's stdout; median
and p99. Also the watch process's peak memory (VmHWM) and CPU time. Baseline, in the
same run: the offline replay (`kvreplay.sources.open_replay`) of the whole file.
`--synthetic N`: also a rendered Iteration-line log of N requests with up to 256 running
(bench_iterations' workload, prompts in the JSON bodies). `--long 10,40`: bursty logs of
10 and 40 bursts (idle between them: watch's window restarts) at the last speed: peak
memory and latency should not grow with the log.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ROOT / "tests" / "data" / "logcases" / "b_fcfs_heavy" / "server.iter.reqbody.log"
TS = re.compile(r"(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)")
IT = re.compile(r"Iteration\((\d+)\)")
STARTUP_S = 3.0


def schedule(lines: list[str]) -> list[float]:
    """Each line's write time (s from the start) at 1x."""
    secs: list[float | None] = []
    for s in lines:
        m = TS.search(s)
        secs.append(int(m[3]) * 3600 + int(m[4]) * 60 + int(m[5]) if m else None)
    out, t, prev = [], 0.0, None
    i = 0
    while i < len(lines):
        sec = secs[i] if secs[i] is not None else prev
        j = i
        while j < len(lines) and (secs[j] if secs[j] is not None else sec) == sec:
            j += 1
        if prev is not None and sec is not None:
            t += min(max(sec - prev, 0), 1.0)
        n = j - i
        out += [t + k / n for k in range(n)]  # spread over the second
        prev = sec
        i = j
    return out


def _rss_mb(pid: int) -> tuple[float, float] | None:
    """(VmRSS, VmHWM) of a process, MB. VmHWM is its peak since its exec: a child's
    ru_maxrss also counts the parent's pages it was forked with (Linux keeps ru_maxrss
    across execve), and this parent holds the rendered log."""
    got: dict[str, float] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for s in f:
                if s.startswith(("VmRSS:", "VmHWM:")):
                    got[s[:5]] = int(s.split()[1]) / 1024
    except OSError:
        return None
    return (got["VmRSS"], got["VmHWM"]) if len(got) == 2 else None


def run(path: Path, speed: float) -> dict:
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines(True)
    when = schedule(lines)
    n_of_line = {k: int(m[1]) for k, s in enumerate(lines) if (m := IT.search(s))}
    written: dict[int, float] = {}  # Iteration N -> when its line was written
    printed: list[tuple[int, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "server.log"
        log.write_text("")
        p = subprocess.Popen([sys.executable, "-m", "kvreplay", "watch", str(log), "--format",
                              "jsonl", "--exit-idle", "3"], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True, cwd=ROOT)

        def read() -> None:
            for s in p.stdout:  # type: ignore[union-attr]
                t = time.monotonic()
                o = json.loads(s)
                if o["event"] == "preemption":
                    printed.append((o["step"], t))

        peak = [0.0]
        done = threading.Event()

        def sample() -> None:  # (watch's peak: VmHWM, see _rss_mb)
            while not done.wait(0.25):
                m = _rss_mb(p.pid)
                if m is not None:
                    peak[0] = max(peak[0], m[1])

        reader = threading.Thread(target=read)
        reader.start()
        sampler = threading.Thread(target=sample)
        sampler.start()
        time.sleep(STARTUP_S)  # watch is up (imports done), following the empty file
        t0 = time.monotonic()
        with log.open("a") as f:
            for k, s in enumerate(lines):
                delay = t0 + when[k] / speed - time.monotonic()
                if delay > 0:
                    f.flush()
                    time.sleep(delay)
                f.write(s)
                if k in n_of_line:
                    f.flush()
                    written[n_of_line[k]] = time.monotonic()
        _, status, ru = os.wait4(p.pid, 0)
        done.set()
        sampler.join()
        reader.join()
    lat = sorted(t - written[step + 1] for step, t in printed if step + 1 in written)
    if status:
        print(f"  (watch ended with status {status})")
    return {"rows": len(printed), "median": statistics.median(lat) if lat else float("nan"),
            "p99": lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else float("nan"),
            "maxrss_mb": peak[0], "cpu_s": ru.ru_utime + ru.ru_stime,
            "wall_s": when[-1] / speed}


def bench(path: Path, speeds: list[float]) -> None:
    from kvreplay.sources import open_replay

    open_replay([str(path)])  # (imports and caches warm: the second is timed)
    t0 = time.perf_counter()
    rep = open_replay([str(path)])
    base = time.perf_counter() - t0
    print(f"{path.name}: {len(rep.preemptions)} preemptions, {len(rep.steps):,} steps; "
          f"offline replay (baseline) {base:.2f} s")
    for sp in speeds:
        r = run(path, sp)
        print(f"  {sp:>5g}x ({r['wall_s']:6.1f} s of log): {r['rows']} rows, latency from the "
              f"deciding line: median {r['median']:.3f} s ({r['median'] / base:.2f}x the "
              f"baseline), p99 {r['p99']:.3f} s ({r['p99'] / base:.2f}x); watch "
              f"{r['cpu_s']:.1f} s CPU ({r['cpu_s'] / base:.1f}x), peak {r['maxrss_mb']:.0f} MB")


def synthetic(n: int, dest: Path) -> Path:
    from bench.bench_iterations import make_workload
    from kvreplay.replay import parse_workload, simulate
    from tools.oracle.render_log import render_log

    wl = parse_workload(make_workload(n))
    records, _ = simulate(wl)
    lines = render_log(wl, records, step_time_s=0.012, stats_interval_s=10.0,
                       iteration_lines=True, with_prompts=True)
    dest.write_text("\n".join(lines) + "\n")
    return dest


def bursty(bursts: int, dest: Path) -> Path:
    from tools.oracle.bursty_log import render_bursty

    dest.write_text("\n".join(render_bursty(bursts)) + "\n")
    return dest


def long_runs(bursts: list[int], speed: float) -> None:
    """Peak memory and latency of watch over logs of growing length (quiet points between
    bursts): flat when the window restarts."""
    print(f"bursty logs (8 requests a burst, idle between), appended at {speed:g}x:")
    with tempfile.TemporaryDirectory() as tmp:
        for n in bursts:
            path = bursty(n, Path(tmp) / f"bursty{n}.log")
            r = run(path, speed)
            print(f"  {n:>4} bursts ({r['wall_s']:6.1f} s): {r['rows']} rows, latency median "
                  f"{r['median']:.3f} s, p99 {r['p99']:.3f} s; watch {r['cpu_s']:.1f} s CPU, "
                  f"peak {r['maxrss_mb']:.0f} MB")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log", type=Path, default=DEFAULT)
    ap.add_argument("--speeds", default="1,10,100")
    ap.add_argument("--synthetic", type=int, default=0, metavar="N")
    ap.add_argument("--long", default="", metavar="B1,B2",
                    help="also bursty logs of B1, B2... bursts at the last speed (memory)")
    args = ap.parse_args()
    speeds = [float(s) for s in args.speeds.split(",")]
    bench(args.log, speeds)
    if args.synthetic:
        with tempfile.TemporaryDirectory() as tmp:
            bench(synthetic(args.synthetic, Path(tmp) / "synthetic.log"), speeds)
    if args.long:
        long_runs([int(b) for b in args.long.split(",")], speeds[-1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
