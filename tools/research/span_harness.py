#!/usr/bin/env python3
"""Plain log + request spans, scored against the truth (dev tool; docs/accuracy.md,
"Request spans"): the published cases' `server.otlp.log` + `spans.otlp.jsonl`, and renders
of our own whose spans vLLM 0.33.0's `do_tracing` writes (tools/oracle/vllm_do_tracing.py, in the
vLLM venv with the OpenTelemetry SDK on PYTHONPATH, as tools/research/render_poisson_spans.py).

    python -m tools.research.span_harness render OUT [--seeds 0 1] [--n 150]
        [--vllm-python PY] [--otel-path DIR]
    python -m tools.research.span_harness score OUT [CASE_DIR ...] [--logs server.log ...] [--json F]

Renders: every combination of prefix caching off / on (on: prompts share a few
100-800-token prefixes, as tools/oracle/calib_corpus.py), sync / async scheduling, and arrivals
Poisson over steps or on-off bursts (5-30 requests within a few steps, then an idle gap the
engine runs dry in); prompts 100-2000 tokens, outputs 50-500; the KV pool sized until the
run has tens of preemptions. Each case gets `server.log` (no prompts) and
`server.reqbody.log` (the JSON-body lines), both rendered with p1's step-time formula,
`spans.otlp.jsonl`, and `truth.json` (each preemption's step, its step counting busy steps
only, and its victim).

Score, per case and log (always with the spans): preemptions found with the right victim
within +-5 steps (`hit`; `hit_busy` counts busy steps only: the replay does not step an idle
engine, the simulator does, so after an idle gap only the busy count is comparable), the
replay's count against the truth, whether the uncertainty object's 90% interval holds the
true count, the rows with p >= 0.8 and how many of them are right, the rows called sure
(exact-by-log / consistent, no probability), and how the arrivals were placed.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tools.oracle.calib_corpus import draw_prompt

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent

START = 1778148060.05
P1 = ROOT / "tests/data/logcases/p1_poisson_fcfs_200"


def workload(seed: int, n: int, pc: bool, asyn: bool, bursty: bool, blocks: int) -> dict:
    rng = random.Random(f"span-harness:{seed}:{pc}:{asyn}:{bursty}")
    groups: list[list[int]] = []
    reqs = []
    t = 0.0
    left = 0  # requests left in the current burst
    for i in range(n):
        prompt = draw_prompt(rng, groups, pc)
        reqs.append({"id": f"req-{seed}-{i}", "arrival_step": int(t), "prompt_token_ids": prompt,
                     "max_tokens": rng.randrange(50, 500)})
        if bursty:
            if left <= 0:
                left = rng.randrange(5, 31)
                if i:  # (the first request arrives at step 0, as in the published cases)
                    t += rng.uniform(150, 900)  # the idle gap (and the burst's work), steps
            left -= 1
            t += rng.expovariate(1.0 / 0.8)
        else:
            t += rng.expovariate(1.0 / 8.0)
    return {"name": f"span-harness-{seed}", "config": {
        "num_gpu_blocks": blocks, "block_size": 16, "max_num_seqs": 64,
        "max_num_batched_tokens": 8192, "max_model_len": 4096, "enable_chunked_prefill": True,
        "enable_prefix_caching": pc, "policy": "fcfs", "async_scheduling": asyn,
        "max_steps": 200000}, "requests": reqs}


def render(args: argparse.Namespace) -> int:
    from kvreplay.replay import parse_workload, simulate
    from tools.oracle.render_log import formula_step_time, render_log, step_starts
    from tools.research.render_poisson_spans import run_json

    model = json.load(open(P1 / "truth.json"))["step_time_model"]
    dt = formula_step_time(model)
    out = Path(args.out)
    pairs: list[str] = []
    for seed in args.seeds:
        for pc in (False, True):
            for asyn in (False, True):
                for bursty in (False, True):
                    name = (f"{'pc' if pc else 'nopc'}-{'async' if asyn else 'sync'}-"
                            f"{'bursty' if bursty else 'poisson'}-s{seed}")
                    blocks = 1800
                    for _ in range(12):  # tens of preemptions
                        wl = parse_workload(workload(seed, args.n, pc, asyn, bursty, blocks))
                        recs, _ = simulate(wl)
                        k = sum(len(r.get("preempted", ())) for r in recs)
                        if k < 15:
                            blocks = int(blocks * 0.88)
                        elif k > 60:
                            blocks = int(blocks * 1.1)
                        else:
                            break
                    d = out / name
                    d.mkdir(parents=True, exist_ok=True)
                    busy, b = [], 0
                    for r in recs:
                        busy.append(b)
                        b += bool(r.get("num_scheduled_tokens", 0))
                    true = [{"step": r["step"], "busy_step": busy[r["step"]], "victim_log_id": p}
                            for r in recs for p in r.get("preempted", ())]
                    starts = step_starts(recs, dt, START)
                    for fname, prompts in (("server.log", False), ("server.reqbody.log", True)):
                        lines = render_log(wl, recs, step_time_s=dt, start=START,
                                           stats_interval_s=10.0, stats_phase_s=0.37,
                                           with_prompts=prompts)
                        (d / fname).write_text("\n".join(lines) + "\n")
                    (d / "run.json").write_text(json.dumps(
                        run_json(wl, recs, starts, 0.0, random.Random(seed))))
                    (d / "truth.json").write_text(json.dumps({
                        "preemptions": true, "steps": len(recs), "busy_steps": b,
                        "blocks": blocks, "requests": len(wl.requests)}))
                    pairs += [str(d / "run.json"), str(d / "spans.otlp.jsonl")]
                    print(f"{name}: {len(wl.requests)} requests, {len(recs)} steps ({b} busy), "
                          f"{len(true)} preemptions, {blocks} blocks", flush=True)
    env = dict(os.environ, PYTHONPATH=args.otel_path)
    subprocess.run([args.vllm_python, str(ROOT / "tools" / "oracle" / "vllm_do_tracing.py"), *pairs], check=True,
                   env=env)
    return 0


def truth_of(case: Path) -> tuple[list[tuple[int, int, str]], bool]:
    """(step, busy step, victim) of each true preemption; whether busy steps are known."""
    t = json.loads((case / "truth.json").read_text())
    rows = [(p["step"], p.get("busy_step", p["step"]), p["victim_log_id"])
            for p in t["preemptions"]]
    return rows, all("busy_step" in p for p in t["preemptions"])


def score_one(case: Path, log: str) -> dict[str, Any]:
    from kvreplay.sources import open_replay
    from tools.research.matching import match_preemptions

    true, _ = truth_of(case)
    t0 = time.perf_counter()
    rep = open_replay([str(case / log), str(case / "spans.otlp.jsonl")], year=2026)
    secs = time.perf_counter() - t0
    found = list(rep.preemptions)
    busy, b = [], 0
    for rec in rep.steps:
        busy.append(b)
        b += bool(rec.num_scheduled)
    hit = match_preemptions([(s, v) for s, _, v in true], [(q.step, q.victim) for q in found])
    hit_busy = match_preemptions([(s, v) for _, s, v in true],
                                 [(busy[q.step] if q.step < len(busy) else q.step, q.victim)
                                  for q in found])
    right = hit | hit_busy
    unc = rep.uncertainty
    row: dict[str, Any] = {
        "case": case.name, "log": log, "true": len(true), "found": len(found),
        "hit": len(hit), "hit_busy": len(hit_busy), "seconds": round(secs, 1),
        "arrivals": (rep.info.spans or {}).get("arrivals"),
        "sure_rows": sum(1 for q in found if q.probability is None and
                         q.confidence in ("exact", "exact-by-log", "consistent")),
        "sure_wrong": sum(1 for j, q in enumerate(found) if j not in right and
                          q.probability is None and
                          q.confidence in ("exact", "exact-by-log", "consistent")),
    }
    if unc is not None:
        c = unc.preemptions
        row["interval"] = [c["low"], c["median"], c["high"]]
        row["holds"] = c["low"] <= len(true) <= c["high"]
        row["width"] = c["high"] - c["low"]
        p8 = [j for j, q in enumerate(found) if (q.probability or 0.0) >= 0.8]
        row["p80"] = len(p8)
        row["p80_right"] = sum(1 for j in p8 if j in right)
    return row


CASES = ("p1_poisson_fcfs_200", "f_prefix_caching", "b_fcfs_heavy")


def score(args: argparse.Namespace) -> int:
    cases = [Path(c) for c in args.cases]
    if not cases:
        pub = ROOT / "tests/data/logcases"
        cases = [pub / c for c in CASES]
        if args.out:
            cases += sorted(p for p in Path(args.out).iterdir() if (p / "truth.json").exists())
    rows = []
    for case in cases:
        logs = ["server.otlp.log"] if (case / "server.otlp.log").exists() else args.logs
        for log in logs:
            if not (case / log).exists():
                continue
            row = score_one(case, log)
            rows.append(row)
            print(json.dumps(row), flush=True)
    tot = {k: sum(r.get(k, 0) for r in rows) for k in ("true", "hit", "hit_busy", "p80",
                                                        "p80_right", "sure_rows", "sure_wrong")}
    with_iv = [r for r in rows if "holds" in r]
    print(f"TOTAL {len(rows)} replays: {max(tot['hit'], tot['hit_busy'])}.. of {tot['true']} "
          f"victims (step {tot['hit']}, busy step {tot['hit_busy']}); intervals held "
          f"{sum(r['holds'] for r in with_iv)} of {len(with_iv)} (mean width "
          f"{sum(r['width'] for r in with_iv) / max(1, len(with_iv)):.1f}); p>=0.8 right "
          f"{tot['p80_right']} of {tot['p80']}; sure rows wrong {tot['sure_wrong']} of "
          f"{tot['sure_rows']}")
    if args.json:
        Path(args.json).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("render")
    r.add_argument("out")
    r.add_argument("--seeds", type=int, nargs="+", default=[0])
    r.add_argument("--n", type=int, default=150)
    r.add_argument("--vllm-python",
                   default=str(Path.home() / ".cache/kvreplay/vllm-0.33/bin/python"))
    r.add_argument("--otel-path", default=os.environ.get("KVREPLAY_OTEL_PATH", ""))
    s = sub.add_parser("score")
    s.add_argument("out", nargs="?")
    s.add_argument("cases", nargs="*")
    s.add_argument("--logs", nargs="+", default=["server.log", "server.reqbody.log"])
    s.add_argument("--json")
    args = ap.parse_args()
    return render(args) if args.cmd == "render" else score(args)


if __name__ == "__main__":
    sys.exit(main())
