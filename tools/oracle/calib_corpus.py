#!/usr/bin/env python3
"""Write a corpus of vLLM 0.33 logs with known truth, for calibrating the log replay's
uncertainty (dev tool; tools/research/calib_members.py dumps and scores the replay's
ensemble on it).

    python -m tools.oracle.calib_corpus [--out /tmp/calib/corpus] [--only bank|poisson|logcases]

One folder per log, `server.log` and `truth.json`, and `index.json` listing them. Three
groups, each deterministic (running it twice gives identical files):

* bank: the 0.33 oracle bank workloads (tests/data/oracle/0.33/*/workload.json) with at
  least one preemption, simulated as they are (nothing redrawn), rendered with prompts,
  a fixed 8 ms step, stats lines every 1 s (even index) or 2 s (odd index);
* poisson: 48 new Poisson workloads (200-600 requests): FCFS / priority x prefix caching
  off / on x stats every 2 s / 10 s x with / without prompts, 3 seeds each; async
  scheduling on a quarter, the log cases' step-time formula (step times that depend on
  the step) on two thirds, a fixed 8-15 ms step on the rest; the KV pool is shrunk or
  grown until the run has tens of preemptions;
* logcases: tests/data/logcases/*/ (server.log = without prompts, server.reqbody.log =
  with prompts; no iteration lines), their truth converted.

truth.json: name, group, stats_interval_s, with_prompts, requests (N), request_ids (as the
log names them), preemptions [{step, victim, tokens_recomputed, time}], num_preemptions,
recomputed_tokens (sum of `tokens_recomputed` as kvreplay.replay.records.preemption_records
defines it: num_tokens at readmission minus the prefix hit), preempted_requests {id:
count}, windows [[start, end, count]] (preemptions counted by each stats line: start = the
previous line's log time stamp, end = this line's, as epoch seconds of whole-second
stamps; the first line's start is its end minus the interval), plus a few descriptors.
"""
from __future__ import annotations

import argparse
import bisect
import calendar
import collections
import json
import os
import random
import shutil
import sys
import time
from typing import Any, Callable

from kvreplay.replay import parse_workload
from kvreplay.replay import DEFAULT_PROFILE
from kvreplay.replay.engine import Engine, without_cyclic_gc
from kvreplay.replay.records import preemption_records
from tools.oracle.render_log import formula_step_time, render_log, step_starts
from kvreplay.replay.trace import conformance_record

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BANK = os.path.join(ROOT, "tests", "data", "oracle", "0.33")
LOGCASES = os.path.join(ROOT, "tests", "data", "logcases")
START = 1778148060.05  # as tools/research/eval_poisson.py
BANK_STEP_S = 0.008


@without_cyclic_gc
def simulate_both(wl: Any) -> tuple[list[dict[str, Any]], list[Any]]:
    """`simulate`'s conformance trace and the StepRecords of the same run (one run)."""
    engine = Engine(wl, DEFAULT_PROFILE)
    recs, steps = [], []
    for rec in engine.run():
        steps.append(rec)
        recs.append(conformance_record(engine, rec))
    if not engine.summary.completed:
        raise RuntimeError(f"{wl.name}: the run did not complete")
    return recs, steps


def stats_ticks(records: list[dict[str, Any]], step_time_s: float | Callable, start: float,
                interval: float, phase: float) -> list[tuple[float, int]]:
    """(tick, last step the line counts) of every stats line render_log writes (the same
    loop as render_log's)."""
    starts = step_starts(records, step_time_s, start) if callable(step_time_s) else None
    n = len(records)
    last_end = starts[n] if starts is not None else start + n * step_time_s
    tick = start - (start % 1) + phase
    while tick < start:
        tick += interval
    out = []
    while tick <= last_end + 2 * interval:
        if starts is not None:
            k = min(n - 1, bisect.bisect_right(starts, tick) - 2)
        else:
            k = min(n - 1, int((tick - start) / step_time_s) - 1)
        out.append((tick, k))
        tick += interval
    return out


def windows_of(ticks: list[tuple[float, int]], steps: list[int], interval: float
               ) -> list[list[float]]:
    """Preemptions (their steps) per stats line, as [start, end, count] in log seconds."""
    out, prev_k, prev_t = [], -1, None
    for tick, k in ticks:
        end = float(int(tick))  # the line's whole-second stamp
        k = max(prev_k, k)
        count = sum(1 for s in steps if prev_k < s <= k)
        out.append([end - interval if prev_t is None else prev_t, end, count])
        prev_k, prev_t = k, end
    assert sum(w[2] for w in out) == len(steps), "a preemption after the last stats line"
    return out


def truth_of(name: str, group: str, wl: Any, recs: list[dict[str, Any]], steps: list[Any],
             clock: list[float] | None, windows: list[list[float]], interval: float,
             with_prompts: bool, ids: dict[str, str] | None = None, **extra: Any
             ) -> dict[str, Any]:
    ids = ids or {}
    pre = preemption_records(steps, clock)
    from_trace = [(r["step"], p["req"]) for r in recs for p in r.get("preemptions", ())]
    assert from_trace == [(p.step, p.victim) for p in pre], name
    rows = [{"step": p.step, "victim": ids.get(p.victim, p.victim),
             "tokens_recomputed": p.tokens_recomputed or 0, "time": p.time} for p in pre]
    per_req = collections.Counter(r["victim"] for r in rows)
    cfg = wl.config
    return {
        "name": name, "group": group, "stats_interval_s": interval,
        "with_prompts": with_prompts,
        "policy": cfg.policy, "prefix_caching": cfg.enable_prefix_caching,
        "async_scheduling": cfg.async_scheduling, "num_gpu_blocks": cfg.num_gpu_blocks,
        "max_num_seqs": cfg.max_num_seqs, "num_steps": len(recs), **extra,
        "requests": len(wl.requests),
        "request_ids": [ids.get(s.id, s.id) for s in wl.requests],
        "preemptions": rows,
        "num_preemptions": len(rows),
        "recomputed_tokens": sum(r["tokens_recomputed"] for r in rows),
        "preempted_requests": dict(sorted(per_req.items())),
        "windows": windows,
    }


def write_case(out: str, name: str, lines: list[str] | None, truth: dict[str, Any],
               copy_from: str | None = None) -> dict[str, Any]:
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    log = os.path.join(d, "server.log")
    if copy_from is not None:
        shutil.copyfile(copy_from, log)
    else:
        with open(log, "w") as f:
            f.write("\n".join(lines) + "\n")
    with open(os.path.join(d, "truth.json"), "w") as f:
        json.dump(truth, f, indent=1)
        f.write("\n")
    n_stats = sum(1 for line in open(log) if "[loggers.py:335] Engine 000:" in line)
    assert n_stats == len(truth["windows"]), (name, n_stats, len(truth["windows"]))
    return {"name": name, "group": truth["group"], "dir": name,
            "stats_interval_s": truth["stats_interval_s"], "with_prompts": truth["with_prompts"],
            "requests": truth["requests"], "num_preemptions": truth["num_preemptions"]}


def render_case(out: str, name: str, group: str, wl: Any, *, step_time: Any, interval: float,
                phase: float, with_prompts: bool, **extra: Any) -> dict[str, Any] | None:
    recs, steps = simulate_both(wl)
    if not any(s.preemptions for s in steps):
        return None
    lines = render_log(wl, recs, step_time_s=step_time, start=START, stats_interval_s=interval,
                       stats_phase_s=phase, with_prompts=with_prompts)
    if callable(step_time):
        clock = step_starts(recs, step_time, START)[:-1]
    else:
        clock = [START + k * step_time for k in range(len(recs))]
    ticks = stats_ticks(recs, step_time, START, interval, phase)
    pre_steps = [r["step"] for r in recs for _ in r.get("preemptions", ())]
    truth = truth_of(name, group, wl, recs, steps, clock, windows_of(ticks, pre_steps, interval),
                     interval, with_prompts, stats_phase_s=phase, **extra)
    return write_case(out, name, lines, truth)


# -- groups ---------------------------------------------------------------------------

def bank(out: str) -> list[dict[str, Any]]:
    rows = []
    dirs = sorted(d for d in os.listdir(BANK) if os.path.isfile(os.path.join(BANK, d, "workload.json")))
    for i, d in enumerate(dirs):
        wl = parse_workload(json.load(open(os.path.join(BANK, d, "workload.json"))))
        row = render_case(out, f"bank-{d}", "bank", wl, step_time=BANK_STEP_S,
                          interval=1.0 if i % 2 == 0 else 2.0, phase=0.5, with_prompts=True,
                          step_clock="fixed 8 ms", source=f"tests/data/oracle/0.33/{d}")
        if row is not None:
            rows.append(row)
    return rows


def draw_prompt(rng: random.Random, groups: list[list[int]], prefix_caching: bool) -> list[int]:
    """A prompt's token ids: with prefix caching a 100-800-token prefix shared by a group of
    requests (a new group one time in ten; the last 5 groups live, `groups` kept in place)
    plus a 50-1200-token suffix, else 100-2000 tokens of its own."""
    if prefix_caching:
        if not groups or rng.random() < 0.1:
            groups.append([rng.randrange(10, 50000) for _ in range(rng.randrange(100, 800))])
            del groups[:-5]
        return rng.choice(groups) + [rng.randrange(10, 50000) for _ in range(rng.randrange(50, 1200))]
    return [rng.randrange(10, 50000) for _ in range(rng.randrange(100, 2000))]


def poisson_workload(seed: int, n: int, policy: str, pc: bool, asyn: bool, blocks: int,
                     gap: float, seqs: int) -> dict[str, Any]:
    """Prompts 100-2000 tokens (with prefix caching: a 100-800-token prefix shared by a
    group of requests, a handful of groups live at a time, plus a 50-1200-token suffix),
    outputs 50-500, priorities 0-4 under the priority policy, Poisson arrivals over steps
    with mean gap `gap`."""
    rng = random.Random(seed)
    groups: list[list[int]] = []
    reqs = []
    t = 0.0
    for i in range(n):
        prompt = draw_prompt(rng, groups, pc)
        r: dict[str, Any] = {"id": f"r{i}", "arrival_step": int(t), "prompt_token_ids": prompt,
                             "max_tokens": rng.randrange(50, 500)}
        if policy == "priority":
            r["priority"] = rng.randrange(0, 5)
        reqs.append(r)
        t += rng.expovariate(1.0 / gap)
    return {"name": f"poisson_s{seed}",
            "description": f"{n} Poisson requests, mean gap {gap:.2f} steps",
            "config": {"num_gpu_blocks": blocks, "block_size": 16, "max_num_seqs": seqs,
                       "max_num_batched_tokens": 8192, "max_model_len": 4096,
                       "enable_chunked_prefill": True, "enable_prefix_caching": pc,
                       "policy": policy, "async_scheduling": asyn, "max_steps": 200000},
            "requests": reqs}


SEED_BASE = 1000  # --seed-base: another set of Poisson workloads (a held-out check)
# --subset: build only the Poisson logs without prompts of at most this many requests (a
# fixed subset for a before/after on a busy machine: 8 logs per seed base at 200)
SUBSET_MAX_REQUESTS: int | None = None


def poisson(out: str) -> list[dict[str, Any]]:
    model = json.load(open(os.path.join(LOGCASES, "p1_poisson_fcfs_200", "truth.json")))["step_time_model"]
    formula = formula_step_time(model)
    rows = []
    combos = [(pol, pc, iv, wp) for pol in ("fcfs", "priority") for pc in (False, True)
              for iv in (2.0, 10.0) for wp in (True, False)]
    for c, (policy, pc, interval, with_prompts) in enumerate(combos):
        for r in range(3):
            seed = SEED_BASE + 10 * c + r
            rng = random.Random(seed)
            n = 200 + 200 * ((c + 2 * r) % 3)
            if SUBSET_MAX_REQUESTS is not None and (with_prompts or n > SUBSET_MAX_REQUESTS):
                continue
            asyn = (c + r) % 4 == 1
            use_formula = (c + r) % 3 != 2
            blocks = rng.randrange(1500, 2501, 50)
            gap = round(rng.uniform(6.0, 11.0), 2)
            seqs = rng.choice((48, 64, 96))
            phase = round(rng.uniform(0.05, 0.95), 2)
            step_ms = rng.choice((8, 10, 12, 15))
            lo, hi = 15, max(40, n // 4)  # tens of preemptions
            for _ in range(12):  # shrink / grow the pool until the run has tens of preemptions
                wl = parse_workload(poisson_workload(seed, n, policy, pc, asyn, blocks, gap, seqs))
                _, steps = simulate_both(wl)
                k = sum(len(s.preemptions) for s in steps)
                if k < lo:
                    blocks = int(blocks * 0.88)
                elif k > hi:
                    blocks = int(blocks * 1.1)
                else:
                    break
            name = (f"poisson-{policy}-{'pc' if pc else 'nopc'}-{int(interval)}s-"
                    f"{'prompts' if with_prompts else 'noprompts'}-s{seed}")
            row = render_case(out, name, "poisson", wl,
                              step_time=formula if use_formula else step_ms / 1000.0,
                              interval=interval, phase=phase, with_prompts=with_prompts,
                              step_clock="formula p1_poisson_fcfs_200" if use_formula
                              else f"fixed {step_ms} ms", seed=seed, mean_gap_steps=gap)
            if row is not None:
                rows.append(row)
            print(f"  {name}: {n} requests, {row and row['num_preemptions']} preemptions",
                  flush=True)
    return rows


def log_seconds(ts: str, year: int = 2026) -> float:
    return float(calendar.timegm(time.strptime(f"{year}-{ts}", "%Y-%m-%d %H:%M:%S")))


def logcases(out: str) -> list[dict[str, Any]]:
    rows = []
    for case in sorted(os.listdir(LOGCASES)):
        d = os.path.join(LOGCASES, case)
        if not os.path.isfile(os.path.join(d, "truth.json")):
            continue
        t = json.load(open(os.path.join(d, "truth.json")))
        wl = parse_workload(json.load(open(os.path.join(d, "workload.json"))))
        recs, steps = simulate_both(wl)
        ids = {rid: r["log_request_id"] for rid, r in t["requests"].items()}
        mine = [(s.step, p.victim) for s in steps for p in s.preemptions]
        assert mine == [(p["step"], p["victim"]) for p in t["preemptions"]], case
        interval = float(t["stats_interval_s"])
        ends = [log_seconds(s) for s in t["stats_lines"]]
        count = collections.Counter(log_seconds(p["stats_interval_counting_it_ts"])
                                    for p in t["preemptions"])
        windows = [[(ends[i - 1] if i else e - interval), e, count.get(e, 0)]
                   for i, e in enumerate(ends)]
        assert sum(w[2] for w in windows) == len(t["preemptions"]), case
        for fname, wp in (("server.log", False), ("server.reqbody.log", True)):
            truth = truth_of(f"logcases-{case}-{'prompts' if wp else 'noprompts'}", "logcases",
                             wl, recs, steps, t["step_start_sim_time"], windows, interval, wp,
                             ids, source=f"tests/data/logcases/{case}/{fname}",
                             step_clock="formula (the case's own)")
            # the truth's own account of the cost, as a check of the definition
            for row, p in zip(truth["preemptions"], t["preemptions"]):
                assert row["tokens_recomputed"] == p["num_tokens"] - p["prefix_hit_tokens_at_readmission"]
            rows.append(write_case(out, truth["name"], None, truth, copy_from=os.path.join(d, fname)))
    return rows


GROUPS = {"bank": bank, "poisson": poisson, "logcases": logcases}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="/tmp/calib/corpus")
    ap.add_argument("--only", choices=sorted(GROUPS), action="append",
                    help="build only this group (repeatable); index.json keeps the others' rows")
    ap.add_argument("--seed-base", type=int, default=1000,
                    help="seeds of the Poisson workloads: BASE + 10 x combination + replicate "
                         "(another base: a held-out set)")
    ap.add_argument("--subset", type=int, metavar="N",
                    help="Poisson logs without prompts of at most N requests only (a fixed subset)")
    args = ap.parse_args(argv)
    global SEED_BASE, SUBSET_MAX_REQUESTS
    SEED_BASE = args.seed_base
    SUBSET_MAX_REQUESTS = args.subset
    os.makedirs(args.out, exist_ok=True)
    index_path = os.path.join(args.out, "index.json")
    old = json.load(open(index_path))["logs"] if os.path.exists(index_path) else []
    groups = args.only or list(GROUPS)
    rows = [r for r in old if r["group"] not in groups]
    for g in groups:
        t0 = time.time()
        got = GROUPS[g](args.out)
        print(f"{g}: {len(got)} logs, {sum(r['num_preemptions'] for r in got)} preemptions "
              f"({time.time() - t0:.0f} s)", flush=True)
        rows += got
    order = {g: i for i, g in enumerate(GROUPS)}
    rows.sort(key=lambda r: (order[r["group"]], r["name"]))
    with open(index_path, "w") as f:
        json.dump({"logs": rows, "count": len(rows),
                   "per_group": dict(collections.Counter(r["group"] for r in rows))}, f, indent=1)
        f.write("\n")
    print(f"wrote {index_path}: {len(rows)} logs", dict(collections.Counter(r["group"] for r in rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
