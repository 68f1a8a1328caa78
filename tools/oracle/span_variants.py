#!/usr/bin/env python3
"""Variants of an OTLP/JSON span file for the sampling and clock-offset measurements
(docs/accuracy.md, "Request spans"): every span's start and end shifted by --shift seconds,
and/or only every --every-th span kept (file order). Dev tool: edits vLLM's own spans, it
does not make new ones.

    python -m tools.oracle.span_variants IN.otlp.jsonl OUT.otlp.jsonl [--shift 3.2] [--every 2]
"""
from __future__ import annotations

import argparse
import json
import sys


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("src")
    ap.add_argument("out")
    ap.add_argument("--shift", type=float, default=0.0)
    ap.add_argument("--every", type=int, default=1)
    args = ap.parse_args()
    k = 0
    out = []
    with open(args.src, encoding="utf-8") as f:
        for line in f:
            d = json.loads(line)
            for rs in d["resourceSpans"]:
                for ss in rs["scopeSpans"]:
                    kept = []
                    for sp in ss["spans"]:
                        if k % args.every == 0:
                            for key in ("startTimeUnixNano", "endTimeUnixNano"):
                                sp[key] = str(int(sp[key]) + round(args.shift * 1e9))
                            kept.append(sp)
                        k += 1
                    ss["spans"] = kept
            out.append(json.dumps(d, separators=(",", ":")))
    with open(args.out, "w", encoding="utf-8") as f:
        f.write("\n".join(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
