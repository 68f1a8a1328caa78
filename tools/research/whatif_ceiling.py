#!/usr/bin/env python3
"""How well can a what-if do when the base replay is nearly exact? (dev tool)

    python -m tools.research.whatif_ceiling /tmp/whatif_corpus/keys.jsonl --root /tmp/whatif_corpus \
        [--jitter 0 1 2] [--seeds 3] [--placement] [-o CEILING.json]

For each case, the what-if context of its Iteration-line log (`server.iter.log`, whose base
replay is exact: its arrival steps are truth.json's, checked) is taken, and each arrival is
moved by a random -J..+J steps (J = --jitter; file order kept, the first request at step 0).
The answer keys' settings are then run as `kvreplay whatif` runs them (audit.whatif_replays.run_one,
central run only) and scored as tools/research/score_whatif.py scores them. J = 0 is the exact base;
J = 1 is a base replay off by at most one step per arrival, far closer than any placement a
stats-line log allows. `--placement` also replays each case's stats-line log (`server.log`)
and prints how far its arrival steps are from the truth's.

Prints, per J, the rows within max(3, 10%) preemptions and 10% throughput of vLLM's.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys

from tools.research.score_whatif import keys_by_case, right, settings_of
from tools.oracle.whatif_keys import parse_set


def jittered(steps: list[int], j: int, rng: random.Random) -> list[int]:
    out = [0] + [max(0, a + rng.randint(-j, j)) for a in steps[1:]] if j else list(steps)
    for k in range(1, len(out)):
        out[k] = max(out[k], out[k - 1])  # file order: a later line never enters earlier
    return out


def main() -> int:
    from kvreplay.audit import whatif_replays as whatif
    from kvreplay.audit.whatif_inputs import _steps_of
    from kvreplay.sources import open_replay

    ap = argparse.ArgumentParser()
    ap.add_argument("keys")
    ap.add_argument("--root", required=True)
    ap.add_argument("--jitter", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--seeds", type=int, default=3, help="jitter draws per J (J > 0)")
    ap.add_argument("--placement", action="store_true")
    ap.add_argument("-o", "--output")
    args = ap.parse_args()
    by_case = keys_by_case(args.keys)
    score = {j: [0, 0, 0] for j in args.jitter}  # rows right, rows, base rows right
    offsets = []
    for case, keys in by_case.items():
        d = os.path.join(args.root, case)
        truth = json.load(open(os.path.join(d, "truth.json")))
        ctx = whatif.load([os.path.join(d, "server.iter.log")], year=2026)
        ids = [s.id for s in ctx.workload.requests]
        true_steps = [truth["requests"][i]["arrival_step"] for i in ids]
        assert ctx.arrival_steps == true_steps, f"{case}: the Iteration-line replay is not exact"
        ctx.variants = []  # central runs only
        settings = settings_of(keys)
        line = [case]
        for j in args.jitter:
            for seed in range(args.seeds if j else 1):
                arr = jittered(true_steps, j, random.Random(1000 * j + seed))
                ctx.arrival_steps = arr
                ctx.base_steps = _steps_of(ctx.workload, ctx.profile, arr)
                ok = 0
                for k, s in zip(keys, settings):
                    row = whatif.run_one(ctx, s, None)
                    good = all(right(row, k))
                    if parse_set(k["set"]):
                        score[j][0] += good
                        score[j][1] += 1
                        ok += good
                    else:
                        score[j][2] += good
                line.append(f"J={j}#{seed}: {ok}/{len(keys) - 1}")
        if args.placement:
            rp = open_replay([os.path.join(d, "server.log")], year=2026, samples=0)
            pos = {s.id: a for s, a in zip(rp.workload.requests, rp.inputs.arrival_steps)}
            off = [pos[i] - t for i, t in zip(ids, true_steps)]
            offsets.append((case, statistics.mean(off), statistics.mean(map(abs, off))))
            line.append(f"stats-line placement: mean offset {offsets[-1][1]:+.1f}, "
                        f"mean |offset| {offsets[-1][2]:.1f} steps")
        print("  ".join(line), flush=True)
    summary = {}
    for j, (ok, n, base) in score.items():
        runs = args.seeds if j else 1
        summary[j] = {"rows_right": ok, "rows": n, "base_right": base, "base_rows": len(by_case) * runs}
        print(f"J={j}: what-if rows right {ok}/{n} ({100 * ok / max(1, n):.0f}%); "
              f"as-logged rows right {base}/{len(by_case) * runs}")
    if offsets:
        print(f"stats-line placements: mean |offset| {statistics.mean(o[2] for o in offsets):.1f} "
              f"steps (median over cases {statistics.median(o[2] for o in offsets):.1f})")
    if args.output:
        with open(args.output, "w") as f:
            json.dump({"summary": summary, "offsets": offsets}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
