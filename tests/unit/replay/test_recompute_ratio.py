"""The recompute ratio is a ratio (replay/records.py, `RecomputeTally`).

Tokens recomputed are the tokens the engine scheduled for a readmitted victim's prefill
again, up to `num_tokens - hit` at its readmission (spec A11.1) or until it is preempted
again, aborted or the run ends: a part of the processed tokens, so the ratio is <= 1, and
`num_tokens - hit` (the former figure) wherever no prefill again is cut short.
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from kvreplay.replay import Engine, get_profile, parse_workload
from kvreplay.replay.records import EngineInputs, preemption_records, totals
from kvreplay.replay.result import replay_workload
from helpers.strategies import pool_workloads
from helpers.tracecmp import read_workload

DATA = Path(__file__).parents[2] / "data"


def pressured():
    """Small pools, chunked prefill, long prompts and decodes, with and without the full-ISL
    reservation: many preemptions, some of victims still prefilling again."""
    return pool_workloads(requests=(2, 10), gap=4, prompt=160, shared=48, max_tokens=120,
                          blocks=(12, 40), seqs=6, budgets=(16, 32, 64), max_model_len=512,
                          pressure=True)


def _former(steps) -> int:
    """The former figure: num_tokens - hit at every readmission, run to its end or not."""
    return sum(a.num_tokens - a.prefix_hit for r in steps for a in r.admitted
               if a.resumed and not a.swapped_in)


@settings(deadline=None)
@given(pressured(), st.integers(0, 400), st.booleans())
def test_ratio_at_most_one_and_the_former_figure_when_nothing_is_cut(data, cut, use_cut) -> None:
    wl = parse_workload(data, check_capacity=False)
    inputs = EngineInputs([s.arrival_step for s in wl.requests], max_steps=cut if use_cut else None)
    eng = Engine(wl, get_profile("0.33"), inputs=inputs)
    steps = list(eng.run())
    ended = eng.summary.completed  # every request finished: no prefill again cut by the end
    pre = preemption_records(steps)
    t = totals(steps, pre)
    assert t.tokens_recomputed <= t.processed_tokens
    assert t.recompute_ratio is None or 0 <= t.recompute_ratio <= 1
    assert t.tokens_recomputed == sum(p.tokens_recomputed or 0 for p in pre)
    for r in steps:  # a step recomputes no more than it schedules
        assert sum(k for _, k in r.recomputed) <= r.num_scheduled_tokens
    # each readmission: at most num_tokens - hit; exactly that unless cut short
    for p in pre:
        if p.readmission_step is None:
            continue
        adm = next(a for a in steps[p.readmission_step].admitted if a.request == p.victim)
        full = adm.num_tokens - adm.prefix_hit
        assert 0 <= p.tokens_recomputed <= full
        again = next((q for q in pre if q.victim == p.victim and q.index > p.index), None)
        if again is None and ended:
            assert p.tokens_recomputed == full
        if again is not None and again.step > p.readmission_step and p.tokens_recomputed < full:
            # cut short by the next preemption: what it had computed again by then
            assert again.computed_tokens_lost == p.prefix_hit_at_readmission + p.tokens_recomputed
    if ended and all(p.nth_of_victim == 1 for p in pre):
        assert t.tokens_recomputed == _former(steps)


def test_a_prefill_again_cut_short_counts_what_vllm_computed() -> None:
    """vLLM 0.33's own trace (oracle bank, crowd_fcfs_bs16_s7): r24 is readmitted at step
    32 with a 64-token prefix hit and 86 tokens, gets an 11-token chunk (num_computed 75),
    and preempts itself at step 33 with 75 computed. It recomputed 11 tokens, not 22."""
    rep = replay_workload(read_workload(DATA / "oracle" / "0.33" / "crowd_fcfs_bs16_s7"))
    p = next(p for p in rep.preemptions if p.victim == "r24" and p.readmission_step == 32)
    assert (p.prefix_hit_at_readmission, p.tokens_recomputed) == (64, 11)
    q = next(q for q in rep.preemptions if q.victim == "r24" and q.step == 33)
    assert q.self_preemption and q.computed_tokens_lost == 75 == 64 + 11
    t = totals(rep.steps, rep.preemptions)
    assert t.tokens_recomputed == _former(rep.steps) - 11 < _former(rep.steps)


def _vllm_recomputed(trace: list[dict], prompt_len: dict[str, int]) -> int:
    """Tokens recomputed by vLLM's own trace alone: at each readmission (`resumed`) the
    victim owes prompt + outputs so far - its prefix hit; every token `scheduled` for it
    pays that down until it is paid or the victim is preempted again."""
    left: dict[str, int] = {}
    total = 0
    for k, r in enumerate(trace):
        for p in r.get("preemptions", ()):
            left.pop(p["req"], None)
        for v in r.get("resumed", ()):
            owed = prompt_len[v] + trace[k - 1]["num_output_tokens"][v] - r["prefix_hit_tokens"][v]
            left[v] = owed
        for v, n in r.get("scheduled", ()):
            if v in left:
                take = min(n, left[v])
                total += take
                left[v] -= take
                if not left[v]:
                    del left[v]
    return total


ORACLE = sorted(p for p in (DATA / "oracle" / "0.33").iterdir() if (p / "trace.jsonl.gz").exists()
                or (p / "trace.jsonl").exists())


def test_every_oracle_case_recomputes_what_vllms_trace_scheduled() -> None:
    """The whole 0.33 oracle bank: the run's tokens recomputed are what vLLM's own trace
    scheduled for readmitted victims, and the ratio is <= 1. Under the former figure three
    of these cases had a ratio above 1 (noisl_priority_bs8_s10: 1.68)."""
    from helpers.tracecmp import read_trace

    above_one = []
    for case in ORACLE:
        data = read_workload(case)
        rep = replay_workload(data)
        t = totals(rep.steps, rep.preemptions)
        plen = {r["id"]: len(r["prompt_token_ids"]) for r in data["requests"]}
        assert t.tokens_recomputed == _vllm_recomputed(read_trace(case), plen), case.name
        assert t.recompute_ratio is None or t.recompute_ratio <= 1, case.name
        if t.processed_tokens and _former(rep.steps) > t.processed_tokens:
            above_one.append(case.name)
    assert {"noisl_fcfs_bs4_s6", "noisl_priority_bs8_s10",
            "prio_rollback_bs4_thr8_chunked_s11"} <= set(above_one)
