#!/usr/bin/env python3
"""Generate the oracle case bank: seeded nasty workloads run through vLLM itself.

    python -m tools.oracle.make_oracle_cases --release 0.33 [--out tests/data/oracle]
    python -m tools.oracle.make_oracle_cases --release all
    python -m tools.oracle.make_oracle_cases --release 0.33 --dry-run   # workloads only

Every workload comes from a family function below, seeded by (family, seed),
so a run regenerates the same workloads; the traces are then produced by the
release's real vLLM scheduler (tools/oracle/oracle.py, one process per release) and
written to OUT/<release>/<case>/{workload.json, trace.jsonl.gz, summary.json}.
Workloads on which vLLM does not finish every request within max_steps are
kept apart under OUT/incomplete/<release>/<case>/ (same files) and listed in
the index. OUT/index.json lists every case with its release, family, key
config and what the trace shows (preemptions, rollbacks, self-preemptions,
steps with several preemptions, prefix hits at resume, ...).

Families (each exercised rule is named in the case name):
  fcfs_pressure   FCFS under block pressure (bursts or staggered arrivals)
  prio_rollback   PRIORITY: old low-priority prefills preempted by later
                  high-priority requests (victim already scheduled -> rollback)
  prio_ties       PRIORITY with equal priorities / equal arrival steps
  self_preempt    few requests of equal size: the last running one preempts itself
  multi_preempt   a large chunked prefill that needs many blocks while small
                  requests hold 1-2 blocks each (several victims in one step)
  nochunk         chunked prefill off; prompts larger than the budget left (break
                  from 0.12, skip in 0.11)
  threshold       long_prefill_token_threshold > 0, incl. lone requests
                  (exempt from 0.31)
  maxlen          prompt + max_tokens > max_model_len (cap on running requests,
                  length stop), prompts up to max_model_len - 1
  maxseqs         max_num_seqs 1..3
  tiny_budget     token budgets of 4..24
  prefix          prefix caching with shared prefixes and tight pools; resumed
                  requests hit their own cached blocks, incl. output blocks;
                  fake_token_mode fixed and index
  watermark       watermark > 0 (0.33 only)
  noisl           scheduler_reserve_full_isl false (0.33, 0.19)
  gaps            staggered arrivals with idle gaps
  crowd           30-40 requests, shared prefixes, fixed fake token, tight pool
  overflow        a request longer than the whole pool / prompt == max_model_len
                  (vLLM does not finish: kept under incomplete/)
  async_*         any family with async_scheduling true (suffix `_async`)
"""
from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import random
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
from tools.oracle import oracle  # noqa: E402

RELEASES = ["0.33", "0.19.0", "0.11.0"]
DEFAULT_OUT = HERE.parents[1] / "tests" / "data" / "oracle"


def cdiv(a, b):
    return -(-a // b)


# --------------------------------------------------------------------- helpers
class W:
    """Workload builder."""

    def __init__(self, name, rng, **cfg):
        self.name = name
        self.rng = rng
        self.cfg = dict(cfg)
        self.reqs = []
        self.tok_base = rng.randrange(100, 20000)

    def toks(self, n):
        r = self.rng
        return [r.randrange(10, 30000) for _ in range(n)]

    def add(self, prompt, max_tokens, arrival_step=0, priority=None, rid=None):
        rid = rid or f"r{len(self.reqs)}"
        d = {"id": rid, "arrival_step": int(arrival_step),
             "prompt_token_ids": list(prompt), "max_tokens": int(max_tokens)}
        if priority is not None:
            d["priority"] = int(priority)
        self.reqs.append(d)
        return d

    def build(self, description):
        cfg = {k: v for k, v in self.cfg.items() if v is not None}
        return {"name": self.name, "description": description, "config": cfg,
                "requests": self.reqs}


def arrivals(rng, n, mode):
    """Arrival steps for n requests."""
    if mode == "burst":
        return [0] * n
    if mode == "two_bursts":
        k = rng.randrange(1, n)
        t = rng.randrange(3, 40)
        return [0] * k + [t] * (n - k)
    if mode == "poisson":
        lam = rng.choice([0.3, 0.6, 1.0, 2.0])
        out, t = [], 0
        for _ in range(n):
            out.append(t)
            t += int(rng.expovariate(lam))
        return out
    if mode == "gaps":
        # clusters separated by idle gaps (long enough that the engine drains)
        out, t = [], 0
        while len(out) < n:
            c = min(n - len(out), rng.randrange(1, 6))
            out += [t + rng.randrange(0, 3) for _ in range(c)]
            t += rng.randrange(60, 160)
        return sorted(out)
    raise ValueError(mode)


def fit_pool(w, bs, frac, extra=1):
    """num_gpu_blocks: frac of the total demand, but at least the largest
    request's full sequence + extra blocks (so it can always finish alone)."""
    mml = w.cfg.get("max_model_len") or 2048
    need = [cdiv(min(len(r["prompt_token_ids"]) + r["max_tokens"], mml), bs) for r in w.reqs]
    total = sum(need)
    return max(max(need) + extra, int(total * frac)) + 1  # +1: null block


def common_toggles(rng, release, w, allow_async=True, allow_pc=True):
    """Random toggles that are safe for any family; returns name tags."""
    tags = []
    if allow_pc and "enable_prefix_caching" not in w.cfg and rng.random() < 0.35:
        w.cfg["enable_prefix_caching"] = True
        tags.append("pc")
    if allow_async and rng.random() < 0.3:
        w.cfg["async_scheduling"] = True
        tags.append("async")
    return tags


def finish(w, tags, description, seed):
    name = "_".join([w.name] + [t for t in tags if t] + [f"s{seed}"])
    w.name = name
    return w.build(description)


# -------------------------------------------------------------------- families
def fam_fcfs_pressure(rng, seed, release):
    bs = rng.choice([4, 8, 16])
    n = rng.randrange(8, 31)
    w = W("fcfs_pressure", rng, block_size=bs, policy="fcfs",
          max_num_seqs=rng.choice([8, 16, 32]),
          max_num_batched_tokens=rng.choice([64, 128, 256, 2048]))
    mode = rng.choice(["burst", "poisson", "two_bursts"])
    for a in arrivals(rng, n, mode):
        w.add(w.toks(rng.randrange(5, 120)), rng.randrange(5, 100), a)
    tags = [f"bs{bs}", mode] + common_toggles(rng, release, w)
    w.cfg["num_gpu_blocks"] = fit_pool(w, bs, rng.uniform(0.15, 0.5))
    return finish(w, tags, "FCFS under block pressure: decode-time and prefill-time "
                  "preemptions of running[-1]", seed)


def fam_prio_rollback(rng, seed, release):
    bs = rng.choice([4, 8])
    budget = rng.choice([16, 24, 32, 48, 64])
    thr = rng.choice([0, 0, 4, 8, 12])
    thr = min(thr, budget)
    w = W("prio_rollback", rng, block_size=bs, policy="priority",
          max_num_seqs=rng.choice([4, 8, 16]), max_num_batched_tokens=budget,
          long_prefill_token_threshold=thr or None)
    nlow = rng.randrange(2, 8)
    nhigh = rng.randrange(3, 15)
    for i in range(nlow):  # old, low priority, long prompts: chunked prefills
        w.add(w.toks(rng.randrange(24, 120)), rng.randrange(4, 40),
              rng.randrange(0, 3), priority=rng.choice([2, 3, 5]))
    t = rng.randrange(1, 6)
    for i in range(nhigh):  # later, high priority, short
        w.add(w.toks(rng.randrange(3, 30)), rng.randrange(3, 40), t,
              priority=rng.choice([0, 0, 1]))
        t += rng.choice([0, 0, 1, 2, 4])
    tags = [f"bs{bs}", f"thr{thr}" if thr else "",
            "chunked"] + common_toggles(rng, release, w)
    w.cfg["num_gpu_blocks"] = fit_pool(w, bs, rng.uniform(0.15, 0.4), extra=2)
    return finish(w, tags, "PRIORITY: low-priority requests admitted first are the "
                  "victims of later high-priority requests' failed allocations; a victim "
                  "already scheduled this step is rolled back", seed)


def fam_prio_ties(rng, seed, release):
    bs = rng.choice([4, 8, 16])
    n = rng.randrange(8, 25)
    w = W("prio_ties", rng, block_size=bs, policy="priority",
          max_num_seqs=rng.choice([4, 8, 16]),
          max_num_batched_tokens=rng.choice([32, 64, 2048]))
    steps = sorted(rng.choice([0, 0, 0, 2, 5, 9]) for _ in range(n))
    for a in steps:
        w.add(w.toks(rng.randrange(4, 60)), rng.randrange(4, 60), a,
              priority=rng.choice([0, 1, 1, 2]))
    tags = [f"bs{bs}"] + common_toggles(rng, release, w)
    w.cfg["num_gpu_blocks"] = fit_pool(w, bs, rng.uniform(0.2, 0.45))
    return finish(w, tags, "PRIORITY with many equal priorities and equal arrival "
                  "steps: ties broken by arrival_time (list index), victims are "
                  "max(priority, arrival)", seed)


def fam_self_preempt(rng, seed, release):
    bs = rng.choice([4, 8, 16])
    n = rng.randrange(3, 7)
    plen = rng.randrange(bs, 4 * bs)
    mt = rng.randrange(2 * bs, 6 * bs)
    policy = rng.choice(["fcfs", "fcfs", "priority"])
    w = W("self_preempt", rng, block_size=bs, policy=policy,
          max_num_seqs=16, max_num_batched_tokens=2048)
    for i in range(n):
        pr = (i % 2) if policy == "priority" else None
        w.add(w.toks(plen), mt, 0, priority=pr)
    # every request holds cdiv(plen+1, bs) blocks after admission; give the pool
    # just enough for all to be admitted and a little more
    per = cdiv(plen, bs)
    w.cfg["num_gpu_blocks"] = n * per + rng.randrange(0, 3) + 1
    w.cfg["num_gpu_blocks"] = max(w.cfg["num_gpu_blocks"], cdiv(plen + mt, bs) + 2)
    tags = [policy, f"bs{bs}"] + common_toggles(rng, release, w)
    return finish(w, tags, "Equal-sized requests admitted together: when the last "
                  "running request needs a block it is its own victim", seed)


def fam_multi_preempt(rng, seed, release):
    bs = rng.choice([4, 8])
    budget = rng.choice([48, 64, 96])
    policy = rng.choice(["fcfs", "fcfs", "priority"])
    w = W("multi_preempt", rng, block_size=bs, policy=policy,
          max_num_seqs=rng.choice([16, 32]), max_num_batched_tokens=budget)
    big = rng.randrange(150, 400)
    w.add(w.toks(big), rng.randrange(2, 20), 0, priority=0 if policy == "priority" else None)
    nsmall = rng.randrange(8, 25)
    for i in range(nsmall):
        w.add(w.toks(rng.randrange(2, 2 * bs)), rng.randrange(4, 4 * bs),
              rng.choice([0, 0, 1, 2]), priority=rng.choice([1, 2]) if policy == "priority" else None)
    nbig_blocks = cdiv(big + 20, bs)
    w.cfg["num_gpu_blocks"] = nbig_blocks + rng.randrange(2, 10) + 1
    tags = [policy, f"bs{bs}"] + common_toggles(rng, release, w)
    return finish(w, tags, "A long chunked prefill needing many blocks per chunk "
                  "while small requests hold 1-2 blocks each: several preemptions "
                  "in one step", seed)


def fam_nochunk(rng, seed, release):
    bs = rng.choice([4, 8, 16])
    budget = rng.choice([32, 48, 64, 128])
    w = W("nochunk", rng, block_size=bs, policy=rng.choice(["fcfs", "priority"]),
          enable_chunked_prefill=False, max_num_seqs=rng.choice([4, 8, 16]),
          max_num_batched_tokens=budget)
    n = rng.randrange(6, 25)
    mode = rng.choice(["burst", "poisson", "two_bursts"])
    prio = w.cfg["policy"] == "priority"
    for a in arrivals(rng, n, mode):
        # mix of prompts near the budget and small ones
        p = rng.choice([rng.randrange(budget // 2, budget), rng.randrange(2, budget // 4 + 3)])
        p = min(p, budget - 1)
        w.add(w.toks(p), rng.randrange(2, 40), a, priority=rng.choice([0, 1]) if prio else None)
    tags = [w.cfg["policy"], f"bs{bs}", mode] + common_toggles(rng, release, w)
    w.cfg["num_gpu_blocks"] = fit_pool(w, bs, rng.uniform(0.15, 0.6))
    return finish(w, tags, "Chunked prefill off: a waiting prompt larger than the "
                  "token budget left this step ends the waiting scan (0.12+; 0.11 skips "
                  "it and keeps scanning)", seed)


def fam_threshold(rng, seed, release):
    bs = rng.choice([4, 8, 16])
    thr = rng.choice([4, 8, 16, 32])
    w = W("threshold", rng, block_size=bs, policy=rng.choice(["fcfs", "priority"]),
          max_num_seqs=rng.choice([4, 8, 16]),
          max_num_batched_tokens=rng.choice([32, 64, 256]),
          long_prefill_token_threshold=thr)
    prio = w.cfg["policy"] == "priority"
    # a lone request first (threshold exempt from 0.31), then a crowd, then
    # another lone request after an idle gap
    w.add(w.toks(rng.randrange(40, 200)), rng.randrange(3, 30), 0,
          priority=1 if prio else None)
    t = rng.randrange(5, 40)
    for i in range(rng.randrange(3, 12)):
        w.add(w.toks(rng.randrange(8, 150)), rng.randrange(3, 30), t + rng.randrange(0, 4),
              priority=rng.choice([0, 1, 2]) if prio else None)
    w.add(w.toks(rng.randrange(40, 200)), rng.randrange(3, 30), t + 400,
          priority=0 if prio else None)
    w.reqs.sort(key=lambda r: r["arrival_step"])
    for i, r in enumerate(w.reqs):
        r["id"] = f"r{i}"
    tags = [w.cfg["policy"], f"thr{thr}", f"bs{bs}"] + common_toggles(rng, release, w)
    w.cfg["num_gpu_blocks"] = fit_pool(w, bs, rng.uniform(0.25, 0.7))
    return finish(w, tags, "long_prefill_token_threshold > 0 with a lone request at "
                  "the start and after an idle gap (exempt from 0.31, chunked by the "
                  "threshold before)", seed)


def fam_maxlen(rng, seed, release):
    bs = rng.choice([4, 8, 16])
    mml = rng.choice([32, 48, 64, 100, 128])
    w = W("maxlen", rng, block_size=bs, policy=rng.choice(["fcfs", "priority"]),
          max_num_seqs=rng.choice([4, 8, 16]),
          max_num_batched_tokens=rng.choice([16, 32, 128, 2048]),
          max_model_len=mml)
    prio = w.cfg["policy"] == "priority"
    n = rng.randrange(6, 20)
    for a in arrivals(rng, n, rng.choice(["burst", "poisson"])):
        p = rng.choice([rng.randrange(1, mml), mml - 1, mml - 2, rng.randrange(1, mml // 2)])
        w.add(w.toks(p), rng.randrange(1, mml), a, priority=rng.choice([0, 1]) if prio else None)
    if w.cfg["max_num_batched_tokens"] < w.cfg["max_num_seqs"]:
        w.cfg["max_num_batched_tokens"] = w.cfg["max_num_seqs"]
    tags = [f"mml{mml}", f"bs{bs}"] + common_toggles(rng, release, w)
    w.cfg["num_gpu_blocks"] = fit_pool(w, bs, rng.uniform(0.1, 0.5))
    return finish(w, tags, "prompt + max_tokens > max_model_len: running requests are "
                  "capped at max_model_len and stop by length; prompts up to "
                  "max_model_len - 1", seed)


def fam_maxseqs(rng, seed, release):
    bs = rng.choice([4, 8, 16])
    w = W("maxseqs", rng, block_size=bs, policy=rng.choice(["fcfs", "priority"]),
          max_num_seqs=rng.choice([1, 2, 3]),
          max_num_batched_tokens=rng.choice([8, 32, 2048]))
    prio = w.cfg["policy"] == "priority"
    n = rng.randrange(5, 16)
    for a in arrivals(rng, n, rng.choice(["burst", "poisson"])):
        w.add(w.toks(rng.randrange(2, 60)), rng.randrange(2, 30), a,
              priority=rng.choice([0, 1, 2]) if prio else None)
    tags = [f"seqs{w.cfg['max_num_seqs']}", f"bs{bs}"] + common_toggles(rng, release, w)
    w.cfg["num_gpu_blocks"] = fit_pool(w, bs, rng.uniform(0.3, 1.0))
    return finish(w, tags, "max_num_seqs of 1..3 limits admission", seed)


def fam_tiny_budget(rng, seed, release):
    bs = rng.choice([4, 8, 16])
    budget = rng.choice([4, 6, 8, 12, 16, 24])
    w = W("tiny_budget", rng, block_size=bs, policy=rng.choice(["fcfs", "priority"]),
          max_num_seqs=min(budget, rng.choice([2, 4, 8])), max_num_batched_tokens=budget)
    prio = w.cfg["policy"] == "priority"
    n = rng.randrange(5, 15)
    for a in arrivals(rng, n, rng.choice(["burst", "poisson"])):
        w.add(w.toks(rng.randrange(1, 50)), rng.randrange(1, 25), a,
              priority=rng.choice([0, 1]) if prio else None)
    tags = [f"b{budget}", f"bs{bs}"] + common_toggles(rng, release, w)
    w.cfg["num_gpu_blocks"] = fit_pool(w, bs, rng.uniform(0.1, 0.6))
    return finish(w, tags, "Token budgets of 4..24: prefills chunked to the budget "
                  "left after decodes", seed)


def fam_prefix(rng, seed, release):
    bs = rng.choice([4, 8, 16])
    mode = rng.choice(["index", "fixed"])
    w = W("prefix", rng, block_size=bs, policy=rng.choice(["fcfs", "fcfs", "priority"]),
          enable_prefix_caching=True, max_num_seqs=rng.choice([8, 16]),
          max_num_batched_tokens=rng.choice([32, 64, 256, 2048]),
          fake_token_mode=mode, fixed_token=rng.randrange(1, 50) if mode == "fixed" else None)
    prio = w.cfg["policy"] == "priority"
    ngroups = rng.randrange(1, 5)
    prefixes = [w.toks(bs * rng.randrange(1, 7) + rng.choice([0, 0, 1, bs // 2]))
                for _ in range(ngroups)]
    n = rng.randrange(6, 25)
    mode_a = rng.choice(["burst", "poisson", "two_bursts"])
    for a in arrivals(rng, n, mode_a):
        g = rng.randrange(ngroups)
        suffix = w.toks(rng.choice([0, 0, rng.randrange(1, 3 * bs)]))
        # long outputs so that outputs fill hashed blocks before preemption
        w.add(prefixes[g] + suffix, rng.randrange(bs, 6 * bs), a,
              priority=rng.choice([0, 1, 2]) if prio else None)
    tags = [mode, f"bs{bs}", w.cfg["policy"]] + common_toggles(rng, release, w, allow_pc=False)
    w.cfg["num_gpu_blocks"] = fit_pool(w, bs, rng.uniform(0.08, 0.3))
    return finish(w, tags, "Prefix caching: groups sharing prefixes (some identical "
                  "prompts), tight pool; resumed requests hit their own cached prompt "
                  "and output blocks; fake tokens " + mode, seed)


def fam_watermark(rng, seed, release):
    bs = rng.choice([4, 8, 16])
    wm = rng.choice([0.01, 0.05, 0.1, 0.2])
    w = W("watermark", rng, block_size=bs, policy=rng.choice(["fcfs", "priority"]),
          max_num_seqs=16, max_num_batched_tokens=rng.choice([32, 64, 2048]), watermark=wm)
    prio = w.cfg["policy"] == "priority"
    n = rng.randrange(6, 25)
    for a in arrivals(rng, n, rng.choice(["burst", "poisson", "two_bursts"])):
        w.add(w.toks(rng.randrange(3, 100)), rng.randrange(3, 60), a,
              priority=rng.choice([0, 1]) if prio else None)
    tags = [f"wm{int(wm * 100)}", f"bs{bs}"] + common_toggles(rng, release, w)
    w.cfg["num_gpu_blocks"] = fit_pool(w, bs, rng.uniform(0.2, 0.6), extra=1 + int(wm * 60))
    return finish(w, tags, "watermark > 0: admissions (while something runs) need "
                  "int(watermark*N) spare blocks", seed)


def fam_noisl(rng, seed, release):
    bs = rng.choice([4, 8, 16])
    w = W("noisl", rng, block_size=bs, policy=rng.choice(["fcfs", "priority"]),
          max_num_seqs=16, max_num_batched_tokens=rng.choice([16, 32, 64]),
          scheduler_reserve_full_isl=False)
    prio = w.cfg["policy"] == "priority"
    n = rng.randrange(5, 20)
    for a in arrivals(rng, n, rng.choice(["burst", "poisson", "two_bursts"])):
        w.add(w.toks(rng.randrange(10, 200)), rng.randrange(3, 40), a,
              priority=rng.choice([0, 1]) if prio else None)
    tags = [w.cfg["policy"], f"bs{bs}"] + common_toggles(rng, release, w)
    w.cfg["num_gpu_blocks"] = fit_pool(w, bs, rng.uniform(0.2, 0.5))
    return finish(w, tags, "scheduler_reserve_full_isl false: chunked prefills and "
                  "resumes admitted when only their first chunk fits", seed)


def fam_gaps(rng, seed, release):
    bs = rng.choice([4, 8, 16])
    w = W("gaps", rng, block_size=bs, policy=rng.choice(["fcfs", "priority"]),
          max_num_seqs=rng.choice([4, 16]), max_num_batched_tokens=rng.choice([32, 2048]))
    prio = w.cfg["policy"] == "priority"
    n = rng.randrange(5, 16)
    for a in arrivals(rng, n, "gaps"):
        w.add(w.toks(rng.randrange(3, 80)), rng.randrange(2, 40), a,
              priority=rng.choice([0, 1]) if prio else None)
    tags = [f"bs{bs}"] + common_toggles(rng, release, w)
    w.cfg["num_gpu_blocks"] = fit_pool(w, bs, rng.uniform(0.3, 0.8))
    return finish(w, tags, "Staggered clusters of arrivals with idle gaps "
                  "(idle iterations in between)", seed)


def fam_overflow(rng, seed, release):
    """Workloads at the edges of what vLLM accepts; some it never finishes
    (kept under incomplete/ as a record of what it does)."""
    bs = rng.choice([4, 8])
    kind = ["pool", "mml_chunked", "mml_chunked_async", "mml_full"][(seed - 1) % 4]
    if kind == "pool":
        w = W("overflow_pool", rng, block_size=bs, max_num_batched_tokens=32,
              max_steps=300, num_gpu_blocks=9)
        w.add(w.toks(20), 8 * bs, 0)  # needs more than 8 usable blocks
        w.add(w.toks(6), 4, 1)
        desc = "one request's full sequence needs more blocks than the pool has"
    else:
        mml = 32
        budget = 32 if kind == "mml_full" else 16
        w = W("overflow_" + kind, rng, block_size=bs, max_model_len=mml,
              max_num_batched_tokens=budget, max_steps=300, num_gpu_blocks=40,
              async_scheduling=(kind == "mml_chunked_async") or None)
        w.add(w.toks(mml), 4, 0)  # prompt == max_model_len
        w.add(w.toks(5), 4, 0)
        w.add(w.toks(mml - 1), 3, 2)
        desc = ("a prompt of exactly max_model_len tokens (the frontend would reject "
                f"it), token budget {budget}")
    tags = [f"bs{bs}"]
    return finish(w, tags, desc, seed)


def fam_crowd(rng, seed, release):
    """30-40 requests, shared prefixes, fixed fake tokens (output blocks of
    requests with the same prompt hash identically), tight pool."""
    bs = rng.choice([4, 8, 16])
    w = W("crowd", rng, block_size=bs, policy=rng.choice(["fcfs", "priority"]),
          enable_prefix_caching=True, max_num_seqs=rng.choice([16, 32]),
          max_num_batched_tokens=rng.choice([64, 128, 512]),
          fake_token_mode="fixed", fixed_token=rng.randrange(1, 50))
    prio = w.cfg["policy"] == "priority"
    prefixes = [w.toks(bs * rng.randrange(1, 5)) for _ in range(rng.randrange(2, 5))]
    n = rng.randrange(30, 41)
    for a in arrivals(rng, n, rng.choice(["burst", "poisson", "two_bursts"])):
        p = rng.choice(prefixes) + w.toks(rng.choice([0, rng.randrange(1, 2 * bs)]))
        w.add(p, rng.randrange(bs, 5 * bs), a, priority=rng.choice([0, 1, 2]) if prio else None)
    tags = [w.cfg["policy"], f"bs{bs}"] + common_toggles(rng, release, w, allow_pc=False)
    w.cfg["num_gpu_blocks"] = fit_pool(w, bs, rng.uniform(0.08, 0.25))
    return finish(w, tags, "30-40 requests with shared prefixes and identical prompts, "
                  "fixed fake token (output blocks shared across requests), tight pool", seed)


FAMILIES = {
    # family: (function, seeds per release {rel: n}, releases)
    "fcfs_pressure": (fam_fcfs_pressure, 16),
    "prio_rollback": (fam_prio_rollback, 24),
    "prio_ties": (fam_prio_ties, 10),
    "self_preempt": (fam_self_preempt, 10),
    "multi_preempt": (fam_multi_preempt, 12),
    "nochunk": (fam_nochunk, 10),
    "threshold": (fam_threshold, 8),
    "maxlen": (fam_maxlen, 10),
    "maxseqs": (fam_maxseqs, 6),
    "tiny_budget": (fam_tiny_budget, 8),
    "prefix": (fam_prefix, 20),
    "watermark": (fam_watermark, 10),
    "noisl": (fam_noisl, 10),
    "gaps": (fam_gaps, 5),
    "overflow": (fam_overflow, 4),
    "crowd": (fam_crowd, 8),
}
UNSUPPORTED_FAMILIES = {"0.33": set(), "0.19.0": {"watermark"},
                        "0.11.0": {"watermark", "noisl"}}


def spec_examples():
    """Hand-written workloads of spec A12 examples 1-3 and A11.3 (trace step k
    = spec step k+1)."""
    ex = {}
    common = {"max_model_len": 256, "max_num_seqs": 16, "enable_chunked_prefill": True,
              "block_size": 4}
    ex["spec_a12_ex1_fcfs_decode_preempt"] = {
        "name": "spec_a12_ex1_fcfs_decode_preempt",
        "description": "Spec A12 example 1: FCFS decode-time preemption, caching off",
        "config": dict(common, num_gpu_blocks=5, max_num_batched_tokens=64),
        "requests": [
            {"id": "A", "arrival_step": 0, "prompt_token_ids": list(range(1, 7)), "max_tokens": 6},
            {"id": "B", "arrival_step": 0, "prompt_token_ids": list(range(11, 17)), "max_tokens": 6},
        ]}
    ex["spec_a12_ex2_self_preempt_prefix"] = {
        "name": "spec_a12_ex2_self_preempt_prefix",
        "description": "Spec A12 example 2: FCFS, prefix caching, self-preemption, "
                       "readmission with a prefix hit",
        "config": dict(common, num_gpu_blocks=6, max_num_batched_tokens=64,
                       enable_prefix_caching=True),
        "requests": [
            {"id": "A", "arrival_step": 0, "prompt_token_ids": list(range(1, 9)), "max_tokens": 3},
            {"id": "B", "arrival_step": 0, "prompt_token_ids": list(range(11, 19)), "max_tokens": 3},
        ]}
    ex["spec_a12_ex3_prio_rollback_resume"] = {
        "name": "spec_a12_ex3_prio_rollback_resume",
        "description": "Spec A12 example 3: PRIORITY, chunked prefill, rollback of an "
                       "already-scheduled mid-prefill victim, resume from cached chunks",
        "config": dict(common, num_gpu_blocks=6, max_num_batched_tokens=8, max_num_seqs=4,
                       long_prefill_token_threshold=4, enable_prefix_caching=True,
                       policy="priority"),
        "requests": [
            {"id": "L", "arrival_step": 0, "prompt_token_ids": list(range(1, 17)),
             "max_tokens": 2, "priority": 1},
            {"id": "H", "arrival_step": 1, "prompt_token_ids": list(range(101, 105)),
             "max_tokens": 3, "priority": 0},
        ]}
    ex["spec_a11_3_stale_hash_rollback"] = {
        "name": "spec_a11_3_stale_hash_rollback",
        "description": "Spec A11.3: blocks a rolled-back victim got in the step keep "
                       "their hashes; L's readmission hits 24 tokens through them",
        "config": dict(common, num_gpu_blocks=9, max_num_batched_tokens=12, max_num_seqs=4,
                       long_prefill_token_threshold=8, enable_prefix_caching=True,
                       policy="priority"),
        "requests": [
            {"id": "L", "arrival_step": 0, "prompt_token_ids": list(range(1, 29)),
             "max_tokens": 3, "priority": 1},
            {"id": "H", "arrival_step": 1, "prompt_token_ids": list(range(101, 105)),
             "max_tokens": 3, "priority": 0},
        ]}
    return ex


def gen_workloads(release: str) -> dict[str, tuple[str, dict]]:
    """name -> (family, workload) for a release (deterministic)."""
    out = {}
    for fam, (fn, nseeds) in FAMILIES.items():
        if fam in UNSUPPORTED_FAMILIES[release]:
            continue
        for seed in range(1, nseeds + 1):
            rng = random.Random(f"{fam}:{seed}")
            wl = fn(rng, seed, release)
            if fam == "noisl" and release == "0.11.0":
                continue
            wl["config"].setdefault("max_steps", 3000)
            out[wl["name"]] = (fam, wl)
    for name, wl in spec_examples().items():
        out[name] = ("spec_example", wl)
    return out


# -------------------------------------------------------------------- analysis
def analyse(trace: list[dict], summary: dict, release: str, wl: dict) -> dict:
    """What the trace shows: counts used for the index and selection."""
    plen = {r["id"]: len(r["prompt_token_ids"]) for r in wl["requests"]}
    c = wl["config"]
    mml = c.get("max_model_len") or (2048 if c.get("enable_chunked_prefill", True)
                                     else min(2048, c.get("max_num_batched_tokens", 2048)))
    over_mml = sum(1 for r in wl["requests"]
                   if len(r["prompt_token_ids"]) + r["max_tokens"] > mml)
    into_outputs = 0
    prev_running: list = []
    rollbacks = multi_steps = resume_hits = resume_hit_tokens = idle = 0
    max_pre = 0
    prio_continue = 0
    for rec in trace:
        pre = rec.get("preemptions", [])
        if len(pre) >= 2:
            multi_steps += 1
        max_pre = max(max_pre, len(pre))
        for p in pre:
            v, t = p["req"], p["trigger"]
            if t is not None and t != v and v in prev_running and t in prev_running \
                    and prev_running.index(v) < prev_running.index(t):
                rollbacks += 1
        # a self-preempted request followed by more scheduling of running
        # requests later in the list (0.33 PRIORITY "continue")
        for p in pre:
            if p["self_preempt"] and p["req"] in prev_running:
                later = prev_running[prev_running.index(p["req"]) + 1:]
                if any(r in later for r in rec.get("running_scheduled", [])):
                    prio_continue += 1
        for rid in rec.get("resumed", []):
            h = rec["prefix_hit_tokens"].get(rid, 0)
            if h > 0:
                resume_hits += 1
                if h > plen[rid]:
                    into_outputs += 1
                resume_hit_tokens += h
        if rec.get("idle"):
            idle += 1
        prev_running = rec.get("running", prev_running)
    return {
        "num_steps": summary["num_steps"],
        "completed": summary["completed"],
        "preemptions": summary["total_preemptions"],
        "self_preemptions": summary["self_preemptions"],
        "requests_preempted": summary["requests_preempted"],
        "rollbacks": rollbacks,
        "steps_with_multiple_preemptions": multi_steps,
        "max_preemptions_in_a_step": max_pre,
        "self_preempt_then_continue": prio_continue,
        "resumes_with_prefix_hit": resume_hits,
        "resume_prefix_hit_tokens": resume_hit_tokens,
        "resume_hits_into_output_blocks": into_outputs,
        "total_prefix_hit_tokens": summary["total_prefix_hit_tokens"],
        "idle_steps": idle,
        "requests_over_max_model_len": over_mml,
    }


KEY_CFG = ["num_gpu_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens",
           "max_model_len", "enable_chunked_prefill", "enable_prefix_caching", "policy",
           "long_prefill_token_threshold", "scheduler_reserve_full_isl", "watermark",
           "async_scheduling", "fake_token_mode"]


def write_case(d: Path, wl: dict, trace_path: Path, summary: dict):
    d.mkdir(parents=True, exist_ok=True)
    with open(d / "workload.json", "w") as f:
        # compact but diffable: one request per line
        f.write("{\n")
        f.write(f' "name": {json.dumps(wl["name"])},\n')
        f.write(f' "description": {json.dumps(wl["description"])},\n')
        f.write(f' "config": {json.dumps(wl["config"], sort_keys=True)},\n')
        f.write(' "requests": [\n')
        f.write(",\n".join("  " + json.dumps(r, separators=(",", ":")) for r in wl["requests"]))
        f.write("\n ]\n}\n")
    raw = trace_path.read_bytes()
    with open(d / "trace.jsonl.gz", "wb") as f:
        # mtime=0: byte-identical output for identical traces
        with gzip.GzipFile(fileobj=f, mode="wb", compresslevel=9, mtime=0, filename="") as g:
            g.write(raw)
    with open(d / "summary.json", "w") as f:
        json.dump(summary, f, indent=1, sort_keys=True)
        f.write("\n")


def run_release(release: str, out_root: Path, dry_run: bool = False, max_case_kb: int = 200):
    release = oracle.canon_release(release)
    wls = gen_workloads(release)
    print(f"[{release}] {len(wls)} workloads generated", flush=True)
    if dry_run:
        d = out_root / "_dry" / release
        for name, (fam, wl) in wls.items():
            (d / name).mkdir(parents=True, exist_ok=True)
            (d / name / "workload.json").write_text(json.dumps(wl))
        return []
    import tempfile
    with tempfile.TemporaryDirectory(prefix="kvr-cases-") as tmp:
        tmp = Path(tmp)
        jobs = []
        for name, (fam, wl) in wls.items():
            cd = tmp / name
            cd.mkdir()
            (cd / "workload.json").write_text(json.dumps(wl))
            jobs.append({"workload": str(cd / "workload.json"), "out": str(cd / "trace.jsonl"),
                         "summary": str(cd / "summary.json"), "meta": str(cd / "meta.json")})
        recs = oracle._run_batch_jobs(release, jobs, timeout=120)
        rel_dir = out_root / release
        inc_dir = out_root / "incomplete" / release
        for d in (rel_dir, inc_dir):
            if d.exists():
                shutil.rmtree(d)
        index = []
        for (name, (fam, wl)), job, rec in zip(wls.items(), jobs, recs):
            entry = {"case": name, "release": release, "family": fam, "status": rec["status"],
                     "config": {k: wl["config"][k] for k in KEY_CFG if k in wl["config"]},
                     "num_requests": len(wl["requests"])}
            if rec["status"] in ("ok", "incomplete"):
                trace = oracle._read_jsonl(Path(job["out"]))
                summary = json.loads(Path(job["summary"]).read_text())
                entry.update(analyse(trace, summary, release, wl))
                dest = (rel_dir if rec["status"] == "ok" else inc_dir) / name
                write_case(dest, wl, Path(job["out"]), summary)
                kb = (dest / "trace.jsonl.gz").stat().st_size / 1024
                entry["trace_gz_kb"] = round(kb, 1)
                entry["path"] = str(dest.relative_to(out_root))
                if kb > max_case_kb:
                    shutil.rmtree(dest)
                    entry["status"] = "dropped_too_big"
                    entry.pop("path")
            else:
                entry["error"] = (rec["error"] or "")[-2000:]
            index.append(entry)
            print(f"  {entry['status']:10s} {name}: steps={entry.get('num_steps')} "
                  f"pre={entry.get('preemptions')} self={entry.get('self_preemptions')} "
                  f"rb={entry.get('rollbacks')} multi={entry.get('steps_with_multiple_preemptions')} "
                  f"rhit={entry.get('resumes_with_prefix_hit')} kb={entry.get('trace_gz_kb')}",
                  flush=True)
    return index


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--release", default="0.33", help="0.33 | 0.19.0 | 0.11.0 | all")
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args(argv)
    out_root = Path(args.out)
    rels = RELEASES if args.release == "all" else [oracle.canon_release(args.release)]
    idx_path = out_root / "index.json"
    index = json.loads(idx_path.read_text()) if idx_path.exists() else []
    for rel in rels:
        entries = run_release(rel, out_root, dry_run=args.dry_run)
        if args.dry_run:
            continue
        index = [e for e in index if e["release"] != rel] + entries
    if not args.dry_run:
        index.sort(key=lambda e: (RELEASES.index(e["release"]), e["case"]))
        with open(idx_path, "w") as f:
            f.write("[\n" + ",\n".join(json.dumps(e, sort_keys=True) for e in index) + "\n]\n")
        for rel in rels:
            es = [e for e in index if e["release"] == rel]
            ok = [e for e in es if e["status"] == "ok"]
            print(f"[{rel}] ok={len(ok)} of {len(es)}; "
                  f"with preemption={sum(1 for e in ok if e['preemptions'])}, "
                  f"rollback={sum(1 for e in ok if e['rollbacks'])}, "
                  f"self={sum(1 for e in ok if e['self_preemptions'])}, "
                  f"multi={sum(1 for e in ok if e['steps_with_multiple_preemptions'])}, "
                  f"resume-hit={sum(1 for e in ok if e['resumes_with_prefix_hit'])}, "
                  f"resume-hit-into-outputs={sum(1 for e in ok if e['resumes_with_prefix_hit'] and e['resume_hits_into_output_blocks'])}, "
                  f"self-then-continue={sum(1 for e in ok if e['self_preempt_then_continue'])}; "
                  f"not ok: {[(e['case'], e['status']) for e in es if e['status'] != 'ok']}")


if __name__ == "__main__":
    main()
