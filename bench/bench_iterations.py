#!/usr/bin/env python3
"""Replay speed of a log written with --enable-logging-iteration-details.

    python -m bench.bench_iterations [--requests 600] [--no-prompts] [--repeat N]

Builds a Poisson workload of production size (600 requests over about 10,000 engine steps,
up to 256 running, a pool small enough to preempt), runs it through the scheduler,
renders it as the log a vLLM 0.33 server writes with Iteration lines (prompts in the JSON
bodies; stats every 10 s), and times `kvreplay.sources.replay_logs` on it: parse, the
step-by-step placement against every line, the final replay and its check. Baseline,
measured in the same run: one plain pass of the scheduler over the same workload (a
replay cannot be faster). Also: how many of the true preemptions the replay has at the
same step with the same victim, and whether every line matched. Times: wall and CPU
(process time) seconds, each the least of --repeat replays; with --no-prompts, the
ratio of the log without prompts to the same log with them.
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
    rate = 0.06  # arrivals per step: ~10,000 steps for 600 requests
    for i in range(n):
        step += rng.expovariate(rate)
        reqs.append({"id": f"cmpl-bench-{i}-0", "arrival_step": int(step),
                     "prompt_token_ids": [rng.randrange(10, 30000) for _ in range(rng.randrange(64, 1024))],
                     "max_tokens": rng.randrange(500, 3000)})
    return {"name": "bench-iterations", "config": {
        "num_gpu_blocks": 12000, "block_size": 16, "max_num_seqs": 256,
        "max_num_batched_tokens": 8192, "max_model_len": 4096, "enable_prefix_caching": False,
        "max_steps": 10**7}, "requests": reqs}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--no-prompts", action="store_true", help="also time the log without prompts")
    ap.add_argument("--repeat", type=int, default=1, help="time each replay N times (least)")
    args = ap.parse_args()
    from kvreplay.replay import Engine, parse_workload, simulate
    from tools.oracle.render_log import render_log
    from kvreplay.sources import replay_logs

    wl = parse_workload(make_workload(args.requests))
    t0 = time.perf_counter()
    e = Engine(wl)
    peak = 0
    for rec in e.run():
        peak = max(peak, rec.num_running)
    floor = time.perf_counter() - t0
    records, summary = simulate(wl)
    def numbered(steps) -> dict[int, int]:  # step -> N, as the Iteration lines number steps
        out, n = {}, 0
        for step, tokens in steps:
            out[step] = n
            n += 1 if tokens else 0
        return out

    tn = numbered((r["step"], r.get("num_scheduled_tokens", 0)) for r in records)
    true = {(tn[r["step"]], p["req"]) for r in records for p in r.get("preemptions", ())}
    print(f"workload: {args.requests} requests, {summary.num_steps:,} steps, up to {peak} running, "
          f"{summary.total_preemptions} preemptions")
    print(f"one scheduler pass (floor)   : {floor:7.2f} s")
    cpu_of: dict[bool, float] = {}
    for prompts in (True, False) if args.no_prompts else (True,):
        lines = render_log(wl, records, step_time_s=0.012, stats_interval_s=10.0,
                           iteration_lines=True, with_prompts=prompts)
        with tempfile.TemporaryDirectory() as tmp:
            log = Path(tmp) / "server.log"
            log.write_text("\n".join(lines) + "\n")
            total = cpu = float("inf")
            for _ in range(max(1, args.repeat)):
                t0, c0 = time.perf_counter(), time.process_time()
                rep = replay_logs([str(log)], year=2026)
                total = min(total, time.perf_counter() - t0)
                cpu = min(cpu, time.process_time() - c0)
        cpu_of[prompts] = cpu
        it = rep.verification.iterations
        on = numbered((r.step, r.num_scheduled_tokens) for r in rep.steps)
        same = len(true & {(on[p.step], p.victim) for p in rep.preemptions})
        label = "with prompts" if prompts else "without prompts"
        print(f"replay, {label:15s}: {total:7.2f} s, CPU {cpu:.2f} s  ({total / floor:.1f}x "
              f"the floor; {len(lines):,} lines); {it.matched:,} of {it.lines:,} "
              f"Iteration lines match; {same} of {len(true)} preemptions at the same step "
              "and victim")
        u = rep.uncertainty
        if u is not None:
            c = u.preemptions
            print(f"  the count's 90% interval ({u.samples} members): {c['low']}-{c['high']}, "
                  f"median {c['median']}; true {len(true)}")
    if len(cpu_of) == 2:
        print(f"without / with prompts, CPU: {cpu_of[False] / cpu_of[True]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
