#!/usr/bin/env python3
"""Speed of the uncertainty ensemble on a production-size stock log (no Iteration lines).

    python -m bench.bench_ensemble [--requests 600] [--samples 32] [--no-prompts]

Builds the Poisson workload of bench_iterations.py (600 requests over about 10,000 engine
steps, up to 256 running, a pool small enough to preempt), renders it as a stock vLLM
0.33 log (whole-second stamps, stats every 10 s, prompts in the JSON bodies unless
--no-prompts), and times the log replay with its default ensemble against the same
replay with the ensemble off (`samples=0`), both measured in this run: the ratio is what
the ensemble costs. Also prints the interval and whether it holds the true count.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from bench.bench_iterations import make_workload  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--samples", type=int, default=None, help="default: the product's")
    ap.add_argument("--no-prompts", action="store_true")
    args = ap.parse_args()
    from kvreplay.inference import replay_facts
    from kvreplay.replay import Engine, parse_workload, simulate
    from tools.oracle.render_log import render_log
    from kvreplay.sources import read_facts

    wl = parse_workload(make_workload(args.requests))
    records, summary = simulate(wl)
    lines = render_log(wl, records, step_time_s=0.012, start=1778148060.05,
                       stats_interval_s=10.0, stats_phase_s=0.37,
                       with_prompts=not args.no_prompts)
    peak = max(rec.num_running for rec in Engine(wl).run())
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "server.log"
        path.write_text("\n".join(lines) + "\n")
        t0 = time.perf_counter()
        base = replay_facts(read_facts([str(path)], year=2026), samples=0)
        t_base = time.perf_counter() - t0
        t0 = time.perf_counter()
        rep = replay_facts(read_facts([str(path)], year=2026), samples=args.samples)
        t_ens = time.perf_counter() - t0
    u = rep.uncertainty
    true = summary.total_preemptions
    print(f"workload: {args.requests} requests, {len(records)} steps, up to {peak} running, "
          f"{true} preemptions (prompts {'estimated' if args.no_prompts else 'logged'})")
    print(f"baseline (replay, no ensemble): {t_base:.2f} s")
    print(f"with the ensemble ({u.samples} samples): {t_ens:.2f} s  ratio {t_ens / t_base:.2f}x")
    c = u.preemptions
    print(f"count: replay {len(base.preemptions)}, ensemble median {c['median']}, 90% "
          f"{c['low']}-{c['high']}, holds the true {true}: {c['low'] <= true <= c['high']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
