#!/usr/bin/env python3
"""Score `kvreplay whatif` against answer keys made with vLLM's scheduler (dev tool).

    python -m tools.research.score_whatif KEYS.jsonl --root DIR --log server.log [--spans FILE] [-j 2] [-o SCORES.json]

KEYS.jsonl: rows of tools/oracle/whatif_keys.py (or a log case's published whatif.jsonl); the log
of case C is DIR/C/LOG. Each key row's setting is replayed by kvreplay.audit.whatif_replays (as
`kvreplay whatif LOG --<knob> V` does) and compared: a row is right when the preemptions
are within max(3, 10%) of vLLM's count and the output throughput within 10% of vLLM's
(gen tokens/s). Rows with an interval also say whether it holds vLLM's value. The base row
(no setting changed) is scored apart. Prints one line per row and the shares.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys

from tools.oracle.whatif_keys import parse_set


def right(pred: dict, key: dict) -> tuple[bool, bool]:
    v = key["total_preemptions"]
    pre_ok = abs(pred["preemptions"] - v) <= max(3.0, 0.1 * v)
    t = key["gen_tok_per_s"]
    return pre_ok, abs(pred["output_tput"] - t) <= 0.1 * t


def keys_by_case(path: str) -> dict[str, list[dict]]:
    """The answer keys' rows (tools/oracle/whatif_keys.py, or a published whatif.jsonl) by case."""
    by_case: dict[str, list[dict]] = collections.defaultdict(list)
    for line in open(path):
        if line.strip():
            r = json.loads(line)
            by_case[r["case"]].append(r)
    return by_case


def settings_of(keys: list[dict]) -> list:
    """Each key row's setting, as `kvreplay whatif LOG --<knob> V` would run it."""
    from kvreplay.audit import whatif_replays as whatif

    return [whatif.Setting(" ".join(k["set"]) or "as logged", parse_set(k["set"])) for k in keys]


def holds(lo_hi, v) -> bool | None:
    if not lo_hi or lo_hi[0] is None:
        return None
    return lo_hi[0] <= v <= lo_hi[1]


def main() -> int:
    from kvreplay.audit import whatif_replays as whatif

    ap = argparse.ArgumentParser()
    ap.add_argument("keys")
    ap.add_argument("--root", required=True)
    ap.add_argument("--log", default="server.log")
    ap.add_argument("--spans", default=None, help="a span file beside each log (spans.otlp.jsonl)")
    ap.add_argument("-j", "--jobs", type=int, default=None)
    ap.add_argument("-o", "--output")
    args = ap.parse_args()
    by_case = keys_by_case(args.keys)
    out = []
    knees = []
    for case, keys in by_case.items():
        settings = settings_of(keys)
        try:
            paths = [os.path.join(args.root, case, args.log)]
            if args.spans:
                paths.append(os.path.join(args.root, case, args.spans))
            ctx = whatif.load(paths, year=2026)
            res = whatif.sweep(ctx, settings, jobs=args.jobs)
        except Exception as exc:  # a crash is a miss on every row of the case
            print(f"{case}: {type(exc).__name__}: {exc}", flush=True)
            res = {"rows": [{"preemptions": -1000, "output_tput": 0.0} for _ in keys]}
        # the knee of throughput vs max-num-seqs: vLLM's own runs against the what-if's
        seqs = {parse_set(k["set"]).get("max_num_seqs"): k for k in keys
                if set(parse_set(k["set"])) <= {"max_num_seqs"}}
        if len(seqs) >= 3 and res.get("seqs_knee"):
            # the base row (no setting) is at the logged value: the one the sweep adds
            logged = next((x for x, _ in res["seqs_knee"]["points"] if x not in seqs), None)
            pts = [(logged if v is None else v, k["gen_tok_per_s"]) for v, k in seqs.items()]
            from kvreplay.audit.metrics import knee

            xs = sorted(x for x, _ in pts)
            vk = knee(pts)["knee"]
            ours = res["seqs_knee"]
            lo, hi = ours.get("knee_interval") or [ours["knee"], ours["knee"]]
            near = abs(xs.index(ours["knee"]) - xs.index(vk)) <= 1 if vk in xs and ours["knee"] in xs else False
            knees.append({"case": case, "vllm_knee": vk, "knee": ours["knee"], "knee_interval": [lo, hi],
                          "within_one_point": near, "interval_holds": lo <= vk <= hi})
            print(f"{case:22s} knee vs max-num-seqs: vLLM {vk}, what-if {ours['knee']} ({lo}-{hi})"
                  f" {'ok' if near else 'MISS'}", flush=True)
        for k, row in zip(keys, res["rows"]):
            pre_ok, tput_ok = right(row, k)
            rec = {"case": case, "set": k["set"], "base": not parse_set(k["set"]),
                   "vllm_preemptions": k["total_preemptions"], "preemptions": row["preemptions"],
                   "vllm_tput": k["gen_tok_per_s"], "tput": row["output_tput"],
                   "preemptions_ok": pre_ok, "tput_ok": tput_ok, "right": pre_ok and tput_ok,
                   "preemptions_interval": row.get("preemptions_interval"),
                   "tput_interval": row.get("output_tput_interval"),
                   "trust": row.get("trust"),
                   "preemptions_draws": row.get("preemptions_draws"),
                   "tput_draws": row.get("output_tput_draws")}
            rec["pre_in"] = holds(rec["preemptions_interval"], k["total_preemptions"])
            rec["tput_in"] = holds(rec["tput_interval"], k["gen_tok_per_s"])
            out.append(rec)
            print(f"{case:22s} {' '.join(k['set']) or '(as logged)':30s} pre {row['preemptions']:>4} "
                  f"vs {k['total_preemptions']:>4}  tput {row['output_tput']:>8.1f} vs "
                  f"{k['gen_tok_per_s']:>8.1f} ({100 * (row['output_tput'] / k['gen_tok_per_s'] - 1):+5.1f}%)"
                  f"  {'ok' if rec['right'] else 'MISS'}"
                  + (f"  in {rec['pre_in']}/{rec['tput_in']}" if rec["pre_in"] is not None else ""),
                  flush=True)
    rows = [r for r in out if not r["base"]]
    base = [r for r in out if r["base"]]
    n = max(1, len(rows))
    summary = {"rows": len(rows), "right": sum(r["right"] for r in rows),
               "preemptions_ok": sum(r["preemptions_ok"] for r in rows),
               "tput_ok": sum(r["tput_ok"] for r in rows),
               "base_rows": len(base), "base_right": sum(r["right"] for r in base)}
    iv = [r for r in rows if r["pre_in"] is not None]
    if iv:
        summary["pre_interval_holds"] = sum(r["pre_in"] for r in iv)
        summary["tput_interval_holds"] = sum(r["tput_in"] for r in iv)
        summary["with_interval"] = len(iv)
    print(f"what-if rows right: {summary['right']}/{len(rows)} ({100 * summary['right'] / n:.0f}%); "
          f"preemptions {summary['preemptions_ok']}, throughput {summary['tput_ok']}; "
          f"base rows right {summary['base_right']}/{len(base)}"
          + (f"; intervals hold vLLM's preemptions {summary['pre_interval_holds']}/{len(iv)}, "
             f"throughput {summary['tput_interval_holds']}/{len(iv)}" if iv else ""))
    if knees:
        summary["knees"] = len(knees)
        summary["knees_within_one_point"] = sum(k["within_one_point"] for k in knees)
        summary["knee_intervals_hold"] = sum(k["interval_holds"] for k in knees)
        print(f"knee of throughput vs max-num-seqs within one sweep point of vLLM's: "
              f"{summary['knees_within_one_point']}/{len(knees)}; its interval holds vLLM's: "
              f"{summary['knee_intervals_hold']}/{len(knees)}")
    if args.output:
        with open(args.output, "w") as f:
            json.dump({"summary": summary, "rows": out, "knees": knees}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
