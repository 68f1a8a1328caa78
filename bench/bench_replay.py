#!/usr/bin/env python3
"""Log replay speed: parse + fit + replay of a large vLLM 0.33 log.

    python bench/bench_replay.py [--requests 10000] [--step-ms 8]

Builds a workload (Poisson arrivals, shared prefixes, a pool small enough to preempt),
runs it through the scheduler, renders it as the log a 0.33 server writes (request lines
with prompts, stats lines every 10 s, access lines), then times `kvreplay.sources.replay_logs`
on it. Baseline measured in the same run: one plain simulation of the same workload with no
trace (the floor: a replay cannot be faster than one pass of the scheduler).
"""
from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path


def make_workload(n: int, seed: int = 0) -> dict:
    rng = random.Random(seed)
    reqs = []
    step = 0.0
    rate = 0.9  # arrivals per step: a queue builds, the pool fills, preemptions happen
    prefixes = [[rng.randrange(10, 30000) for _ in range(rng.randrange(32, 256))] for _ in range(8)]
    for i in range(n):
        step += rng.expovariate(rate)
        p = rng.choice(prefixes)[: rng.randrange(0, 200)]
        prompt = p + [rng.randrange(10, 30000) for _ in range(rng.randrange(16, 400))]
        reqs.append({"id": f"cmpl-bench-{i}-0", "arrival_step": int(step),
                     "prompt_token_ids": prompt, "max_tokens": rng.randrange(16, 256)})
    return {"name": "bench", "config": {"num_gpu_blocks": 1500, "block_size": 16,
            "max_num_seqs": 128, "max_num_batched_tokens": 4096, "max_model_len": 2048,
            "enable_prefix_caching": True, "max_steps": 10**7}, "requests": reqs}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=10000)
    ap.add_argument("--step-ms", type=float, default=8.0)
    args = ap.parse_args()
    from kvreplay.replay import Engine, parse_workload, simulate
    from kvreplay.replay.render import render_log
    from kvreplay.sources import replay_logs

    data = make_workload(args.requests)
    wl = parse_workload(data)
    t0 = time.perf_counter()
    e = Engine(wl)
    for _ in e.run():
        pass
    floor = time.perf_counter() - t0
    records, summary = simulate(wl)
    lines = render_log(wl, records, step_time_s=args.step_ms / 1000.0)
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "server.log"
        log.write_text("\n".join(lines) + "\n")
        t0 = time.perf_counter()
        rep = replay_logs([str(log)], year=2026)
        total = time.perf_counter() - t0
    print(f"log: {args.requests} requests, {len(lines):,} lines, {summary.num_steps:,} steps, "
          f"{summary.total_preemptions} preemptions")
    print(f"one scheduler pass (floor) : {floor:7.2f} s")
    print(f"parse + fit + replay       : {total:7.2f} s  ({total / floor:.1f}x the floor)")
    print(f"replayed preemptions       : {len(rep.preemptions)} (true {summary.total_preemptions})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
