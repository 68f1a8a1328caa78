#!/usr/bin/env python3
"""Generate V0 conformance cases from vLLM 0.6.6.post1's own scheduler (dev-time tool).

Writes tests/data/v0_oracle/<case>/{workload.json,trace.jsonl,summary.json}: hand-made
workloads for the Part B/F behaviours the published cases do not reach (prefix caching with
the evictor, chunked + caching, priority force-preemption, n>1, swap with too little CPU
space, max_model_len capping, fixed-token dedup) and seeded random ones.

The expected traces come from the real V0 scheduler, driven by the shared oracle harness
`../shared/conformance/oracle/v0/run_oracle_v0.py` (read at dev time only; the tests use
the stored files). Build the oracle venv first, as its README says, e.g.
    python3.11 -m venv ~/.cache/kvreplay/oracle-v0
    ~/.cache/kvreplay/oracle-v0/bin/pip install torch==2.13.0   # local CPU wheel
    ~/.cache/kvreplay/oracle-v0/bin/pip install --no-deps -r <shared>/conformance/oracle/v0/requirements-v0.txt
    ~/.cache/kvreplay/oracle-v0/bin/pip install --no-deps vllm==0.6.6.post1

Usage: tools/oracle/make_v0_cases.py [--venv DIR] [--shared DIR] [--random N] [--only NAME...]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "data", "v0_oracle")
MAX_CASE_BYTES = 300_000
# Seeds kept from scratch runs (1000-1299, 2000-2199; all reproduced step for step) because
# they swap in and out many times, force-preempt by priority or end on a terminal error.
# 2142: a group swapped out mid chunked-prefill is not chunked on swap-in (found by it).
EXTRA_SEEDS = [1036, 1114, 1160, 1201, 1204, 1225, 1254, 1294, 1299, 2142]

# Runs the harness once per workload inside one interpreter (vLLM imports once).
# The harness records a RuntimeError raised by schedule() (swap space) as the terminal event
# and crashes on anything else. vLLM 0.6.6 can also stop on an AssertionError / IndexError
# inside schedule() (spec F.6: a swapped priority victim in `waiting`; a swapped-out chunked
# prefill with prefix caching). The driver runs a copy of the harness that catches those too
# and names the exception type; nothing else in the harness changes.
DRIVER = r"""
import runpy, sys, traceback, tempfile
harness = sys.argv[1]
src = open(harness).read()
old_exc = "        except RuntimeError as e:\n            rec[\"preemptions\"]"
assert old_exc in src
src = src.replace(old_exc, "        except (RuntimeError, AssertionError, IndexError) as e:\n"
                  "            rec[\"preemptions\"]")
old_type = '{"type": "RuntimeError", "message": str(e),'
assert old_type in src
src = src.replace(old_type, '{"type": type(e).__name__, "message": str(e),')
patched = tempfile.NamedTemporaryFile("w", suffix=".py", delete=False)
patched.write(src)
patched.close()
harness = patched.name
for wl in sys.argv[2:]:
    sys.argv = [harness, wl]
    try:
        runpy.run_path(harness, run_name="__main__")
    except SystemExit as e:
        print(f"EXIT {e.code} {wl}", flush=True)
    except BaseException:
        print(f"CRASH {wl}", flush=True)
        traceback.print_exc()
"""


def toks(rng: random.Random, n: int) -> list:
    return [rng.randrange(1, 30000) for _ in range(n)]


def req(rid, prompt, max_tokens, arrival=0, priority=0, n=1):
    r = {"id": rid, "arrival_step": arrival, "prompt_token_ids": prompt, "max_tokens": max_tokens}
    if priority:
        r["priority"] = priority
    if n != 1:
        r["n"] = n
    return r


def wl(name, desc, config, requests):
    return {"name": name, "engine": "v0", "description": desc, "config": config, "requests": requests}


def hand_made() -> list:
    rng = random.Random(66)
    cases = []
    base_a, base_b = toks(rng, 40), toks(rng, 24)
    reqs = []
    for i in range(8):
        base = base_a if i % 2 == 0 else base_b
        reqs.append(req(f"p{i}", base + toks(rng, rng.randrange(3, 20)), rng.randrange(10, 40),
                        arrival=i // 2))
    cases.append(wl("v0h_prefix_caching_evictor",
                    "Prefix caching on, default path: shared prefixes, recompute preemptions that "
                    "re-hit cached blocks, LRU evictor reuse.",
                    {"num_gpu_blocks": 20, "block_size": 8, "max_num_seqs": 6,
                     "max_num_batched_tokens": 256, "max_model_len": 256,
                     "enable_prefix_caching": True}, reqs))
    reqs = [req(f"c{i}", base_a[:32] + toks(rng, rng.randrange(5, 40)), rng.randrange(8, 30),
                arrival=i) for i in range(7)]
    cases.append(wl("v0h_chunked_prefix_caching",
                    "Chunked prefill + prefix caching: block-rounded chunks, cached tokens free in "
                    "the budget, decode-first with preemptions.",
                    {"num_gpu_blocks": 24, "block_size": 8, "max_num_seqs": 5,
                     "max_num_batched_tokens": 48, "enable_chunked_prefill": True,
                     "enable_prefix_caching": True}, reqs))
    reqs = [req(f"lo{i}", toks(rng, 30 + 5 * i), 40, arrival=0, priority=2) for i in range(4)]
    reqs += [req(f"hi{i}", toks(rng, 25), 20, arrival=3 + 2 * i, priority=0) for i in range(3)]
    cases.append(wl("v0h_priority_force_preempt",
                    "Priority policy, default path: high-priority arrivals force-preempt the "
                    "lowest-priority running groups (recompute); counted by the warning counter, "
                    "not by Prometheus.",
                    {"num_gpu_blocks": 24, "block_size": 16, "max_num_seqs": 4,
                     "max_num_batched_tokens": 512, "max_model_len": 512, "policy": "priority"},
                    reqs))
    reqs = [req("par", toks(rng, 20), 30, n=3), req("solo", toks(rng, 33), 25, arrival=1),
            req("par2", toks(rng, 12), 20, arrival=2, n=2)]
    cases.append(wl("v0h_parallel_n",
                    "n>1 split into <id>_parallel_sample_<i> single-sequence groups, recompute "
                    "preemptions between the samples.",
                    {"num_gpu_blocks": 12, "block_size": 8, "max_num_seqs": 8,
                     "max_num_batched_tokens": 256, "max_model_len": 256}, reqs))
    reqs = [req(f"s{i}", toks(rng, 30 + 7 * i), 60) for i in range(5)]
    cases.append(wl("v0h_swap_too_little_cpu",
                    "preemption_mode=swap with 4 CPU blocks: the second swap-out fails and vLLM "
                    "raises RuntimeError (lack of CPU swap space): the terminal event.",
                    {"num_gpu_blocks": 20, "num_cpu_blocks": 4, "block_size": 16, "max_num_seqs": 8,
                     "max_num_batched_tokens": 512, "max_model_len": 512, "preemption_mode": "swap"},
                    reqs))
    reqs = [req(f"k{i}", toks(rng, 20 + 9 * i), 30 + 5 * i, arrival=i) for i in range(6)]
    cases.append(wl("v0h_chunked_swap",
                    "Chunked prefill with forced swap: swapped groups come back through "
                    "_schedule_swapped while prefills continue (F.7).",
                    {"num_gpu_blocks": 16, "num_cpu_blocks": 64, "block_size": 8, "max_num_seqs": 6,
                     "max_num_batched_tokens": 40, "enable_chunked_prefill": True,
                     "preemption_mode": "swap"}, reqs))
    reqs = [req(f"m{i}", toks(rng, 50 + 3 * i), 100, arrival=i) for i in range(3)]
    cases.append(wl("v0h_max_model_len_cap",
                    "Sequences stop at max_model_len (len > max_model_len -> LENGTH_CAPPED) before "
                    "max_tokens.",
                    {"num_gpu_blocks": 40, "block_size": 8, "max_num_seqs": 4,
                     "max_num_batched_tokens": 64, "max_model_len": 64}, reqs))
    shared = toks(rng, 21)
    reqs = [req(f"f{i}", list(shared), 30, arrival=i % 3) for i in range(5)]
    cases.append(wl("v0h_fixed_token_dedup",
                    "Prefix caching with identical prompts and fixed fake tokens: decode blocks "
                    "fill with identical content and are deduplicated on promotion.",
                    {"num_gpu_blocks": 14, "block_size": 4, "max_num_seqs": 5,
                     "max_num_batched_tokens": 128, "max_model_len": 128,
                     "enable_prefix_caching": True, "fake_token_mode": "fixed"}, reqs))
    reqs = [req(f"w{i}", toks(rng, 60), 30, arrival=0, priority=i % 2) for i in range(6)]
    reqs.append(req("late_hi", toks(rng, 40), 10, arrival=4, priority=0))
    cases.append(wl("v0h_priority_caching",
                    "Priority policy with prefix caching and recompute.",
                    {"num_gpu_blocks": 30, "block_size": 8, "max_num_seqs": 4,
                     "max_num_batched_tokens": 256, "max_model_len": 256, "policy": "priority",
                     "enable_prefix_caching": True}, reqs))
    reqs = [req(f"b{i}", toks(rng, 15), 70, arrival=0) for i in range(4)]
    reqs.append(req("wide", toks(rng, 60), 5, arrival=6))
    cases.append(wl("v0h_swap_blocks_prefill",
                    "Default path with forced swap: a swapped group blocks new prefills until it is "
                    "swapped back in.",
                    {"num_gpu_blocks": 16, "num_cpu_blocks": 32, "block_size": 8, "max_num_seqs": 4,
                     "max_num_batched_tokens": 128, "max_model_len": 128, "preemption_mode": "swap"},
                    reqs))
    reqs = [req("whole", toks(rng, 32), 10), req("after", toks(rng, 8), 5, arrival=3)]
    cases.append(wl("v0h_swap_in_never",
                    "A group that fills all 8 GPU blocks is swapped out by its own decode; swapping "
                    "it back needs 9 > 8 blocks, so can_swap_in says NEVER (F.4, no watermark) and "
                    "it is ignored from the swapped queue, keeping its CPU blocks.",
                    {"num_gpu_blocks": 8, "num_cpu_blocks": 16, "block_size": 4, "max_num_seqs": 4,
                     "max_num_batched_tokens": 64, "max_model_len": 64, "preemption_mode": "swap"},
                    reqs))
    base = toks(rng, 24)
    reqs = [req(f"x{i}", base + toks(rng, rng.randrange(1, 12)), rng.randrange(20, 50), arrival=i // 2)
            for i in range(6)]
    cases.append(wl("v0h_swap_prefix_caching",
                    "Forced swap with prefix caching: swapped-out hashed blocks wait in the GPU "
                    "evictor, shared blocks are touched once, CPU side is a caching pool too.",
                    {"num_gpu_blocks": 18, "num_cpu_blocks": 40, "block_size": 8, "max_num_seqs": 6,
                     "max_num_batched_tokens": 128, "max_model_len": 128, "preemption_mode": "swap",
                     "enable_prefix_caching": True}, reqs))
    reqs = [req("lo0", toks(rng, 60), 30, priority=2), req("lo1", toks(rng, 60), 30, priority=2),
            req("hi", toks(rng, 70), 10, arrival=2, priority=0)]
    cases.append(wl("v0h_priority_swap_victim_in_waiting",
                    "Spec F.6: priority force-preemption with preemption_mode=swap puts the swapped "
                    "victim into waiting; when it reaches the head of the prefill loop 0.6.6 fails "
                    "an assertion (a vLLM defect, copied as the terminal event).",
                    {"num_gpu_blocks": 12, "num_cpu_blocks": 32, "block_size": 16, "max_num_seqs": 4,
                     "max_num_batched_tokens": 256, "max_model_len": 256, "policy": "priority",
                     "preemption_mode": "swap"}, reqs))
    cases.append(dict(random_case(1291), name="v0h_swapped_prefill_assert",
                      description="Chunked prefill + prefix caching + forced swap: a group swapped "
                      "out mid-prefill has fewer cached than computed tokens when it is considered "
                      "for swap-in, and 0.6.6's sanity assertion stops the engine."))
    return cases


def random_case(seed: int) -> dict:
    rng = random.Random(1000 + seed)
    bs = rng.choice([4, 8, 16])
    chunked = rng.random() < 0.5
    caching = rng.random() < 0.5
    mode = rng.choice([None, None, "recompute", "swap"])
    policy = rng.choice(["fcfs", "fcfs", "priority"])
    if mode == "swap" and policy == "priority":
        policy = "fcfs"        # F.6 swap victims in waiting crash 0.6.6 (AssertionError)
    ngpu = rng.randrange(8, 32)
    max_seqs = rng.randrange(2, 9)
    mml = rng.choice([64, 128, 256])
    if chunked:
        budget = bs * rng.randrange(max(2, -(-max_seqs // bs)), max(3, 96 // bs) + 1)
    else:
        budget = rng.choice([mml, mml * 2])
    cfg = {"num_gpu_blocks": ngpu, "block_size": bs, "max_num_seqs": max_seqs,
           "max_num_batched_tokens": budget, "max_model_len": mml}
    if chunked:
        cfg["enable_chunked_prefill"] = True
    if caching:
        cfg["enable_prefix_caching"] = True
    if mode:
        cfg["preemption_mode"] = mode
    if mode == "swap":
        cfg["num_cpu_blocks"] = rng.choice([2, 8, 32, 128])
    if policy != "fcfs":
        cfg["policy"] = policy
    if rng.random() < 0.15:
        cfg["fake_token_mode"] = "fixed"
    bases = [toks(rng, rng.randrange(bs, 4 * bs)) for _ in range(3)]
    reqs = []
    for i in range(rng.randrange(3, 10)):
        if caching and rng.random() < 0.6:
            prompt = rng.choice(bases) + toks(rng, rng.randrange(0, 2 * bs))
        else:
            prompt = toks(rng, rng.randrange(1, min(mml, 90)))
        prompt = prompt[:mml + rng.choice([0, 0, 0, 0, 0, 0, 0, 5])]
        reqs.append(req(f"r{i}", prompt, rng.randrange(1, 45), arrival=rng.randrange(0, 12),
                        priority=rng.randrange(0, 3) if policy == "priority" else 0,
                        n=rng.choice([1, 1, 1, 1, 2, 3])))
    cfg["max_steps"] = 200      # keeps a livelocked run's trace small
    return wl(f"v0r_{seed:03d}", f"random V0 workload, seed {seed}", cfg, reqs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--venv", default=os.path.expanduser("~/.cache/kvreplay/oracle-v0"))
    ap.add_argument("--shared", default=os.path.join(ROOT, "..", "shared"))
    ap.add_argument("--random", type=int, default=30)
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--seed-offset", type=int, default=0)
    ap.add_argument("--out", default=OUT, help="output folder (default tests/data/v0_oracle)")
    ap.add_argument("--no-hand-made", action="store_true")
    args = ap.parse_args()
    harness = os.path.join(args.shared, "conformance", "oracle", "v0", "run_oracle_v0.py")
    py = os.path.join(args.venv, "bin", "python")
    cases = ([] if args.no_hand_made else hand_made()) + [
        random_case(s) for s in range(args.seed_offset, args.seed_offset + args.random)]
    if not args.no_hand_made:
        cases += [random_case(s) for s in EXTRA_SEEDS]
    if args.only:
        cases = [c for c in cases if c["name"] in set(args.only)]
    paths = []
    for c in cases:
        d = os.path.join(args.out, c["name"])
        os.makedirs(d, exist_ok=True)
        p = os.path.join(d, "workload.json")
        with open(p, "w") as f:
            json.dump(c, f, indent=1)
            f.write("\n")
        paths.append(p)
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(DRIVER)
        driver = f.name
    try:
        subprocess.run([py, driver, harness, *paths], check=True,
                       env={**os.environ, "VLLM_LOGGING_LEVEL": "ERROR"})
    finally:
        os.unlink(driver)
    for c in cases:
        d = os.path.join(args.out, c["name"])
        meta = os.path.join(d, "meta.json")
        if os.path.exists(meta):
            os.unlink(meta)
        tr = os.path.join(d, "trace.jsonl")
        size = sum(os.path.getsize(os.path.join(d, x)) for x in os.listdir(d))
        if not os.path.exists(tr):
            print(f"{c['name']}: no trace (oracle crashed)", file=sys.stderr)
        elif size > MAX_CASE_BYTES:
            print(f"{c['name']}: {size} bytes, over {MAX_CASE_BYTES}: dropped", file=sys.stderr)
            shutil.rmtree(d)


if __name__ == "__main__":
    main()
