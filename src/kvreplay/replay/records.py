"""Typed records of a run: what each engine step did, and every preemption with its cost.

* `StepRecord`: one per engine iteration. It holds what changed in the step (arrivals,
  admissions, preemptions, first tokens, finishes, aborts) and a few counts, never the
  whole state: its size does not grow with the number of running requests. The state at a
  step is rebuilt by re-running the run's `EngineInputs` (replay/timeline.py).
* `PreemptionEvent`: one victim thrown out by `schedule()`, as the scheduler decided it.
* `PreemptionRecord`: what a preemption cost, for every view (report, audit, TUI, golden
  files, exports). `preemption_records` is the only place that computes it:

  - computed tokens lost: the victim's `num_computed_tokens` when it was preempted, the
    KV it throws away (spec A1.4; 0 for a V0 swap, whose blocks go to CPU memory);
  - prefix hit at readmission: the tokens `get_computed_blocks` found still cached when
    the victim was admitted again (spec A5, A11.1);
  - tokens recomputed at readmission: the tokens the engine scheduled for the victim's
    prefill again, from that admission until it reached `num_tokens - hit` at that
    admission (spec A11.1: prompt and every generated token are prefilled again, less the
    cached prefix; the last sampled token was never computed, so it is always in it, spec
    A1.4 table) or was cut short (preempted again, aborted, the log's end). Counted by the
    engine as it schedules (`RecomputeTally`, `StepRecord.recomputed`), so the run's total
    is part of its processed tokens and the recompute ratio is <= 1 by construction; it
    is `num_tokens - hit` wherever the prefill again runs to its end.

* `EngineInputs`: everything a run is made of beyond its workload (arrival steps, aborts,
  the cut), so that any view can re-run exactly the same run.
"""

from __future__ import annotations

import bisect
from typing import Sequence

import msgspec


class PreemptionEvent(msgspec.Struct, gc=False):
    """One preemption as `schedule()` made it (spec A7: victim choice; A1.4: reset)."""

    victim: str
    trigger: str | None  # the request whose allocation failed (None: not known)
    self_preempt: bool
    num_computed_tokens: int  # the victim's, before the reset
    num_tokens: int
    num_output_tokens: int
    blocks_held: int  # the victim's blocks before it was freed
    free_blocks_before: int
    free_blocks_after: int | None  # None: the step stopped before freeing (V0 swap error)
    victim_rule: str
    rolled_back_tokens: int = 0  # C6: the victim's tokens scheduled this step, undone
    was_scheduled_this_step: bool = False
    blocks_needed: int | None = None  # what the failed allocation needed ...
    free_blocks_at_failure: int | None = None  # ... and had
    called_from: str = "schedule"
    mode: str = "recompute"  # V0 may swap instead: nothing lost, nothing recomputed
    cumulative: int | None = None  # V0: the scheduler's count, this one included
    warning_logged: bool = False  # V0: the every-50th warning was printed for it
    counted_in_prometheus: bool = True  # V0: running-phase victims only (spec Part D)
    blocks_swapped_out: int | None = None  # V0 swap: CPU blocks taken
    error: str | None = None  # V0: the error vLLM raised in this step


class Admission(msgspec.Struct, gc=False, array_like=True):
    """A request taken from waiting into running (spec A7 Phase W), or swapped back in."""

    request: str
    prefix_hit: int  # num_computed_tokens given by the prefix cache (A5)
    num_tokens: int  # the request's num_tokens at this admission
    resumed: bool  # it had been preempted before
    swapped_in: bool = False  # V0: back from CPU memory, its KV intact


class AdmissionBlocked(msgspec.Struct, gc=False):
    """The first waiting request Phase W could not admit, and why (A7: head-of-line)."""

    request: str
    reason: str
    num_new_tokens: int
    token_budget: int
    blocks_needed: int | None = None
    free_blocks: int | None = None
    watermark_blocks: int | None = None


class StepRecord(msgspec.Struct, gc=False):
    """What one engine iteration did (A9), and the counts after it."""

    step: int
    arrivals: list[str] = []
    aborted: list[str] = []  # finished by an abort between the previous step and this one
    num_scheduled: int = 0  # requests scheduled
    num_scheduled_tokens: int = 0
    context_tokens: int = 0  # num_computed_tokens of the scheduled requests, before the step
    decode_tokens: int = 0  # tokens of running requests scheduled exactly one token
    # the `Iteration(N)` line's "context requests" / "context tokens" (vLLM 0.33
    # compute_iteration_details): scheduled requests with no output token yet; the
    # generation requests and tokens are the rest of num_scheduled / num_scheduled_tokens
    num_ctx_requests: int = 0
    num_ctx_tokens: int = 0
    admitted: list[Admission] = []  # new and resumed, in vLLM's order
    preemptions: list[PreemptionEvent] = []
    blocked: AdmissionBlocked | None = None
    updated_batch: int | None = None  # the step whose output this step applied
    generated_tokens: int = 0  # output tokens appended in this step (stat logger's count)
    stats_prompt_tokens: int = 0  # prompt tokens the stat logger counts in this step ...
    stats_prompt_cached: int = 0  # ... of which the first admission's prefix-cache hit
    first_tokens: list[str] = []  # requests whose first output token came out
    finished: list[str] = []
    finished_output_tokens: list[int] = []  # output tokens of each finished request
    num_running: int = 0
    num_waiting: int = 0
    free_blocks: int = 0
    kv_usage: float = 0.0
    idle: bool = False  # nothing to schedule: EngineCore would not have stepped
    # V0 engine only
    num_swapped: int = 0
    cpu_kv_usage: float = 0.0
    prometheus_preemptions: int = 0  # what vllm:num_preemptions_total counts in this step
    terminal_error: dict | None = None  # vLLM stopped in this step (type, message, victim)
    sampled: list[str] | None = None  # ids that got a token, only when asked for
    # (request, tokens) scheduled in this step for a readmitted victim's prefill again
    # (RecomputeTally): the tokens recomputed, a part of num_scheduled_tokens
    recomputed: list[tuple[str, int]] = []

    @property
    def prefill_tokens(self) -> int:
        """Tokens scheduled for anything but a one-token decode: prompt chunks and
        recomputation."""
        return self.num_scheduled_tokens - self.decode_tokens


class RecomputeTally:
    """What each readmitted victim still has to prefill again (`num_tokens - hit` at its
    readmission, spec A11.1), taken from the tokens scheduled for it step by step; a
    victim preempted again, aborted or finished stops counting. Both engines keep one."""

    __slots__ = ("left",)

    def __init__(self) -> None:
        self.left: dict[str, int] = {}

    def step(self, rec: StepRecord, scheduled: dict[str, int]) -> None:
        """Fill `rec.recomputed` from the step's preemptions and admissions (already on
        `rec`) and the tokens scheduled per request in it (cached tokens excluded)."""
        left = self.left
        for rid in rec.aborted:
            left.pop(rid, None)
        for e in rec.preemptions:
            left.pop(e.victim, None)
        for a in rec.admitted:
            if a.resumed and not a.swapped_in and a.num_tokens > a.prefix_hit:
                left[a.request] = a.num_tokens - a.prefix_hit
        if not left:
            return
        out = []
        for rid in list(left):
            n = scheduled.get(rid, 0)
            if n <= 0:
                continue
            rest = left[rid]
            take = n if n < rest else rest
            out.append((rid, take))
            if take == rest:
                del left[rid]
            else:
                left[rid] = rest - take
        if out:
            rec.recomputed = out


class EngineInputs(msgspec.Struct):
    """A run beyond its workload: request i enters before step `arrival_steps[i]` (-1: only
    when the caller submits it), `aborts` are (step, request id) applied between steps
    before that step runs (a request not yet arrived is aborted as it arrives), the run
    stops after `max_steps` steps when the log was cut short (None: it ran to the end), and
    `mid_aborts` (step-trace logs) land between a step's schedule() and its update."""

    arrival_steps: list[int]
    aborts: list[tuple[int, str]] = []
    max_steps: int | None = None
    mid_aborts: list[tuple[int, str]] = []


class PreemptionRecord(msgspec.Struct):
    """A preemption and what it cost (the definitions: module docstring)."""

    index: int  # ordinal in the run
    step: int
    victim: str
    trigger: str | None
    self_preemption: bool
    victim_rule: str
    mode: str
    computed_tokens_lost: int
    num_tokens: int
    num_output_tokens: int
    nth_of_victim: int  # 1 for the victim's first preemption
    blocks_held: int
    free_blocks_before: int
    free_blocks_after: int | None
    blocks_needed: int | None
    free_blocks_at_failure: int | None
    rolled_back_tokens: int
    was_scheduled_this_step: bool
    readmission_step: int | None = None
    prefix_hit_at_readmission: int | None = None
    tokens_recomputed: int | None = None
    time: float | None = None  # wall clock of the step's start (log replays)
    readmission_time: float | None = None
    time_lost_s: float | None = None
    victim_internal_id: str | None = None
    # how sure the replay is of this preemption: exact | exact-by-log | consistent | inferred
    confidence: str = "exact"
    # share (weighted) of the uncertainty ensemble's replays that preempt this victim
    # within 5 steps of this step (inference/ensemble.py); None: no ensemble
    probability: float | None = None
    basis: str | None = None  # what the confidence rests on, in words
    # V0 engine only
    cumulative: int | None = None
    warning_logged: bool = False
    counted_in_prometheus: bool = True
    blocks_swapped_out: int | None = None
    error: str | None = None
    # where the log shows it (step-trace logs)
    file: str | None = None
    line: int | None = None

    @property
    def blocks_freed(self) -> int | None:
        if self.free_blocks_after is None:
            return None
        return self.free_blocks_after - self.free_blocks_before

    @property
    def waited_steps(self) -> int | None:
        return None if self.readmission_step is None else self.readmission_step - self.step


def preemption_records(steps: Sequence[StepRecord],
                       clock: Sequence[float] | None = None) -> list[PreemptionRecord]:
    """Every preemption of a run, completed with the victim's next admission (the only
    place the cost of a preemption is computed; definitions: module docstring)."""
    out: list[PreemptionRecord] = []
    open_: dict[str, PreemptionRecord] = {}
    count: dict[str, int] = {}
    readmitted: dict[str, PreemptionRecord] = {}  # victims prefilling again
    n = len(clock) if clock is not None else 0
    for rec in steps:
        step = rec.step
        for e in rec.preemptions:
            readmitted.pop(e.victim, None)
        for a in rec.admitted:
            if not a.resumed:
                continue
            p = open_.pop(a.request, None)
            if p is None:
                continue
            p.readmission_step = step
            p.tokens_recomputed = 0
            if not (a.swapped_in or p.mode == "swap"):
                p.prefix_hit_at_readmission = a.prefix_hit
                readmitted[a.request] = p
            if clock is not None and step < n and p.time is not None:
                p.readmission_time = round(clock[step], 3)
                p.time_lost_s = round(clock[step] - clock[p.step], 3)
        for rid, k in rec.recomputed:
            p = readmitted.get(rid)
            if p is not None:
                p.tokens_recomputed += k  # type: ignore[operator]
        for e in rec.preemptions:
            k = count.get(e.victim, 0) + 1
            count[e.victim] = k
            p = PreemptionRecord(
                index=len(out), step=step, victim=e.victim, trigger=e.trigger,
                self_preemption=e.self_preempt, victim_rule=e.victim_rule, mode=e.mode,
                computed_tokens_lost=0 if e.mode == "swap" else e.num_computed_tokens,
                num_tokens=e.num_tokens, num_output_tokens=e.num_output_tokens,
                nth_of_victim=k, blocks_held=e.blocks_held,
                free_blocks_before=e.free_blocks_before, free_blocks_after=e.free_blocks_after,
                blocks_needed=e.blocks_needed, free_blocks_at_failure=e.free_blocks_at_failure,
                rolled_back_tokens=e.rolled_back_tokens,
                was_scheduled_this_step=e.was_scheduled_this_step,
                time=round(clock[step], 3) if clock is not None and step < n else None,
                cumulative=e.cumulative, warning_logged=e.warning_logged,
                counted_in_prometheus=e.counted_in_prometheus,
                blocks_swapped_out=e.blocks_swapped_out, error=e.error,
            )
            out.append(p)
            open_[e.victim] = p
    return out


class Totals(msgspec.Struct):
    """A run's preemption totals: the figures every view prints (one definition)."""

    preemptions: int
    self_preemptions: int
    requests_preempted: int
    computed_tokens_lost: int
    tokens_recomputed: int  # the prefills again, as far as each ran (module docstring)
    processed_tokens: int  # every token the engine computed: scheduled tokens, all steps
    recompute_ratio: float | None  # tokens recomputed / processed tokens: <= 1


def totals(steps: Sequence[StepRecord], preemptions: Sequence[PreemptionRecord]) -> Totals:
    processed = 0
    for rec in steps:
        processed += rec.num_scheduled_tokens
    recomputed = sum(p.tokens_recomputed or 0 for p in preemptions)
    return Totals(
        preemptions=len(preemptions),
        self_preemptions=sum(1 for p in preemptions if p.self_preemption),
        requests_preempted=len({p.victim for p in preemptions}),
        computed_tokens_lost=sum(p.computed_tokens_lost for p in preemptions),
        tokens_recomputed=recomputed,
        processed_tokens=processed,
        recompute_ratio=(recomputed / processed) if processed else None,
    )


def cumulative(values: Sequence[int]) -> list[int]:
    out, c = [], 0
    for v in values:
        c += v
        out.append(c)
    return out


def step_at(clock: Sequence[float], t: float) -> int:
    """The last step that started at or before wall time t (0 before the first)."""
    return max(0, bisect.bisect_right(clock, t) - 1)
