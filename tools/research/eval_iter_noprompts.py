#!/usr/bin/env python3
"""Score the Iteration-line replay of logs WITHOUT prompt bodies (dev tool).

    python -m tools.research.eval_iter_noprompts [--out /tmp/iternp] [--only logcases|renders]
        [--cases NAME,...] [--samples N] [--repeat N] [--seed-base 2900]

Two sets of inputs, each replayed twice, without and with prompt bodies (the same run):

* logcases: tests/data/logcases/*/, `server.iter.log` (no
  prompts) against `server.iter.reqbody.log`; truth.json has every preemption;
* renders (written to --out once, deterministic): 200-request workloads run by our
  scheduler (step-exact against vLLM 0.33, tests/test_oracle_bank.py), timed by the log
  cases' step-time formula (whatif_corpus.step_dt), rendered with Iteration lines
  (tools/oracle/render_log.py), once with prompt bodies and once without: FCFS and priority policy,
  prefix caching off and on, Poisson arrivals (mean gap 5-8 steps) and on-off bursts
  (8-30 requests sent together, idle gaps of 40-200 steps between bursts).

Per log, one JSON line: true and found preemptions, victims named at their step +-5
(matching.match_preemptions), the count's 90% interval if any and whether it holds the
true count, Iteration lines matched, and the time of both replays: wall and CPU seconds
(process time), each the least of --repeat runs, after one replay that loads the modules
(ratio = without / with prompts). The last line sums them up: victims at their step, the
intervals that hold and their mean width (x the true count), the rows with p >= 0.8 and
p < 0.2 and how many are right, the CPU ratios, and [right, all] per probability bin
(< 0.2, 0.2-0.5, 0.5-0.8, >= 0.8) for the rows and for the requests' `p_preempted`
(requests_no_member: [truly preempted, all] of those no member preempts).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

from tools.oracle.calib_corpus import START, poisson_workload
from tools.oracle.whatif_corpus import case_run
from tools.research.matching import match_preemptions

HERE = os.path.dirname(os.path.abspath(__file__))

from tools.oracle.render_log import render_log  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(HERE))
LOGCASES = os.path.join(ROOT, "tests", "data", "logcases")


def bursty(wl: dict, rng: random.Random) -> dict:
    """The workload's requests sent in on-off bursts: 8-30 at one step, then an idle gap of
    40-200 steps (the engine runs dry between some of them)."""
    t, i, reqs = 0, 0, wl["requests"]
    while i < len(reqs):
        k = rng.randrange(8, 31)
        for r in reqs[i:i + k]:
            r["arrival_step"] = t
        i += k
        t += rng.randrange(40, 201)
    wl["description"] = "on-off bursts"
    return wl


def render_cases(out: str, model: dict, seed_base: int = 2900) -> list[dict]:
    """The rendered set: (policy x prefix caching x arrivals), one seed each (seed_base +
    0..7; 2900: the set the constants were chosen on, another base: a held-out set)."""
    rows = []
    c = 0
    for policy in ("fcfs", "priority"):
        for pc in (False, True):
            for arrivals in ("poisson", "bursty"):
                seed = seed_base + c
                c += 1
                rng = random.Random(seed)
                blocks = rng.randrange(1500, 2201, 50)
                gap = round(rng.uniform(5.0, 8.0), 2)
                wl_d = poisson_workload(seed, 200, policy, pc, False, blocks, gap, 64)
                if arrivals == "bursty":
                    wl_d = bursty(wl_d, rng)
                name = (f"r{c:02d}-{policy}-{'pc' if pc else 'nopc'}-{arrivals}"
                        + ("" if seed_base == 2900 else f"-s{seed_base}"))
                d = os.path.join(out, name)
                truth_p = os.path.join(d, "truth.json")
                if not os.path.exists(truth_p):
                    wl_d["name"] = name
                    wl, recs, dts, _ = case_run(wl_d, model)
                    os.makedirs(d, exist_ok=True)
                    for fname, wp in (("server.iter.log", False), ("server.iter.reqbody.log", True)):
                        lines = render_log(wl, recs, step_time_s=lambda r: dts[r["step"]],
                                           start=START, stats_interval_s=10.0,
                                           stats_phase_s=round(rng.uniform(0.05, 0.95), 2),
                                           with_prompts=wp, iteration_lines=True)
                        with open(os.path.join(d, fname), "w") as fh:
                            fh.write("\n".join(lines) + "\n")
                    pre = [{"step": r["step"], "victim_log_id": p["req"]}
                           for r in recs for p in r.get("preemptions", ())]
                    with open(truth_p, "w") as fh:
                        json.dump({"case": name, "num_steps": len(recs), "preemptions": pre}, fh)
                rows.append({"name": name, "dir": d})
    return rows


def replay_once(path: str, samples: int | None, repeat: int = 1) -> tuple[object, float, float]:
    """The replay, and the least wall and CPU seconds of `repeat` runs."""
    from kvreplay.sources import replay_logs
    kw = {} if samples is None else {"samples": samples}
    wall = cpu = float("inf")
    for _ in range(max(1, repeat)):
        t0, c0 = time.perf_counter(), time.process_time()
        rep = replay_logs([path], **kw)
        wall = min(wall, time.perf_counter() - t0)
        cpu = min(cpu, time.process_time() - c0)
    return rep, wall, cpu


def score(name: str, d: str, samples: int | None, repeat: int = 1) -> dict:
    truth = json.load(open(os.path.join(d, "truth.json")))
    true = [(p["step"], p["victim_log_id"]) for p in truth["preemptions"]]
    rep, dt, cpu = replay_once(os.path.join(d, "server.iter.log"), samples, repeat)
    rep_p, dt_p, cpu_p = replay_once(os.path.join(d, "server.iter.reqbody.log"), samples, repeat)
    found = [(p.step, p.victim) for p in rep.preemptions]
    hits = match_preemptions(true, found)
    it = rep.verification.iterations
    row = {"case": name, "true": len(true), "found": len(found), "at_step_5": len(hits),
           "share": round(len(hits) / len(true), 3) if true else 1.0,
           "lines_matched": f"{it.matched}/{it.lines}" if it else "None/None",
           "confidence": rep.confidence,
           "s_noprompts": round(dt, 2), "s_prompts": round(dt_p, 2),
           "ratio": round(dt / max(dt_p, 1e-9), 2),
           "cpu_noprompts": round(cpu, 3), "cpu_prompts": round(cpu_p, 3),
           "cpu_ratio": round(cpu / max(cpu_p, 1e-9), 2),
           "with_prompts_exact": len(match_preemptions(true, [(p.step, p.victim) for p in rep_p.preemptions], 0)) == len(true) == len(rep_p.preemptions)}
    u = rep.uncertainty
    if u is not None:
        c = u.preemptions
        row["interval"] = [c["low"], c["median"], c["high"]]
        row["holds"] = c["low"] <= len(true) <= c["high"]
        labelled = [(p.probability or 0.0, j in hits) for j, p in enumerate(rep.preemptions)]
        row["p>=0.8 right"] = f"{sum(ok for q, ok in labelled if q >= 0.8)}/{sum(q >= 0.8 for q, _ in labelled)}"
        row["p<0.2 right"] = f"{sum(ok for q, ok in labelled if q < 0.2)}/{sum(q < 0.2 for q, _ in labelled)}"
        row["width"] = round((c["high"] - c["low"]) / max(1, len(true)), 3)
        # how often a probability is right, per bin: rows (the victim within 5 steps of
        # the row's step) and requests (`p_preempted`: preempted at least once)
        victims = {v for _, v in true}
        row["rows_by_p"] = _bins((q, ok) for q, ok in labelled)
        row["requests_by_p"] = _bins((r["p_preempted"], r["id"] in victims) for r in u.requests)
        named = {r["id"] for r in u.requests}
        row["requests_no_member"] = [len(victims - named), rep.info.requests - len(named)]
    labels: dict[str, list[int]] = {}
    for j, p in enumerate(rep.preemptions):
        lab = labels.setdefault(p.confidence or "?", [0, 0])
        lab[0] += j in hits
        lab[1] += 1
    row["labels_right"] = {k: f"{a}/{b}" for k, (a, b) in sorted(labels.items())}
    row["notes"] = [n for n in rep.notes if "priorit" in n or "prompt lengths" in n or "estimated" in n]
    return row


BINS = (0.0, 0.2, 0.5, 0.8)


def _bins(pairs) -> list[list[int]]:
    """[right, all] per probability bin (BINS: < 0.2, 0.2-0.5, 0.5-0.8, >= 0.8)."""
    out = [[0, 0] for _ in BINS]
    for q, ok in pairs:
        k = max(i for i, b in enumerate(BINS) if q >= b)
        out[k][0] += bool(ok)
        out[k][1] += 1
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/iternp")
    ap.add_argument("--only", choices=("logcases", "renders"))
    ap.add_argument("--cases", default="")
    ap.add_argument("--samples", type=int, default=None)
    ap.add_argument("--repeat", type=int, default=1, help="time each replay N times (least)")
    ap.add_argument("--seed-base", type=int, default=2900,
                    help="the renders' seeds (2900: the tuning set; another: held out)")
    args = ap.parse_args()
    want = set(filter(None, args.cases.split(",")))
    cases = []
    if args.only != "renders":
        cases += [(n, os.path.join(LOGCASES, n)) for n in sorted(os.listdir(LOGCASES))
                  if os.path.exists(os.path.join(LOGCASES, n, "server.iter.log"))]
    if args.only != "logcases":
        model = json.load(open(os.path.join(LOGCASES, "p1_poisson_fcfs_200", "truth.json")))["step_time_model"]
        cases += [(r["name"], r["dir"]) for r in render_cases(args.out, model, args.seed_base)]
    cases = [(n, d) for n, d in cases if not want or n in want]
    if cases:  # load the modules once, outside the times
        replay_once(os.path.join(cases[0][1], "server.iter.log"), args.samples)
    tot = [0, 0, 0, 0]
    widths: list[float] = []
    rows_hi, rows_lo = [0, 0], [0, 0]
    ratios: dict[str, float] = {}
    by_p = {"rows_by_p": [[0, 0] for _ in BINS], "requests_by_p": [[0, 0] for _ in BINS],
            "requests_no_member": [0, 0]}
    for name, d in cases:
        row = score(name, d, args.samples, args.repeat)
        for key, acc in by_p.items():
            if key not in row:
                continue
            if key == "requests_no_member":
                acc[0] += row[key][0]
                acc[1] += row[key][1]
                continue
            for a, b in zip(acc, row[key]):
                a[0] += b[0]
                a[1] += b[1]
        tot[0] += row["true"]
        tot[1] += row["at_step_5"]
        tot[2] += row["holds"] if "holds" in row else 0
        tot[3] += 1
        if "width" in row:
            widths.append(row["width"])
            for acc, key in ((rows_hi, "p>=0.8 right"), (rows_lo, "p<0.2 right")):
                a, b = row[key].split("/")
                acc[0] += int(a)
                acc[1] += int(b)
        ratios[name] = row["cpu_ratio"]
        print(json.dumps(row), flush=True)
    print(json.dumps({"total_true": tot[0], "at_step_5": tot[1],
                      "share": round(tot[1] / max(1, tot[0]), 3),
                      "intervals_holding": f"{tot[2]}/{tot[3]}",
                      "mean_width": round(sum(widths) / len(widths), 3) if widths else None,
                      "p>=0.8 right": f"{rows_hi[0]}/{rows_hi[1]}",
                      "p<0.2 right": f"{rows_lo[0]}/{rows_lo[1]}",
                      "cpu_ratio_max": max(ratios.values()) if ratios else None,
                      **by_p}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
