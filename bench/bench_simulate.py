#!/usr/bin/env python3
"""Simulation speed: kvreplay's scheduler model vs vLLM's own schedule()+update loop.

    python -m bench.bench_simulate [--requests 2000] [--repeat 3] [--no-oracle]

Builds the heavy workload of tools/oracle/heavy_workload.py (2,000 requests, 2,000 blocks of 16,
prefix caching on, max_num_seqs 64), runs it through kvreplay without writing a trace, and
prints request-steps per second (sum over steps of the requests scheduled). When vLLM's
oracle venv is installed (tools/oracle/oracle.py install 0.33) the same workload is timed through
vLLM 0.33's Scheduler in the same run and the ratio is printed; otherwise the baseline is
a plain Python loop doing the minimum per request-step (a dict update), measured here.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from kvreplay.replay import Engine, get_profile, parse_workload  # noqa: E402


def run_kvreplay(data: dict, repeat: int) -> dict:
    best = None
    for _ in range(repeat):
        engine = Engine(parse_workload(data), get_profile("0.33"))
        t0 = time.perf_counter()
        for _ in engine.run():
            pass
        dt = time.perf_counter() - t0
        s = engine.summary
        if best is None or dt < best["total_s"]:
            best = {"total_s": dt, "request_steps": s.request_steps, "steps": s.num_steps,
                    "preemptions": s.total_preemptions, "completed": s.completed,
                    "prefix_hit_tokens": s.total_prefix_hit_tokens}
    best["request_steps_per_s"] = best["request_steps"] / best["total_s"]
    return best


def memory_per_request(make, sizes: tuple[int, ...]) -> list[tuple[int, float]]:
    out = []
    for n in sizes:
        data = make(seed=1, n_requests=n)
        tracemalloc.start()
        engine = Engine(parse_workload(data), get_profile("0.33"))
        for _ in engine.run():
            pass
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        out.append((n, peak / 2**20))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-oracle", action="store_true")
    ap.add_argument("--memory", action="store_true", help="also measure peak memory vs requests")
    args = ap.parse_args()
    from tools.oracle.heavy_workload import make

    data = make(seed=0, n_requests=args.requests)
    ours = run_kvreplay(data, args.repeat)
    print(f"workload: {args.requests} requests, {ours['steps']} steps, "
          f"{ours['preemptions']} preemptions, {ours['prefix_hit_tokens']} prefix-hit tokens")
    print(f"kvreplay      : {ours['request_steps_per_s']:>12,.0f} request-steps/s "
          f"({ours['request_steps']:,} in {ours['total_s']:.2f} s)")
    baseline = None
    if not args.no_oracle:
        try:
            from tools.oracle import oracle
            from tools.oracle.oracle_bench import bench_oracle

            if oracle.oracle_available("0.33"):
                with tempfile.TemporaryDirectory() as tmp:
                    path = Path(tmp) / "heavy.json"
                    path.write_text(json.dumps(data))
                    baseline = bench_oracle(path, release="0.33", repeat=args.repeat)
        except Exception as exc:  # the oracle is a dev tool; the bench still runs without
            print(f"(vLLM oracle not used: {exc})")
    if baseline is not None:
        assert baseline["request_steps"] == ours["request_steps"], "runs disagree"
        ratio = ours["request_steps_per_s"] / baseline["request_steps_per_s"]
        print(f"vLLM 0.33     : {baseline['request_steps_per_s']:>12,.0f} request-steps/s "
              f"(schedule() + update_from_output() only, {baseline['total_s']:.2f} s)")
        print(f"ratio         : {ratio:.1f}x vLLM's own scheduler loop (target >= 5x)")
    else:
        t0 = time.perf_counter()
        d: dict[int, int] = {}
        for i in range(ours["request_steps"]):
            d[i & 1023] = i
        floor = ours["request_steps"] / (time.perf_counter() - t0)
        print(f"python floor  : {floor:>12,.0f} dict updates/s")
        print(f"ratio         : {ours['request_steps_per_s'] / floor:.3f}x of a bare dict-update loop")
    if args.memory:
        for n, mib in memory_per_request(make, (500, 1000, 2000)):
            print(f"memory        : {n:>5} requests -> peak {mib:6.1f} MiB ({mib * 1024 / n:.1f} KiB/request)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
