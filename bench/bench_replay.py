#!/usr/bin/env python3
"""Log replay at production size: parse + facts + fit + replay of a large vLLM 0.33 log.

    python -m bench.bench_replay [--requests 10000 100000] [--iterations] [--step-ms 8]

For each size, builds a workload (Poisson arrivals at 0.9 a step, shared prefixes, 128
seqs on a 1,500-block pool that preempts), runs it through the scheduler, renders the log
a 0.33 server writes (request lines with prompts, stats lines every 10 s, access lines;
with --iterations also the `Iteration(N)` line of every step), then runs
`kvreplay replay LOG --format summary` on it as a separate process: wall time and peak RSS
(`/usr/bin/time`-style, from the child's rusage). Baseline measured in the same run: one
plain scheduler pass over the same workload (the floor: a replay cannot be faster than one
pass of the scheduler). The last lines give the growth from the first size to the last,
against linear.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator


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


def slim_trace(engine: Any) -> Iterator[dict[str, Any]]:
    """The trace records render_log reads, without the whole-state maps of every step
    (a 100k-request trace in full is tens of GB): counts stand in for the queues, and the
    per-request maps keep the scheduled requests (computed tokens) and the live ones with
    an output (output tokens; every other live request has none)."""
    from kvreplay.replay.trace import conformance_head

    for rec in engine.run():
        r = conformance_head(engine, rec)
        sched = engine.scheduler
        live = sched.requests
        r["num_computed_tokens"] = {rid: live[rid].num_computed_tokens
                                    for rid, _ in r.get("scheduled", ()) if rid in live}
        r["num_output_tokens"] = {rid: q.num_output_tokens for rid, q in live.items()
                                  if q.num_output_tokens}
        r["running"] = range(len(sched.running))
        r["waiting"] = range(len(sched.waiting))
        r["free_blocks"] = sched.pool.get_num_free_blocks()
        r["kv_usage"] = round(sched.kv_cache_usage, 6)
        yield r


def render(n: int, iterations: bool, step_ms: float, path: Path) -> tuple[float, int, int]:
    """Write the log; (one scheduler pass in s, steps, preemptions)."""
    from kvreplay.replay import Engine, parse_workload
    from tools.oracle.render_log import render_log

    wl = parse_workload(make_workload(n))
    t0 = time.perf_counter()
    e = Engine(wl)
    for _ in e.run():
        pass
    floor = time.perf_counter() - t0
    eng = Engine(wl)
    records = list(slim_trace(eng))
    lines = render_log(wl, records, step_time_s=step_ms / 1000.0, iteration_lines=iterations)
    with path.open("w") as f:
        for line in lines:
            f.write(line)
            f.write("\n")
    return floor, eng.summary.num_steps, eng.summary.total_preemptions


def replay(path: Path) -> tuple[float, float, dict]:
    """`kvreplay replay PATH --format json` in a child: (seconds, peak RSS GiB, summary)."""
    exe = [sys.executable, "-m", "kvreplay"]
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # the child: its own rusage, nothing of this process's heap
        out = os.open(str(path) + ".json", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(out, 1)
        os.execv(sys.executable, exe + ["replay", str(path), "--format", "json", "--year", "2026"])
    _, status, usage = os.wait4(pid, 0)
    dt = time.perf_counter() - t0
    if status != 0:
        raise SystemExit(f"kvreplay replay failed on {path} (status {status})")
    summary = json.loads(Path(str(path) + ".json").read_text()).get("summary", {})
    return dt, usage.ru_maxrss / 2**20, summary


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, nargs="+", default=[10000, 100000])
    ap.add_argument("--iterations", action="store_true", help="also write Iteration lines")
    ap.add_argument("--step-ms", type=float, default=8.0)
    args = ap.parse_args()
    rows = []
    print(f"{'requests':>9} {'lines':>10} {'steps':>8} {'preempt':>8} {'floor s':>8} "
          f"{'replay s':>9} {'x floor':>8} {'peak GiB':>9} {'replayed':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.requests:
            log = Path(tmp) / f"server.{n}.log"
            floor, steps, pre = render(n, args.iterations, args.step_ms, log)
            nlines = sum(1 for _ in log.open())
            dt, gib, summary = replay(log)
            rows.append((n, dt, gib))
            print(f"{n:>9} {nlines:>10,} {steps:>8,} {pre:>8,} {floor:>8.2f} {dt:>9.2f} "
                  f"{dt / floor:>8.1f} {gib:>9.2f} {summary.get('preemptions', '?'):>9}",
                  flush=True)
            log.unlink()
    if len(rows) > 1:
        (n0, t0, m0), (n1, t1, m1) = rows[0], rows[-1]
        print(f"growth {n0:,} -> {n1:,} requests ({n1 / n0:.0f}x): time {t1 / t0:.1f}x, "
              f"peak memory {m1 / m0:.1f}x (linear: {n1 / n0:.0f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
