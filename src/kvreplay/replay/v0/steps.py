"""The V0 engine behind the same input API and step records as the V1 `Engine`.

`V0Steps` drives `V0Engine` (replay/v0/v0_engine.py, oracle-format records) and returns each
iteration as a `StepRecord` (replay/records.py), so the log inference and every view read
V0 and V1 runs alike. A request index is a logged request; with n > 1 it enters as n
sequence groups, as 0.6.6 splits it (`LLMEngine._add_processed_request`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvreplay.limits import limit, too_many_steps
from kvreplay.replay.records import (Admission, EngineInputs, PreemptionEvent,
                                     RecomputeTally, StepRecord)
from kvreplay.replay.v0.v0_engine import DEFAULTS, V0Engine
from kvreplay.replay.v0.v0_scheduler import V0_PROFILES
from kvreplay.replay.workload import RequestSpec

V0_PROFILE = "0.6.6.post1"


@dataclass(slots=True)
class V0Config:
    """The V0 engine's configuration (0.6.x names)."""

    num_gpu_blocks: int
    num_cpu_blocks: int
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    enable_chunked_prefill: bool
    enable_prefix_caching: bool
    policy: str
    preemption_mode: str | None
    watermark: float = 0.01
    fake_token_mode: str = "index"
    fixed_token: int = 42

    def engine_dict(self) -> dict[str, Any]:
        d = dict(DEFAULTS)
        for k in ("num_gpu_blocks", "num_cpu_blocks", "block_size", "max_num_seqs",
                  "max_num_batched_tokens", "max_model_len", "enable_chunked_prefill",
                  "enable_prefix_caching", "policy", "preemption_mode", "watermark",
                  "fake_token_mode", "fixed_token"):
            d[k] = getattr(self, k)
        return d


def v0_workload(data: dict[str, Any], name: str = "") -> tuple["V0Workload", list[int]]:
    """A V0 workload JSON (`"engine": "v0"`, replay/v0/v0_engine.py) as a `V0Workload` and
    the arrival step of each of its requests."""
    from kvreplay.replay.v0.v0_engine import parse_workload

    cfg, reqs, _profile = parse_workload(data)
    config = V0Config(**{k: cfg[k] for k in V0Config.__dataclass_fields__})  # type: ignore[attr-defined]
    specs: list[RequestSpec] = []
    parent: dict[str, str] = {}
    arrivals: list[int] = []
    for r in reqs:
        n = int(r.get("n", 1))
        ids = [r["id"]] if n == 1 else [f"{r['id']}_parallel_sample_{i}" for i in range(n)]
        for gid in ids:
            specs.append(RequestSpec(gid, int(r.get("arrival_step", 0)), r["prompt_token_ids"],
                                     int(r["max_tokens"]), int(r.get("priority", 0))))
            parent[gid] = r["id"]
        arrivals.append(int(r.get("arrival_step", 0)))
    return V0Workload(name or str(data.get("name", "")), str(data.get("description", "")),
                      config, specs, int(cfg["max_steps"]), parent), arrivals


@dataclass(slots=True)
class V0Workload:
    """Same shape as `Workload` (name, description, config, requests, max_steps), one
    request spec per sequence group; `parent` maps a group to its logged request."""

    name: str
    description: str
    config: V0Config
    requests: list[RequestSpec]
    max_steps: int
    parent: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class V0ProfileRef:
    """The V0 rules a replay follows (V0 has one profile: 0.6.6.post1)."""

    name: str = f"v0-{V0_PROFILE}"
    version: str = V0_PROFILE
    engine: str = "V0"


def victim_rule(p: dict[str, Any]) -> str:
    """V0 picks the last running group (spec B), or the lowest priority under PRIORITY."""
    if p["called_from"] == "_schedule_priority_preemption":
        return "priority"
    return "self" if p["self_preempt"] else "last running"


def preemption_event(p: dict[str, Any]) -> PreemptionEvent:
    failed = "free_gpu_after" not in p  # the swap-out that stopped vLLM
    swap = p["mode"] == "swap"
    return PreemptionEvent(
        victim=p["req"], trigger=p["trigger"], self_preempt=p["self_preempt"],
        num_computed_tokens=p["num_computed_tokens_before"], num_tokens=p["num_tokens"],
        num_output_tokens=p["num_output_tokens"], blocks_held=p["blocks_held_before"],
        free_blocks_before=p["free_gpu_before"],
        free_blocks_after=None if failed else p["free_gpu_after"],
        victim_rule=victim_rule(p), called_from=p["called_from"], mode=p["mode"],
        cumulative=p["cumulative_before"] + 1, warning_logged=p["warning_logged"],
        counted_in_prometheus=p["called_from"] == "_schedule_running",
        blocks_swapped_out=(None if failed else p["free_cpu_before"] - p["free_cpu_after"])
        if swap else 0,
        error=p.get("error"),
    )


def step_tokens(rec: dict[str, Any]) -> tuple[int, int]:
    """(prompt tokens, generation tokens) the V0 stat logger counts for one step:
    prompt = token chunks of the prefill groups; generation = the rest of the batch plus
    one per prefill that completed (it sampled its first token)."""
    sched = rec.get("scheduled") or []
    npf = rec.get("num_prefill_groups", 0)
    prompt = sum(n for _, n in sched[:npf])
    sampled = set(rec.get("sampled", ()))
    done_prefills = sum(1 for rid, _ in sched[:npf] if rid in sampled)
    gen = rec.get("num_batched_tokens", 0) - prompt + done_prefills
    return prompt, gen


class V0Steps:
    """A V0 run one step at a time, with the V1 `Engine`'s input API (replay/engine.py)."""

    def __init__(self, workload: V0Workload, *, inputs: EngineInputs | None = None,
                 record_sampled: bool = False) -> None:
        self.workload = workload
        self.eng = V0Engine(workload.config.engine_dict(), V0_PROFILES[V0_PROFILE])
        self.groups_of: list[list[RequestSpec]] = []  # per logged request, its groups
        self.request_ids: list[str] = []
        pos: dict[str, int] = {}
        for s in workload.requests:
            parent = workload.parent.get(s.id, s.id)
            if parent not in pos:
                pos[parent] = len(self.groups_of)
                self.groups_of.append([])
                self.request_ids.append(parent)
            self.groups_of[pos[parent]].append(s)
        n = len(self.groups_of)
        if inputs is None:
            inputs = EngineInputs([-1] * n)
        self.by_step: dict[int, list[int]] = {}
        for i, a in enumerate(inputs.arrival_steps):
            if a >= 0:
                self.by_step.setdefault(a, []).append(i)
        self.aborts_at: dict[int, list[str]] = {}
        for s_, rid in inputs.aborts:
            self.aborts_at.setdefault(s_, []).append(rid)
        self.max_steps = workload.max_steps if inputs.max_steps is None else inputs.max_steps
        self.step_cap = limit("steps")  # past it: one UserError, not hours of steps
        self.max_arrival = max(self.by_step, default=-1)
        self.record_sampled = record_sampled
        self.step_index = 0
        self.done = self.max_steps <= 0
        self.stopped = False
        self.submitted: list[int] = []
        self.arrival_step = [-1] * n
        self.unsubmitted = sum(1 for a in inputs.arrival_steps if a < 0)
        self.abort_log: list[tuple[int, str]] = []
        self.abort_on_arrival: set[str] = set()
        self.pending_aborts: list[str] = []
        self.arrived: set[str] = set()
        self.ended: set[str] = set()
        self.seq = 0
        self.last_record: dict[str, Any] | None = None  # the oracle-format record
        self.recompute = RecomputeTally()

    # -- inputs (same contract as Engine) -------------------------------------------
    def submit(self, index: int) -> None:
        self.submitted.append(index)

    def abort(self, request_id: str) -> bool:
        if request_id in self.ended or request_id in self.abort_on_arrival:
            return False
        if request_id in self.arrived:
            if not self._abort_now(request_id):
                return False  # it had finished
        else:
            self.abort_on_arrival.add(request_id)
        self.abort_log.append((self.step_index, request_id))
        return True

    def _abort_now(self, rid: str) -> bool:
        ids = self.eng.abort_request(rid)
        self.pending_aborts.extend(ids)
        self.ended.add(rid)
        return bool(ids)

    def stop(self) -> None:
        self.stopped = True
        self.done = True

    def inputs(self) -> EngineInputs:
        return EngineInputs(list(self.arrival_step), list(self.abort_log),
                            self.step_index if self.stopped else None)

    def has_work(self) -> bool:
        return self.eng.has_unfinished()

    def finish_imminent(self) -> bool:
        """Will a running group sample its last token in the coming step?"""
        mml = self.eng.cfg["max_model_len"]
        for g in self.eng.sched.running:
            if not g.is_prefill() and (g.num_output_tokens + 1 >= g.max_tokens
                                       or g.get_len() + 1 > mml):
                return True
        return False

    # -- the loop --------------------------------------------------------------------
    def step(self) -> StepRecord:
        if self.done:
            raise RuntimeError("the run is over")
        eng = self.eng
        step = self.step_index
        if step >= self.step_cap:
            raise too_many_steps(self.step_cap)
        for rid in self.aborts_at.get(step, ()):
            self.abort(rid)
        arrivals: list[str] = []
        new_idx = [*self.by_step.get(step, ()), *self.submitted]
        self.unsubmitted -= len(self.submitted)
        self.submitted = []
        for i in new_idx:
            self.arrival_step[i] = step
            for s in self.groups_of[i]:
                r = {"id": s.id, "prompt_token_ids": s.prompt_token_ids,
                     "max_tokens": s.max_tokens, "priority": s.priority}
                arrivals.extend(eng.add_request(r, self.seq, arrival_time=self.seq * 1e-6))
                self.seq += 1
            rid = self.request_ids[i]
            self.arrived.add(rid)
            if rid in self.abort_on_arrival:
                self.abort_on_arrival.discard(rid)
                self._abort_now(rid)
        raw = eng.step(step, arrivals)
        self.last_record = raw
        rec = self._record(raw, step)
        self.step_index = step + 1
        if eng.terminated or self.step_index >= self.max_steps or (
                not eng.has_unfinished() and not self.unsubmitted
                and self.step_index > self.max_arrival):
            self.done = True
        return rec

    def _record(self, r: dict[str, Any], step: int) -> StepRecord:
        eng = self.eng
        sched = eng.sched
        rec = StepRecord(step, r.get("arrivals", []))
        if self.pending_aborts:
            rec.aborted = self.pending_aborts
            self.pending_aborts = []
        rec.preemptions = [preemption_event(p) for p in r.get("preemptions", ())]
        if "terminal_error" in r:
            rec.terminal_error = r["terminal_error"]
        if r.get("idle"):
            rec.idle = True
        scheduled = r.get("scheduled") or []
        if scheduled:
            cached = r.get("cached_tokens", {})
            admitted_ids = set(r.get("new", ())) | set(r.get("resumed", ()))
            rec.num_scheduled = len(scheduled)
            rec.num_scheduled_tokens = sum(n for _, n in scheduled) - sum(cached.values())
            rec.decode_tokens = sum(1 for rid, n in scheduled if n == 1 and rid not in admitted_ids)
            sampled = set(r.get("sampled", ()))
            groups = eng.groups
            adm = []
            for key, resumed, swapped in (("new", False, False), ("resumed", True, False),
                                          ("swapped_in", True, True)):
                for rid in r.get(key, ()):
                    n_tok = groups[rid].get_len() - (rid in sampled)
                    adm.append(Admission(rid, 0 if swapped else cached.get(rid, 0), n_tok,
                                         resumed, swapped))
            rec.admitted = adm
            prompt, gen = step_tokens(r)
            rec.stats_prompt_tokens = prompt
            rec.generated_tokens = gen
            rec.first_tokens = [rid for rid in r.get("sampled", ())
                                if groups[rid].num_output_tokens == 1]
            rec.updated_batch = step
            if self.record_sampled:
                rec.sampled = list(r.get("sampled", ()))
        cached = r.get("cached_tokens", {})
        self.recompute.step(rec, {rid: n - cached.get(rid, 0) for rid, n in scheduled})
        rec.finished = list(r.get("finished", ()))
        if rec.finished:
            rec.finished_output_tokens = [eng.groups[rid].num_output_tokens for rid in rec.finished]
        rec.prometheus_preemptions = r.get("so_preempted", 0)
        rec.num_running = len(sched.running)
        rec.num_waiting = len(sched.waiting)
        rec.num_swapped = len(sched.swapped)
        bm = sched.block_manager
        rec.free_blocks = bm.get_num_free_gpu_blocks()
        ng, nc = eng.cfg["num_gpu_blocks"], eng.cfg["num_cpu_blocks"]
        rec.kv_usage = r.get("gpu_cache_usage", round(1.0 - rec.free_blocks / ng, 6))
        rec.cpu_kv_usage = r.get("cpu_cache_usage",
                                 round(1.0 - bm.get_num_free_cpu_blocks() / nc, 6) if nc else 0.0)
        return rec
