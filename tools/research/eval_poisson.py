#!/usr/bin/env python3
"""Poisson-arrival logs rendered from a workload (dev tool): score the log replay and the
calibration of each preemption's `probability` (the uncertainty ensemble).

    python -m tools.research.eval_poisson WORKLOAD.json [--seeds 0 1 2] [--step-ms 12] [--stats-s 2]

For each seed, the workload's arrivals are redrawn as a Poisson process over steps with the
workload's own mean gap, the run is simulated (our scheduler == vLLM's, tests/test_oracle_bank),
rendered as a 0.33 log (tools/oracle/render_log.py: whole-second time stamps, stats lines every
--stats-s), replayed from the log alone, and compared with the simulation: preemptions found
(right victim, +-5 steps), and how often a preemption with a given probability (to 0.1), or a given
confidence, is a true one.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import random
import tempfile

from kvreplay.replay import parse_workload, simulate
from kvreplay.inference import replay_facts
from tools.oracle.render_log import formula_step_time, render_log
from kvreplay.sources import read_facts
from tools.research.matching import match_preemptions


def mean_gap(wl) -> float:
    """The workload's mean gap between arrivals, in steps."""
    steps = [s.arrival_step for s in wl.requests]
    return max(1e-9, (max(steps) - min(steps)) / max(1, len(steps) - 1))


def poisson_redraw(wl0, rng: random.Random, gap: float):
    """The workload with its arrivals redrawn as a Poisson process over steps (mean `gap`),
    drawn from `rng` (which the caller may draw on from after)."""
    t = 0.0
    specs = []
    for s in wl0.requests:
        specs.append(dataclasses.replace(s, arrival_step=int(t)))
        t += rng.expovariate(1.0 / gap)
    return dataclasses.replace(wl0, requests=specs)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("workload")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--step-ms", type=float, default=12.0)
    ap.add_argument("--stats-s", type=float, default=2.0)
    ap.add_argument("--clock-from", metavar="TRUTH.json",
                    help="step times from a log case's step-time formula (fixed cost, weight "
                         "read vs per-token cost, per context token, per request) instead of "
                         "a fixed --step-ms")
    ap.add_argument("--original", action="store_true",
                    help="keep the workload's own arrival steps (one run, no redraw)")
    ap.add_argument("--no-prompts", action="store_true",
                    help="render without the JSON-body lines (server.log): score the count interval")
    ap.add_argument("--phase", type=float, default=0.37, help="stats lines' phase in the second")
    args = ap.parse_args()
    wl0 = parse_workload(json.load(open(args.workload)))
    gap = mean_gap(wl0)
    calib: dict[float, list[int]] = collections.defaultdict(lambda: [0, 0])
    conf: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    tot_true = tot_hit = tot_found = 0
    for seed in ([None] if args.original else args.seeds):
        wl = wl0
        if seed is not None:
            wl = poisson_redraw(wl0, random.Random(seed), gap)
        recs, summ = simulate(wl)
        true = [(r["step"], p) for r in recs for p in r.get("preempted", ())]
        step_time = args.step_ms / 1000.0
        if args.clock_from:
            step_time = formula_step_time(json.load(open(args.clock_from))["step_time_model"])
        lines = render_log(wl, recs, step_time_s=step_time, start=1778148060.05,
                           stats_interval_s=args.stats_s, stats_phase_s=args.phase,
                           with_prompts=not args.no_prompts)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "server.log")
            with open(path, "w") as f:
                f.write("\n".join(lines) + "\n")
            facts = read_facts([path], year=2026)
            facts = dataclasses.replace(facts, interval_s=args.stats_s)
            rep = replay_facts(facts)
        found = [(q.step, q.victim) for q in rep.preemptions]
        used = match_preemptions(true, found)
        hit = len(used)
        hit15 = len(match_preemptions(true, found, 15))
        # a replay that fails usually has (nearly) every arrival off by the same few steps:
        # the victims are right, their steps shifted
        offsets = sorted(a - s.arrival_step for a, s in zip(rep.inputs.arrival_steps, wl.requests))
        median_offset = offsets[len(offsets) // 2]
        for j, q in enumerate(rep.preemptions):
            conf[q.confidence][0] += j in used
            conf[q.confidence][1] += 1
            if q.probability is not None:
                b = round(q.probability, 1)
                calib[b][0] += j in used
                calib[b][1] += 1
        tot_true += len(true)
        tot_hit += hit
        tot_found += len(rep.preemptions)
        est = rep.uncertainty.preemptions if rep.uncertainty is not None else None
        print(f"seed {seed}: pattern {rep.info.arrival_pattern}, true {len(true)}, found "
              f"{len(rep.preemptions)}, matched {hit} (within 15 steps {hit15}), median "
              f"arrival offset {median_offset:+d} steps, exact stats lines "
              f"{rep.verification.exact_lines}/{rep.verification.stats_lines}"
              + (f", interval {est['low']}-{est['high']}" if est else ""),
              flush=True)
    print(f"TOTAL true {tot_true} found {tot_found} matched {tot_hit} "
          f"({tot_hit / max(1, tot_true):.0%})")
    for sup in sorted(calib):
        ok, n = calib[sup]
        print(f"  probability {sup:.1f}: {ok}/{n} true")
    for c in sorted(conf):
        ok, n = conf[c]
        print(f"  confidence {c}: {ok}/{n} true")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
