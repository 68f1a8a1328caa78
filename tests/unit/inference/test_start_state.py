"""A run started from the state carried out of another after step c (inference/start_state.py)
takes the same steps as the whole run after c: its arrivals, schedules, preemptions (victim,
trigger, tokens lost), finishes and counts, the steps renumbered from c + 1."""

from __future__ import annotations

import random

import msgspec
import pytest
from hypothesis import given, settings, strategies as st

from helpers.examples import few
from kvreplay.inference.start_state import capture, start_engine
from kvreplay.replay.engine import Engine
from kvreplay.replay.records import EngineInputs
from kvreplay.replay.scheduler import SchedulerConfig
from kvreplay.replay.workload import RequestSpec, Workload


def _workload(seed: int, n: int, policy: str, caching: bool, async_: bool) -> Workload:
    rng = random.Random(seed)
    cfg = SchedulerConfig(num_gpu_blocks=96, block_size=16, max_num_seqs=12,
                          max_num_batched_tokens=256, max_model_len=1024, policy=policy,
                          enable_prefix_caching=caching, async_scheduling=async_)
    shared = [rng.randrange(10, 30000) for _ in range(64)]
    specs = []
    for i in range(n):
        prompt = (shared[:rng.choice((0, 32, 64))]
                  + [rng.randrange(10, 30000) for _ in range(rng.randrange(8, 300))])
        specs.append(RequestSpec(f"r{i}", 0, prompt, rng.randrange(4, 200),
                                 rng.randrange(0, 3) if policy == "priority" else 0))
    return Workload("t", "t", cfg, specs, max_steps=10**6)


def _arrivals(seed: int, n: int) -> list[int]:
    rng = random.Random(seed + 1)
    t, out = 0, []
    for _ in range(n):
        t += rng.choice((0, 0, 1, 2, 5))
        out.append(t)
    return out


def _norm(rec, off: int) -> dict:
    d = msgspec.structs.asdict(rec)
    d["step"] -= off
    if d["updated_batch"] is not None:
        d["updated_batch"] -= off
    return msgspec.to_builtins(d)


def _check(seed: int, c: int, policy: str, caching: bool, async_: bool) -> int:
    wl = _workload(seed, 40, policy, caching, async_)
    arrivals = _arrivals(seed, 40)
    whole = Engine(wl, inputs=EngineInputs(list(arrivals)))
    recs = list(whole.run())
    if c >= len(recs) - 1:
        return 0
    eng = Engine(_workload(seed, 40, policy, caching, async_), inputs=EngineInputs(list(arrivals)))
    for _ in range(c + 1):
        eng.step()
    state = capture(eng, n=0)
    live = set(state.ids)
    assert live == set(eng.scheduler.requests)
    pending = [i for i, a in enumerate(arrivals) if a > c]
    specs = [wl.requests[int(rid[1:])] for rid in state.ids] + [wl.requests[i] for i in pending]
    inputs = EngineInputs([-1] * len(state.ids) + [arrivals[i] - (c + 1) for i in pending])
    window = Workload("w", "w", wl.config, specs, max_steps=10**6)
    rest = list(start_engine(state, window, inputs).run())
    assert [_norm(r, 0) for r in rest] == [_norm(r, c + 1) for r in recs[c + 1:]]
    # a second engine from the same state: the state is not spent by the first
    again = list(start_engine(state, window, inputs).run())
    assert len(again) == len(rest)
    return sum(len(r.preemptions) for r in rest)


@pytest.mark.parametrize("policy, caching, async_", [
    ("fcfs", False, False), ("fcfs", False, True), ("priority", False, False),
    ("fcfs", True, False), ("priority", True, True)])
def test_a_run_from_a_carried_state_is_the_whole_runs_steps_after_it(policy, caching, async_):
    pre = 0
    for seed, c in ((0, 30), (1, 77), (2, 150), (3, 5)):
        pre += _check(seed, c, policy, caching, async_)
    assert pre > 0  # the steps after the cut preempt: victims and tokens lost compared


@settings(few(), deadline=None)
@given(seed=st.integers(0, 10**6), c=st.integers(0, 400),
       policy=st.sampled_from(("fcfs", "priority")), caching=st.booleans(),
       async_=st.booleans())
def test_any_cut_step_resumes_to_the_same_steps(seed, c, policy, caching, async_):
    _check(seed, c, policy, caching, async_)


def test_a_window_whose_first_requests_are_not_the_carried_ones_is_refused():
    wl = _workload(0, 10, "fcfs", False, False)
    eng = Engine(wl, inputs=EngineInputs([0] * 10))
    eng.step()
    state = capture(eng, n=0)
    other = Workload("w", "w", wl.config, list(reversed(wl.requests)), max_steps=10**6)
    with pytest.raises(ValueError, match="not the carried ones"):
        start_engine(state, other)
