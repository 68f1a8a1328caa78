#!/usr/bin/env python3
"""Write a corpus of stats-line vLLM 0.33 logs driven by production-like traffic, with known
truth, for calibrating and testing the stats-line replay's uncertainty (dev tool).

    python -m tools.oracle.calib_traffic [--out /tmp/calib/traffic] [--requests 150] [--seed-base 31000]
    python -m tools.research.calib_members dump --corpus /tmp/calib/traffic --out /tmp/calib/traffic.members
    python -m tools.research.calib_members product --out /tmp/calib/traffic.members --split heldout

Each log: request lines (`Received request`/`Added request`, with the JSON body or
without), stats lines, no Iteration lines; rendered (tools/oracle/render_log.py) from our scheduler's
run (== vLLM's step for step) with the layout of tools/oracle/calib_corpus.py (server.log,
truth.json, index.json). What varies:

* arrivals: Poisson; on-off bursts (a burst of requests a step or two apart, then an idle
  gap of 4-15 s in which the engine runs dry); a rate ramp (the mean gap falls from 3x to
  1/2x); a closed loop (C clients, each sending its next request a think time after its
  last one finished, run by the engine's own `submit`); and a public production trace:
  Mooncake's conversation trace (tools/oracle/data/mooncake_conversation_head.csv, its first 132
  requests; its 3-second clumps resampled with replacement, lengths / 8, the shared first
  block as a 64-token common prefix);
* lengths: uniform (prompts 100-2000, outputs 50-500), log-normal (prompt median 500,
  sigma 1; output median 150, sigma 0.8) and code-like (Pareto prompts, alpha 1.1 from 200
  tokens, capped at 3500; outputs 4-80 tokens);
* FCFS / priority (0-4), prefix caching off / on (groups sharing a prefix), sync / async;
  stats lines every 2 s or 10 s; p1's step-time formula (idle iterations 10 ms) or a
  fixed 8-15 ms step; prompts logged or not.

The KV pool is shrunk or grown until the run has 5 to max(30, N/4) preemptions. The split
is fixed here, before any tuning: replicate 0 of every combination is "calib", replicate
1 "heldout" (index.json `split`; truth.json `split`). Deterministic: same arguments, same
files. Another --seed-base (31000, 33000, ...) gives another 56 logs of the same traffic
kinds and split, the other settings crossed with them differently (docs/accuracy.md,
section 3: corpus C is the sets of 29000 and 31000).
"""
from __future__ import annotations

import argparse
import collections
import csv
import json
import math
import os
import random
import sys
import time
from typing import Any

from tools.oracle.calib_corpus import LOGCASES, render_case, simulate_both

HERE = os.path.dirname(os.path.abspath(__file__))

from kvreplay.replay import DEFAULT_PROFILE, parse_workload  # noqa: E402
from kvreplay.replay.engine import Engine  # noqa: E402
from kvreplay.replay.records import EngineInputs  # noqa: E402
from tools.oracle.render_log import formula_step_time  # noqa: E402

MOONCAKE = os.path.join(HERE, "data", "mooncake_conversation_head.csv")
ARRIVALS = ("poisson", "onoff", "ramp", "closed")
LENGTHS = ("uniform", "lognormal", "code")
MAX_PROMPT = 3500


# -- lengths ----------------------------------------------------------------------------

def draw_length(kind: str, rng: random.Random) -> tuple[int, int]:
    """(prompt tokens, max_tokens) of one request."""
    if kind == "uniform":
        return rng.randrange(100, 2000), rng.randrange(50, 500)
    if kind == "lognormal":
        p = int(500 * math.exp(rng.gauss(0.0, 1.0)))
        o = int(150 * math.exp(rng.gauss(0.0, 0.8)))
        return min(MAX_PROMPT, max(16, p)), min(1000, max(1, o))
    # code-like: heavy-tailed prompts (files pasted whole), short answers
    p = int(200 / (1.0 - rng.random()) ** (1 / 1.1))
    return min(MAX_PROMPT, max(32, p)), rng.randrange(4, 81)


def prompt_of(n: int, pc: bool, groups: list[list[int]], rng: random.Random,
              common: list[int] | None = None) -> list[int]:
    """n tokens; with prefix caching a request shares a group's prefix (at most half its
    prompt), a handful of groups live at a time; `common`: a prefix every request has."""
    head: list[int] = list(common or [])
    if pc and n > 64:
        if not groups or rng.random() < 0.1:
            groups.append([rng.randrange(10, 50000) for _ in range(rng.randrange(64, 600))])
            del groups[:-5]
        g = rng.choice(groups)
        head += g[:max(0, n // 2 - len(head))]
    return (head + [rng.randrange(10, 50000) for _ in range(max(1, n - len(head)))])[:max(n, 1)]


# -- arrivals (in steps) ----------------------------------------------------------------

def arrival_steps(kind: str, n: int, gap: float, rng: random.Random) -> list[int]:
    """Open-loop arrival steps of n requests, mean gap `gap` steps overall."""
    out, t = [], 0.0
    if kind == "poisson":
        for _ in range(n):
            out.append(int(t))
            t += rng.expovariate(1.0 / gap)
    elif kind == "onoff":
        while len(out) < n:
            burst = rng.randrange(8, 40)
            for _ in range(min(burst, n - len(out))):
                out.append(int(t))
                t += rng.expovariate(1.0 / max(0.5, gap / 6))
            t += rng.uniform(400, 1500)  # idle: the engine runs dry (steps of 10 ms idle)
    elif kind == "ramp":
        for i in range(n):
            out.append(int(t))
            g = gap * (3.0 - 2.5 * i / max(1, n - 1))  # 3x the mean gap down to 1/2x
            t += rng.expovariate(1.0 / g)
    else:
        raise ValueError(kind)
    return out


def closed_loop(wl: dict[str, Any], clients: int, think: tuple[int, int],
                rng: random.Random) -> list[int]:
    """Arrival steps of a closed loop: `clients` clients, each sending the next request of
    the workload (in order) a think time drawn from `think` (steps, counted from the step
    after the one its last request finished in) later (the engine's `submit`: the request
    enters before the step it is due)."""
    n = len(wl["requests"])
    engine = Engine(parse_workload(wl), DEFAULT_PROFILE, inputs=EngineInputs([-1] * n))
    due: dict[int, list[int]] = collections.defaultdict(list)
    nxt = 0
    for c in range(min(clients, n)):
        due[rng.randrange(0, 20)].append(nxt)
        nxt += 1
    seen = 0
    while not engine.done:
        for idx in due.pop(engine.step_index, ()):
            engine.submit(idx)
        engine.step()
        fin = engine.summary.finished_step
        if len(fin) > seen:
            for _ in range(len(fin) - seen):
                if nxt < n:
                    due[engine.step_index + rng.randint(*think)].append(nxt)
                    nxt += 1
            seen = len(fin)
    arr = list(engine.arrival_step)
    assert all(a >= 0 for a in arr), "a closed-loop request never entered"
    return arr


def mooncake_rows() -> list[tuple[int, int, int]]:
    with open(MOONCAKE) as f:
        rows = [r for r in csv.reader(line for line in f if not line.startswith("#"))]
    return [(int(a), int(b), int(c)) for a, b, c in rows[1:]]


def mooncake_requests(n: int, rng: random.Random, step_ms: float
                      ) -> list[tuple[int, int, int]]:
    """(arrival step, prompt, output) of n requests: the trace's 3-second clumps drawn
    with replacement, in their order of draw, each clump's requests spread over its first
    30 steps (the trace's stamps are coarser than a step), lengths / 8."""
    clumps: dict[int, list[tuple[int, int]]] = collections.defaultdict(list)
    for ts, i, o in mooncake_rows():
        clumps[ts].append((i, o))
    keys = sorted(clumps)
    period = (keys[1] - keys[0]) / step_ms  # steps between clumps
    out: list[tuple[int, int, int]] = []
    k = 0
    while len(out) < n:
        c = clumps[rng.choice(keys)]
        base = int(k * period)
        for i, o in sorted(c, key=lambda _: rng.random()):
            if len(out) == n:
                break
            out.append((base + rng.randrange(0, 30), min(MAX_PROMPT, max(16, i // 8)), max(1, o)))
        k += 1
    return sorted(out, key=lambda x: x[0])


# -- workloads --------------------------------------------------------------------------

def workload(name: str, seed: int, n: int, arrivals: str, lengths: str, policy: str, pc: bool,
             asyn: bool, blocks: int, seqs: int) -> dict[str, Any]:
    rng = random.Random(seed)
    gap = rng.uniform(5.0, 10.0)
    groups: list[list[int]] = []
    reqs = []
    if arrivals == "mooncake":
        common = [rng.randrange(10, 50000) for _ in range(64)]
        rows = mooncake_requests(n, rng, step_ms=rng.uniform(15.0, 30.0))
        for i, (a, p, o) in enumerate(rows):
            reqs.append({"id": f"r{i}", "arrival_step": a,
                         "prompt_token_ids": prompt_of(p, pc, groups, rng, common),
                         "max_tokens": min(o, 4096 - p)})
    else:
        steps = arrival_steps(arrivals, n, gap, rng) if arrivals != "closed" else [0] * n
        for i in range(n):
            p, o = draw_length(lengths, rng)
            reqs.append({"id": f"r{i}", "arrival_step": steps[i],
                         "prompt_token_ids": prompt_of(p, pc, groups, rng),
                         "max_tokens": o})
    if policy == "priority":
        for r in reqs:
            r["priority"] = rng.randrange(0, 5)
    wl = {"name": name, "description": f"{n} requests, {arrivals} arrivals, {lengths} lengths",
          "config": {"num_gpu_blocks": blocks, "block_size": 16, "max_num_seqs": seqs,
                     "max_num_batched_tokens": 8192, "max_model_len": 4096,
                     "enable_chunked_prefill": True, "enable_prefix_caching": pc,
                     "policy": policy, "async_scheduling": asyn, "max_steps": 400000},
          "requests": reqs}
    if arrivals == "closed":
        arr = closed_loop(wl, clients=rng.choice((8, 16, 32, 48)), think=(1, 60), rng=rng)
        order = sorted(range(n), key=lambda i: (arr[i], i))
        wl["requests"] = [dict(reqs[i], id=f"r{k}", arrival_step=arr[i])
                          for k, i in enumerate(order)]
    return wl


SEED_BASE = 29000  # the first corpus's; --seed-base BASE: another 56 logs, the same recipe


def combos(seed_base: int = SEED_BASE) -> list[dict[str, Any]]:
    """Every log of the corpus, in a fixed order: 4 arrival processes x 3 length kinds x
    with / without prompts x 2 replicates (calib, heldout), plus 8 Mooncake logs; the
    other settings cycle with the index (and, for another seed base, with the base, so
    that the second set crosses the settings differently)."""
    turn = (seed_base - SEED_BASE) // 2000  # 0 for the first corpus
    out = []
    traffic = [(a, l) for a in ARRIVALS for l in LENGTHS]
    for c, (arr, lens) in enumerate(traffic + [("mooncake", "mooncake")] * 2):
        for wp in (True, False):
            for rep in (0, 1):
                k = len(out)
                out.append({"arrivals": arr, "lengths": lens, "with_prompts": wp,
                            "split": ("calib", "heldout")[rep], "seed": seed_base + 10 * c + 2 * int(wp) + rep,
                            "policy": ("fcfs", "priority")[(c + rep + turn) % 2],
                            "pc": (c // 2 + rep + int(wp) + turn) % 2 == 1,
                            "async": (k + turn) % 5 == 3,
                            "interval": (10.0, 2.0)[(c + int(wp) + turn) % 2],
                            "formula": (k + turn) % 3 != 2})
    return out


def build(out: str, n: int, only: str | None = None, seed_base: int = SEED_BASE
          ) -> list[dict[str, Any]]:
    model = json.load(open(os.path.join(LOGCASES, "p1_poisson_fcfs_200", "truth.json")))["step_time_model"]
    formula = formula_step_time(model)
    rows = []
    for spec in combos(seed_base):
        name = (f"{spec['split']}-{spec['arrivals']}-{spec['lengths']}-{spec['policy']}-"
                f"{'pc' if spec['pc'] else 'nopc'}-{'async-' if spec['async'] else ''}"
                f"{int(spec['interval'])}s-{'prompts' if spec['with_prompts'] else 'noprompts'}"
                f"-s{spec['seed']}")
        if only and only not in name:
            continue
        rng = random.Random(spec["seed"] * 7 + 1)
        blocks = rng.randrange(1200, 2201, 50)
        seqs = rng.choice((32, 48, 64))
        phase = round(rng.uniform(0.05, 0.95), 2)
        step_ms = rng.choice((8, 10, 12, 15))
        lo, hi = 5, max(30, n // 4)
        t0 = time.time()
        for _ in range(16):  # shrink / grow the pool until the run has some preemptions
            d = workload(name, spec["seed"], n, spec["arrivals"], spec["lengths"],
                         spec["policy"], spec["pc"], spec["async"], blocks, seqs)
            wl = parse_workload(d)
            _, steps = simulate_both(wl)
            k = sum(len(s.preemptions) for s in steps)
            if k < lo:
                blocks = max(260, int(blocks * 0.85))  # (a prompt of 3,500 needs 219 blocks)
            elif k > hi:
                blocks = int(blocks * 1.12)
            else:
                break
        row = render_case(out, name, "traffic", wl,
                          step_time=formula if spec["formula"] else step_ms / 1000.0,
                          interval=spec["interval"], phase=phase,
                          with_prompts=spec["with_prompts"],
                          step_clock="formula p1_poisson_fcfs_200" if spec["formula"]
                          else f"fixed {step_ms} ms", seed=spec["seed"], split=spec["split"],
                          arrivals=spec["arrivals"], lengths=spec["lengths"],
                          processed_tokens=sum(s.num_scheduled_tokens for s in steps))
        if row is not None:
            row["split"] = spec["split"]
            rows.append(row)
            with open(os.path.join(out, name, "workload.json"), "w") as f:
                json.dump(d, f, separators=(",", ":"))
        print(f"  {name}: {n} requests, {blocks} blocks, "
              f"{row and row['num_preemptions']} preemptions ({time.time() - t0:.1f} s)",
              flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="/tmp/calib/traffic")
    ap.add_argument("--requests", type=int, default=150)
    ap.add_argument("--only", help="build only the logs whose name contains this")
    ap.add_argument("--seed-base", type=int, default=SEED_BASE,
                    help=f"seeds BASE + 10 x combination + ...: another base (e.g. 31000, "
                         f"33000), another 56 logs made the same way (default {SEED_BASE})")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    rows = build(args.out, args.requests, args.only, args.seed_base)
    if not args.only:
        with open(os.path.join(args.out, "index.json"), "w") as f:
            json.dump({"logs": rows, "count": len(rows),
                       "per_split": dict(collections.Counter(r["split"] for r in rows))}, f,
                      indent=1)
            f.write("\n")
    print(f"{len(rows)} logs", dict(collections.Counter(r["split"] for r in rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
