#!/usr/bin/env python3
"""What-if sweep speed: 5 settings of a 1,000-request log vs one plain run of it.

    python -m bench.bench_whatif [--requests 1000] [--jobs 2]

Writes a 1,000-request vLLM 0.33 log with known answers (tools.oracle.synth_log: Poisson
arrivals at 15/s, prompts 200-1,200 tokens, outputs 50-400, 1,500 blocks of 16,
max_num_seqs 64: the pool runs full and preempts), fits the step-time model on it once
(`whatif.load`, timed and printed separately: it is the log replay, shared by every
setting), then times in the same run:

* baseline: one open-loop run of the log's workload as logged;
* sweep: 5 settings (--max-num-seqs 16,32,128, --num-gpu-blocks 1000,3000), open loop,
  without intervals (--draws 0 --samples 0) and with them (each row re-run under the
  drawn step-time models and ensemble members: ~10 runs a row), in `--jobs` processes
  (and once in one process).

Prints the wall times and the ratio sweep / baseline (5 sequential runs would be ~5x).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

from kvreplay.audit import whatif_replays as W
from tools.oracle.synth_log import make_workload, render_log


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args(argv)

    wl, arr = make_workload(args.requests, seed=1, rate=15, num_gpu_blocks=1500, max_num_seqs=64)
    text, run = render_log(wl, arr, interval_s=10.0)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "server.log")
        with open(path, "w") as f:
            f.write(text)
        t0 = time.perf_counter()
        ctx0 = W.load([path], draws=0, samples=0)
        fit0_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        ctx = W.load([path])
        fit_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    base = W.drive(ctx.workload, ctx.profile, ctx.model, arrivals=W.timed_arrivals(ctx, ctx.model))
    baseline_s = time.perf_counter() - t0

    settings = W.plan({"max_num_seqs": [16, 32, 128], "num_gpu_blocks": [1000, 3000]})[1:]
    assert len(settings) == 5
    t0 = time.perf_counter()
    res0 = W.sweep(ctx0, settings, jobs=args.jobs)
    sweep0_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    res = W.sweep(ctx, settings, jobs=args.jobs)
    sweep_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    res1 = W.sweep(ctx, settings, jobs=1)
    sweep1_s = time.perf_counter() - t0
    assert res1["rows"] == res["rows"]

    print(f"log: {args.requests} requests, {len(run.records)} steps simulated, "
          f"{run.truth['preemptions']} preemptions (truth), recompute ratio "
          f"{run.truth['recompute_ratio']:.3f}")
    print(f"load, no intervals (--draws 0 --samples 0): {fit0_s:7.2f} s")
    print(f"load, with intervals (ensemble):            {fit_s:7.2f} s   {ctx.model.describe()} ({ctx.fit_text})")
    print(f"baseline (one open-loop run as logged):     {baseline_s:7.2f} s   "
          f"{base['preemptions']} preemptions, {base['steps']} steps")
    print(f"sweep, 5 settings, no intervals, {args.jobs} jobs:  {sweep0_s:7.2f} s   ratio {sweep0_s / baseline_s:.2f}x baseline")
    print(f"sweep, 5 settings, intervals, {args.jobs} jobs:     {sweep_s:7.2f} s   ratio {sweep_s / baseline_s:.2f}x baseline")
    print(f"sweep, 5 settings, intervals, 1 job:        {sweep1_s:7.2f} s   ratio {sweep1_s / baseline_s:.2f}x baseline")
    for r0, r in zip(res0["rows"], res["rows"]):
        print(f"  {r['setting']:<24} preemptions {r.get('preemptions')!s:>4} ({r.get('preemptions_range')})"
              f"  out tok/s {r.get('output_tput')!s:>8} ({r.get('output_tput_range')})"
              f"  [no intervals: {r0.get('preemptions')}, {r0.get('output_tput')}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
