"""Property tests: random workloads and configs never break an invariant, always finish
every request, and replay deterministically."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from helpers.examples import few

from kvreplay.replay import PROFILES, get_profile, parse_workload, simulate

from helpers.strategies import workloads


PROFILE_NAMES = sorted(PROFILES)


@given(workloads(), st.sampled_from(PROFILE_NAMES))
def test_invariants_hold_and_every_request_finishes(data: dict, profile_name: str) -> None:
    profile = get_profile(profile_name)
    if not profile.priority_policy:
        data["config"]["policy"] = "fcfs"
    if not profile.watermark:
        data["config"]["watermark"] = 0.0
    workload = parse_workload(data)
    records, summary = simulate(workload, profile, check_invariants=True)
    assert summary.completed, f"not finished after {summary.num_steps} steps"
    last = records[-1]
    assert last["running"] == [] and last["waiting"] == []
    assert last["free_blocks"] == workload.config.num_gpu_blocks - 1
    for rec in records:
        budget = workload.config.max_num_batched_tokens
        assert rec.get("num_scheduled_tokens", 0) <= budget
        assert len(rec["running"]) <= workload.config.max_num_seqs
        if rec.get("preempted"):
            assert rec["new"] == [] and rec["resumed"] == []  # no admission after preemption
    # every request ends with exactly max_tokens outputs, or at max_model_len
    for spec in workload.requests:
        assert spec.id in summary.finished_step


@settings(few())
@given(workloads())
def test_replay_is_deterministic(data: dict) -> None:
    a, _ = simulate(parse_workload(data))
    b, _ = simulate(parse_workload(data))
    assert a == b


@settings(few())
@given(workloads(), st.integers(min_value=0, max_value=200))
def test_snapshot_resume_equals_straight_run(data: dict, cut: int) -> None:
    """A deep copy taken between steps resumes to the same trace (the TUI's step-back)."""
    import copy

    from kvreplay.replay import Engine

    straight = list(Engine(parse_workload(data)).run())
    engine = Engine(parse_workload(data))
    head = []
    while not engine.done and len(head) < cut:
        head.append(engine.step())
    snapshot = copy.deepcopy(engine)
    tail_a = list(engine.run())
    tail_b = list(snapshot.run())
    assert tail_a == tail_b
    assert head + tail_a == straight


def _trace(data: dict, every: int) -> tuple[list, int]:
    from kvreplay.replay.engine import Engine, iter_trace

    eng = Engine(parse_workload(data), collect_hashes_every=every)
    out = list(iter_trace(eng))
    return out, len(eng.block_hasher._ids) if eng.block_hasher is not None else 0


@given(workloads(), st.integers(min_value=1, max_value=5))
def test_collecting_block_hashes_changes_nothing(data: dict, every: int) -> None:
    """Forgetting the block-hash ids nothing live can reach (BlockHasher.collect, as
    `kvreplay simulate` does) gives the same trace, prefix hits included, step for step."""
    data["config"]["enable_prefix_caching"] = True
    want, kept_all = _trace(data, 0)
    got, kept = _trace(data, every)
    assert got == want
    assert kept <= kept_all


def test_collecting_block_hashes_bounds_the_table() -> None:
    """On a long prefix-caching run the table keeps what is live, not every block ever
    hashed; the trace is the same (a bank case, our scheduler equal to vLLM's there)."""
    import json
    from pathlib import Path

    case = Path(__file__).parents[2] / "data" / "oracle" / "0.33" / "fcfs_pressure_bs4_burst_pc_s10"
    data = json.loads((case / "workload.json").read_text())
    want, kept_all = _trace(data, 0)
    got, kept = _trace(data, 1)
    assert got == want
    assert kept < kept_all
