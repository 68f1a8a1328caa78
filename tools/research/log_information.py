#!/usr/bin/env python3
"""How much does a 0.33 INFO log say about when each request arrived? (dev tool; reads a
log case's truth.json and workload.json, which the product never does)

    python -m tools.research.log_information tests/data/logcases/p1_poisson_fcfs_200 [--every K]

1. Windows: with vLLM's own trace and clock (a perfect replay), how wide is the range of
   steps each arrival could have entered at, given its second and the order of the
   access lines; and what does placing every arrival in the middle of its range give.
2. Invisible moves: move one arrival by +-1..3 steps (every K-th request), replay with the
   case's own step-time formula, and render the observable log (seconds, the order of
   arrival / access / stats lines, the stats values). Counts the moves whose log is
   identical to the unmoved one, and among those, the moves that change the preemptions
   (victim, or step by more than 5). A log determines the preemptions to the extent that
   no invisible move changes them.
"""
from __future__ import annotations

import argparse
import bisect
import json
import math
import sys
from pathlib import Path

from kvreplay.replay.engine import Engine
from tools.oracle.render_log import formula_step_time, step_starts
from kvreplay.replay.profile import get_profile
from kvreplay.replay.workload import RequestSpec, Workload, parse_workload
from tools.research.matching import match_preemptions


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("case")
    ap.add_argument("--every", type=int, default=1, help="move every K-th request only")
    ap.add_argument("--phase", type=float, default=0.7, help="stats lines' phase in the second")
    args = ap.parse_args()
    case = Path(args.case)
    truth = json.loads((case / "truth.json").read_text())
    wl = parse_workload(json.loads((case / "workload.json").read_text()))
    prof = get_profile(truth["vllm_version"])
    m = truth["step_time_model"]
    t0 = truth["step_start_sim_time"][0]
    specs = {s.id: s for s in wl.requests}

    def run(arrivals: list[int]) -> list[dict]:
        reqs = [RequestSpec(s.id, a, s.prompt_token_ids, s.max_tokens, s.priority)
                for s, a in zip(wl.requests, arrivals)]
        e = Engine(Workload(wl.name, wl.description, wl.config, reqs, max_steps=10**6), prof)
        out = []
        while not e.done:
            out.append(e.step(trace=True))
        return out

    def clock(recs: list[dict]) -> list[float]:
        return step_starts(recs, formula_step_time(m), t0)

    def observables(recs: list[dict], st: list[float]) -> list[tuple]:
        ev = []
        for r in recs:
            k = r["step"]
            for j, rid in enumerate(r.get("arrivals", ())):
                t = st[k] - 0.0005 + 2e-5 * j
                ev.append((t, 0, ("A", rid, math.floor(t))))
            for _ in r.get("finished", ()):
                ev.append((st[k + 1] + 0.0011, 1, ("F",)))
        n = len(recs)
        tick, seen, prev = math.floor(st[0]) + args.phase, set(), -1
        while tick <= st[n] + 4:
            k = min(bisect.bisect_right(st, tick) - 2, n - 1)
            win = recs[prev + 1:k + 1] if k >= 0 else []
            prev = max(prev, k)
            gen = sum(len(r["sampled"]) for r in win)
            prompt = 0
            for r in win:
                for rid in r["sampled"]:
                    if rid not in seen:
                        seen.add(rid)
                        prompt += len(specs[rid].prompt_token_ids)
            s = recs[k] if k >= 0 else None
            ev.append((tick, 2, ("S", prompt, gen, len(s["running"]) if s else 0,
                                 len(s["waiting"]) if s else 0,
                                 round(1000 * s["kv_usage"]) if s else 0)))
            tick += truth["stats_interval_s"]
        ev.sort(key=lambda x: (x[0], x[1]))
        return [e[2] for e in ev]

    def preemptions(recs: list[dict]) -> list[tuple[int, str]]:
        return [(r["step"], p if isinstance(p, str) else p[0]) for r in recs for p in r["preempted"]]

    def recall(ref, got, tol=5) -> int:
        return len(match_preemptions(ref, got, tol))

    true_arr = [s.arrival_step for s in wl.requests]
    recs0 = run(true_arr)
    st0 = clock(recs0)
    drift = max(abs(a - b) for a, b in zip(st0, truth["step_start_sim_time"]))
    print(f"steps {len(recs0)}; clock formula vs the case's clock: max {1000 * drift:.1f} ms")
    pre0 = preemptions(recs0)

    # 1. windows on the perfect replay (file order = arrival order of the log lines)
    fins = sorted(r["finish_step"] for r in truth["requests"].values())
    order = sorted(truth["requests"].values(), key=lambda r: (r["arrival_sim_time"]))
    lines = sorted([(r["arrival_sim_time"], 0, r) for r in order]
                   + [(st0[f + 1] + 0.0011, 1, None) for f in fins], key=lambda x: (x[0], x[1]))
    widths, mid, c = [], [], 0
    for _, kind, r in lines:
        if kind == 1:
            c += 1
            continue
        lo = fins[c - 1] + 2 if c > 0 else 0
        hi = fins[c] + 1 if c < len(fins) else len(recs0)
        sec = math.floor(r["arrival_sim_time"])
        lo = max(lo, bisect.bisect_left(st0, sec + 0.0005))
        hi = min(hi, bisect.bisect_left(st0, sec + 1.0005))
        widths.append(max(0, hi - lo) + 1)
        mid.append((lo + hi) // 2)
    arr = {}
    prev = 0
    for m_a, r in zip(mid, [x[2] for x in lines if x[1] == 0]):
        arr[r["log_request_id"]] = max(prev, m_a)
        prev = arr[r["log_request_id"]]
    mid_arr = [arr[truth["requests"][s.id]["log_request_id"]] if s.id in truth["requests"]
               else 0 for s in wl.requests]
    if mid_arr:
        mid_arr[0] = 0
    hits = recall(pre0, preemptions(run(mid_arr)))
    print(f"1. windows on the perfect replay: mean {sum(widths) / len(widths):.1f} steps, "
          f"median {sorted(widths)[len(widths) // 2]}; middle of each window: "
          f"{hits}/{len(pre0)} preemptions (right victim, +-5 steps)")

    # 2. invisible moves
    obs0 = observables(recs0, st0)
    tried = same = changed = 0
    for i in range(1, len(true_arr), args.every):
        for d in (-3, -2, -1, 1, 2, 3):
            a = list(true_arr)
            a[i] += d
            if a[i] < a[i - 1] or (i + 1 < len(a) and a[i] > a[i + 1]):
                continue
            tried += 1
            recs = run(a)
            if observables(recs, clock(recs)) != obs0:
                continue
            same += 1
            got = preemptions(recs)
            if recall(pre0, got) < len(pre0) or len(got) != len(pre0):
                changed += 1
        print(f"\r2. moves tried {tried}, log identical {same}, of those preemptions changed "
              f"{changed}", end="", file=sys.stderr)
    print(f"\n2. single moves of one arrival by 1-3 steps: {tried} tried, {same} give the "
          f"identical log, {changed} of those change the preemptions")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
