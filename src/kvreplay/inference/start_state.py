"""A replay that starts from a carried engine state: the state after a decided step of an
earlier replay of the same log (`kvreplay watch` on a server that is never quiet cuts its
window there: live/session.py).

Consumes: the final run's engine of one replay (iterations.py `_replayed`) at the step it
was asked to stop at, the search's bounds and lags (iteration_search.py). Produces: a
`StartState`, and from it, for the next window's workload, engines that start where the
earlier one was (`start_engine`): the Search's and the final run's.

What is carried: the engine whole (the scheduler's running and waiting requests with their
progress, preemption counts and outputs; the free-block queue and every block's ref count
and hash; the recompute tally; with async scheduling, the batch in flight), made the next
window's: its live requests are the window workload's first ones, in the order they
entered (one frontend: the order of their request lines, iteration_search.py), numbered
0..k-1; its steps count from 0 again (the session puts the offset back). The requests not
in the engine yet are the window's facts, with the Search's bounds they had (a request
logged before the window's first Iteration line may enter at the line before it, spec
vllm-log-formats.md 4.3), and the lags seen so far (the Search's most likely choice first).

The engine is deterministic (scheduler spec A9): from the state after step c, the same
arrivals and aborts give the same steps as the whole run after c. Held to that by
tests/unit/test_start_state.py.
"""

from __future__ import annotations

import heapq
import threading
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any

from kvreplay.replay.engine import Engine, RunSummary
from kvreplay.replay.records import EngineInputs
from kvreplay.replay.snapshots import SnapshotCodec


@dataclass(slots=True)
class StartState:
    """The engine after step `step` (whose Iteration line is N = `n`, both in the numbering
    of the replay it came from), ready for the window after it."""

    engine: Engine  # its live requests numbered 0..k-1 (the order of `ids`), step_index 0
    ids: list[str]  # the carried (live) requests' ids, in the order they entered
    step: int
    n: int
    # request id -> its Search bound in the next window's Iteration numbering (below 0 for
    # a request logged before that window's first line), for requests not in the engine
    bounds: dict[str, int] = field(default_factory=dict)
    lag_seen: dict[int, int] = field(default_factory=dict)


@dataclass(slots=True)
class Window:
    """What a replay of a window is asked (iterations.py `iteration_replay`): start from
    `start` (None: an empty engine), and carry the state out after the step whose line is
    Iteration(`carry_n`) (None: carry nothing). The carried state comes back on the Replay
    (`Replay.carried`) when the lines matched the replay up to that step."""

    start: StartState | None = None
    carry_n: int | None = None


def _clone(eng: Engine) -> Engine:
    """An independent copy of `eng` (SnapshotCodec: a pickle with the pool as arrays)."""
    codec = SnapshotCodec(eng, threading.RLock())
    return codec.restore(codec.take())


def capture(eng: Engine, n: int) -> StartState:
    """The state of `eng` after its last step (whose line is Iteration(n)), renumbered for a
    window of its own: the live requests first, steps from 0."""
    c = eng.step_index - 1
    new = _clone(eng)
    live = sorted(new.scheduler.requests.values(), key=lambda r: r.index)
    specs = [new.workload.requests[r.index] for r in live]
    for i, r in enumerate(live):
        r.index = i
        # the arrival order the scheduler reads (Engine._make_request), renumbered
        r.arrival_time = float(specs[i].arrival_step) + i * 1e-6
    _resort(new)
    new.batch_queue = deque((s - (c + 1), out, ids) for s, out, ids in new.batch_queue)
    new.workload = replace(new.workload, requests=specs)
    _reset(new, EngineInputs([-1] * len(specs)), len(specs))
    return StartState(new, [s.id for s in specs], c, n)


def _resort(eng: Engine) -> None:
    """The priority queue's heap again, on the renumbered arrival times (FCFS: a deque, its
    order kept)."""
    q = eng.scheduler.waiting
    heap = getattr(q, "_heap", None)
    if heap is not None:
        q._heap = [(r.sort_key(), r) for _, r in heap]  # type: ignore[union-attr]
        heapq.heapify(q._heap)  # type: ignore[union-attr]


def _reset(eng: Engine, inputs: EngineInputs, carried: int) -> None:
    """The run-level containers of a new Engine for its workload and `inputs` (as
    Engine.__init__ makes them), the first `carried` requests being in it already."""
    specs = eng.workload.requests
    eng.by_step = {}
    for idx, a in enumerate(inputs.arrival_steps):
        if a >= 0 and idx >= carried:
            eng.by_step.setdefault(a, []).append(idx)
    eng.aborts_at = {}
    for s, rid in inputs.aborts:
        eng.aborts_at.setdefault(s, []).append(rid)
    eng.mid_aborts = {}
    for s, rid in inputs.mid_aborts:
        eng.mid_aborts.setdefault(s, []).append(rid)
    eng.max_steps = eng.workload.max_steps if inputs.max_steps is None else inputs.max_steps
    eng.order = {spec.id: i for i, spec in enumerate(specs)}
    eng.summary = RunSummary(preemptions_per_request={spec.id: 0 for spec in specs})
    eng.all_ids = [spec.id for spec in specs]
    eng.num_requests = len(specs)
    eng.max_arrival = max(eng.by_step) if eng.by_step else -1
    eng.step_index = 0
    eng.done = eng.max_steps <= 0
    eng.stopped = False
    eng.unsubmitted = sum(1 for a in inputs.arrival_steps[carried:] if a < 0)
    eng.submitted = []
    eng.arrival_step = [-1] * len(specs)
    eng.abort_on_arrival = set()
    eng.pending_aborts = []
    eng.abort_log = []
    eng.last_output = None
    eng.last_sample_ids = []
    eng.last_update = None
    eng._gone = []


def start_engine(state: StartState, workload: Any, inputs: EngineInputs | None = None) -> Engine:
    """An engine for `workload` (its first requests: the carried ones, in `state.ids`'
    order) that starts from the carried state; with `inputs`, the run they describe (the
    carried requests' arrival steps are not read), else one whose requests enter only when
    submitted."""
    k = len(state.ids)
    got = [spec.id for spec in workload.requests[:k]]
    if got != state.ids:
        raise ValueError("the window's first requests are not the carried ones "
                         f"({got[:3]}... vs {state.ids[:3]}...)")
    eng = _clone(state.engine)
    eng.workload = workload
    reqs = eng.scheduler.requests
    for i, spec in enumerate(workload.requests[:k]):
        r = reqs[spec.id]
        if r.prompt_token_ids != spec.prompt_token_ids or r.max_tokens != spec.max_tokens:
            raise ValueError(f"{spec.id}: the window's spec is not the carried request's")
    if inputs is None:
        inputs = EngineInputs([-1] * len(workload.requests))
    _reset(eng, inputs, k)
    return eng
