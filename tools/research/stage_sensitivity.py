#!/usr/bin/env python3
"""Which arrivals decide a Poisson log's preemptions? (dev tool; reads a log case's
truth.json, which the product never does)

    python -m tools.research.stage_sensitivity tests/data/logcases/p1_poisson_fcfs_200 [--jitter 1 2 4]

Requests are grouped by *stage*: how many stats lines the log prints before their
"Received request" line. Then:

1. Hybrid replays: the true arrival steps for every request of stage < m, the replay's own
   placement for the rest. Prints, for each m, the preemptions matched (right victim within
   +-5 steps) and the stats lines matched exactly.
2. Jitter: the true arrivals, with only the requests of one stage moved by up to J steps
   (order kept). Prints the median and the range of matched preemptions over N draws.

On the published Poisson case: the true arrivals of the requests logged before the third
stats line (54 of 200) with the replay's placement for the rest give 54 of 54; one step of
jitter in one of the first two stages alone costs up to 8 (median 4); four steps in a later
stage cost none.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

from kvreplay.inference import replay_facts
from kvreplay.inference.clock import clocked
from kvreplay.inference.formats import log_format
from kvreplay.inference.lines import phase_estimate
from kvreplay.inference.rebuild import rebuild_workload
from kvreplay.inference.runs import step_replay
from kvreplay.inference.verify import verify
from kvreplay.sources import read_facts
from tools.research.matching import match_preemptions


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("case")
    ap.add_argument("--jitter", type=int, nargs="*", default=[1, 4])
    ap.add_argument("--draws", type=int, default=20)
    args = ap.parse_args()
    case = Path(args.case)
    truth = json.loads((case / "truth.json").read_text())
    facts = read_facts([str(case / "server.reqbody.log")], year=2026)
    rep = replay_facts(facts, support=0)
    fmt = log_format(facts.vllm_version, facts.engine_version)
    rebuilt = rebuild_workload(facts, fmt, rep.profile)
    by_log_id = {v["log_request_id"]: k for k, v in truth["requests"].items()}
    ids = [s.id for s in rep.workload.requests]
    true_arrival = [truth["requests"][by_log_id[i]]["arrival_step"] for i in ids]
    ours = list(rep.inputs.arrival_steps)
    stage = [r.stats_before for r in facts.requests]
    true = [(p["step"], p["victim"]) for p in truth["preemptions"]]
    phase = phase_estimate(facts) or 0.5

    def score(arrival: list[int]) -> tuple[int, int, int]:
        arrival = list(arrival)
        for i in range(1, len(arrival)):
            arrival[i] = max(arrival[i], arrival[i - 1])  # file order is arrival order
        run = step_replay(rebuilt, facts, rep.profile, arrival, rep.step_time_model)
        clocked(run, facts, fmt, phase)
        exact = verify(run, facts, fmt, phase, prompts_known=True).exact_lines or 0
        found = [(rec.step, by_log_id[p.victim]) for rec in run.steps for p in rec.preemptions]
        return len(match_preemptions(true, found)), len(found), exact

    stages = sorted(set(stage))
    print(f"{len(ids)} requests; per stage: " + ", ".join(
        f"{k}: {stage.count(k)}" for k in stages))
    print(f"true preemptions {len(true)}; stats lines {len(facts.stats)}")
    print("\n1. true arrivals for stages < m, the replay's placement for the rest")
    for m in stages + [stages[-1] + 1]:
        hybrid = [t if s < m else o for t, o, s in zip(true_arrival, ours, stage)]
        hit, found, exact = score(hybrid)
        print(f"  m={m:2d}: matched {hit}/{len(true)} (found {found}), exact lines {exact}")
    print("\n2. true arrivals, one stage moved by up to J steps")
    for j in args.jitter:
        for k in stages:
            rng = random.Random(k)
            members = [i for i, s in enumerate(stage) if s == k and i > 0]
            if not members:
                continue
            hits = []
            for _ in range(args.draws):
                arr = list(true_arrival)
                for i in members:
                    arr[i] = max(0, arr[i] + rng.randint(-j, j))
                hits.append(score(arr)[0])
            print(f"  J={j} stage {k}: matched median {statistics.median(hits)}, "
                  f"range {min(hits)}-{max(hits)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
