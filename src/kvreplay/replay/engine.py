"""The engine loop around the scheduler, as the conformance oracle drives vLLM (A9).

Sync: each iteration adds arrivals, schedules, runs the fake model, applies the output.
Async: a batch queue of depth 2; iteration k schedules batch k and applies batch k-1.
The fake model returns one token for each scheduled request whose scheduled tokens reach
the end of its current sequence (`will_sample`), nothing for a partial chunk.

Inputs: a request enters at its workload `arrival_step`, or at the step `EngineInputs`
gives, or when the caller `submit`s it (arrival step -1); `abort` finishes a request
between steps (A8); `stop` ends the run (a log cut short). `inputs()` gives back what the
run was made of, so that the same run can be made again. `step()` returns the step's
`StepRecord` (replay/records.py); replay/trace.py writes the conformance trace from it.
"""

from __future__ import annotations

import functools
import gc
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator, TypeVar

from kvreplay.limits import limit, too_many_steps
from kvreplay.replay.profile import DEFAULT_PROFILE, SchedulerProfile
from kvreplay.replay.records import Admission, EngineInputs, RecomputeTally, StepRecord
from kvreplay.replay.request import BlockHasher, Request, RequestStatus
from kvreplay.replay.scheduler import Scheduler, SchedulerOutput, UpdateResult
from kvreplay.replay.workload import FAKE_TOKEN_FIRST, FAKE_TOKEN_PERIOD, Workload


@dataclass(slots=True)
class RunSummary:
    num_steps: int = 0
    completed: bool = False
    total_preemptions: int = 0
    self_preemptions: int = 0
    total_prefix_hit_tokens: int = 0
    preemption_events: list[dict[str, Any]] = field(default_factory=list)
    preemptions_per_request: dict[str, int] = field(default_factory=dict)
    first_scheduled_step: dict[str, int] = field(default_factory=dict)
    first_token_step: dict[str, int] = field(default_factory=dict)
    finished_step: dict[str, int] = field(default_factory=dict)
    request_steps: int = 0  # sum over steps of requests scheduled

    def to_dict(self) -> dict[str, Any]:
        return {
            "completed": self.completed,
            "finished_step": self.finished_step,
            "first_scheduled_step": self.first_scheduled_step,
            "first_token_step": self.first_token_step,
            "num_steps": self.num_steps,
            "preemption_events": self.preemption_events,
            "preemptions_per_request": self.preemptions_per_request,
            "requests_preempted": sum(1 for v in self.preemptions_per_request.values() if v),
            "self_preemptions": self.self_preemptions,
            "total_preemptions": self.total_preemptions,
            "total_prefix_hit_tokens": self.total_prefix_hit_tokens,
        }


_F = TypeVar("_F", bound=Callable[..., Any])


def without_cyclic_gc(fn: _F) -> _F:
    """Run `fn` with Python's cyclic garbage collector paused. A run keeps every step's
    record alive, and each collection walks them all. The engine makes no reference cycles
    that must go early; whatever it makes is collected once the collector is back on."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not gc.isenabled():
            return fn(*args, **kwargs)
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            gc.enable()

    return wrapper  # type: ignore[return-value]


class Engine:
    """Drives a Scheduler over a workload, one `step()` (one `StepRecord`) at a time."""

    def __init__(
        self,
        workload: Workload,
        profile: SchedulerProfile = DEFAULT_PROFILE,
        *,
        inputs: EngineInputs | None = None,
        check_invariants: bool = False,
        block_hasher: Callable[[Request], None] | None = None,
        record_sampled: bool = False,
        collect_hashes_every: int = 0,
    ) -> None:
        """`collect_hashes_every`: every so many steps, forget the block-hash ids nothing
        live can reach (BlockHasher.collect); 0: never (an engine that is snapshotted)."""
        self.collect_hashes_every = collect_hashes_every
        self.workload = workload
        self.profile = profile
        self.scheduler = Scheduler(workload.config, profile, check_invariants=check_invariants)
        cfg = workload.config
        if block_hasher is None and cfg.enable_prefix_caching:
            block_hasher = BlockHasher(cfg.block_size)
        self.block_hasher = block_hasher if cfg.enable_prefix_caching else None
        self.batch_queue_size = 2 if cfg.async_scheduling else 1
        specs = workload.requests
        if inputs is None:
            inputs = EngineInputs([s.arrival_step for s in specs])
        if len(inputs.arrival_steps) != len(specs):
            raise ValueError("EngineInputs.arrival_steps must give one step per request")
        self.by_step: dict[int, list[int]] = {}
        for idx, a in enumerate(inputs.arrival_steps):
            if a >= 0:
                self.by_step.setdefault(a, []).append(idx)
        self.aborts_at: dict[int, list[str]] = {}
        for s, rid in inputs.aborts:
            self.aborts_at.setdefault(s, []).append(rid)
        self.mid_aborts: dict[int, list[str]] = {}
        for s, rid in inputs.mid_aborts:
            self.mid_aborts.setdefault(s, []).append(rid)
        self.max_steps = workload.max_steps if inputs.max_steps is None else inputs.max_steps
        self.step_cap = limit("steps")  # past it: one UserError, not hours of steps
        self.order = {spec.id: i for i, spec in enumerate(specs)}
        self.summary = RunSummary(preemptions_per_request={spec.id: 0 for spec in specs})
        self.all_ids = [spec.id for spec in specs]
        self.num_requests = len(specs)
        self.max_arrival = max(self.by_step) if self.by_step else -1
        self.record_sampled = record_sampled
        # Loop state (all on the instance: an Engine can be snapshotted between steps).
        self.step_index = 0  # the next step
        self.batch_queue: deque[tuple[int, SchedulerOutput, list[str]]] = deque()
        self.done = self.max_steps <= 0
        self.stopped = False
        self.unsubmitted = sum(1 for a in inputs.arrival_steps if a < 0)
        self.submitted: list[int] = []  # manual arrivals for the next step
        self.arrival_step = [-1] * len(specs)
        self.abort_on_arrival: set[str] = set()
        self.pending_aborts: list[str] = []  # aborted since the last step (its record)
        self.abort_log: list[tuple[int, str]] = []  # (step, request id) of every abort asked
        self.last_output: SchedulerOutput | None = None
        self.last_sample_ids: list[str] = []
        self.last_update: tuple[int, UpdateResult] | None = None
        self._gone: list[Request] = []  # requests that left the scheduler inside this step
        self.recompute = RecomputeTally()

    # -- inputs --------------------------------------------------------------------
    def submit(self, index: int) -> None:
        """Request `index` of the workload enters before the next step."""
        self.submitted.append(index)

    def abort(self, request_id: str) -> bool:
        """Finish a request now, between steps (A8: its blocks are freed at once); one that
        has not arrived yet is aborted as it arrives. False if it had finished already."""
        if request_id in self.summary.finished_step or request_id in self.abort_on_arrival:
            return False
        self.abort_log.append((self.step_index, request_id))
        if request_id in self.scheduler.requests:
            self._abort_now(request_id)
        else:
            self.abort_on_arrival.add(request_id)
        return True

    def set_prompt(self, index: int, prompt_token_ids: list[int]) -> None:
        """Input: request `index` gets another prompt, before it produced a token (a log
        that shows a prompt's length only as it is scheduled: inference/iteration_search.py). Its
        computed tokens must lie within the new prompt."""
        spec = self.workload.requests[index]
        self.workload.requests[index] = replace(spec, prompt_token_ids=prompt_token_ids)
        req = self.scheduler.requests.get(spec.id)
        if req is None or req.num_output_tokens or req.prompt_token_ids is prompt_token_ids:
            return
        if req.num_computed_tokens > len(prompt_token_ids):
            raise ValueError(f"{spec.id} has computed {req.num_computed_tokens} tokens, more "
                             f"than a prompt of {len(prompt_token_ids)}")
        req.prompt_token_ids = prompt_token_ids
        req.num_prompt_tokens = req.num_tokens = len(prompt_token_ids)
        req.block_hashes = []
        if req.block_hasher is not None:
            req.block_hasher(req)

    def stop(self) -> None:
        """End the run here (the log stops: server killed, log copied mid-run)."""
        self.stopped = True
        self.done = True
        self.summary.num_steps = self.step_index
        self.summary.completed = False

    def inputs(self) -> EngineInputs:
        """What this run was made of: a new Engine given it makes the same run."""
        return EngineInputs(list(self.arrival_step), list(self.abort_log),
                            self.step_index if self.stopped else None,
                            [(s, r) for s, ids in sorted(self.mid_aborts.items()) for r in ids])

    def has_work(self) -> bool:
        return self.scheduler.has_requests() or bool(self.batch_queue)

    def finish_imminent(self) -> bool:
        """Will a running request produce its last token in the coming step?"""
        sched = self.scheduler
        max_len = sched.max_model_len
        for r in sched.running:
            if r.num_computed_tokens >= r.num_tokens - 1 and (
                r.num_output_tokens + 1 >= r.max_tokens or r.num_tokens + 1 >= max_len
            ):
                return True
        return False

    def _collect_hashes(self) -> None:
        sched = self.scheduler
        reachable: set[int] = set(sched.pool.cached_block_hash_to_block)
        for r in sched.requests.values():
            reachable.update(r.block_hashes)
        self.block_hasher.collect(reachable)  # type: ignore[union-attr]

    def _abort_now(self, rid: str) -> None:
        self.scheduler.finish_requests([rid], RequestStatus.FINISHED_ABORTED)
        self.summary.finished_step[rid] = self.step_index
        self.pending_aborts.append(rid)

    def _make_request(self, idx: int) -> Request:
        spec = self.workload.requests[idx]
        return Request(
            spec.id,
            spec.prompt_token_ids,
            spec.max_tokens,
            arrival_time=float(spec.arrival_step) + idx * 1e-6,
            priority=spec.priority,
            index=idx,
            block_hasher=self.block_hasher,
        )

    # -- the loop ------------------------------------------------------------------
    def run(self) -> Iterator[StepRecord]:
        """Run to completion (or max_steps, or a stop)."""
        while not self.done:
            yield self.step()

    def step(self) -> StepRecord:
        """One engine iteration (A9)."""
        if self.done:
            raise RuntimeError("the run is over")
        sched = self.scheduler
        batch_queue = self.batch_queue
        step = self.step_index
        if step >= self.step_cap:
            raise too_many_steps(self.step_cap)
        every = self.collect_hashes_every
        if every and step % every == 0 and isinstance(self.block_hasher, BlockHasher):
            self._collect_hashes()
        for rid in self.aborts_at.get(step, ()):
            self.abort(rid)
        arrivals: list[str] = []
        new_idx = self.by_step.get(step, ())
        if self.submitted:
            new_idx = [*new_idx, *self.submitted]
            self.unsubmitted -= len(self.submitted)
            self.submitted = []
        for idx in new_idx:
            req = self._make_request(idx)
            self.arrival_step[idx] = step
            sched.add_request(req)
            arrivals.append(req.request_id)
            if req.request_id in self.abort_on_arrival:
                self.abort_on_arrival.discard(req.request_id)
                self._abort_now(req.request_id)
        rec = StepRecord(step, arrivals)
        if self.pending_aborts:
            rec.aborted = self.pending_aborts
            self.pending_aborts = []
        self.last_update = None
        idle = False
        if sched.has_requests():
            out = sched.schedule()
            self.last_output = out
            self._account_schedule(step, out, rec)
            sample_ids = out.will_sample
            self.last_sample_ids = sample_ids
            batch_queue.appendleft((step, out, sample_ids))
            model_executed = out.total_num_scheduled_tokens > 0
            if not (
                len(batch_queue) < self.batch_queue_size
                and (model_executed or sched.has_requests())
            ):
                self._update(step, rec)
        elif batch_queue:
            self.last_output = None
            self._update(step, rec)
        else:
            self.last_output = None
            idle = True  # EngineCore does not step with nothing to do
            rec.idle = True
        if rec.num_scheduled:
            # the context the scheduled requests attend to, over those still live after
            # the step (a request that finished in it is gone)
            out = self.last_output
            ctx = out.context_tokens  # type: ignore[union-attr]
            for r in self._gone:
                if r.request_id in out.num_scheduled_tokens:  # type: ignore[union-attr]
                    ctx -= r.num_computed_tokens
            rec.context_tokens = ctx
        self._gone = []
        rec.num_running = len(sched.running)
        rec.num_waiting = len(sched.waiting)
        rec.free_blocks = sched.pool.free_block_queue.num_free_blocks
        rec.kv_usage = sched.kv_cache_usage
        step += 1
        self.step_index = step
        summary = self.summary
        if (len(summary.finished_step) == self.num_requests and not batch_queue) or (
            idle and step > self.max_arrival and not self.unsubmitted
        ) or step >= self.max_steps:
            self.done = True
            summary.num_steps = step
            summary.completed = len(summary.finished_step) == self.num_requests
        return rec

    # -- bookkeeping ---------------------------------------------------------------
    def _account_schedule(self, step: int, out: SchedulerOutput, rec: StepRecord) -> None:
        summary = self.summary
        ns = out.num_scheduled_tokens
        summary.request_steps += len(ns)
        rec.num_scheduled = len(ns)
        rec.num_scheduled_tokens = out.total_num_scheduled_tokens
        hits = out.prefix_hit_tokens
        decode = list(ns.values()).count(1)
        for rid in hits:  # admitted this step: prefilling, not decoding
            if ns[rid] == 1:
                decode -= 1
        rec.decode_tokens = decode
        rec.num_ctx_requests = out.num_ctx_requests
        rec.num_ctx_tokens = out.num_ctx_tokens
        if hits:
            requests = self.scheduler.requests
            first = summary.first_scheduled_step
            admitted = []
            for rid in out.new_req_ids:
                hit = hits[rid]
                req = requests[rid]
                req.first_prefix_hit = hit
                admitted.append(Admission(rid, hit, req.num_tokens, False))
            for rid in out.resumed_req_ids:
                admitted.append(Admission(rid, hits[rid], requests[rid].num_tokens, True))
            rec.admitted = admitted
            for rid, hit in hits.items():
                summary.total_prefix_hit_tokens += hit
                first.setdefault(rid, step)
        if out.preemptions:
            rec.preemptions = out.preemptions
            for p in out.preemptions:
                summary.total_preemptions += 1
                summary.preemptions_per_request[p.victim] += 1
                if p.self_preempt:
                    summary.self_preemptions += 1
                summary.preemption_events.append(
                    {
                        "num_computed_tokens_before": p.num_computed_tokens,
                        "num_tokens": p.num_tokens,
                        "req": p.victim,
                        "self_preempt": p.self_preempt,
                        "step": step,
                        "trigger": p.trigger,
                    }
                )
        rec.blocked = out.admission_blocked
        self.recompute.step(rec, ns)

    def _update(self, step: int, rec: StepRecord) -> None:
        b_step, out, sample_ids = self.batch_queue.pop()
        sched = self.scheduler
        wl = self.workload
        tokens: dict[str, int] = {}
        requests = sched.requests
        if wl.fake_token_mode == "fixed":
            for rid in sample_ids:
                if rid in requests:
                    tokens[rid] = wl.fixed_token
        else:  # Workload.fake_token, inline: it runs for every token
            first, period = FAKE_TOKEN_FIRST, FAKE_TOKEN_PERIOD
            for rid in sample_ids:
                req = requests.get(rid)
                if req is not None:
                    tokens[rid] = first + req.num_output_tokens % period
        mid = self.mid_aborts.get(step)
        if mid:  # between this step's schedule() and update_from_output()
            for rid in mid:
                if rid in sched.requests:
                    self._gone.append(sched.requests[rid])
                    self._abort_now(rid)
            rec.aborted = [*rec.aborted, *self.pending_aborts]
            self.pending_aborts = []
        result = sched.update_from_output(out, tokens)
        self.last_update = (b_step, result)
        summary = self.summary
        first = summary.first_token_step
        first_tokens: list[str] = []
        prompt = cached = 0
        for req in result.sampled:
            if req.num_output_tokens == 1:  # its first token (outputs survive preemption)
                rid = req.request_id
                if rid not in first:
                    first[rid] = step
                    first_tokens.append(rid)
                    # IterationStats counts a prompt when its first token comes out
                    prompt += req.num_prompt_tokens
                    cached += req.first_prefix_hit
        for req in result.finished:
            summary.finished_step[req.request_id] = step
        if result.finished:
            self._gone.extend(result.finished)
        rec.updated_batch = b_step
        rec.generated_tokens = len(result.sampled)
        if first_tokens:
            rec.first_tokens = first_tokens
            rec.stats_prompt_tokens = prompt
            rec.stats_prompt_cached = cached
        if result.finished:
            done = sorted(result.finished, key=_by_index)
            rec.finished = [r.request_id for r in done]
            rec.finished_output_tokens = [r.num_output_tokens for r in done]
        if self.record_sampled:
            rec.sampled = [r.request_id for r in result.sampled]


def _by_index(r: Request) -> int:
    return r.index


@without_cyclic_gc
def run_steps(workload: Workload, profile: SchedulerProfile = DEFAULT_PROFILE, *,
              inputs: EngineInputs | None = None) -> tuple[list[StepRecord], RunSummary]:
    """Run a workload; return its step records and the summary."""
    engine = Engine(workload, profile, inputs=inputs)
    records = list(engine.run())
    return records, engine.summary


@without_cyclic_gc
def simulate(
    workload: Workload,
    profile: SchedulerProfile = DEFAULT_PROFILE,
    *,
    check_invariants: bool = False,
) -> tuple[list[dict[str, Any]], RunSummary]:
    """Run a workload; return its conformance trace (replay/trace.py) and the summary."""
    engine = Engine(workload, profile, check_invariants=check_invariants)
    records = list(iter_trace(engine))
    return records, engine.summary


def iter_trace(engine: Engine) -> Iterator[dict[str, Any]]:
    """The conformance record of every step, as the engine runs (nothing kept: a trace
    written as it goes needs memory for one step; engine.summary is complete at the end)."""
    from kvreplay.replay.trace import conformance_record

    for rec in engine.run():
        yield conformance_record(engine, rec)


def iter_trace_lines(engine: Engine) -> Iterator[bytes]:
    """`iter_trace` as JSON lines (bytes, newline included), each encoded at the cost of
    what its step touched (replay/trace.py TraceWriter), byte-identical to encoding
    `iter_trace`'s records."""
    from kvreplay.replay.trace import TraceWriter

    writer = TraceWriter(engine)
    for rec in engine.run():
        yield writer.line(rec)
