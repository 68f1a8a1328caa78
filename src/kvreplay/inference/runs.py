"""Clocked replays: the faithful engine driven by a wall clock.

Consumes: a rebuilt workload (stage 3), `LogFacts`, a step-time model (stage 4). Produces
a `Run`: the step records, the clock, and the `EngineInputs` that make the same run again.

* `timed_replay`: a request enters when the clock passes its logged arrival (placed
  inside its second), but never before the completions the log shows ahead of it, and
  never after one it shows behind it;
* `step_replay`: each request enters at a given step (a placement, stage 5).

Both apply the logged aborts when the clock passes them and stop where the log was cut.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any, TYPE_CHECKING

from kvreplay.inference.clock import StepTimeModel
from kvreplay.inference.engines import make_engine, num_requests
from kvreplay.inference.facts import LogFacts
from kvreplay.inference.log_shape import aborts, cut_time
from kvreplay.replay.engine import without_cyclic_gc
from kvreplay.replay.records import EngineInputs, StepRecord

if TYPE_CHECKING:
    from kvreplay.inference.engines import Profile
    from kvreplay.inference.rebuild import Rebuilt
    from kvreplay.inference.formats import LogFormat



@dataclass(slots=True)
class Run:
    steps: list[StepRecord]
    clock: list[float]  # wall-clock start of each step
    end: float  # when the last step ended
    inputs: EngineInputs  # a new engine given these makes the same run
    model: StepTimeModel
    placement: tuple[float, float]  # (phase, spread) of arrivals within their second
    cut_at: float | None  # the replay stopped at the log's end (server killed)
    unfinished: list[str]

    @property
    def arrival_steps(self) -> list[int]:
        return self.inputs.arrival_steps

    @property
    def num_preemptions(self) -> int:
        return sum(len(r.preemptions) for r in self.steps)


def arrival_times(facts: LogFacts, phase: float, spread: float) -> list[float]:
    """Logged second + a place within it: the j-th of m arrivals logged in second S is put
    at S + phase + (1 - phase) * spread * (j + 1) / (m + 1) (spread 0: a burst; 1: evenly
    spread, the expectation for Poisson arrivals). Sub-second stamps are used as they are."""
    reqs = facts.requests
    if facts.precise_times or (reqs and all(r.precise_time is not None for r in reqs)):
        return [r.precise_time for r in reqs]  # type: ignore[misc]
    out: list[float] = []
    base = facts.first_time or 0.0
    i = 0
    while i < len(reqs):
        sec = reqs[i].time if reqs[i].time is not None else (math.floor(out[-1]) if out else base)
        j = i
        while j < len(reqs) and (reqs[j].time if reqs[j].time is not None else sec) == sec:
            j += 1
        m = j - i
        for k in range(m):
            t = reqs[i + k].precise_time  # (a request span's arrival; the others estimated)
            out.append(t if t is not None else
                       sec + phase + (1.0 - phase) * spread * (k + 1) / (m + 1))
        i = j
    for k in range(1, len(out)):  # keep file order monotonic
        if out[k] < out[k - 1]:
            out[k] = out[k - 1]
    return out


def step_limit(workload: Any, extra: int = 0) -> int:
    """A bound no faithful replay of this workload reaches: every request prefilled one
    token a step and decoded alone, with room for a preemption each. Stops a workload that
    could never finish (vLLM would spin forever) from running away."""
    return 2000 + 3 * sum(len(s.prompt_token_ids) + 2 * s.max_tokens for s in workload.requests) + extra


def _finish(eng: Any, rebuilt: Rebuilt, steps: list, starts: list, end: float, model, placement,
            cut: float | None) -> Run:
    ended = {rid for rec in steps for rid in (*rec.finished, *rec.aborted)}
    parent = getattr(rebuilt.workload, "parent", {})
    unfinished = list(dict.fromkeys(parent.get(s.id, s.id) for s in rebuilt.workload.requests
                                    if s.id not in ended))
    return Run(steps, starts, end, eng.inputs(), model, placement, cut, unfinished)


@without_cyclic_gc
def timed_replay(rebuilt: Rebuilt, facts: LogFacts, profile: Profile, model: StepTimeModel,
                 placement: tuple[float, float], *, use_completion_order: bool = True,
                 record_sampled: bool = False, cut: bool = True,
                 order_window_s: float | None = None, stop_after: float | None = None) -> Run:
    """`order_window_s`: an arrival the log shows before the next completion is let in
    ahead of an imminent finish only within this many seconds of its time (None: always;
    LogFormat.order_window_s). `stop_after`: stop once the clock passes this wall time, as
    at the log's cut (the run is then a prefix of the whole one, step for step)."""
    eng = make_engine(rebuilt.workload, profile, record_sampled=record_sampled)
    reqs = facts.requests
    times = arrival_times(facts, *placement)
    pending = deque(range(num_requests(rebuilt.workload)))
    clock = times[0] if times else 0.0
    steps: list[StepRecord] = []
    starts: list[float] = []
    finished = 0
    stop_at = cut_time(facts) if cut else None
    if stop_after is not None:
        stop_at = stop_after if stop_at is None else min(stop_at, stop_after)
    cut_at = None
    ab = aborts(facts)
    ai = 0
    limit = step_limit(rebuilt.workload)
    while not eng.done and eng.step_index < limit:
        busy = eng.has_work()
        if not busy and pending:
            clock = max(clock, times[pending[0]])
        if stop_at is not None and clock > stop_at:
            cut_at = stop_at
            eng.stop()
            break
        while ai < len(ab) and ab[ai][0] <= clock:
            eng.abort(ab[ai][1])
            ai += 1
        submitted = False
        imminent = None
        while pending:
            k = pending[0]
            need = reqs[k].completions_before if use_completion_order else 0
            if finished < need and clock < times[k] + 2.0:
                break  # the log shows more completions before this arrival
            due = times[k] <= clock
            if (not due and use_completion_order and finished >= need
                    and (order_window_s is None or clock >= times[k] - order_window_s)):
                if imminent is None:
                    imminent = eng.finish_imminent()
                # The log shows this arrival before the next completion: do not let the
                # replay finish a request first.
                due = imminent and finished == need
            if not due:
                break
            pending.popleft()
            eng.submit(k)
            submitted = True
        if not submitted and not busy:
            if not pending:
                break
            # idle, and the next arrival is held back by the completion order: let it in.
            k = pending.popleft()
            eng.submit(k)
            clock = max(clock, times[k])
        rec = eng.step()
        starts.append(clock)
        clock += model.dt_record(rec)
        finished += len(rec.finished)
        steps.append(rec)
    if cut_at is None and not eng.done:
        eng.stop()  # the step limit
    return _finish(eng, rebuilt, steps, starts, clock, model, placement, cut_at)


@without_cyclic_gc
def step_replay(rebuilt: Rebuilt, facts: LogFacts, profile: Profile, arrival_steps: list[int],
                model: StepTimeModel, *, record_sampled: bool = False) -> Run:
    """Replay with each request entering at a given step, the clock run by the model
    (the stats lines refine it later: clock.wall_clock)."""
    eng = make_engine(rebuilt.workload, profile, inputs=EngineInputs(list(arrival_steps)),
                      record_sampled=record_sampled)
    reqs = facts.requests
    ab = aborts(facts)
    ai = 0
    steps: list[StepRecord] = []
    starts: list[float] = []
    t = reqs[0].time if reqs and reqs[0].time is not None else 0.0
    stop_at = cut_time(facts)
    cut_at = None
    limit = step_limit(rebuilt.workload, max(arrival_steps, default=0))
    while not eng.done and eng.step_index < limit:
        if stop_at is not None and t > stop_at:
            cut_at = stop_at
            eng.stop()
            break
        while ai < len(ab) and ab[ai][0] <= t:
            eng.abort(ab[ai][1])
            ai += 1
        rec = eng.step()
        starts.append(t)
        t += model.dt_record(rec)
        steps.append(rec)
    if cut_at is None and not eng.done:
        eng.stop()
    return _finish(eng, rebuilt, steps, starts, t, model, (0.0, 0.0), cut_at)


def as_step_replay(run: Run, facts: LogFacts, arrival_steps: list[int],
                   model: StepTimeModel) -> Run | None:
    """`step_replay(rebuilt, facts, profile, arrival_steps, model)` without replaying, when
    `run` already is that replay: the engine is deterministic given its arrival steps, so a
    run with these arrival steps, this model and no wall-clock events (aborts, the log's
    cut, both applied by the clock) has the same step records; only its clock is rebuilt
    the way step_replay runs it. None when that does not hold."""
    ins = run.inputs
    if (run.model is not model or list(ins.arrival_steps) != list(arrival_steps)
            or ins.aborts or ins.mid_aborts or ins.max_steps is not None or aborts(facts)
            or cut_time(facts) is not None or run.cut_at is not None):
        return None
    reqs = facts.requests
    t = reqs[0].time if reqs and reqs[0].time is not None else 0.0
    starts: list[float] = []
    for rec in run.steps:
        starts.append(t)
        t += model.dt_record(rec)
    return Run(run.steps, starts, t, run.inputs, model, (0.0, 0.0), None, list(run.unfinished))


def rerun(rebuilt: Rebuilt, profile: Profile, inputs: EngineInputs) -> list[StepRecord]:
    """The run `inputs` describe, again (its records equal the first run's)."""
    eng = make_engine(rebuilt.workload, profile, inputs=inputs)
    return [eng.step() for _ in iter(lambda: eng.done, True)]
