#!/usr/bin/env python3
"""`kvreplay export` on a 10k-step, 200-request replay.

    python -m bench.bench_export [--requests 200] [--repeat 3]

Builds a workload of 200 requests (prompts 300-1,500 tokens, outputs 150-900, arriving over
the first ~5,000 steps) on an 896-block pool with chunked prefill (512-token budget), so
requests are preempted and recomputed, and replays it (about 10,000 steps). Then times,
best of --repeat:
- baseline: `Replay.rerun()` over every step, the checked re-run the export rides on;
- build: `export.build_trace` (the re-run plus the tracks, slices, counters);
- write: the Perfetto protobuf (perfetto package) and the Chrome JSON from that trace;
and prints each with its ratio to the baseline, the file sizes, and the trace's counts.
"""
from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

from kvreplay.export import build_trace, write_trace
from kvreplay.replay.result import replay_workload


def make(n: int, seed: int = 0) -> dict:
    rng = random.Random(seed)
    reqs = []
    for i in range(n):
        plen = rng.randrange(300, 1500)
        reqs.append({"id": f"r{i:03d}", "arrival_step": int(i * 25 + rng.random() * 20),
                     "prompt_token_ids": [rng.randrange(10, 30000) for _ in range(plen)],
                     "max_tokens": rng.randrange(150, 900)})
    return {"name": "export_bench", "description": "200 requests, chunked prefill, preemptions",
            "config": {"num_gpu_blocks": 896, "block_size": 16, "max_num_seqs": 24,
                       "max_num_batched_tokens": 512, "max_model_len": 2560,
                       "enable_chunked_prefill": True, "max_steps": 1_000_000},
            "requests": reqs}


def best(fn, repeat: int) -> tuple[float, object]:
    out, times = None, []
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    t0 = time.perf_counter()
    rep = replay_workload(make(a.requests))
    t_replay = time.perf_counter() - t0
    print(f"replay: {a.requests} requests, {rep.num_steps:,} steps, "
          f"{len(rep.preemptions)} preemptions ({t_replay:.2f} s)")
    t_base, _ = best(lambda: sum(1 for _ in rep.rerun()), a.repeat)
    t_build, trace = best(lambda: build_trace(rep), a.repeat)
    samples = sum(len(c.ts) for c in trace.counters)
    print(f"trace: {len(trace.tracks)} tracks, {len(trace.slices):,} slices, "
          f"{len(trace.instants):,} instants, {samples:,} counter samples")
    print(f"baseline  Replay.rerun(), every step: {t_base:6.2f} s  1.00x")
    print(f"build     export.build_trace:         {t_build:6.2f} s  {t_build / t_base:.2f}x")
    with tempfile.TemporaryDirectory() as d:
        for fmt, ext in (("perfetto", ".pftrace"), ("chrome", ".json")):
            path = Path(d) / f"t{ext}"
            t_w, size = best(lambda: write_trace(trace, path, fmt), a.repeat)
            total = t_build + t_w
            print(f"write     {fmt:<8}                    {t_w:6.2f} s  {t_w / t_base:.2f}x; "
                  f"export total {total:.2f} s ({total / t_base:.2f}x), "
                  f"{size / 2**20:.2f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
