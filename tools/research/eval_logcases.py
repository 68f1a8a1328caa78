#!/usr/bin/env python3
"""Score `kvreplay replay` against a log case's truth.json (dev tool: the product never
reads truth.json).

    python -m tools.research.eval_logcases tests/data/logcases/*/ [--log server.reqbody.log]
        [--spans spans.otlp.jsonl]

Prints, per case: true vs found preemptions, how many true ones were found with the right
victim within +-5 steps, and the total count error.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from tools.research.matching import match_preemptions


def score(case: Path, log_name: str, tol: int = 5, spans: str | None = None) -> dict:
    from kvreplay.sources import replay_logs

    truth = json.loads((case / "truth.json").read_text())
    t0 = time.perf_counter()
    rep = replay_logs([str(case / log_name)] + ([str(case / spans)] if spans else []))
    dt = time.perf_counter() - t0
    true = truth["preemptions"]
    found = list(rep.preemptions)
    hits = len(match_preemptions([(p["step"], p["victim_log_id"]) for p in true],
                                 [(q.step, q.victim) for q in found], tol))
    n_true, n_found = len(true), len(found)
    out = {
        "case": case.name, "log": log_name, "spans": spans, "true": n_true, "found": n_found,
        "matched": hits, "recall": hits / n_true if n_true else 1.0,
        "count_error": (n_found - n_true) / n_true if n_true else float(n_found),
        "seconds": round(dt, 2), "model": rep.info.step_time_model, "placement": rep.info.placement,
        "loss": rep.info.fit_loss,
        "agreeing_stats": f"{rep.verification.agreeing_lines}/{rep.verification.stats_lines}",
    }
    if rep.uncertainty is not None:
        u = rep.uncertainty.preemptions
        out["interval"] = [u["low"], u["median"], u["high"]]
    elif rep.estimate is not None:
        out["estimate"] = [rep.estimate.preemptions_low, rep.estimate.preemptions_high]
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("cases", nargs="+")
    ap.add_argument("--log", default="server.reqbody.log")
    ap.add_argument("--spans", default=None, help="a span file in each case (spans.otlp.jsonl)")
    args = ap.parse_args()
    for c in args.cases:
        print(json.dumps(score(Path(c), args.log, spans=args.spans)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
