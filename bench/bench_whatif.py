#!/usr/bin/env python3
"""What-if sweep speed: 5 settings of a 1,000-request log vs one plain replay of it.

    python bench/bench_whatif.py [--requests 1000] [--jobs 2]

Writes a 1,000-request vLLM 0.33 log with known answers (kvreplay.audit.synth: Poisson
arrivals at 15/s, prompts 200-1,200 tokens, outputs 50-400, 1,500 blocks of 16,
max_num_seqs 64: the pool runs full and preempts), fits the step-time model on it once
(`whatif.load`, timed and printed separately: it is the log replay, shared by every
setting), then times in the same run:

* baseline: one plain open-loop replay of the log's workload as logged;
* sweep: 5 settings (--max-num-seqs 16,32,128, --num-gpu-blocks 1000,3000), open loop,
  in `--jobs` processes (and once in one process).

Prints the wall times and the ratio sweep / baseline (5 sequential replays would be ~5x).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

from kvreplay.audit import whatif as W
from kvreplay.audit.synth import make_workload, render_log


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
        ctx = W.load([path])
        fit_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    from kvreplay.inference.runs import arrival_times

    base = W.drive(ctx.workload, ctx.profile, ctx.model,
                   arrivals=arrival_times(ctx.facts, *ctx.placement))
    baseline_s = time.perf_counter() - t0

    settings = W.plan({"max_num_seqs": [16, 32, 128], "num_gpu_blocks": [1000, 3000]})[1:]
    assert len(settings) == 5
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
    print(f"fit (log replay, once):        {fit_s:7.2f} s   {ctx.model.describe()}")
    print(f"baseline (one plain replay):   {baseline_s:7.2f} s   "
          f"{base.summary.total_preemptions} preemptions, {len(base.records)} steps")
    print(f"sweep, 5 settings, {args.jobs} jobs:    {sweep_s:7.2f} s   ratio {sweep_s / baseline_s:.2f}x baseline")
    print(f"sweep, 5 settings, 1 job:      {sweep1_s:7.2f} s   ratio {sweep1_s / baseline_s:.2f}x baseline")
    for r in res["rows"]:
        print(f"  {r['setting']:<24} preemptions {r.get('preemptions')!s:>4}  recompute "
              f"{(r.get('recompute_ratio') or 0):.3f}  out tok/s {r.get('output_tput')!s:>8}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
