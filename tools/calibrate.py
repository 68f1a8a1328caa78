#!/usr/bin/env python3
"""Replay every log of a calibration corpus (tools/calib_corpus.py) and score how well
the replay's uncertainty is calibrated (dev tool).

    python tools/calibrate.py [--corpus /tmp/calib/corpus] [--tag base] [--only poisson]
                              [--limit 6] [--samples N] [--seed S] [--fresh] [--workers 2]

Each log is replayed from the log alone (`read_facts`, the stats interval set as
tools/eval_poisson.py does, `replay_facts(facts[, samples=N][, seed=S])`), in parallel, and
its result cached as one JSON line in /tmp/calib/results/<tag>.jsonl: a log already there
(same --samples/--seed, no error) is not replayed again unless --fresh. The scores are
printed and written to /tmp/calib/report-<tag>.md, overall and per group.

What is scored is the replay's `uncertainty` (a dict: preemptions / recomputed_tokens
{median, low, high} with low-high a 90% interval, requests [{id, p_preempted,
expected_preemptions}], windows [{start, end, median, low, high}], samples, seed) and each
preemption's `probability`. Where the replay has no `uncertainty` yet, a stand-in is
scored instead, and the report says so:
  row probability = `support` when set, else 1.0 for an exact / exact-by-log / consistent
  preemption and 0.5 for an inferred one; a request's p_preempted = the largest
  probability of its rows; the count interval = `estimate` (preemptions low / median /
  high) when set, else the replayed count as a point; recomputed tokens = the replayed sum
  as a point; windows = the replayed preemptions counted between the steps the
  verification puts each stats line at, as a point.

--limit N takes N logs round-robin over the groups (so a small run sees every group).
A log whose replay raised is recorded with its error, left out of the scores, and replayed
again on the next run.
"""
from __future__ import annotations

import argparse
import collections
import json
import math
import multiprocessing as mp
import os
import signal
import statistics
import sys
import time
import traceback
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from matching import match_preemptions  # noqa: E402

BINS = 10
GROUP_ORDER = ("bank", "poisson", "logcases")
STANDIN_CONFIDENCE = {"exact": 1.0, "exact-by-log": 1.0, "consistent": 1.0, "inferred": 0.5}


# -- replaying ------------------------------------------------------------------------

def _alarm(signum: int, frame: Any) -> None:
    raise TimeoutError("replay took longer than --timeout")


def jsonable(x: Any) -> Any:
    return json.loads(json.dumps(x, default=lambda o: getattr(o, "__dict__", str(o))))


def replay_one(job: tuple[str, dict[str, Any], dict[str, Any], int]) -> dict[str, Any]:
    log, truth, kw, timeout = job
    out: dict[str, Any] = {"name": truth["name"], "group": truth["group"], "kw": kw}
    t0 = time.perf_counter()
    try:
        from kvreplay.inference import replay_facts
        from kvreplay.sources import read_facts

        signal.signal(signal.SIGALRM, _alarm)
        signal.alarm(timeout)
        try:
            facts = read_facts([log], year=2026)
            facts.interval_s = truth["stats_interval_s"]
            rep = replay_facts(facts, **kw)
        finally:
            signal.alarm(0)
        out["seconds"] = round(time.perf_counter() - t0, 3)
        unc = getattr(rep, "uncertainty", None)
        if unc is not None and hasattr(unc, "to_json"):
            unc = unc.to_json()
        out["uncertainty"] = jsonable(unc) if unc is not None else None
        out["rows"] = [{"step": p.step, "victim": p.victim,
                        "probability": getattr(p, "probability", None),
                        "support": getattr(p, "support", None), "confidence": p.confidence,
                        "tokens_recomputed": p.tokens_recomputed, "time": p.time}
                       for p in rep.preemptions]
        est = rep.estimate
        out["estimate"] = ({k: est[k] for k in ("preemptions_low", "preemptions_median",
                                                 "preemptions_high") if k in est}
                           if est else None)
        ver = rep.verification or {}
        out["stats_steps"] = [[r.get("time"), r.get("step")] for r in ver.get("lines", ())]
        out["exact_lines"] = ver.get("exact_lines")
        out["pattern"] = rep.info.get("arrival_pattern")
        out["replay_confidence"] = rep.confidence
        out["num_steps"] = len(rep.steps)
        out["error"] = None
    except BaseException as exc:  # noqa: BLE001 - recorded, the run goes on
        if isinstance(exc, KeyboardInterrupt):
            raise
        out["seconds"] = round(time.perf_counter() - t0, 3)
        out["error"] = f"{type(exc).__name__}: {exc}"
        out["traceback"] = traceback.format_exc()[-2000:]
    return out


def load_cache(path: str) -> dict[str, dict[str, Any]]:
    got: dict[str, dict[str, Any]] = {}
    if os.path.exists(path):
        for line in open(path):
            line = line.strip()
            if line:
                r = json.loads(line)
                got[r["name"]] = r  # the last line of a log wins
    return got


def select(index: list[dict[str, Any]], only: list[str] | None, limit: int | None
           ) -> list[dict[str, Any]]:
    logs = [r for r in index if not only or r["group"] in only]
    if limit is None:
        return logs
    by_group: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for r in logs:
        by_group[r["group"]].append(r)
    out: list[dict[str, Any]] = []
    queues = [by_group[g] for g in sorted(by_group, key=lambda g: (g not in GROUP_ORDER, g))]
    i = 0
    while len(out) < limit and any(i < len(q) for q in queues):
        for q in queues:
            if i < len(q) and len(out) < limit:
                out.append(q[i])
        i += 1
    return out


# -- what the replay predicts -----------------------------------------------------------

def point(x: float) -> dict[str, float]:
    return {"median": x, "low": x, "high": x}


def prediction(res: dict[str, Any]) -> dict[str, Any]:
    """The replay's uncertainty in one shape, from `uncertainty` or the stand-in."""
    unc = res.get("uncertainty")
    rows = res["rows"]
    standin_row = [r["support"] if r["support"] is not None
                   else STANDIN_CONFIDENCE.get(r["confidence"], 0.5) for r in rows]
    if unc is not None:
        probs = [r["probability"] if r["probability"] is not None else s
                 for r, s in zip(rows, standin_row)]
        p_req = {q["id"]: float(q.get("p_preempted") or 0.0) for q in unc.get("requests", ())}
        count = unc.get("preemptions") or point(len(rows))
        tokens = unc.get("recomputed_tokens") or point(sum(r["tokens_recomputed"] or 0 for r in rows))
        windows = [(w["start"], w["end"], w["median"], w["low"], w["high"])
                   for w in unc.get("windows", ())]
        return {"standin": False, "rows": probs, "p_req": p_req, "count": count,
                "tokens": tokens, "windows": windows}
    p_req: dict[str, float] = {}
    for r, p in zip(rows, standin_row):
        p_req[r["victim"]] = max(p_req.get(r["victim"], 0.0), p)
    est = res.get("estimate")
    if est and "preemptions_low" in est:
        count = {"median": est.get("preemptions_median", len(rows)),
                 "low": est["preemptions_low"], "high": est["preemptions_high"]}
    else:
        count = point(len(rows))
    windows = []
    prev = -1
    for t, step in res.get("stats_steps") or ():
        if t is None or step is None:
            continue
        c = sum(1 for r in rows if prev < r["step"] <= step)
        windows.append((None, t, c, c, c))
        prev = max(prev, step)
    return {"standin": True, "rows": standin_row, "p_req": p_req, "count": count,
            "tokens": point(sum(r["tokens_recomputed"] or 0 for r in rows)), "windows": windows}


# -- scores -------------------------------------------------------------------------------

def bin_of(p: float) -> int:
    return min(BINS - 1, max(0, int(p * BINS)))


class Acc:
    """Everything one group's scores are made of."""

    def __init__(self) -> None:
        self.logs = 0
        self.standin = 0
        self.seconds: list[float] = []
        self.req_bins = [[0, 0.0, 0] for _ in range(BINS)]  # n, sum p, preempted
        self.brier: list[float] = []
        self.brier_base: list[float] = []
        self.hi = {0.8: [0, 0], 0.5: [0, 0]}  # threshold: [n, preempted]
        self.count: list[tuple[bool, float, float, float]] = []  # covered, width, rel, err
        self.tokens: list[tuple[bool, float, float, float]] = []
        self.row_bins = [[0, 0.0, 0] for _ in range(BINS)]
        self.windows = [0, 0]  # covered, n
        self.true_pre = 0
        self.found = 0
        self.matched = 0

    def add(self, truth: dict[str, Any], res: dict[str, Any]) -> None:
        pred = prediction(res)
        self.logs += 1
        self.standin += pred["standin"]
        self.seconds.append(res["seconds"])
        preempted = set(truth["preempted_requests"])
        base = len(preempted) / max(1, truth["requests"])
        for rid in truth["request_ids"]:
            p = min(1.0, max(0.0, float(pred["p_req"].get(rid, 0.0))))
            y = rid in preempted
            b = self.req_bins[bin_of(p)]
            b[0] += 1
            b[1] += p
            b[2] += y
            self.brier.append((p - y) ** 2)
            self.brier_base.append((base - y) ** 2)
            for th, acc in self.hi.items():
                if p >= th:
                    acc[0] += 1
                    acc[1] += y
        for what, true_v, lst in (("count", truth["num_preemptions"], self.count),
                                  ("tokens", truth["recomputed_tokens"], self.tokens)):
            iv = pred[what]
            lo, hi, med = float(iv["low"]), float(iv["high"]), float(iv["median"])
            lst.append((lo <= true_v <= hi, hi - lo, (hi - lo) / max(1, true_v),
                        abs(med - true_v) / max(1, true_v)))
        true_rows = [(p["step"], p["victim"]) for p in truth["preemptions"]]
        found = [(r["step"], r["victim"]) for r in res["rows"]]
        used = match_preemptions(true_rows, found)
        self.true_pre += len(true_rows)
        self.found += len(found)
        self.matched += len(used)
        for j, p in enumerate(pred["rows"]):
            b = self.row_bins[bin_of(min(1.0, max(0.0, float(p))))]
            b[0] += 1
            b[1] += float(p)
            b[2] += j in used
        # a stats line stamped second S was printed in [S, S+1): the replay's window ends
        # at the line's time (its second, or its second plus the lines' phase)
        by_end = {}
        for w in pred["windows"]:
            by_end.setdefault(math.floor(float(w[1]) + 1e-6), w)
        for start, end, c in truth["windows"]:
            w = by_end.get(math.floor(end + 1e-6))
            lo, hi = (float(w[3]), float(w[4])) if w is not None else (0.0, 0.0)
            self.windows[0] += lo <= c <= hi
            self.windows[1] += 1


def pct(a: float, b: float) -> str:
    return f"{100 * a / b:.1f}%" if b else "-"


def fmt_bins(bins: list[list[float]], what: str) -> list[str]:
    out = [f"| {what} | n | mean predicted | observed |", "|---|---|---|---|"]
    for i, (n, s, y) in enumerate(bins):
        label = f"[{i / BINS:.1f}, {(i + 1) / BINS:.1f}{']' if i == BINS - 1 else ')'}"
        out.append(f"| {label} | {n} | {s / n:.3f} | {y / n:.3f} |" if n
                   else f"| {label} | 0 | - | - |")
    return out


def interval_line(name: str, lst: list[tuple[bool, float, float, float]]) -> str:
    if not lst:
        return f"- {name}: -"
    cov = sum(c for c, *_ in lst)
    return (f"- {name} interval: covers the truth in {cov}/{len(lst)} logs ({pct(cov, len(lst))}; "
            f"target 85-95%), mean width {statistics.mean(w for _, w, _, _ in lst):.1f} "
            f"({100 * statistics.mean(r for *_, r, _ in lst):.1f}% of the true value), "
            f"median relative error of the median {100 * statistics.median(e for *_, e in lst):.1f}%")


def section(title: str, a: Acc) -> list[str]:
    out = [f"## {title}", ""]
    if not a.logs:
        return out + ["(no replayed logs)", ""]
    out.append(f"- logs {a.logs} ({a.standin} scored with the stand-in), mean "
               f"{statistics.mean(a.seconds):.2f} s per replay (median "
               f"{statistics.median(a.seconds):.2f}, max {max(a.seconds):.1f})")
    out.append(f"- preemptions: true {a.true_pre}, replayed {a.found}, matched {a.matched} "
               f"(right victim +-5 steps: {pct(a.matched, a.true_pre)} of the true, "
               f"{pct(a.matched, a.found)} of the replayed)")
    n = len(a.brier)
    out.append(f"- requests {n}: Brier {statistics.mean(a.brier):.4f} (base rate "
               f"{statistics.mean(a.brier_base):.4f})")
    for th in (0.8, 0.5):
        k, y = a.hi[th]
        out.append(f"- p_preempted >= {th}: {k} requests, {y} really preempted "
                   f"({pct(y, k)}{'; target >= 85%' if th == 0.8 else ''})")
    out.append(interval_line("count", a.count))
    out.append(interval_line("recomputed tokens", a.tokens))
    out.append(f"- per-window count interval covers {a.windows[0]}/{a.windows[1]} "
               f"({pct(a.windows[0], a.windows[1])})")
    out += ["", "Per-request p_preempted (observed: preempted at least once):", ""]
    out += fmt_bins(a.req_bins, "p_preempted")
    out += ["", "Per-row probability (observed: a true preemption, same victim +-5 steps):", ""]
    out += fmt_bins(a.row_bins, "probability")
    return out + [""]


def report(selection: list[dict[str, Any]], truths: dict[str, dict[str, Any]],
           results: dict[str, dict[str, Any]], args: argparse.Namespace, wall: float) -> str:
    accs: dict[str, Acc] = collections.defaultdict(Acc)
    errors = []
    for entry in selection:
        name = entry["name"]
        res = results.get(name)
        if res is None:
            continue
        if res.get("error"):
            errors.append((name, res["error"]))
            continue
        t = truths[name]
        keys = ["all", t["group"]]
        if t["group"] == "poisson":
            keys.append(f"poisson, stats every {t['stats_interval_s']:g} s")
        keys.append(f"{t['group']}, {'with' if t['with_prompts'] else 'without'} prompts")
        for k in keys:
            accs[k].add(t, res)
    standin = accs["all"].standin if "all" in accs else 0
    lines = [f"# Calibration report: {args.tag}", "",
             f"corpus {args.corpus}, {len(selection)} logs selected"
             + (f" (--only {','.join(args.only)})" if args.only else "")
             + (f" (--limit {args.limit})" if args.limit else "")
             + f", replay kwargs {kwargs_of(args) or '{}'}, "
             f"{sum(1 for e in selection if e['name'] in results)} with a result, "
             f"{len(errors)} errors; "
             + (f"this run's wall time {wall:.0f} s" if wall >= 1 else "every result from the cache"),
             ""]
    if standin:
        lines += [f"**{standin} logs have no `uncertainty` yet: scored with the stand-in** "
                  "(support / confidence per row, `estimate` or a point for the count; see "
                  "tools/calibrate.py's docstring).", ""]
    order = ["all"] + [g for g in GROUP_ORDER] + sorted(k for k in accs if k not in ("all",) + GROUP_ORDER)
    for k in order:
        if k in accs:
            lines += section(k, accs[k])
    if errors:
        lines += ["## Errors", ""] + [f"- {n}: {e}" for n, e in errors] + [""]
    return "\n".join(lines)


def per_log_table(selection: list[dict[str, Any]], truths: dict[str, dict[str, Any]],
                  results: dict[str, dict[str, Any]]) -> str:
    """One row per replayed log (the report file only)."""
    out = ["## Per log", "",
           "| log | clock | true | replayed | matched +-5 | count interval | covered | "
           "replay steps / true | s |", "|---|---|---|---|---|---|---|---|---|"]
    for e in selection:
        res = results.get(e["name"])
        if res is None or res.get("error"):
            continue
        t = truths[e["name"]]
        pred = prediction(res)
        iv = pred["count"]
        true_rows = [(p["step"], p["victim"]) for p in t["preemptions"]]
        m = len(match_preemptions(true_rows, [(r["step"], r["victim"]) for r in res["rows"]]))
        cov = iv["low"] <= t["num_preemptions"] <= iv["high"]
        out.append(f"| {e['name']} | {t.get('step_clock', '')} | {t['num_preemptions']} | "
                   f"{len(res['rows'])} | {m} | {iv['median']} [{iv['low']}, {iv['high']}] | "
                   f"{'yes' if cov else 'no'} | {res.get('num_steps')} / {t.get('num_steps')} | "
                   f"{res['seconds']:.1f} |")
    return "\n".join(out)


def kwargs_of(args: argparse.Namespace) -> dict[str, Any]:
    kw: dict[str, Any] = {}
    if args.samples is not None:
        kw["samples"] = args.samples
    if args.seed is not None:
        kw["seed"] = args.seed
    return kw


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default="/tmp/calib/corpus")
    ap.add_argument("--tag", default="base")
    ap.add_argument("--only", action="append", choices=GROUP_ORDER, help="a group (repeatable)")
    ap.add_argument("--limit", type=int)
    ap.add_argument("--samples", type=int)
    ap.add_argument("--seed", type=int)
    ap.add_argument("--fresh", action="store_true", help="replay every log again")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per replay")
    ap.add_argument("--results", default="/tmp/calib/results")
    ap.add_argument("--report", help="default /tmp/calib/report-<tag>.md")
    args = ap.parse_args(argv)
    index = json.load(open(os.path.join(args.corpus, "index.json")))["logs"]
    selection = select(index, args.only, args.limit)
    truths = {e["name"]: json.load(open(os.path.join(args.corpus, e["dir"], "truth.json")))
              for e in selection}
    os.makedirs(args.results, exist_ok=True)
    cache_path = os.path.join(args.results, f"{args.tag}.jsonl")
    if args.fresh and os.path.exists(cache_path):
        os.remove(cache_path)
    results = load_cache(cache_path)
    kw = kwargs_of(args)
    todo = [e for e in selection
            if not (e["name"] in results and not results[e["name"]].get("error")
                    and results[e["name"]].get("kw", {}) == kw)]
    # the costly first (no prompts, many requests), so the two workers end together
    todo.sort(key=lambda e: -(e["requests"] * (3 if not e["with_prompts"] else 1)))
    print(f"{len(selection)} logs selected, {len(selection) - len(todo)} cached in {cache_path}, "
          f"{len(todo)} to replay with {args.workers} workers, kwargs {kw}", flush=True)
    t0 = time.time()
    jobs = [(os.path.join(args.corpus, e["dir"], "server.log"), truths[e["name"]], kw,
             args.timeout) for e in todo]
    if jobs:
        with open(cache_path, "a") as cache, \
                mp.get_context("fork").Pool(args.workers, maxtasksperchild=10) as pool:
            for i, res in enumerate(pool.imap_unordered(replay_one, jobs), 1):
                cache.write(json.dumps(res, separators=(",", ":")) + "\n")
                cache.flush()
                results[res["name"]] = res
                t = truths[res["name"]]
                el = time.time() - t0
                what = (f"ERROR {res['error'][:120]}" if res.get("error") else
                        f"true {t['num_preemptions']} replayed {len(res['rows'])}"
                        + ("" if res.get("uncertainty") is not None else " (no uncertainty)"))
                print(f"[{i}/{len(jobs)}] {res['name']}: {res['seconds']:.1f} s, {what}; "
                      f"elapsed {el:.0f} s, eta {el / i * (len(jobs) - i):.0f} s", flush=True)
    wall = time.time() - t0
    text = report(selection, truths, results, args, wall)
    path = args.report or os.path.join(os.path.dirname(args.results.rstrip("/")) or ".",
                                       f"report-{args.tag}.md")
    with open(path, "w") as f:
        f.write(text + "\n\n" + per_log_table(selection, truths, results) + "\n")
    print(text)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
