#!/usr/bin/env python3
"""Rendered vLLM 0.33 logs with known truth, for scoring `kvreplay whatif` (dev tool).

    python -m tools.oracle.whatif_corpus --out /tmp/whatif_corpus [--n 20]
    $VLLM_PY tools/oracle/whatif_keys.py --jobs /tmp/whatif_corpus/jobs.json -o /tmp/whatif_corpus/keys.jsonl
    python -m tools.research.score_whatif /tmp/whatif_corpus/keys.jsonl
    python -m tools.oracle.render_step_trace --root /tmp/whatif_corpus   # + server.trace.log

Each log is made as p1_poisson_fcfs_200 was (../shared/logcases/README.md): 200 requests
(tools/calib_corpus.poisson_workload: prompts 100-2000 tokens, or shared 100-800-token
prefixes with prefix caching; outputs 50-500; priorities 0-4 under the priority policy;
Poisson arrivals over steps), run by our scheduler (== vLLM's step for step,
tests/conformance/test_oracle_bank.py), each step timed by the log cases' step-time formula (p1's
truth.json `step_time_model`, context = num_computed_tokens after scheduling), rendered
(tools/oracle/render_log.py) with prompts (`server.log`), with iteration lines as well
(`server.iter.log`) and without prompts (`server.noprompts.log`), stats lines every 2 s. truth.json has what tools/oracle/whatif_keys.py reads:
`step_time_model`, `step_start_sim_time`, `requests[id].arrival_sim_time` (the start of
the step the request entered at, less `arrival_lead_s` and 20 us per later request of
that step, as in p1). jobs.json asks for the sweeps: max-num-seqs, KV blocks, batched tokens.
Deterministic: the same --n gives the same files.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

from tools.oracle.calib_corpus import LOGCASES, START, poisson_workload  # noqa: E402

from kvreplay.replay import parse_workload, simulate  # noqa: E402
from tools.oracle.render_log import render_log, step_starts  # noqa: E402

SEQS = (8, 16, 24, 32, 48, 96)  # the max-num-seqs sweep (the log's own is 64)


def step_dt(m: dict):
    """The README's formula on a trace record; num_computed_tokens after scheduling (a
    request that finished in the step is gone from the record: its count before + chunk)."""
    prev: dict[str, int] = {}

    def dt(r: dict) -> float:
        nonlocal prev
        n = r.get("num_scheduled_tokens", 0)
        if n == 0:
            out = m["idle_iteration_s"]
        else:
            hits = r.get("prefix_hit_tokens", {})
            ctx = 0
            for rid, k in r["scheduled"]:
                after = r["num_computed_tokens"].get(rid)
                ctx += after if after is not None else prev.get(rid, hits.get(rid, 0)) + k
            out = (m["overhead_s"] + max(m["weight_read_s"], m["per_scheduled_token_s"] * n)
                   + m["per_context_token_s"] * ctx + m["per_scheduled_request_s"] * len(r["scheduled"]))
        prev = dict(r.get("num_computed_tokens", {}))
        return out
    return dt


FILES = (("server.log", False, True), ("server.iter.log", True, True),
         ("server.noprompts.log", False, False))  # (name, iteration lines, prompts)


def case_setup(i: int) -> tuple[str, dict, int, dict[str, float]]:
    """Case i: (name, workload dict, KV blocks, stats-line phase of each file in FILES)."""
    policy = "priority" if i % 3 == 1 else "fcfs"
    pc = i % 3 == 2
    rng = random.Random(2300 + i)
    blocks = rng.randrange(1500, 2201, 50)
    gap = round(rng.uniform(5.0, 8.0), 2)
    wl_d = poisson_workload(2300 + i, 200, policy, pc, False, blocks, gap, 64)
    name = f"w{i:02d}-{policy}-{'pc' if pc else 'nopc'}"
    wl_d["name"] = name
    phases = {fname: round(rng.uniform(0.05, 0.95), 2) for fname, _, _ in FILES}
    return name, wl_d, blocks, phases


def case_run(wl_d: dict, model: dict):
    """(workload, conformance records, each step's duration, each step's start and the
    last's end) of a case, timed by the log cases' formula (step_dt)."""
    wl = parse_workload(wl_d)
    recs, _ = simulate(wl)
    f = step_dt(model)  # stateful: called on the records in order
    dts = [f(r) for r in recs]
    return wl, recs, dts, step_starts(recs, lambda r: dts[r["step"]], START)


def make_case(out: str, i: int, model: dict) -> dict:
    name, wl_d, blocks, phases = case_setup(i)
    wl, recs, dts, starts = case_run(wl_d, model)
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    for fname, it, wp in FILES:
        lines = render_log(wl, recs, step_time_s=lambda r: dts[r["step"]], start=START,
                           stats_interval_s=2.0, stats_phase_s=phases[fname],
                           with_prompts=wp, iteration_lines=it)
        with open(os.path.join(d, fname), "w") as fh:
            fh.write("\n".join(lines) + "\n")
    reqs = {}
    for r in recs:
        arr = r.get("arrivals", ())
        for j, rid in enumerate(arr):
            reqs[rid] = {"arrival_step": r["step"], "arrival_sim_time": round(
                starts[r["step"]] - model["arrival_lead_s"] - 2e-5 * (len(arr) - 1 - j), 6)}
    truth = {"case": name, "step_time_model": model, "step_start_sim_time": [round(s, 6) for s in starts[:-1]],
             "requests": reqs, "num_steps": len(recs),
             "total_preemptions": sum(len(r.get("preempted", ())) for r in recs)}
    with open(os.path.join(d, "truth.json"), "w") as fh:
        json.dump(truth, fh)
    with open(os.path.join(d, "workload.json"), "w") as fh:
        json.dump(wl_d, fh)
    sets = [[""]] + [[f"max_num_seqs={s}"] for s in SEQS]
    sets += [[f"num_gpu_blocks={int(blocks * 0.75)}"], [f"num_gpu_blocks={int(blocks * 1.5)}"]]
    sets += [["max_num_batched_tokens=2048"], ["max_num_batched_tokens=4096"]]
    print(f"{name}: {len(recs)} steps, {truth['total_preemptions']} preemptions", flush=True)
    return {"case": name, "workload": os.path.join(d, "workload.json"),
            "truth": os.path.join(d, "truth.json"), "sets": sets, "dir": d}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/whatif_corpus")
    ap.add_argument("--n", type=int, default=20)
    args = ap.parse_args()
    model = json.load(open(os.path.join(LOGCASES, "p1_poisson_fcfs_200", "truth.json")))["step_time_model"]
    jobs = [make_case(args.out, i, model) for i in range(args.n)]
    with open(os.path.join(args.out, "jobs.json"), "w") as fh:
        json.dump(jobs, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
