#!/usr/bin/env python3
"""Peak memory of `kvreplay simulate` on a production-size workload.

    python -m bench.bench_simulate_memory [--requests 20000] [--no-trace]

Writes the heavy workload of tools/oracle/heavy_workload.py (20,000 requests on a 2,000-block pool,
about 30,000 steps, up to 128 running, thousands of preemptions) and runs, each in its own
process, `kvreplay simulate W --format summary` and `kvreplay simulate W -o /dev/null` (the
whole conformance trace, written as the engine runs). Baseline, in the same run: a process
that only loads and parses the workload. Prints each one's peak RSS, its ratio to the
baseline, and the memory per request above the baseline (flat: nothing per step is kept).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOAD = ("import sys; from kvreplay.replay.workload import load_workload, parse_workload; "
        "parse_workload(load_workload(sys.argv[1]))")
PEAK = ("import resource, subprocess, sys, time; t = time.perf_counter(); "
        "rc = subprocess.run(sys.argv[1:]).returncode; "
        "print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, rc)")


def peak(cmd: list[str]) -> tuple[float, int]:
    """(seconds, peak RSS in KiB) of one command, in a process of its own."""
    out = subprocess.run([sys.executable, "-c", PEAK, *cmd], capture_output=True, text=True,
                         check=True).stdout.split()
    if out[2] != "0":
        raise SystemExit(f"{' '.join(cmd)} exited {out[2]}")
    return float(out[0]), int(out[1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--no-trace", action="store_true", help="skip the -o run (the slow one)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        wl = os.path.join(d, "heavy.json")
        subprocess.run([sys.executable, "-m", "tools.oracle.heavy_workload", "-o", wl,
                        "--requests", str(args.requests)], check=True, capture_output=True, cwd=ROOT)
        summary = os.path.join(d, "summary.json")
        base_s, base_kb = peak([sys.executable, "-c", LOAD, wl])
        runs = [("simulate --format summary", [sys.executable, "-m", "kvreplay", "simulate", wl,
                                               "--format", "summary", "-o", summary])]
        if not args.no_trace:
            runs.append(("simulate -o TRACE (to /dev/null)",
                         [sys.executable, "-m", "kvreplay", "simulate", wl, "-o", os.devnull]))
        print(f"workload: {args.requests} requests (tools/oracle/heavy_workload.py)")
        print(f"baseline (load and parse the workload): {base_kb / 1024:.0f} MiB, {base_s:.1f} s")
        results = [(name, *peak(cmd)) for name, cmd in runs]
        s = json.load(open(summary))
        print(f"run: {s['num_steps']:,} steps, {s['total_preemptions']:,} preemptions")
        for name, sec, kb in results:
            per = (kb - base_kb) * 1024 / args.requests
            print(f"{name}: {kb / 1024:.0f} MiB peak ({kb / base_kb:.1f}x the baseline, "
                  f"{per / 1024:.1f} KiB per request above it), {sec:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
