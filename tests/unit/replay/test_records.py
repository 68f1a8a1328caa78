"""The typed records (kvreplay.replay.records) and the engine's input API.

* `preemption_records` / `totals` on hand-made step records, computed by hand;
* against vLLM's own traces (conformance cases and the 0.33 oracle bank): every
  preemption's step, victim, trigger, tokens lost, readmission step, prefix hit, and the
  tokens recomputed (num_tokens at readmission - hit, spec A11.1, or what vLLM scheduled
  of it before preempting the victim again) as vLLM's trace gives them;
* properties (hypothesis): a run made again from its `EngineInputs` is the same run;
  recorded figures obey their definitions;
* aborts and the cut through the input API.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvreplay.replay import Engine, get_profile, parse_workload
from kvreplay.replay.records import (Admission, EngineInputs, PreemptionEvent, StepRecord,
                                     preemption_records, totals)
from kvreplay.replay.result import replay_workload
from helpers.strategies import pool_workloads
from helpers.tracecmp import case_dirs, read_trace, read_workload

DATA = Path(__file__).parents[2] / "data"


def _event(victim: str, trigger: str, computed: int, num_tokens: int, mode: str = "recompute"):
    return PreemptionEvent(victim=victim, trigger=trigger, self_preempt=victim == trigger,
                           num_computed_tokens=computed, num_tokens=num_tokens,
                           num_output_tokens=num_tokens - 100, blocks_held=4,
                           free_blocks_before=0, free_blocks_after=4, victim_rule="fcfs", mode=mode)


def test_preemption_cost_by_hand() -> None:
    """b is preempted with 100 computed tokens and 101 in all (its last sampled token not
    computed yet), readmitted two steps later with a 32-token prefix hit and 102 tokens (an
    in-flight token came in while it waited): 102 - 32 = 70 recomputed, all scheduled in
    step 3 (the engine's `recomputed`). a is preempted
    and never readmitted: lost, nothing recomputed. A swap loses nothing."""
    steps = [
        StepRecord(0, num_scheduled=2, num_scheduled_tokens=300),
        StepRecord(1, num_scheduled=1, num_scheduled_tokens=2,
                   preemptions=[_event("b", "a", 100, 101)]),
        StepRecord(2, num_scheduled=1, num_scheduled_tokens=1),
        StepRecord(3, num_scheduled=1, num_scheduled_tokens=70,
                   admitted=[Admission("b", 32, 102, True)], recomputed=[("b", 70)]),
        StepRecord(4, num_scheduled=1, num_scheduled_tokens=10,
                   preemptions=[_event("a", "a", 210, 211), _event("c", "b", 50, 51, "swap")]),
        StepRecord(5, num_scheduled=1, num_scheduled_tokens=1,
                   admitted=[Admission("c", 0, 51, True, swapped_in=True)]),
    ]
    clock = [10.0, 10.1, 10.2, 10.3, 10.4, 10.5]
    b, a, c = preemption_records(steps, clock)
    assert (b.step, b.victim, b.trigger, b.computed_tokens_lost) == (1, "b", "a", 100)
    assert (b.readmission_step, b.prefix_hit_at_readmission, b.tokens_recomputed) == (3, 32, 70)
    assert b.time == 10.1 and b.readmission_time == 10.3 and b.time_lost_s == 0.2
    assert b.waited_steps == 2 and b.blocks_freed == 4 and b.nth_of_victim == 1
    assert (a.self_preemption, a.readmission_step, a.tokens_recomputed) == (True, None, None)
    assert (c.computed_tokens_lost, c.tokens_recomputed, c.prefix_hit_at_readmission) == (0, 0, None)
    assert [p.index for p in (b, a, c)] == [0, 1, 2]
    t = totals(steps, [b, a, c])
    assert (t.preemptions, t.self_preemptions, t.requests_preempted) == (3, 1, 3)
    assert (t.computed_tokens_lost, t.tokens_recomputed, t.processed_tokens) == (310, 70, 384)
    assert t.recompute_ratio == pytest.approx(70 / 384)


def _vllm_preemptions(trace: list[dict], prompt_len: dict[str, int]) -> list[tuple]:
    """Each preemption of vLLM's own trace with what it cost, read from that trace alone:
    the victim's next admission (`resumed`), its prefix hit there, and the tokens that
    admission computed again: its prompt + outputs so far (the step before) - the hit,
    fewer when it was preempted again before it got them all."""
    out = []
    for i, r in enumerate(trace):
        for p in r.get("preemptions", ()):
            v = p["req"]
            back = next((k for k in range(i + 1, len(trace)) if v in trace[k].get("resumed", ())), None)
            if back is None:
                out.append((r["step"], v, p["trigger"], p["num_computed_tokens_before"], None, None, None))
                continue
            hit = trace[back]["prefix_hit_tokens"][v]
            num_tokens = prompt_len[v] + trace[back - 1]["num_output_tokens"][v]
            # what vLLM scheduled for it from there, up to num_tokens - hit or until it
            # was preempted again (a prefill again cut short counts what it computed)
            left = done = num_tokens - hit
            for k in range(back, len(trace)):
                if left == 0 or (k > back and any(q["req"] == v for q in trace[k].get("preemptions", ()))):
                    break
                n = dict(map(tuple, trace[k].get("scheduled", ()))).get(v, 0)
                left -= min(n, left)
            out.append((r["step"], v, p["trigger"], p["num_computed_tokens_before"],
                        trace[back]["step"], hit, done - left))
    return out


CASES = [pytest.param("0.33", d, id=f"conformance/{d.name}")
         for d in case_dirs(DATA / "conformance" / "cases")]
CASES += [pytest.param("0.33", d, id=f"oracle/{d.name}")
          for d in case_dirs(DATA / "oracle" / "0.33")[::3]]


@pytest.mark.parametrize("profile,case_dir", CASES)
def test_preemption_records_agree_with_vllms_trace(profile: str, case_dir: Path) -> None:
    data = read_workload(case_dir)
    rep = replay_workload(data, profile=profile)
    prompt_len = {r["id"]: len(r["prompt_token_ids"]) for r in data["requests"]}
    want = _vllm_preemptions(read_trace(case_dir), prompt_len)
    got = [(p.step, p.victim, p.trigger, p.computed_tokens_lost, p.readmission_step,
            p.prefix_hit_at_readmission, p.tokens_recomputed) for p in rep.preemptions]
    assert got == want


def test_the_bank_has_preemptions_with_prefix_hits_and_async_tokens() -> None:
    """The comparison above covers what the definitions are about: readmissions with a
    prefix hit, and (async) a token appended while the victim waited."""
    hits = tokens_in_flight = 0
    for param in CASES:
        _, d = param.values
        data = read_workload(d)
        plen = {r["id"]: len(r["prompt_token_ids"]) for r in data["requests"]}
        for p in replay_workload(data).preemptions:
            hits += bool(p.prefix_hit_at_readmission)
            tokens_in_flight += p.tokens_recomputed is not None and (
                p.tokens_recomputed + (p.prefix_hit_at_readmission or 0) > p.num_tokens)
            assert p.num_tokens - plen[p.victim] == p.num_output_tokens
    assert hits > 10 and tokens_in_flight > 3


# ---------------------------------------------------------------- properties
workloads = pool_workloads  # (requests a few steps apart on a small pool)


@given(workloads(), st.data())
def test_a_run_made_again_from_its_inputs_is_the_same_run(data, draw) -> None:
    """Arrivals submitted step by step, aborts and a cut, recorded by `inputs()`: a new
    engine given them makes the same steps; the preemption figures obey their definitions."""
    wl = parse_workload(data, check_capacity=False)
    n = len(wl.requests)
    eng = Engine(wl, get_profile("0.33"), inputs=EngineInputs([-1] * n))
    aborted = set(draw.draw(st.lists(st.sampled_from([s.id for s in wl.requests]), max_size=3)))
    abort_at = {rid: draw.draw(st.integers(0, 60)) for rid in aborted}
    cut = draw.draw(st.one_of(st.none(), st.integers(5, 400)))
    steps = []
    pending = list(range(n))
    while not eng.done:
        if cut is not None and eng.step_index >= cut:
            eng.stop()
            break
        for rid, s in abort_at.items():
            if s == eng.step_index:
                eng.abort(rid)
        while pending and wl.requests[pending[0]].arrival_step <= eng.step_index:
            eng.submit(pending.pop(0))
        if not pending and not eng.has_work():
            break
        steps.append(eng.step())
    inputs = eng.inputs()
    again = Engine(wl, get_profile("0.33"), inputs=inputs)
    redo = []
    while not again.done and len(redo) < len(steps):
        redo.append(again.step())
    assert redo == steps
    pre = preemption_records(steps)
    t = totals(steps, pre)
    for p in pre:
        assert 0 <= p.computed_tokens_lost <= p.num_tokens
        if p.readmission_step is not None:
            assert p.readmission_step > p.step
            assert 0 <= p.prefix_hit_at_readmission < p.tokens_recomputed + p.prefix_hit_at_readmission
            assert p.tokens_recomputed >= 1  # the last sampled token is always computed again
    assert t.tokens_recomputed <= t.processed_tokens
    gone: set[str] = set()
    for r in steps:  # an aborted request is never admitted again
        gone |= set(r.aborted)
        assert not {a.request for a in r.admitted} & gone


def test_abort_through_the_input_api_frees_the_request() -> None:
    """An abort between steps finishes a running request at once (A8: blocks freed); one
    given before its arrival aborts it as it arrives: it is never scheduled."""
    data = read_workload(DATA / "conformance" / "cases" / "b_fcfs_heavy")
    wl = parse_workload(data)
    base = [s.arrival_step for s in wl.requests]
    plain = Engine(wl, get_profile("0.33"))
    ref = list(plain.run())
    running = next(r for r in ref if r.step == 30).num_running
    assert running > 0
    rid_running = ref[0].admitted[0].request  # running from step 0 on
    late = wl.requests[-1].id  # arrives at step 0 too: aborted as it comes in
    eng = Engine(wl, get_profile("0.33"),
                 inputs=EngineInputs(base, aborts=[(30, rid_running), (0, late)]))
    steps = list(eng.run())
    assert rid_running in steps[30].aborted
    # A8: the blocks come back at once, between the steps
    e2 = Engine(wl, get_profile("0.33"))
    for _ in range(30):
        e2.step()
    held = e2.scheduler.kv_cache_manager.num_blocks(rid_running)
    free = e2.scheduler.pool.get_num_free_blocks()
    assert held > 0 and e2.abort(rid_running)
    assert e2.scheduler.kv_cache_manager.num_blocks(rid_running) == 0
    assert e2.scheduler.pool.get_num_free_blocks() == free + held
    assert not e2.abort(rid_running)  # finished already
    assert not any(rid_running in r.finished for r in steps)
    assert late in steps[base[-1]].aborted and late in steps[base[-1]].arrivals
    assert not any(a.request == late for r in steps for a in r.admitted)
    assert eng.summary.finished_step[late] == base[-1]
    assert eng.inputs().aborts == [(0, late), (30, rid_running)]


def test_cut_through_the_input_api() -> None:
    data = read_workload(DATA / "conformance" / "cases" / "b_fcfs_heavy")
    wl = parse_workload(data)
    eng = Engine(wl, get_profile("0.33"),
                 inputs=EngineInputs([s.arrival_step for s in wl.requests], max_steps=100))
    steps = list(eng.run())
    assert len(steps) == 100 and not eng.summary.completed
    full = list(Engine(wl, get_profile("0.33")).run())
    assert steps == full[:100]


def test_workload_replay_json_round_trip() -> None:
    """Step and preemption records are msgspec Structs: they encode and decode losslessly."""
    import msgspec

    rep = replay_workload(json.loads((DATA / "conformance" / "cases" / "f_prefix_caching" /
                                      "workload.json").read_text()))
    enc = msgspec.json.encode(rep.steps)
    assert msgspec.json.decode(enc, type=list[StepRecord]) == rep.steps
    from kvreplay.replay.records import PreemptionRecord

    assert msgspec.json.decode(msgspec.json.encode(rep.preemptions),
                               type=list[PreemptionRecord]) == rep.preemptions
