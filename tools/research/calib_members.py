#!/usr/bin/env python3
"""Dump each corpus log's uncertainty ensemble, member by member (dev tool), so that the
weighting's temperature can be chosen offline (tools/research/calib_members.py score).

    python -m tools.research.calib_members dump [--corpus /tmp/calib/corpus] [--out /tmp/calib/members]
    python -m tools.research.calib_members score [--out ...] [--temperatures 1 2 4 8 16]

Members: the stats lines' SSE (ensemble._sse, without the temperature), the preemption
count, recomputed tokens and processed tokens, victim -> steps; the representative
replay's rows; the truth (tools/oracle/calib_corpus.py's truth.json).
"""
from __future__ import annotations

import dataclasses

import argparse
import json
import multiprocessing
import os
import sys
import time


def dump_one(job: tuple[str, str, int]) -> str:
    d, out, samples = job
    from kvreplay.inference import replay_facts
    from kvreplay.sources import read_facts

    name = os.path.basename(d)
    dest = os.path.join(out, name + ".json")
    if os.path.exists(dest):
        return name + " (cached)"
    truth = json.load(open(os.path.join(d, "truth.json")))
    facts = read_facts([os.path.join(d, "server.log")], year=2026)
    facts = dataclasses.replace(facts, interval_s=truth["stats_interval_s"])
    t0 = time.perf_counter()
    rep = replay_facts(facts, samples=samples)
    dt = time.perf_counter() - t0
    u = rep.uncertainty
    rec = {"name": name, "group": truth.get("group"), "seconds": round(dt, 2),
           "stats_interval_s": truth["stats_interval_s"], "pattern": rep.info.arrival_pattern,
           "prompts": rep.info.prompts,
           "truth": {"preemptions": [[p["step"], p["victim"]] for p in truth["preemptions"]],
                     "recomputed_tokens": truth.get("recomputed_tokens"),
                     "processed_tokens": truth.get("processed_tokens"),
                     "split": truth.get("split"), "arrivals": truth.get("arrivals"),
                     "windows": truth.get("windows"),
                     "requests": truth.get("request_ids") or []},
           "rows": [[p.step, p.victim] for p in rep.preemptions],
           "members": [] if u is None else [
               {"loss": m.loss, "inexact": m.inexact, "count": m.count, "recomputed": m.recomputed,
                "processed": m.processed, "by_victim": m.by_victim, "windows": m.windows}
               for m in u.members]}
    with open(dest + ".tmp", "w") as f:
        json.dump(rec, f)
    os.replace(dest + ".tmp", dest)
    return f"{name} {dt:.1f}s"


PER_LINE = False
WIDEN = 0.0
FLOOR = 0.5
ESS_FRACTION = None


def score(recs: list[dict], temp: float, cost: float = 2.0, adapt: float = 0.0) -> dict:
    """Another weighting tried offline: T = `temp` (x lines with --per-line), at least
    ADAPT x the best member's loss per line (FLOOR), raised to keep --ess effective;
    intervals widened by --widen on Poisson logs; raw (uncalibrated) probabilities."""
    from kvreplay.inference.uncertainty import temper

    def weigh(sse: list[float], lines: int) -> list[float]:
        t = max(temp * lines if PER_LINE else temp, adapt * max(FLOOR, min(sse) / lines), 1e-9)
        return temper(sse, t, ESS_FRACTION or 0.0)

    out = score_product(recs, weigh=weigh, cost=cost, calibrate=False,
                        widen=lambda known, fit: WIDEN, noise=False)
    out["T"] = temp
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd", choices=("dump", "score", "product", "fit"))
    ap.add_argument("--corpus", default="/tmp/calib/corpus")
    ap.add_argument("--out", default="/tmp/calib/members")
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--only")
    ap.add_argument("--temperatures", type=float, nargs="+", default=[1, 2, 4, 8, 16, 32])
    ap.add_argument("--costs", type=float, nargs="+", default=[2.0],
                    help="SSE per stats line the exact check misses")
    ap.add_argument("--adapt", type=float, nargs="+", default=[0.0],
                    help="temperature at least ADAPT x the best member's loss per line")
    ap.add_argument("--groups", nargs="+")
    ap.add_argument("--full", action="store_true", help="print reliability tables")
    ap.add_argument("--per-line", action="store_true", help="temperature per stats line")
    ap.add_argument("--ess", type=float, help="temper each log to this effective share")
    ap.add_argument("--widen", type=float, default=0.0, help="widen each interval by this x median")
    args = ap.parse_args()
    global PER_LINE, ESS_FRACTION, WIDEN
    WIDEN = args.widen
    PER_LINE = args.per_line
    ESS_FRACTION = args.ess
    os.makedirs(args.out, exist_ok=True)
    if args.cmd == "dump":
        dirs = sorted(os.path.join(args.corpus, d) for d in os.listdir(args.corpus)
                      if os.path.isdir(os.path.join(args.corpus, d))
                      and (not args.only or d.startswith(args.only)))
        jobs = [(d, args.out, args.samples) for d in dirs]
        with multiprocessing.Pool(args.workers) as pool:
            for i, msg in enumerate(pool.imap_unordered(dump_one, jobs)):
                print(f"[{i + 1}/{len(jobs)}] {msg}", flush=True)
        return 0
    recs = [json.load(open(os.path.join(args.out, f))) for f in sorted(os.listdir(args.out))
            if f.endswith(".json")]
    if args.cmd == "fit":  # the calibration maps ensemble.CALIBRATION holds
        pois = [r for r in recs if r.get("pattern") == "poisson" and r["group"] == "poisson"]
        for known in ("exact", "estimated"):
            o = outcomes([r for r in pois if r["prompts"] == known])
            for kind in ("requests", "rows"):
                print(f'("{kind}", {known == "exact"}): {tuple(pav_table(o[kind]))},')
        return 0
    groups = {"all": recs}
    for r in recs:
        groups.setdefault(r["group"], []).append(r)
        if r["group"] == "poisson":
            groups.setdefault(f"poisson-{r['stats_interval_s']:g}s", []).append(r)
            groups.setdefault(f"poisson-{r['prompts']}", []).append(r)
    for r in recs:  # tools/calib_traffic.py's corpus: by split, prompts, arrivals
        sp = r["truth"].get("split")
        if sp:
            groups.setdefault(sp, []).append(r)
            groups.setdefault(f"{sp}-{r['prompts']}", []).append(r)
            groups.setdefault(f"{sp}-{r['truth'].get('arrivals')}", []).append(r)
    if args.cmd == "product":
        for g, rs in groups.items():
            if args.groups and g not in args.groups:
                continue
            s = score_product(rs)
            rel, rows = s.pop("reliability"), s.pop("rows")
            print(g, json.dumps(s))
            if args.full:
                print("  requests:", rel)
                print("  rows:    ", rows)
        return 0
    for t, c, a in [(t, c, a) for t in args.temperatures for c in args.costs for a in args.adapt]:
        for g, rs in groups.items():
            if args.groups and g not in args.groups:
                continue
            s = score(rs, t, c, adapt=a)
            s["cost"] = c
            s["adapt"] = a
            rel = s.pop("reliability")
            rows = s.pop("rows")
            print(g, json.dumps(s))
            if args.full and g == "all":
                print("  requests:", rel)
                print("  rows:    ", rows)
    return 0



def pav_table(pairs: list[tuple[float, bool]], bins: int = 10) -> list[tuple[float, float]]:
    """(raw p, outcome) pairs -> a monotone map as knots (mean raw p of a bin, observed
    share), bins pooled until the shares are nondecreasing (pool adjacent violators)."""
    cells = [[0, 0.0, 0] for _ in range(bins)]
    for p, y in pairs:
        c = cells[min(bins - 1, int(p * bins))]
        c[0] += 1; c[1] += p; c[2] += y
    blocks = [[c[0], c[1], c[2]] for c in cells if c[0]]
    i = 0
    while i < len(blocks) - 1:
        a, b = blocks[i], blocks[i + 1]
        if a[2] / a[0] > b[2] / b[0]:
            blocks[i:i + 2] = [[a[0] + b[0], a[1] + b[1], a[2] + b[2]]]
            i = max(0, i - 1)
        else:
            i += 1
    return [(round(b[1] / b[0], 3), round(b[2] / b[0], 3)) for b in blocks]


def outcomes(recs: list[dict], temp_k: float = 4.0) -> dict[str, list[tuple[float, bool]]]:
    """Raw (uncalibrated) request and row probabilities with their outcomes, weighted as
    the product weights members (uncertainty.noise_weights)."""
    from kvreplay.inference.uncertainty import TOL_STEPS, noise_weights
    out: dict[str, list[tuple[float, bool]]] = {"requests": [], "rows": []}
    for r in recs:
        ms = r["members"]
        if not ms:
            continue
        w = noise_weights([m["loss"] + 2.0 * m["inexact"] for m in ms], len(ms[0]["windows"]) - 1)
        tot = sum(w)
        true = r["truth"]["preemptions"]
        victims = {v for _, v in true}
        for q in set(r["truth"]["requests"]) | victims:
            p = sum(wi for wi, m in zip(w, ms) if q in m["by_victim"]) / tot
            out["requests"].append((p, q in victims))
        for step, v in r["rows"]:
            p = sum(wi for wi, m in zip(w, ms)
                    if any(abs(s - step) <= TOL_STEPS for s in m["by_victim"].get(v, ()))) / tot
            out["rows"].append((p, any(v == tv and abs(step - ts) <= TOL_STEPS for ts, tv in true)))
    return out


# With prompts estimated the replays undercount more often than they overcount (on the
# calibration part the true count lay above the ensemble's median in 11 of 14 logs,
# below in 1: heavy-tailed prompts whose lengths the throughput spreads evenly). COUNT_UP moves
# this share of the low side's widening to the high side (count, recomputed tokens,
# ratio). Not adopted (0): with COUNT_NOISE 0.25 and COUNT_UP 0.5, the narrowest pair
# holding 13 of the 14 calibration counts, the held-out counts held as before (11 of 14)
# at 135% of the true count instead of 146%, but recomputed tokens held 10 of 14
# instead of 11 and the ratio 10 instead of 12; the misses are logs no member comes near
# (the interval's edge at half the true count), which no widening of this size reaches.
# (Measured with the narrower length draws of before; the heavier-tailed draws of
# prompts.draw_lengths now reach two of those three logs: docs/accuracy.md, section 4.)
COUNT_UP = {True: 0.0, False: 0.0}  # the product's: none


def score_product(recs: list[dict], *, weigh=None, widen=None, cost: float = 2.0,
                  calibrate: bool = True, noise: bool = True) -> dict:
    """The scores of what the product prints: its weights (noise_weights), its widened
    intervals (widen_for, on Poisson logs) and its calibrated probabilities
    (ensemble.CALIBRATION); `weigh(sse, lines)`, `widen(prompts_known, fit)`, `cost` (SSE
    per inexact line) and `calibrate` try others (score)."""
    from kvreplay.inference.ensemble import (CALIBRATION, POOR_FIT, POOR_FIT_P_MAX, count_noise,
                                             widen_for)
    from kvreplay.inference.uncertainty import TOL_STEPS, calibrated, noise_weights
    from kvreplay.inference.uncertainty import interval as _interval, quantiles as _quantiles
    weigh = weigh or noise_weights
    widen = widen or widen_for
    n = cover = cover_r = cover_w = nwin = cover_q = nratio = 0
    widths = []
    brier = brier_base = 0.0
    nreq = 0
    hi8, hi5 = [0, 0], [0, 0]
    bins = [[0, 0.0, 0] for _ in range(10)]
    rows_bins = [[0, 0.0, 0] for _ in range(10)]
    rows8 = [0, 0]
    for r in recs:
        ms = r["members"]
        if not ms:
            continue
        known = r["prompts"] == "exact"
        poisson = r.get("pattern") == "poisson"
        cal = poisson and calibrate
        sse = [m["loss"] + cost * m["inexact"] for m in ms]
        lines = len(ms[0]["windows"]) - 1
        wd = widen(known, min(sse) / max(1, lines)) if poisson else 0.0
        w = weigh(sse, max(1, lines))
        wdt = wd + (count_noise(known, _quantiles([m["count"] for m in ms], w)[1])
                    if poisson and noise else 0.0)
        tot = sum(w)
        true = r["truth"]["preemptions"]
        tc = len(true)
        up = COUNT_UP[known] if poisson and noise else 0.0  # (tried; 0 in the product)
        iv = _interval([m["count"] for m in ms], w, widen=wdt, up=up)
        n += 1
        cover += iv["low"] <= tc <= iv["high"]
        widths.append((iv["high"] - iv["low"], (iv["high"] - iv["low"]) / max(1, tc)))
        tr = r["truth"].get("recomputed_tokens")
        if tr is not None:
            ir = _interval([m["recomputed"] for m in ms], w, widen=wdt, up=up)
            cover_r += ir["low"] <= tr <= ir["high"]
        tp = r["truth"].get("processed_tokens")
        if tr is not None and tp:
            nratio += 1
            iq = _interval([m["recomputed"] / m["processed"] if m["processed"] else 0.0
                            for m in ms], w, digits=4, widen=wdt, up=up)
            cover_q += iq["low"] <= round(tr / tp, 4) <= iq["high"]
        tw = r["truth"].get("windows")
        if tw and len(tw) + 1 == len(ms[0]["windows"]):  # (members: and after the last)
            for k, (_, _, cnt) in enumerate(tw):
                ik = _interval([m["windows"][k] for m in ms], w, widen=wd)
                nwin += 1
                cover_w += ik["low"] <= cnt <= ik["high"]
        victims = {v for _, v in true}
        reqs = set(r["truth"]["requests"]) | victims | {v for m in ms for v in m["by_victim"]}
        base = len(victims) / max(1, len(reqs))
        preq = {}
        for q in reqs:
            p = sum(wi for wi, m in zip(w, ms) if q in m["by_victim"]) / tot
            if cal:
                p = calibrated(p, CALIBRATION[("requests", known)])
                if min(sse) / max(1, lines) >= POOR_FIT:
                    p = min(p, POOR_FIT_P_MAX)
            preq[q] = p
            y = q in victims
            brier += (p - y) ** 2
            brier_base += (base - y) ** 2
            nreq += 1
            b = bins[min(9, int(p * 10))]
            b[0] += 1; b[1] += p; b[2] += y
            for lim, acc in ((0.8, hi8), (0.5, hi5)):
                if p >= lim:
                    acc[0] += 1; acc[1] += y
        for step, v in r["rows"]:
            p = sum(wi for wi, m in zip(w, ms)
                    if any(abs(s - step) <= TOL_STEPS for s in m["by_victim"].get(v, ()))) / tot
            if cal:
                p = min(calibrated(p, CALIBRATION[("rows", known)]), preq.get(v, 0.0))
            y = any(v == tv and abs(step - ts) <= TOL_STEPS for ts, tv in true)
            b = rows_bins[min(9, int(p * 10))]
            b[0] += 1; b[1] += p; b[2] += y
            if p >= 0.8:
                rows8[0] += 1; rows8[1] += y

    def table(bs):
        return [[i / 10, b[0], round(b[1] / b[0], 3) if b[0] else None,
                 round(b[2] / b[0], 3) if b[0] else None] for i, b in enumerate(bs)]

    return {"logs": n, "coverage": round(cover / max(1, n), 3),
            "coverage_recomputed": round(cover_r / max(1, n), 3),
            "coverage_windows": round(cover_w / max(1, nwin), 3),
            "coverage_ratio": round(cover_q / nratio, 3) if nratio else None,
            "mean_width": round(sum(a for a, _ in widths) / max(1, n), 2),
            "mean_rel_width": round(sum(b for _, b in widths) / max(1, n), 3),
            "brier": round(brier / max(1, nreq), 4), "brier_base": round(brier_base / max(1, nreq), 4),
            "requests": nreq,
            "p>=0.8": [hi8[0], round(hi8[1] / max(1, hi8[0]), 3)],
            "p>=0.5": [hi5[0], round(hi5[1] / max(1, hi5[0]), 3)],
            "rows p>=0.8": [rows8[0], round(rows8[1] / max(1, rows8[0]), 3)],
            "reliability": table(bins), "rows": table(rows_bins)}


if __name__ == "__main__":
    sys.exit(main())
