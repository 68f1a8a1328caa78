"""The V0 step loop: workload in, oracle-format trace records out.

Mirrors `../shared/conformance/oracle/v0/run_oracle_v0.py`, the harness that drove vLLM
0.6.6.post1: the sync path of `LLMEngine.step()` (arrivals, `schedule()`, a fake model that
samples one token for every scheduled group whose chunk reaches the end of its sequence,
the stop check, frees). Trace field names and order are the oracle's.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any, Dict, List, Optional

from kvreplay.errors import UserError
from kvreplay.limits import check as check_limit

from .v0_scheduler import (FINISHED_IGNORED, FINISHED_LENGTH_CAPPED, RUNNING, SWAPPED, WAITING,
                        Scheduler, SequenceGroup, TerminalError, V0Config, V0Profile,
                        V0_PROFILES)

DEFAULTS: Dict[str, Any] = {
    "num_gpu_blocks": 64, "num_cpu_blocks": 0, "block_size": 16,
    "max_num_seqs": 16, "max_num_batched_tokens": 2048, "max_model_len": None,
    "enable_chunked_prefill": False, "enable_prefix_caching": False,
    "policy": "fcfs", "preemption_mode": None, "watermark": 0.01,
    "delay_factor": 0.0, "max_steps": 5000,
    "fake_token_mode": "index", "fixed_token": 42,
}
# V1 keys with no V0 equivalent: accepted only at their V1 default (as the oracle does)
V1_ONLY_AT_DEFAULT: Dict[str, Any] = {"long_prefill_token_threshold": 0,
                                      "scheduler_reserve_full_isl": True,
                                      "async_scheduling": False}
TOP_KEYS = {"name", "engine", "description", "config", "requests", "profile", "notes"}
REQUEST_KEYS = {"id", "arrival_step", "prompt_token_ids", "max_tokens", "priority", "n"}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _int(where: str, v: Any, lo: int) -> int:
    if not _is_int(v) or v < lo:
        raise UserError(f"{where} must be an integer >= {lo}, got {v!r}")
    return v


def _bool(where: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise UserError(f"{where} must be true or false, got {v!r}")
    return v


def parse_workload(workload: Any) -> tuple:
    """Validate a V0 workload dict; returns (config dict with defaults, requests, profile)."""
    if not isinstance(workload, dict):
        raise UserError("workload must be a JSON object")
    unknown = sorted(set(workload) - TOP_KEYS)
    if unknown:
        raise UserError(f"unknown workload key {unknown[0]!r}")
    if workload.get("engine", "v0") != "v0":
        raise UserError(f"workload engine is {workload.get('engine')!r}, not 'v0'")
    prof_name = workload.get("profile", "0.6.6.post1")
    if prof_name not in V0_PROFILES:
        raise UserError(f"unknown V0 profile {prof_name!r} (known: {', '.join(sorted(V0_PROFILES))})")
    raw = workload.get("config") or {}
    if not isinstance(raw, dict):
        raise UserError("config must be a JSON object")
    cfg = dict(DEFAULTS)
    for k, v in raw.items():
        if k in V1_ONLY_AT_DEFAULT:
            if v != V1_ONLY_AT_DEFAULT[k] or type(v) is not type(V1_ONLY_AT_DEFAULT[k]):
                raise UserError(f"config key {k}={v!r} has no V0 equivalent")
            continue
        if k not in DEFAULTS:
            raise UserError(f"unknown config key {k!r}")
        cfg[k] = v
    for k in ("num_gpu_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens", "max_steps"):
        _int(f"config.{k}", cfg[k], 1)
    _int("config.num_cpu_blocks", cfg["num_cpu_blocks"], 0)
    _bool("config.enable_chunked_prefill", cfg["enable_chunked_prefill"])
    _bool("config.enable_prefix_caching", cfg["enable_prefix_caching"])
    if cfg["policy"] not in ("fcfs", "priority"):
        raise UserError(f"config.policy must be 'fcfs' or 'priority', got {cfg['policy']!r}")
    if cfg["preemption_mode"] not in (None, "recompute", "swap"):
        raise UserError(f"config.preemption_mode must be null, 'recompute' or 'swap', "
                        f"got {cfg['preemption_mode']!r}")
    if cfg["watermark"] != 0.01 or isinstance(cfg["watermark"], bool):
        raise UserError("config.watermark is fixed at 0.01 in V0 (the block manager's default)")
    if cfg["delay_factor"] != 0.0 or isinstance(cfg["delay_factor"], bool):
        raise UserError("config.delay_factor > 0 depends on wall time and is not supported")
    if cfg["fake_token_mode"] not in ("index", "fixed"):
        raise UserError(f"config.fake_token_mode must be 'index' or 'fixed', got {cfg['fake_token_mode']!r}")
    _int("config.fixed_token", cfg["fixed_token"], 0)
    if cfg["max_model_len"] is None:
        cfg["max_model_len"] = 2048 if cfg["enable_chunked_prefill"] else min(
            2048, cfg["max_num_batched_tokens"])
    _int("config.max_model_len", cfg["max_model_len"], 1)
    # SchedulerConfig._verify_args (0.6.6)
    if not cfg["enable_chunked_prefill"] and cfg["max_num_batched_tokens"] < cfg["max_model_len"]:
        raise UserError(f"max_num_batched_tokens ({cfg['max_num_batched_tokens']}) is smaller than "
                        f"max_model_len ({cfg['max_model_len']}) with chunked prefill off")
    if cfg["max_num_batched_tokens"] < cfg["max_num_seqs"]:
        raise UserError(f"max_num_batched_tokens ({cfg['max_num_batched_tokens']}) must be >= "
                        f"max_num_seqs ({cfg['max_num_seqs']})")
    if (cfg["enable_chunked_prefill"] and cfg["enable_prefix_caching"]
            and cfg["max_num_batched_tokens"] % cfg["block_size"]):
        # 0.6.6 raises ValueError at the first chunked schedule in this configuration
        raise UserError("with chunked prefill and prefix caching, max_num_batched_tokens must be "
                        "a multiple of block_size")
    reqs = workload.get("requests")
    if not isinstance(reqs, list):
        raise UserError("requests must be a list")
    seen = set()
    for i, r in enumerate(reqs):
        where = f"requests[{i}]"
        if not isinstance(r, dict):
            raise UserError(f"{where} must be an object")
        unknown = sorted(set(r) - REQUEST_KEYS)
        if unknown:
            raise UserError(f"{where}: unknown key {unknown[0]!r}")
        if not isinstance(r.get("id"), str) or not r["id"]:
            raise UserError(f"{where}.id must be a non-empty string")
        _int(f"{where}.arrival_step", r.get("arrival_step", 0), 0)
        p = r.get("prompt_token_ids")
        if not isinstance(p, list) or not p or not all(_is_int(t) and t >= 0 for t in p):
            raise UserError(f"{where}.prompt_token_ids must be a non-empty list of token ids")
        _int(f"{where}.max_tokens", r.get("max_tokens"), 1)
        if not _is_int(r.get("priority", 0)):
            raise UserError(f"{where}.priority must be an integer")
        n = _int(f"{where}.n", r.get("n", 1), 1)
        check_limit("n", n, f"{where}.n")
        ids = [r["id"]] if n == 1 else [f"{r['id']}_parallel_sample_{j}" for j in range(n)]
        for gid in ids:
            if gid in seen:
                raise UserError(f"duplicate request id {gid!r}")
            seen.add(gid)
    return cfg, reqs, V0_PROFILES[prof_name]


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


class V0Engine:
    """The V0 step loop one iteration at a time (the step-wise API under `run_workload`).

    `add_request(r, idx, arrival_time)` puts a request (a workload request dict: id,
    prompt_token_ids, max_tokens, priority, n) into the waiting queue; `step(step, arrivals)`
    runs one engine iteration and returns its trace record (oracle field names and order).
    Used by `run_workload` (arrivals by step) and by the V0 log replay (arrivals by time).
    """

    def __init__(self, cfg: Dict[str, Any], profile: V0Profile,
                 check_invariants: bool = False) -> None:
        config = V0Config(
            block_size=cfg["block_size"], num_gpu_blocks=cfg["num_gpu_blocks"],
            num_cpu_blocks=cfg["num_cpu_blocks"], max_num_seqs=cfg["max_num_seqs"],
            max_num_batched_tokens=cfg["max_num_batched_tokens"],
            max_model_len=cfg["max_model_len"],
            enable_chunked_prefill=cfg["enable_chunked_prefill"],
            enable_prefix_caching=cfg["enable_prefix_caching"], policy=cfg["policy"],
            preemption_mode=cfg["preemption_mode"], watermark=cfg["watermark"])
        self.cfg = cfg
        self.sched = Scheduler(config, profile, check_invariants=check_invariants)
        self.groups: Dict[str, SequenceGroup] = {}
        self.order: List[str] = []
        self.ever_preempted: set = set()
        self.seq_counter = 0
        self.fixed = cfg["fixed_token"] if cfg["fake_token_mode"] == "fixed" else None
        self.terminated = False

    def add_request(self, r: dict, idx: int, arrival_time: Optional[float] = None) -> List[str]:
        """Add a request; n > 1 becomes n groups (`LLMEngine._add_processed_request`).
        Returns the group ids. `arrival_time` (default: arrival_step + idx * 1e-6) orders
        groups under the priority policy."""
        if arrival_time is None:
            arrival_time = float(r.get("arrival_step", 0)) + idx * 1e-6
        n = int(r.get("n", 1))
        ids = [r["id"]] if n == 1 else [f"{r['id']}_parallel_sample_{i}" for i in range(n)]
        for rid in ids:
            g = SequenceGroup(rid, self.seq_counter, r["prompt_token_ids"], int(r["max_tokens"]),
                              int(r.get("priority", 0)), arrival_time)
            self.seq_counter += 1
            self.groups[rid] = g
            self.order.append(rid)
            self.sched.add_seq_group(g)
        return ids

    def has_unfinished(self) -> bool:
        return self.sched.has_unfinished_seqs()

    def abort_request(self, request_id: str) -> List[str]:
        """`Scheduler.abort_seq_group`: the request's groups leave every queue and free their
        blocks (GPU or CPU). Returns the aborted group ids."""
        sched = self.sched
        out: List[str] = []
        prefix = request_id + "_parallel_sample_"
        for name in ("waiting", "running", "swapped"):
            q = getattr(sched, name)
            keep = []
            for g in q:
                if g.request_id == request_id or g.request_id.startswith(prefix):
                    if not g.is_finished():
                        g.status = "FINISHED_ABORTED"
                    sched.block_manager.free(g)
                    out.append(g.request_id)
                else:
                    keep.append(g)
            q.clear()
            q.extend(keep)
        return out

    def step(self, step: int, arrivals: List[str]) -> dict:
        """One engine iteration: an `idle` record when nothing is unfinished, a record with
        `terminal_error` when vLLM would stop (then `terminated` is set)."""
        sched = self.sched
        bm = sched.block_manager
        groups = self.groups
        cfg = self.cfg
        rec: Dict[str, Any] = {"step": step, "arrivals": arrivals}
        if not sched.has_unfinished_seqs():
            rec["idle"] = True
            return rec
        pre_status: Dict[str, str] = {}
        for q, name in ((sched.waiting, WAITING), (sched.running, RUNNING), (sched.swapped, SWAPPED)):
            for g in q:
                pre_status[g.request_id] = name
        try:
            so = sched.schedule(float(step))
        except TerminalError as e:
            pre = sched.preemption_log
            rec["preemptions"] = pre
            rec["preempted"] = [p["req"] for p in pre]
            # "victim" as the oracle defines it: the last group preempted in this step, if any
            rec["terminal_error"] = {"type": e.type_name, "message": e.message,
                                     "victim": pre[-1]["req"] if pre else None}
            rec["num_cumulative_preemption"] = sched.num_cumulative_preemption
            self.terminated = True
            return rec
        free_gpu_after_schedule = bm.get_num_free_gpu_blocks()
        free_cpu_after_schedule = bm.get_num_free_cpu_blocks()
        ssg = so.scheduled
        rec["scheduled"] = [[g.request_id, chunk] for g, chunk, _ in ssg]
        rec["num_prefill_groups"] = so.num_prefill_groups
        rec["num_batched_tokens"] = so.num_batched_tokens
        cached: Dict[str, int] = {}
        for rid, _nb, ncached in sched.budget_log:
            if ncached:
                cached[rid] = cached.get(rid, 0) + ncached
        rec["cached_tokens"] = cached
        ids = [g.request_id for g, _, _ in ssg]
        ever = self.ever_preempted
        rec["new"] = [i for i in ids if pre_status.get(i) == WAITING and i not in ever]
        rec["resumed"] = [i for i in ids if pre_status.get(i) == WAITING and i in ever]
        rec["swapped_in"] = [i for i in ids if pre_status.get(i) == SWAPPED]
        rec["running_scheduled"] = [i for i in ids if pre_status.get(i) == RUNNING]
        pre = sched.preemption_log
        rec["preempted"] = [p["req"] for p in pre]
        rec["preemptions"] = pre
        rec["swapped_out"] = [p["req"] for p in pre if p["mode"] == "swap"]
        rec["so_preempted"] = so.preempted
        rec["blocks_to_swap_out"] = so.blocks_to_swap_out
        rec["blocks_to_swap_in"] = so.blocks_to_swap_in
        rec["blocks_to_copy"] = so.blocks_to_copy
        rec["ignored"] = [g.request_id for g in so.ignored]
        for p in pre:
            ever.add(p["req"])

        # ---- fake model + _process_model_outputs (sync, single step)
        fixed = self.fixed
        max_model_len = cfg["max_model_len"]
        will_sample: List[str] = []
        sampled: List[str] = []
        finished_now: List[str] = []
        for g, chunk, do_sample in ssg:
            if g.is_finished():
                continue
            g.update_num_computed_tokens(chunk)
            if do_sample:
                will_sample.append(g.request_id)
                tok = fixed if fixed is not None else 1000 + (g.num_output_tokens % 30000)
                g.token_ids.append(tok)
                # StopChecker with ignore_eos, no stop ids: max_model_len, then max_tokens
                if g.get_len() > max_model_len or g.num_output_tokens == g.max_tokens:
                    g.status = FINISHED_LENGTH_CAPPED
                sampled.append(g.request_id)
                if g.is_finished():
                    sched.free_seq(g)
            if g.is_finished():
                finished_now.append(g.request_id)
        if finished_now:
            sched.free_finished_seq_groups()
        if sched.check_invariants:
            sched.check()
        rec["will_sample"] = will_sample
        rec["sampled"] = sampled
        rec["finished"] = finished_now + rec["ignored"]
        live = [rid for rid in self.order if not groups[rid].is_finished()]
        if len(live) < len(self.order) // 2:
            self.order = [rid for rid in self.order if not groups[rid].is_finished()]
        rec["num_computed_tokens"] = {rid: groups[rid].num_computed_tokens for rid in live}
        rec["num_output_tokens"] = {rid: groups[rid].num_output_tokens for rid in live}
        rec["status"] = {rid: groups[rid].status for rid in live}
        bh = {}
        for rid in live:
            nb = bm.blocks_held(groups[rid])
            if nb:
                bh[rid] = nb
        rec["blocks_held"] = bh
        rec["running"] = [g.request_id for g in sched.running]
        rec["waiting"] = [g.request_id for g in sched.waiting]
        rec["swapped"] = [g.request_id for g in sched.swapped]
        ng, nc = cfg["num_gpu_blocks"], cfg["num_cpu_blocks"]
        rec["free_gpu_blocks_after_schedule"] = free_gpu_after_schedule
        rec["free_cpu_blocks_after_schedule"] = free_cpu_after_schedule
        rec["free_gpu_blocks"] = bm.get_num_free_gpu_blocks()
        rec["free_cpu_blocks"] = bm.get_num_free_cpu_blocks()
        rec["gpu_cache_usage"] = round(1.0 - rec["free_gpu_blocks"] / ng, 6)
        rec["cpu_cache_usage"] = round(1.0 - rec["free_cpu_blocks"] / nc, 6) if nc else 0.0
        rec["num_cumulative_preemption"] = sched.num_cumulative_preemption
        return rec


def run_workload(workload: dict, check_invariants: bool = False) -> List[dict]:
    """Replay a V0 workload (`"engine": "v0"`) through the V0 scheduler model.

    Returns one record per engine iteration, with the oracle's field names and order.
    A run vLLM would abort (swap space exhausted) ends with a `terminal_error` record.
    Raises `UserError` for an invalid workload.
    """
    cfg, reqs, profile = parse_workload(workload)
    eng = V0Engine(cfg, profile, check_invariants=check_invariants)
    by_step: Dict[int, List[tuple]] = {}
    for idx, r in enumerate(reqs):
        by_step.setdefault(int(r.get("arrival_step", 0)), []).append((idx, r))
    last_arrival = max((int(r.get("arrival_step", 0)) for r in reqs), default=0)
    lines: List[dict] = []
    for step in range(int(cfg["max_steps"])):
        arrivals: List[str] = []
        for idx, r in by_step.get(step, []):
            arrivals.extend(eng.add_request(r, idx))
        rec = eng.step(step, arrivals)
        lines.append(rec)
        if rec.get("idle"):
            if step >= last_arrival:
                break
            continue
        if eng.terminated:
            break
        if not eng.has_unfinished() and step >= last_arrival:
            break
    return lines


def trace_text(trace: List[dict]) -> str:
    """The trace as compact JSON lines, byte-identical to the oracle's trace.jsonl."""
    return "".join(_dumps(r) + "\n" for r in trace)


def summarize(trace: List[dict], workload: Optional[dict] = None) -> dict:
    """summary.json fields computed from a trace (name and completion need the workload)."""
    order: List[str] = []
    last_out: Dict[str, int] = {}
    finished: Dict[str, dict] = {}
    terminal = None
    for rec in trace:
        order.extend(rec.get("arrivals", []))
        if "terminal_error" in rec:
            terminal = rec["terminal_error"]
            continue
        if rec.get("idle"):
            continue
        ignored = set(rec.get("ignored", []))
        sampled = set(rec.get("sampled", []))
        for rid in rec.get("finished", []):
            n = last_out.get(rid, 0) + (1 if rid in sampled else 0)
            finished[rid] = {"step": rec["step"],
                             "reason": FINISHED_IGNORED if rid in ignored else FINISHED_LENGTH_CAPPED,
                             "num_output_tokens": n}
        last_out.update(rec.get("num_output_tokens", {}))
    all_pre = [p for r in trace for p in r.get("preemptions", [])]
    by_mode = {"recompute": 0, "swap": 0}
    for p in all_pre:
        # (a record without a mode: the swap-out itself stopped vLLM, inside the allocator)
        by_mode[p.get("mode", "swap")] += 1
    unfinished = [rid for rid in order if rid not in finished]
    arrived_all = True
    if workload is not None and trace:
        last = max((int(r.get("arrival_step", 0)) for r in workload.get("requests", [])), default=0)
        arrived_all = trace[-1]["step"] >= last
    text = trace_text(trace)
    return {
        "name": workload.get("name") if workload else None,
        "steps": len(trace),
        "completed": terminal is None and not unfinished and arrived_all,
        "terminal_error": terminal,
        "preemptions": len(all_pre),
        "preemptions_by_mode": by_mode,
        "self_preemptions": sum(1 for p in all_pre if p["self_preempt"]),
        "priority_force_preemptions": sum(1 for p in all_pre
                                          if p["called_from"] == "_schedule_priority_preemption"),
        "prometheus_num_preemptions_total": sum(r.get("so_preempted", 0) for r in trace),
        "num_cumulative_preemption": max((r.get("num_cumulative_preemption", 0) for r in trace),
                                         default=0),
        "preemption_warnings_logged": sum(1 for p in all_pre if p["warning_logged"]),
        "swap_outs": by_mode["swap"],
        "swap_ins": sum(len(r.get("swapped_in", [])) for r in trace),
        "ignored": sorted(rid for rid, v in finished.items() if v["reason"] == FINISHED_IGNORED),
        "finished": {rid: finished[rid] for rid in order if rid in finished},
        "unfinished": unfinished,
        "trace_sha256": hashlib.sha256(text.encode()).hexdigest(),
    }
