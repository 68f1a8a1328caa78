#!/usr/bin/env python3
"""Answer keys for `kvreplay whatif`: vLLM 0.33.0's own scheduler under another setting.

Run with the Python of the vLLM venv the plugin tests use (a dev tool, not part of kvreplay):

    $VLLM_PY tools/oracle/whatif_keys.py CASE_DIR --set max_num_seqs=16 --set num_gpu_blocks=1500 \
        [-o whatif.jsonl]
    $VLLM_PY tools/oracle/whatif_keys.py --jobs JOBS.json -o keys.jsonl
        # JOBS.json: [{"case", "workload", "truth", "sets": [["max_num_seqs=16"], ...]}, ...]

The method of ../shared/logcases/README.md (`whatif.jsonl`): the case's requests
(workload.json: prompts, max_tokens, priorities) at their wall-clock arrival times
(truth.json `requests[*].arrival_sim_time`), the case's step-time model (truth.json
`step_time_model`, the formula of `step_time_formula`), the config changed by `--set`. A
request arriving at t enters at the first step that starts at least `arrival_lead_s` after
t; idle steps take `idle_iteration_s`. The README finds the arrival steps as a fixed point
of run-and-recompute; the start of step k depends only on steps 0..k-1, so the fixed point
is the one the run reaches when each step's arrivals are read off the clock as it goes,
which is what this does (one pass; `iterations` counts the arrival steps that moved against
the case's own, the README's iteration count is not reproduced).

Only the model and the engine loop are fake (tools/oracle/harness/run_oracle.py, whose
scheduler set-up this copies): Scheduler.schedule, update_from_output, the KV cache
manager and preemption are vLLM's own code. Synchronous scheduling only.

Row: set, total_preemptions, requests_preempted, steps (engine loop iterations, idle ones
included), duration_s (start of step 0 to the end of the step that finished the last
request: what the published rows use), gen_tok_per_s (output tokens / duration_s).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

# run as a script: vLLM's block hashes are Python hashes, so the seed is fixed first
# (imported for parse_set, nothing is re-run)
if __name__ == "__main__" and os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable] + sys.argv)
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("DO_NOT_TRACK", "1")

HERE = os.path.dirname(os.path.abspath(__file__))
FAKE_MODEL_DIR = os.path.join(HERE, "harness", "fake_model")
# truth.json times are rounded to the microsecond: an arrival logged at a step's start
# minus arrival_lead_s is that step's, to the rounding
TOL = 1e-6
KNOBS = {"max_num_seqs": int, "num_gpu_blocks": int, "max_num_batched_tokens": int,
         "max_model_len": int, "enable_prefix_caching": lambda s: s.lower() in ("1", "true"),
         "policy": str}


def make_scheduler(cfg: dict):
    """vLLM's Scheduler as run_oracle.py sets it up (one full-attention KV group)."""
    import torch
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import (get_request_block_hasher, init_none_hash,
                                             resolve_kv_cache_block_sizes)
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    model_config = ModelConfig(model=FAKE_MODEL_DIR, tokenizer=FAKE_MODEL_DIR,
                               skip_tokenizer_init=True, dtype="float16", seed=42,
                               max_model_len=cfg["max_model_len"])
    sc = SchedulerConfig(max_num_seqs=cfg["max_num_seqs"],
                         max_num_batched_tokens=cfg["max_num_batched_tokens"],
                         max_model_len=cfg["max_model_len"], is_encoder_decoder=False,
                         enable_chunked_prefill=cfg.get("enable_chunked_prefill", True),
                         long_prefill_token_threshold=cfg.get("long_prefill_token_threshold", 0),
                         policy=cfg.get("policy", "fcfs"),
                         scheduler_reserve_full_isl=cfg.get("scheduler_reserve_full_isl", True),
                         watermark=cfg.get("watermark", 0.0), async_scheduling=False)
    cc = CacheConfig(block_size=cfg["block_size"], gpu_memory_utilization=0.9, cache_dtype="auto",
                     enable_prefix_caching=cfg.get("enable_prefix_caching", False))
    vc = VllmConfig(scheduler_config=sc, model_config=model_config, cache_config=cc)
    kvc = KVCacheConfig(num_blocks=cfg["num_gpu_blocks"], kv_cache_tensors=[],
                        kv_cache_groups=[KVCacheGroupSpec(["layer"], FullAttentionSpec(
                            block_size=cfg["block_size"], num_kv_heads=1, head_size=1,
                            dtype=torch.float32))])
    vc.cache_config.num_gpu_blocks = cfg["num_gpu_blocks"]
    sbs, hbs = resolve_kv_cache_block_sizes(kvc, vc)
    for k, v in (("max_num_seqs", vc.scheduler_config.max_num_seqs),
                 ("max_num_batched_tokens", vc.scheduler_config.max_num_batched_tokens),
                 ("max_model_len", vc.model_config.max_model_len),
                 ("policy", vc.scheduler_config.policy)):
        if cfg.get(k, v) != v:
            raise SystemExit(f"vLLM rewrote {k}: asked {cfg[k]!r}, got {v!r}")
    sched = Scheduler(vllm_config=vc, kv_cache_config=kvc,
                      structured_output_manager=StructuredOutputManager(vc), block_size=sbs,
                      hash_block_size=hbs, include_finished_set=False, log_stats=True)
    hasher = None
    if vc.cache_config.enable_prefix_caching:
        fn = get_hash_fn_by_name(vc.cache_config.prefix_caching_hash_algo)
        init_none_hash(fn)
        hasher = get_request_block_hasher(hbs, fn, vc.num_hash_lookahead_tokens)
    return sched, hasher


def run_setting(cfg: dict, reqs: list[dict], arrivals: list[float], start: float,
                m: dict) -> dict:
    """One open-loop run on the simulated clock; arrivals read off the clock as it goes."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request

    sched, hasher = make_scheduler(cfg)
    order = sorted(range(len(reqs)), key=lambda i: (arrivals[i], i))
    lead, idle = m["arrival_lead_s"], m["idle_iteration_s"]
    pre_per_req: dict[str, int] = {}
    total_pre = 0
    out_tokens = 0
    finished: dict[str, float] = {}
    arrival_step: dict[str, int] = {}
    clock = start
    k = step = 0
    limit = cfg.get("max_steps", 200000)
    while step < limit:
        while k < len(order) and arrivals[order[k]] + lead <= clock + TOL:
            i = order[k]
            r = reqs[i]
            sp = SamplingParams(max_tokens=int(r["max_tokens"]), ignore_eos=True, temperature=0.0)
            sched.add_request(Request(request_id=str(r["id"]),
                                      prompt_token_ids=list(r["prompt_token_ids"]),
                                      sampling_params=sp, pooling_params=None,
                                      # as run_oracle.py: the arrival step, file order
                                      arrival_time=float(step) + i * 1e-6,
                                      priority=int(r.get("priority", 0)), block_hasher=hasher))
            arrival_step[str(r["id"])] = step
            k += 1
        if not sched.has_requests():
            if k >= len(order):
                break
            clock += idle  # EngineCore has nothing to do: an idle iteration
            step += 1
            continue
        so = sched.schedule()
        total_pre += len(so.preempted_req_ids)
        for rid in so.preempted_req_ids:
            pre_per_req[rid] = pre_per_req.get(rid, 0) + 1
        n = so.total_num_scheduled_tokens
        if n == 0:
            dt = idle
        else:
            # num_computed_tokens is advanced at schedule time (_update_after_schedule)
            ctx = sum(sched.requests[rid].num_computed_tokens for rid in so.num_scheduled_tokens)
            dt = (m["overhead_s"] + max(m["weight_read_s"], m["per_scheduled_token_s"] * n)
                  + m["per_context_token_s"] * ctx
                  + m["per_scheduled_request_s"] * len(so.num_scheduled_tokens))
        ids = list(so.num_scheduled_tokens)
        sampled = [[1000 + sched.requests[rid].num_output_tokens % 30000]
                   if not sched.requests[rid].is_prefill_chunk else [] for rid in ids]
        mro = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: j for j, r in enumerate(ids)},
                                sampled_token_ids=sampled, logprobs=None,
                                prompt_logprobs_dict={}, pooler_output=[])
        end = clock + dt
        for outs in sched.update_from_output(so, mro).values():
            for o in outs.outputs:
                out_tokens += len(o.new_token_ids)
                if o.finish_reason is not None:
                    finished[o.request_id] = end
        clock = end
        step += 1
        if len(finished) == len(reqs) and k >= len(order):
            break  # as run_oracle.py: every request done, the loop ends
    dur = max(finished.values()) - start
    return {"total_preemptions": total_pre, "requests_preempted": len(pre_per_req),
            "steps": step, "duration_s": round(dur, 3),
            "gen_tok_per_s": round(out_tokens / dur, 1),
            "completed": len(finished) == len(reqs), "arrival_step": arrival_step}


def parse_set(items: list[str]) -> dict:
    out = {}
    for it in items:
        if not it:
            continue
        k, _, v = it.partition("=")
        if k not in KNOBS:
            raise SystemExit(f"--set {it}: one of {sorted(KNOBS)}")
        out[k] = KNOBS[k](v)
    return out


def keys_for(case: str, workload: dict, truth: dict, sets: list[list[str]]) -> list[dict]:
    reqs = workload["requests"]
    arrivals = [truth["requests"][r["id"]]["arrival_sim_time"] for r in reqs]
    start = truth["step_start_sim_time"][0]
    own = {rid: r["arrival_step"] for rid, r in truth["requests"].items()}
    rows = []
    for s in sets:
        cfg = dict(workload["config"])
        cfg.update(parse_set(s))
        res = run_setting(cfg, reqs, arrivals, start, truth["step_time_model"])
        moved = sum(1 for rid, st in res.pop("arrival_step").items() if own.get(rid) != st)
        rows.append({"case": case, "set": list(s), "moved_arrivals": moved, **res})
        print(f"{case} {' '.join(s) or '(as logged)'}: {rows[-1]['total_preemptions']} "
              f"preemptions, {rows[-1]['gen_tok_per_s']} tok/s", file=sys.stderr, flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("case", nargs="?", help="a log case folder (workload.json + truth.json)")
    ap.add_argument("--set", action="append", default=[], metavar="KNOB=V",
                    help="one setting per --set (several KNOB=V joined with ',' change together)")
    ap.add_argument("--jobs", help="JSON list of {case, workload, truth, sets}")
    ap.add_argument("-o", "--output", default="-")
    args = ap.parse_args()
    jobs = []
    if args.jobs:
        jobs = json.load(open(args.jobs))
    if args.case:
        jobs.append({"case": os.path.basename(os.path.normpath(args.case)),
                     "workload": os.path.join(args.case, "workload.json"),
                     "truth": os.path.join(args.case, "truth.json"),
                     "sets": [x.split(",") for x in args.set] or [[]]})
    rows = []
    for j in jobs:
        rows += keys_for(j["case"], json.load(open(j["workload"])), json.load(open(j["truth"])),
                         j["sets"])
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if args.output == "-":
        sys.stdout.write(text)
    else:
        with open(args.output, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
