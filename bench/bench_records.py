#!/usr/bin/env python3
"""What a replay keeps per step: memory and time of the step records at production size.

    python -m bench.bench_records [--seqs 64 128 256]

For workloads whose running set reaches max_num_seqs (64, 128, 256: tools/oracle/heavy_workload.py
scaled up), the same engine run is made three ways, measured in the same process:

* floor: the engine with no record kept (the baseline of every ratio);
* StepRecords: what a `Replay` stores (what changed in each step, and a few counts);
* whole-state records: the conformance trace record of every step (every live request's
  num_computed_tokens, status and blocks; what the per-step record used to hold and what
  `kvreplay simulate -o` writes), kept in memory.

Memory is what stays allocated after the run (tracemalloc, in a run of its own); time is a
separate run without tracemalloc. Each line prints the ratio to the floor.
"""
from __future__ import annotations

import argparse
import gc
import sys
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from kvreplay.replay import Engine, get_profile, parse_workload  # noqa: E402
from kvreplay.replay.trace import conformance_record  # noqa: E402


def run(data: dict, mode: str, memory: bool) -> tuple[float, float, int, float]:
    """(seconds, MiB retained, steps, scheduled requests per step)."""
    eng = Engine(parse_workload(data), get_profile("0.33"))
    gc.collect()
    gc.disable()
    if memory:
        tracemalloc.start()
    keep: list = []
    t0 = time.perf_counter()
    while not eng.done:
        rec = eng.step()
        if mode == "records":
            keep.append(rec)
        elif mode == "whole":
            keep.append(conformance_record(eng, rec))
    dt = time.perf_counter() - t0
    retained = 0.0
    if memory:
        retained = tracemalloc.get_traced_memory()[0] / 2**20
        tracemalloc.stop()
    gc.enable()
    s = eng.summary
    return dt, retained, s.num_steps, s.request_steps / max(1, s.num_steps)


def main() -> int:
    from tools.oracle.heavy_workload import make

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqs", type=int, nargs="+", default=[64, 128, 256])
    args = ap.parse_args()
    print(f"{'max_num_seqs':>12} {'steps':>6} {'sched/step':>10}  {'kept':<20}"
          f"{'time s':>8} {'x floor':>8} {'MiB kept':>9} {'MiB over floor':>15}")
    for seqs in args.seqs:
        # the pool and the request count grow with the batch, so the running set reaches it
        n = {64: 3000, 128: 4000, 256: 6000}.get(seqs, 24 * seqs)
        data = make(seed=0, n_requests=n, rate=2.0 * seqs / 64,
                    num_gpu_blocks=2000 * seqs // 64, max_num_seqs=seqs)
        floor_t, _, steps, per = run(data, "none", False)
        _, floor_m, _, _ = run(data, "none", True)
        for mode, label in (("none", "nothing (floor)"), ("records", "StepRecords"),
                            ("whole", "whole-state records")):
            t = floor_t if mode == "none" else run(data, mode, False)[0]
            m = floor_m if mode == "none" else run(data, mode, True)[1]
            print(f"{seqs:>12} {steps:>6} {per:>10.0f}  {label:<20}{t:>8.2f} {t / floor_t:>8.2f} "
                  f"{m:>9.1f} {m - floor_m:>15.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
