#!/usr/bin/env python3
"""Dump the prefix-sharing ensemble (span_prefix.prefix_ensemble) of span_harness renders,
member by member, and score other weightings of the same members offline (dev tool;
docs/accuracy.md, section 5).

    python -m tools.research.span_members dump OUT CASE_DIR ... [--log server.log] [--jobs 2]
    python -m tools.research.span_members score OUT [--calibration 0 2 6 ...]

dump: each case's plain log + spans replayed as `kvreplay replay` does (sources.open_replay),
and per member of its ensemble: the stats lines' SSE, the early admissions (span_prefix
.admitted_early), the count, and each preemption as (step, busy step, victim) with whether
it matches a true one (tools/research/matching.py, step or busy step, as span_harness
scores); the pipeline's own interval, weights and rows; the truth (truth.json, which the
product never reads). score: the pipeline's figures from the dump, calibration seeds and the
others (held out) apart: intervals held, victims found by the replay shown (the member
weighed most), rows right by probability bin.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
from pathlib import Path
from typing import Any


def _rows(run: Any) -> list[tuple[int, int, str]]:
    from kvreplay.replay.records import preemption_records

    busy, b = [], 0
    for rec in run.steps:
        busy.append(b)
        b += bool(rec.num_scheduled)
    return [(p.step, busy[p.step] if p.step < len(busy) else p.step, p.victim)
            for p in preemption_records(run.steps, run.clock)]


def dump_one(job: tuple[str, str, str]) -> str:
    from kvreplay.inference import ensemble, span_prefix, uncertainty
    from kvreplay.sources import open_replay
    from tools.research.matching import match_preemptions
    from tools.research.span_harness import truth_of

    case, log, out = (Path(x) for x in job)
    dest = out / f"{case.name}.json"
    if dest.exists():
        return f"{case.name} (cached)"
    runs: list[Any] = []
    early: list[list[int]] = []
    weights: list[list[float]] = []
    orig_member, orig_weights, orig_summarize = (ensemble.stats_member, span_prefix.span_weights,
                                                 uncertainty.summarize)

    def member(run, *a, **k):  # type: ignore[no-untyped-def]
        runs.append(run)
        return orig_member(run, *a, **k)

    def sw(w, e):  # type: ignore[no-untyped-def]
        early.append(list(e))
        return orig_weights(w, e)

    def summ(members, w, **k):  # type: ignore[no-untyped-def]
        weights.append(list(w))
        return orig_summarize(members, w, **k)

    ensemble.stats_member, span_prefix.span_weights, uncertainty.summarize = member, sw, summ
    try:
        rep = open_replay([str(case / log), str(case / "spans.otlp.jsonl")], year=2026)
    finally:
        ensemble.stats_member, span_prefix.span_weights, uncertainty.summarize = (
            orig_member, orig_weights, orig_summarize)
    true, _ = truth_of(case)
    unc = rep.uncertainty
    members = []
    for k, run in enumerate(runs[-len(unc.members):] if unc is not None else ()):
        rows = _rows(run)
        right = match_preemptions([(s, v) for s, _, v in true], [(s, v) for s, _, v in rows]) | \
            match_preemptions([(b, v) for _, b, v in true], [(b, v) for _, b, v in rows])
        m = unc.members[k]
        members.append({"sse": m.sse, "count": m.count, "recomputed": m.recomputed,
                        "processed": m.processed,
                        "early": early[-1][k] if early else 0,
                        "rows": [[s, b, v, j in right] for j, (s, b, v) in enumerate(rows)]})
    found = list(rep.preemptions)
    rec = {"case": case.name, "log": str(log), "true": len(true), "lines": len(rep.facts.stats),
           "interval": None if unc is None else unc.preemptions,
           "weights": weights[-1] if weights else None, "members": members,
           "shown": [[q.step, q.victim, q.probability] for q in found],
           "poor_fit": None if unc is None else unc.poor_fit,
           "notes": list(getattr(rep, "notes", ()) or ())}
    dest.write_text(json.dumps(rec))
    return f"{case.name}: {len(members)} members"


def dump(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    jobs = [(c, args.log, str(out)) for c in args.cases]
    if args.jobs > 1:
        with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
            for msg in pool.imap_unordered(dump_one, jobs):
                print(msg, flush=True)
    else:
        for j in jobs:
            print(dump_one(j), flush=True)
    return 0


def load(out: str, seeds: list[int] | None = None) -> list[dict[str, Any]]:
    recs = []
    for p in sorted(Path(out).glob("*.json")):
        r = json.loads(p.read_text())
        seed = int(r["case"].rsplit("-s", 1)[1])
        if seeds is None or seed in seeds:
            r["seed"] = seed
            recs.append(r)
    return recs


def _shown(r: dict[str, Any]) -> int:
    """The member shown: the one weighed most (ties: the first), as prefix_ensemble."""
    w = r["weights"]
    return max(range(len(w)), key=lambda k: (w[k], -k))


def _row_p(r: dict[str, Any], top: int, s: int, v: str) -> float:
    """A row's probability as span_prefix.voters and Uncertainty.assign give it: the share
    of the other members' weight that preempts its victim within 5 steps of its step."""
    w = [0.0 if k == top else x for k, x in enumerate(r["weights"])]
    if sum(w) <= 0:
        w = list(r["weights"])
    hit = sum(x for m, x in zip(r["members"], w)
              if any(v2 == v and abs(s2 - s) <= 5 for s2, _, v2, _ in m["rows"]))
    return hit / sum(w)


def summary(recs: list[dict[str, Any]]) -> str:
    """Intervals held (mean width), victims found by the replay shown, rows by probability
    bin (right / rows)."""
    held = sum(r["interval"]["low"] <= r["true"] <= r["interval"]["high"] for r in recs)
    width = sum(r["interval"]["high"] - r["interval"]["low"] for r in recs) / max(1, len(recs))
    found = true = 0
    bins: dict[int, list[int]] = {}
    for r in recs:
        top = _shown(r)
        true += r["true"]
        for s, _, v, right in r["members"][top]["rows"]:
            found += right
            b = bins.setdefault(min(4, int(_row_p(r, top, s, v) * 5)), [0, 0])
            b[0] += 1
            b[1] += right
    rows = ", ".join(f"p {k / 5:.1f}-{(k + 1) / 5:.1f}: {b[1]} of {b[0]}"
                     for k, b in sorted(bins.items()))
    return (f"{len(recs)} logs: interval held {held} of {len(recs)} (mean width {width:.1f}); "
            f"victims found {found} of {true}; rows right by p: {rows}")


def score(args: argparse.Namespace) -> int:
    recs = load(args.out, None)
    for r in recs:
        iv = r["interval"]
        print(f"{r['case']:24s} true {r['true']:3d} interval {iv['low']:3d}-{iv['median']:3d}-"
              f"{iv['high']:3d} {'held' if iv['low'] <= r['true'] <= iv['high'] else 'MISSED'}")
    cal = set(args.calibration)
    print("calibration seeds", sorted(cal), summary([r for r in recs if r["seed"] in cal]))
    print("held-out seeds", sorted({r["seed"] for r in recs} - cal),
          summary([r for r in recs if r["seed"] not in cal]))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump")
    d.add_argument("out")
    d.add_argument("cases", nargs="+")
    d.add_argument("--log", default="server.log")
    d.add_argument("--jobs", type=int, default=1)
    s = sub.add_parser("score")
    s.add_argument("out")
    s.add_argument("--calibration", type=int, nargs="*", default=[0, 2, 6, 7, 8, 9, 12, 13, 14,
                                                                   15, 16, 17])
    args = ap.parse_args()
    return dump(args) if args.cmd == "dump" else score(args)


if __name__ == "__main__":
    sys.exit(main())
