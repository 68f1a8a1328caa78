#!/usr/bin/env python3
"""Poisson renders of a workload with their request spans made by vLLM's own code, and the
replay scored with and without them (dev tool; docs/accuracy.md, "Request spans").

    python -m tools.research.render_poisson_spans WORKLOAD.json --clock-from TRUTH.json
        [--seeds 0 1 2] [--vllm-python PY] [--otel-path DIR] [--keep DIR] [--jitter-ms 0]

For each seed, as tools/research/eval_poisson.py: arrivals redrawn as a Poisson process over steps,
the run simulated (our scheduler == vLLM's), rendered as a plain 0.33 `server.log` (no
prompts) with the truth's step-time formula. Then its engine outputs (QUEUED, SCHEDULED,
PREEMPTED events at step starts, one token per sampled request at step ends) go through
vLLM 0.33's `OutputProcessor(tracing_enabled=True)` in the vLLM venv
(tools/oracle/vllm_do_tracing.py), whose `do_tracing` writes the spans. `--jitter-ms J`: each
span's arrival up to J ms (and at most 80% of the step before) ahead of the step that took
it in, instead of at that step's start less 0.5 ms as the log's Received line is (the
arrivals taken in at one step keep their queue order). Prints,
per seed: preemptions, and those found with the right victim within +-5 steps from the
log, the log + spans, and the spans alone (the workload JSON's config as --config).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

from kvreplay.replay import parse_workload, simulate
from tools.oracle.render_log import formula_step_time, render_log, step_starts
from kvreplay.sources import open_replay
from tools.research.eval_poisson import mean_gap, poisson_redraw
from tools.research.matching import match_preemptions

START = 1778148060.05
HERE = Path(__file__).resolve().parent


def run_json(wl, recs, starts, jitter_s: float, rng: random.Random) -> dict:
    arrival_step = {}
    for rec in recs:
        for rid in rec.get("arrivals", ()):
            arrival_step[rid] = rec["step"]
    # the jitter of the arrivals taken in at one step, largest first: they keep the
    # order they queue in (the workload's), as a frontend hands them over in arrival order
    ahead: dict[int, list[float]] = {}
    for s in wl.requests:
        ahead.setdefault(arrival_step[s.id], []).append(rng.random())
    for v in ahead.values():
        v.sort(reverse=True)
    reqs = []
    for s in wl.requests:
        k = arrival_step[s.id]
        lead = min(0.0005, (starts[k + 1] - starts[k]) / 4)  # as render_log's Received line
        a = starts[k] - lead
        u = ahead[k].pop(0)
        if jitter_s and k > 0:
            a -= u * min(jitter_s, 0.8 * (starts[k] - starts[k - 1]))
        reqs.append({"id": s.id, "internal_id": f"{s.id}-0", "prompt_len":
                     len(s.prompt_token_ids), "max_tokens": s.max_tokens, "arrival": a})
    steps = [{"start": starts[r["step"]], "end": starts[r["step"] + 1],
              "queued": list(r.get("arrivals", ())),
              "scheduled": list(r.get("new", ())) + list(r.get("resumed", ())),
              "preempted": list(r.get("preempted", ())), "sampled": list(r.get("sampled", ())),
              "finished": list(r.get("finished", ()))} for r in recs]
    return {"requests": reqs, "steps": steps, "ipc_s": 0.0003}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("workload")
    ap.add_argument("--clock-from", required=True, metavar="TRUTH.json")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--vllm-python", default=str(Path.home() / ".cache/kvreplay/vllm-0.33/bin/python"))
    ap.add_argument("--otel-path", default=os.environ.get("KVREPLAY_OTEL_PATH", ""),
                    help="a folder with opentelemetry-sdk and the OTLP exporter for the vLLM venv")
    ap.add_argument("--keep", metavar="DIR", help="keep each seed's log and spans here")
    ap.add_argument("--jitter-ms", type=float, default=0.0)
    ap.add_argument("--phase", type=float, default=0.37)
    args = ap.parse_args()
    wl0 = parse_workload(json.load(open(args.workload)))
    model = json.load(open(args.clock_from))["step_time_model"]
    dt = formula_step_time(model)
    gap = mean_gap(wl0)
    tot = [0, 0, 0, 0]
    for seed in args.seeds:
        rng = random.Random(seed)
        wl = poisson_redraw(wl0, rng, gap)
        recs, _ = simulate(wl)
        true = [(r["step"], p) for r in recs for p in r.get("preempted", ())]
        starts = step_starts(recs, dt, START)
        lines = render_log(wl, recs, step_time_s=dt, start=START, stats_interval_s=2.0,
                           stats_phase_s=args.phase, with_prompts=False)
        d = Path(args.keep) / f"seed{seed}" if args.keep else Path(tempfile.mkdtemp())
        d.mkdir(parents=True, exist_ok=True)
        (d / "server.log").write_text("\n".join(lines) + "\n")
        (d / "run.json").write_text(json.dumps(run_json(wl, recs, starts,
                                                        args.jitter_ms / 1000.0, rng)))
        env = dict(os.environ, PYTHONPATH=args.otel_path)
        subprocess.run([args.vllm_python, str(HERE.parent / "oracle" / "vllm_do_tracing.py"), str(d / "run.json"),
                        str(d / "spans.otlp.jsonl")], check=True, env=env)
        (d / "truth.json").write_text(json.dumps({"preemptions": [
            {"step": s, "victim_log_id": v} for s, v in true]}))
        row = [len(true)]
        spans = str(d / "spans.otlp.jsonl")
        for paths, cfg in (([str(d / "server.log")], None), ([str(d / "server.log"), spans], None),
                           ([spans], args.workload)):  # the log; the log + spans; spans alone
            rep = open_replay(paths, year=2026, config=cfg)
            row.append(len(match_preemptions(true, [(q.step, q.victim) for q in rep.preemptions])))
            if len(paths) == 2:
                sp = rep.info.spans or {}
                note = (f"arrivals by {sp.get('arrivals')}, offset {sp.get('clock_offset_s')}, "
                        f"contradicted {sp.get('first_token_late', 0) + sp.get('admitted_early', 0)}")
        print(f"seed {seed}: true {row[0]}, found without spans {row[1]}, with spans {row[2]} "
              f"({note}), spans alone {row[3]}", flush=True)
        tot = [a + b for a, b in zip(tot, row)]
    n = max(1, tot[0])
    print(f"TOTAL true {tot[0]}: without spans {tot[1]} ({tot[1] / n:.0%}), with spans "
          f"{tot[2]} ({tot[2] / n:.0%}), spans alone {tot[3]} ({tot[3] / n:.0%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
