#!/usr/bin/env python3
"""The oracle's step loop and trace writer: drive the installed vLLM's real v1
Scheduler / AsyncScheduler + KVCacheManager on CPU with fake model outputs and write a
step-by-step JSONL trace, a summary and a meta file.

Usage (run_oracle.py is the command; this module is its body):
    "$ORACLE_VENV"/bin/python run_oracle.py WORKLOAD.json [-o TRACE.jsonl]
        [--meta META.json] [--summary SUMMARY.json]

Only the model is fake: scheduling, KV block allocation, prefix caching, preemption and
request bookkeeping are vLLM's own code (vllm.v1.core.*). The release is the installed
vLLM (`vllm.__version__`); what a release does differently is in oracle_releases.py, the
workload's config keys and the vLLM configs built from them in oracle_config.py.
Exit status: 2 if vLLM did not finish every request within max_steps, 3 if the workload
uses a config key the release lacks. See README.md in this directory.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import deque

# --- environment: must be set before vllm is imported -----------------------
# Deterministic Python hashing (vLLM's prefix-cache hashes default to sha256,
# but keep anything hash()-based stable too). Re-exec once if unset.
if os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable] + sys.argv)
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # select vLLM's CpuPlatform
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach a model hub
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("DO_NOT_TRACK", "1")

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
import oracle_config  # noqa: E402  (this folder; no kvreplay import)
import oracle_releases  # noqa: E402

EXIT_INCOMPLETE = 2  # vLLM did not finish every request within max_steps


def import_vllm(release: str | None = None):
    """Import vLLM, pick the installed release's class and prepare its platform (before
    vLLM resolves it). `release`: the version the caller requires (SystemExit if the
    installed vLLM is another). Returns (vllm module, release object)."""
    import vllm

    if release is not None and vllm.__version__ != release:
        raise SystemExit(f"this harness is for vLLM {release}, got {vllm.__version__}")
    rel = oracle_releases.for_version(vllm.__version__)
    rel.prepare_platform()
    return vllm, rel


class PreemptionRecorder:
    """Each preemption's victim, trigger (whose allocation failed) and state before and
    after vLLM resets it; a release's scheduler calls before() / after() around vLLM's own
    preemption code (oracle_releases: make_scheduler)."""

    def __init__(self) -> None:
        self.log: list[dict] = []

    def before(self, scheduler, request, caller) -> None:
        trigger = caller.f_locals.get("request") if caller.f_code.co_name == "schedule" else None
        self.log.append(
            {
                "req": request.request_id,
                "trigger": trigger.request_id if trigger is not None else None,
                "self_preempt": trigger is request,
                "num_computed_tokens_before": request.num_computed_tokens,
                "num_tokens": request.num_tokens,
                "num_output_tokens": request.num_output_tokens,
                "blocks_held_before": _num_blocks(scheduler, request.request_id),
                "free_blocks_before": scheduler.kv_cache_manager.block_pool.get_num_free_blocks(),
                "called_from": caller.f_code.co_name,
            }
        )

    def after(self, scheduler) -> None:
        self.log[-1]["free_blocks_after"] = (
            scheduler.kv_cache_manager.block_pool.get_num_free_blocks()
        )


def main(release: str | None = None) -> None:
    """The command line (sys.argv). `release`: require this vLLM version."""
    ap = argparse.ArgumentParser(
        description="Ground-truth oracle: drive vLLM's real v1 Scheduler + KVCacheManager on "
        "CPU with fake model outputs and write a step-by-step JSONL trace.")
    ap.add_argument("workload")
    ap.add_argument("-o", "--out", help="trace.jsonl (default: next to workload)")
    ap.add_argument("--meta", help="meta.json (default: next to workload)")
    ap.add_argument("--summary", help="summary.json (default: next to workload)")
    args = ap.parse_args()

    cfg, req_specs = oracle_config.load_workload(args.workload)
    wl_dir = os.path.dirname(os.path.abspath(args.workload))
    out_path = args.out or os.path.join(wl_dir, "trace.jsonl")
    meta_path = args.meta or os.path.join(wl_dir, "meta.json")
    summary_path = args.summary or os.path.join(wl_dir, "summary.json")

    t_import = time.perf_counter()
    vllm, rel = import_vllm(release)
    why = rel.unsupported(cfg)
    if why:
        print(why, file=sys.stderr)
        sys.exit(oracle_releases.EXIT_UNSUPPORTED)
    run(vllm, rel, cfg, req_specs, wl_dir, out_path, summary_path, meta_path, t_import)


def run(vllm, rel, cfg: dict, req_specs: list[dict], wl_dir: str, out_path: str,
        summary_path: str, meta_path: str, t_import: float) -> None:
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core.kv_cache_utils import init_none_hash
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request, RequestStatus
    from vllm.v1.structured_output import StructuredOutputManager
    import torch

    import_s = time.perf_counter() - t_import

    # ------------------------------------------------------ configs, scheduler
    t_setup = time.perf_counter()
    setup = oracle_config.build(rel, cfg)
    vllm_config, kv_cache_config = setup.vllm_config, setup.kv_cache_config
    cc = vllm_config.cache_config
    recorder = PreemptionRecorder()
    base_cls = AsyncScheduler if cfg["async_scheduling"] else Scheduler
    scheduler = rel.make_scheduler(
        base_cls,
        recorder,
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        **rel.scheduler_kwargs(setup.scheduler_block_size, setup.hash_block_size),
        include_finished_set=False,
        log_stats=True,
    )
    block_hasher = None
    if cc.enable_prefix_caching:
        # Same as EngineCore.__init__.
        caching_hash_fn = rel.hash_fn_by_name(cc.prefix_caching_hash_algo)
        init_none_hash(caching_hash_fn)
        block_hasher = rel.block_hasher(setup.hash_block_size, caching_hash_fn, vllm_config)
    setup_s = time.perf_counter() - t_setup

    # ------------------------------------------------------------- requests
    by_step: dict[int, list[dict]] = {}
    for idx, r in enumerate(req_specs):
        by_step.setdefault(int(r["arrival_step"]), []).append((idx, r))
    order = {r["id"]: i for i, r in enumerate(req_specs)}
    request_kwargs = rel.request_kwargs()

    def make_request(idx: int, spec: dict) -> Request:
        sp = SamplingParams(
            max_tokens=int(spec["max_tokens"]),
            ignore_eos=True,
            temperature=0.0,
        )
        return Request(
            request_id=str(spec["id"]),
            prompt_token_ids=list(spec["prompt_token_ids"]),
            sampling_params=sp,
            pooling_params=None,
            # Deterministic arrival times (used for priority tie-breaks).
            arrival_time=float(spec["arrival_step"]) + idx * 1e-6,
            priority=int(spec.get("priority", 0)),
            block_hasher=block_hasher,
            **request_kwargs,
        )

    def fake_token(req) -> int:
        if cfg["fake_token_mode"] == "fixed":
            return int(cfg["fixed_token"])
        return 1000 + (req.num_output_tokens % 30000)

    # ------------------------------------------------------------- main loop
    all_ids = [r["id"] for r in req_specs]
    finished_at: dict[str, int] = {}
    preemptions_per_req: dict[str, int] = {i: 0 for i in all_ids}
    first_scheduled_at: dict[str, int] = {}
    first_token_at: dict[str, int] = {}
    total_preemptions = 0
    total_prefix_hit_tokens = 0
    preemption_events: list[dict] = []
    max_step_arrival = max(by_step) if by_step else 0
    # Depth of EngineCore's batch queue: 2 with async scheduling, else 1 (plain step()).
    batch_queue_size = 2 if cfg["async_scheduling"] else 1
    rel.check_batch_queue(vllm_config, scheduler, cfg, batch_queue_size)
    # Pending batches: (step that scheduled it, SchedulerOutput, [sample?]).
    batch_queue: deque = deque()

    def do_schedule(step: int, rec: dict) -> None:
        nonlocal total_preemptions, total_prefix_hit_tokens
        status_before = {rid: req.status for rid, req in scheduler.requests.items()}
        sample_state = rel.before_schedule(scheduler)
        recorder.log.clear()

        so = scheduler.schedule()

        scheduled = list(so.num_scheduled_tokens.items())
        new_ids, resumed_ids, running_ids = [], [], []
        prefix_hits = {}
        for rid, n in scheduled:
            st = status_before.get(rid)
            req = scheduler.requests[rid]
            if st == RequestStatus.RUNNING:
                running_ids.append(rid)
            else:
                (resumed_ids if st == RequestStatus.PREEMPTED else new_ids).append(rid)
                # num_computed_tokens was set to the prefix-cache hit at
                # admission, then advanced by n in _update_after_schedule.
                hit = req.num_computed_tokens - n
                prefix_hits[rid] = hit
                total_prefix_hit_tokens += hit
                first_scheduled_at.setdefault(rid, step)
        # Cross-check our classification against vLLM's SchedulerOutput (the
        # V2 model runner path lists resumed requests as new ones).
        so_new = [r.req_id for r in so.scheduled_new_reqs]
        assert so_new == new_ids or set(so_new) == set(new_ids) | set(resumed_ids), (
            so_new, new_ids, resumed_ids)

        preempted = [dict(p) for p in recorder.log]
        rel.check_preempted(so, preempted, status_before, scheduler)
        for p in preempted:
            preemptions_per_req[p["req"]] += 1
            preemption_events.append(
                {"step": step, "req": p["req"], "trigger": p["trigger"],
                 "self_preempt": p["self_preempt"],
                 "num_computed_tokens_before": p["num_computed_tokens_before"],
                 "num_tokens": p["num_tokens"]}
            )
        total_preemptions += len(preempted)

        will_sample = [rel.will_sample(scheduler, rid, sample_state) for rid, _ in scheduled]
        batch_queue.appendleft((step, so, will_sample))
        rec.update(
            {
                "scheduled": [[rid, n] for rid, n in scheduled],
                "num_scheduled_tokens": so.total_num_scheduled_tokens,
                "new": new_ids,
                "resumed": resumed_ids,
                "running_scheduled": running_ids,
                "so_resumed_req_ids": rel.resumed_req_ids(so),
                "prefix_hit_tokens": prefix_hits,
                "preempted": [p["req"] for p in preempted],
                "preemptions": preempted,
                "will_sample": [rid for (rid, _), w in zip(scheduled, will_sample) if w],
                "free_blocks_after_schedule": scheduler.kv_cache_manager.block_pool.get_num_free_blocks(),
            }
        )

    def do_update(step: int, rec: dict) -> None:
        """Pop the oldest in-flight batch, fake its model output, and feed it to
        update_from_output (EngineCore.step / step_with_batch_queue)."""
        b_step, so, will_sample = batch_queue.pop()
        req_ids = list(so.num_scheduled_tokens)
        sampled_token_ids: list[list[int]] = []
        for rid, w in zip(req_ids, will_sample):
            req = scheduler.requests.get(rid)
            sampled_token_ids.append([fake_token(req)] if w and req is not None else [])
        mro = ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
            sampled_token_ids=sampled_token_ids,
            logprobs=None,
            prompt_logprobs_dict={},
            pooler_output=[],
        )
        engine_outputs = scheduler.update_from_output(so, mro)
        finished_now = []
        emitted = []
        for outs in engine_outputs.values():
            for o in outs.outputs:
                if o.new_token_ids:
                    emitted.append(o.request_id)
                    first_token_at.setdefault(o.request_id, step)
                if o.finish_reason is not None:
                    finished_now.append(o.request_id)
                    finished_at[o.request_id] = step
        finished_now.sort(key=lambda r: order[r])
        emitted.sort(key=lambda r: order[r])
        rec["updated_batch"] = b_step
        rec["sampled"] = emitted
        rec["finished"] = finished_now

    t_run = time.perf_counter()
    lines: list[str] = []
    step = 0
    while step < cfg["max_steps"]:
        arrivals = []
        for idx, spec in by_step.get(step, []):
            scheduler.add_request(make_request(idx, spec))
            arrivals.append(str(spec["id"]))
        rec: dict = {"step": step, "arrivals": arrivals}

        # Mirrors EngineCore.step() (sync) and step_with_batch_queue() (async).
        did_update = False
        if scheduler.has_requests():
            do_schedule(step, rec)
            so = batch_queue[0][1]
            model_executed = so.total_num_scheduled_tokens > 0
            if not rel.batch_stays_queued(scheduler, model_executed, len(batch_queue),
                                          batch_queue_size):
                do_update(step, rec)
                did_update = True
        elif batch_queue:
            do_update(step, rec)
            did_update = True
        else:
            rec["idle"] = True  # EngineCore does not step with nothing to do.
        if not did_update:
            rec.setdefault("sampled", [])
            rec.setdefault("finished", [])

        bp = scheduler.kv_cache_manager.block_pool
        live = [rid for rid in all_ids if rid in scheduler.requests]
        rec.update(
            {
                "num_computed_tokens": {
                    rid: scheduler.requests[rid].num_computed_tokens for rid in live
                },
                "num_output_tokens": {
                    rid: scheduler.requests[rid].num_output_tokens for rid in live
                },
                "status": {rid: str(scheduler.requests[rid].status) for rid in live},
                "blocks_held": {
                    rid: nb for rid in live if (nb := _num_blocks(scheduler, rid))
                },
                "running": [r.request_id for r in scheduler.running],
                "waiting": rel.waiting_order(scheduler),
                "free_blocks": bp.get_num_free_blocks(),
                "kv_usage": round(scheduler.kv_cache_manager.usage, 6),
                "cached_blocks": len(bp.cached_block_hash_to_block),
            }
        )
        if cfg["async_scheduling"]:
            rec["num_output_placeholders"] = {
                rid: p
                for rid in live
                if (p := scheduler.requests[rid].num_output_placeholders)
            }
            rec["in_flight_batches"] = [b[0] for b in batch_queue]
        lines.append(json.dumps(rec, separators=(",", ":")))
        step += 1
        if len(finished_at) == len(all_ids) and not batch_queue:
            break
        if rec.get("idle") and step > max_step_arrival:
            break
    run_s = time.perf_counter() - t_run
    completed = len(finished_at) == len(all_ids)

    # ------------------------------------------------------------- writers
    with open(out_path, "w") as f:
        f.write("\n".join(lines) + "\n")

    summary = {
        "num_steps": len(lines),
        "completed": completed,
        "total_preemptions": total_preemptions,
        "preemptions_per_request": preemptions_per_req,
        "requests_preempted": sum(1 for v in preemptions_per_req.values() if v),
        "self_preemptions": sum(1 for e in preemption_events if e["self_preempt"]),
        "preemption_events": preemption_events,
        "total_prefix_hit_tokens": total_prefix_hit_tokens,
        "first_scheduled_step": first_scheduled_at,
        "first_token_step": first_token_at,
        "finished_step": finished_at,
    }
    _write_json(summary_path, summary)
    meta = {
        "vllm_version": vllm.__version__,
        "torch_version": torch.__version__,
        "python": sys.version.split()[0],
        "scheduler_class": base_cls.__module__ + "." + base_cls.__name__,
        "batch_queue_size": batch_queue_size,
        "vllm_max_concurrent_batches": rel.max_concurrent_batches(vllm_config),
        "kv_cache_manager_class": type(scheduler.kv_cache_manager).__module__
        + "."
        + type(scheduler.kv_cache_manager).__name__,
        "platform": type(__import__("vllm.platforms", fromlist=["current_platform"]).current_platform).__name__,
        "workload_config": cfg,
        "resolved_config": setup.resolved,
        "usable_blocks": cfg["num_gpu_blocks"] - 1,
        "timing_s": {
            "import": round(import_s, 3),
            "setup": round(setup_s, 3),
            "run": round(run_s, 3),
        },
    }
    # timing is the only non-deterministic content; keep it out of the trace.
    _write_json(meta_path, meta)
    print(
        f"{os.path.basename(wl_dir)}: steps={len(lines)} completed={completed} "
        f"preemptions={total_preemptions} "
        f"requests_preempted={summary['requests_preempted']} "
        f"prefix_hit_tokens={total_prefix_hit_tokens} run={run_s:.2f}s "
        f"(import {import_s:.1f}s, setup {setup_s:.1f}s)"
    )
    if not completed:
        sys.exit(EXIT_INCOMPLETE)


def _write_json(path: str, obj: dict) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.write("\n")


def _num_blocks(scheduler, req_id: str) -> int:
    """Blocks currently held by a request (single KV cache group)."""
    mgr = scheduler.kv_cache_manager.coordinator.single_type_managers[0]
    return len(mgr.req_to_blocks.get(req_id, ()))


if __name__ == "__main__":
    main()
