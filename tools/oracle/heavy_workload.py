#!/usr/bin/env python3
"""Write a heavy benchmark workload: 2,000 requests on a 2,000-block pool.

    python -m tools.oracle.heavy_workload [-o heavy.json] [--seed 0] [--requests 2000]

Prefix caching on, block size 16, max_num_seqs 128, budget 2048 (chunked
prefill). Requests come in groups of 10-40 that share a 48-320-token prefix
(plus a private suffix), arriving as a Poisson process over steps (1.0 per step by default, faster
than the engine drains them, so a queue builds and the pool runs full: vLLM
0.33 preempts ~830 times; prefix hits at admission and at resume).
"""
from __future__ import annotations

import argparse
import json
import random


def make(seed: int = 0, n_requests: int = 2000, rate: float = 1.0,
         num_gpu_blocks: int = 2000, max_num_seqs: int = 128) -> dict:
    rng = random.Random(seed)
    reqs = []
    step = 0.0
    groups = []
    while len(reqs) < n_requests:
        if not groups or rng.random() < 0.08:
            groups.append([rng.randrange(10, 30000) for _ in range(rng.randrange(48, 321))])
            groups = groups[-6:]  # a handful of "hot" system prompts at a time
        prefix = rng.choice(groups)
        suffix = [rng.randrange(10, 30000) for _ in range(rng.randrange(8, 300))]
        step += rng.expovariate(rate)
        reqs.append({"id": f"h{len(reqs)}", "arrival_step": int(step),
                     "prompt_token_ids": prefix + suffix,
                     "max_tokens": rng.randrange(16, 300)})
    return {
        "name": "heavy_2000",
        "description": f"{n_requests} requests, shared prefixes in groups, Poisson "
                       f"arrivals ({rate}/step), {num_gpu_blocks} blocks of 16, "
                       "prefix caching on",
        "config": {"num_gpu_blocks": num_gpu_blocks, "block_size": 16,
                   "max_num_seqs": max_num_seqs, "max_num_batched_tokens": 2048,
                   "max_model_len": 2048, "enable_chunked_prefill": True,
                   "enable_prefix_caching": True, "policy": "fcfs",
                   "max_steps": 100000},
        "requests": reqs,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--out", default="heavy_workload.json")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--rate", type=float, default=1.0)
    args = ap.parse_args(argv)
    wl = make(args.seed, args.requests, args.rate)
    with open(args.out, "w") as f:
        json.dump(wl, f, separators=(",", ":"))
    print(f"wrote {args.out}: {len(wl['requests'])} requests, last arrival step "
          f"{wl['requests'][-1]['arrival_step']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
