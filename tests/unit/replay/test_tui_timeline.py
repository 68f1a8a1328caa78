"""The model behind `kvreplay tui` (replay/timeline.py): every view it rebuilds from a
snapshot equals the straight run's record, at any step, for pools of any size."""

from __future__ import annotations

import json
import random
import sys
import subprocess
from pathlib import Path

import pytest

from kvreplay.replay.timeline import (
    CACHED, FREE, HELD, NULL, SHARED, EngineState, Timeline, diff_states,
)
from kvreplay.replay.workload import parse_workload
from kvreplay.samples import sample_path
from kvreplay.sources import open_replay as _open


def open_source(paths):
    return _open([str(p) for p in paths], year=2026)

CASES = Path(__file__).parents[2] / "data" / "conformance" / "cases"
SOURCES = [
    sample_path("fcfs_heavy.workload.json"),
    CASES / "d_priority" / "workload.json",
    CASES / "f_prefix_caching" / "workload.json",
    CASES / "e_chunked_prefill" / "workload.json",
    CASES / "x_async_b_fcfs_heavy" / "workload.json",
    CASES / "a_light_load" / "workload.json",
]


def assert_view(v, src, rec) -> None:
    """A step view against the straight run's conformance record of the step: the view
    holds the replay's own StepRecord, and what it adds (each request's tokens in vLLM's
    order, the budget left, new/resumed, cached blocks) is what the trace says."""
    assert v.record == src.steps[v.step]
    assert [[s.rid, s.tokens] for s in v.scheduled] == rec.get("scheduled", [])
    if "token_budget_left" in rec:
        assert v.token_budget_left == rec["token_budget_left"]
    assert [a.request for a in v.admitted] == rec.get("new", [])
    assert [a.request for a in v.resumed] == rec.get("resumed", [])
    assert {a.request: a.prefix_hit for a in v.record.admitted} == rec.get("prefix_hit_tokens", {})
    assert v.record.finished == rec["finished"]
    assert v.record.free_blocks == rec["free_blocks"]
    assert v.after.cached_blocks == rec["cached_blocks"]
    assert round(v.record.kv_usage, 6) == rec["kv_usage"]


def straight(src):
    """The replay's conformance trace, and an engine run straight through its inputs."""
    engine = src.new_engine()
    assert list(engine.run()) == src.steps
    return src.trace(), engine


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: Path(p).parent.name)
@pytest.mark.parametrize("every", [None, 7])
def test_views_equal_the_straight_run(path, every) -> None:
    src = open_source([path])
    records, engine = straight(src)
    tl = Timeline(src, snapshot_every=every)
    tl.build()
    assert tl.done and tl.num_steps == len(records)
    assert tl.engine.summary.to_dict() == engine.summary.to_dict()
    rng = random.Random(len(records))
    steps = rng.sample(range(len(records)), 25) + [0, len(records) - 1]
    # random order: backwards, forwards, far jumps
    for s in steps + sorted(steps, reverse=True)[:5]:
        v = tl.view(s)
        assert_view(v, src, records[s])
        assert v.after.running == records[s]["running"]
        assert v.after.waiting == records[s]["waiting"]
        assert v.after.free_blocks == records[s]["free_blocks"]
        held = {rid: len(r.blocks) for rid, r in v.after.requests.items() if r.blocks}
        assert held == records[s]["blocks_held"]
        if s > 0:
            assert v.before.running == records[s - 1]["running"]
    # compact columns agree with the records at every step
    assert list(tl.free_blocks) == [r["free_blocks"] for r in records]
    assert list(tl.num_running) == [len(r["running"]) for r in records]
    assert list(tl.num_waiting) == [len(r["waiting"]) for r in records]
    assert [round(x, 4) for x in tl.kv_usage] == [round(r["kv_usage"], 4) for r in records]
    assert list(tl.num_tokens) == [r.get("num_scheduled_tokens", 0) for r in records]
    expect = {
        "preemption": [r["step"] for r in records if r.get("preemptions")],
        "admission": [r["step"] for r in records if r.get("new")],
        "resume": [r["step"] for r in records if r.get("resumed")],
        "finish": [r["step"] for r in records if r.get("finished")],
        "arrival": [r["step"] for r in records if r.get("arrivals")],
        "blocked": [r["step"] for r in records if "admission_blocked" in r],
    }
    for kind, steps in expect.items():
        assert list(tl.event_steps[kind]) == steps, kind
    assert [s for s in range(len(records)) if tl.flags[s] & 32] == [
        r["step"] for r in records if r.get("idle")]
    finishes = {rid: evs[-1].step for rid, evs in tl.life.items() if evs and evs[-1].kind == "finished"}
    assert finishes == {rid: s for rid, s in engine.summary.finished_step.items()}
    assert [p.victim for p in tl.preemptions] == [
        p["req"] for r in records for p in r.get("preemptions", ())
    ]


def test_snapshot_resumes_to_identical_trace_and_summary() -> None:
    src = open_source([CASES / "f_prefix_caching" / "workload.json"])
    records, engine = straight(src)
    tl = Timeline(src, snapshot_every=40)
    tl.build()
    for snap in tl.snapshots:
        e = tl.codec.restore(snap)
        assert list(e.run()) == src.steps[snap.step:]
        assert e.summary.to_dict() == engine.summary.to_dict()


def _big_pool_workload(num_gpu_blocks: int) -> dict:
    rng = random.Random(3)
    reqs = [{"id": f"q{i}", "arrival_step": i * 3,
             "prompt_token_ids": [rng.randrange(10, 900) for _ in range(rng.randrange(50, 400))],
             "max_tokens": rng.randrange(50, 300)} for i in range(40)]
    return {"name": "big", "config": {"num_gpu_blocks": num_gpu_blocks, "block_size": 16,
                                      "enable_prefix_caching": True, "max_num_seqs": 32},
            "requests": reqs}


def test_snapshots_work_where_deepcopy_hits_the_recursion_limit(tmp_path) -> None:
    path = tmp_path / "big.workload.json"
    path.write_text(json.dumps(_big_pool_workload(3000)))
    src = open_source([path])
    records, _ = straight(src)
    tl = Timeline(src, snapshot_every=25)
    tl.build()
    for s in (len(records) - 1, 3, len(records) // 2, 26, 24):
        assert_view(tl.view(s), src, records[s])


def test_thinning_keeps_memory_under_the_cap() -> None:
    src = open_source([sample_path("fcfs_heavy.workload.json")])
    records, _ = straight(src)
    tl = Timeline(src, snapshot_every=2, snapshot_cap=40_000)
    tl.build()
    assert tl.snapshot_bytes <= 40_000
    assert tl.snapshots[0].step == 0
    for s in (600, 1, 300):
        assert_view(tl.view(s), src, records[s])


def test_navigation_and_preemption_details() -> None:
    src = open_source([sample_path("fcfs_heavy.workload.json")])
    records, _ = straight(src)
    tl = Timeline(src)
    tl.build()
    pre_steps = [r["step"] for r in records if r.get("preemptions")]
    assert tl.next_event("preemption", -1) == pre_steps[0]
    assert tl.next_event("preemption", pre_steps[0]) == pre_steps[1]
    assert tl.next_event("preemption", pre_steps[1], forward=False) == pre_steps[0]
    assert tl.next_event("preemption", pre_steps[0], forward=False) is None
    first = tl.preemptions_at(pre_steps[0])
    p = records[pre_steps[0]]["preemptions"][0]
    assert (first[0].victim, first[0].trigger, first[0].computed_tokens_lost) == (
        p["req"], p["trigger"], p["num_computed_tokens_before"])
    assert first[0].blocks_needed == p["blocks_needed"]
    assert first[0].free_blocks_at_failure == p["free_blocks_at_failure"]
    # readmission: the first later step that resumed the victim
    resumed = next(r for r in records[pre_steps[0]:] if first[0].victim in r.get("resumed", ()))
    assert first[0].readmission_step == resumed["step"]
    assert first[0].prefix_hit_at_readmission == resumed["prefix_hit_tokens"][first[0].victim]
    # request life is in step order and ends with its finish
    for rid, events in tl.life.items():
        assert [e.step for e in events] == sorted(e.step for e in events)
        assert events[0].kind == "arrival" and events[-1].kind == "finished"
    assert tl.find_requests("r1")[:2] == ["r1", "r10"]


def test_scheduled_kinds() -> None:
    src = open_source([sample_path("fcfs_heavy.workload.json")])
    tl = Timeline(src)
    tl.build()
    p = tl.preemptions[1]
    v = tl.view(p.readmission_step)
    kinds = {s.rid: s.kind for s in v.scheduled}
    assert kinds[p.victim] == "recompute"
    v0 = tl.view(0)
    assert {s.kind for s in v0.scheduled} == {"prefill"}
    late = tl.view(p.readmission_step + 40)
    assert "decode" in {s.kind for s in late.scheduled}


def test_block_states_and_diff() -> None:
    src = open_source([CASES / "f_prefix_caching" / "workload.json"])
    tl = Timeline(src)
    tl.build()
    p = tl.preemptions[0]
    v = tl.view(p.step)
    after = v.after
    assert after.block_states[0] == NULL
    counts = after.counts()
    assert counts["free"] + counts["cached"] == after.free_blocks
    assert counts["shared"] > 0  # the shared prefix
    for bid, owners in after.owners.items():
        state = after.block_states[bid]
        assert state == (SHARED if len(owners) > 1 else HELD)
    # the victim held blocks before the step and none after
    assert v.before.requests[p.victim].blocks and not after.requests[p.victim].blocks
    d = diff_states(v.before, after)
    assert any(rid == p.victim and f == "status" for rid, f, _, _ in d.changed)
    assert {FREE, CACHED} & set(after.block_states)


def test_cancel_keeps_what_was_loaded() -> None:
    src = open_source([sample_path("fcfs_heavy.workload.json")])
    tl = Timeline(src)
    tl.build(max_steps=100)
    assert tl.num_steps == 100 and not tl.done
    records, _ = straight(src)
    assert_view(tl.view(99), src, records[99])
    with pytest.raises(IndexError):
        tl.view(100)


def test_timeline_module_imports_no_ui() -> None:
    code = ("import sys, kvreplay.replay.timeline\n"
            "print(','.join(m for m in sys.modules if m.split('.')[0] in ('textual', 'polars')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_log_source_times_confidence_and_log_neighbours() -> None:
    """A log source: every step has a wall-clock start; a time maps to the step running
    then; each preemption has its own confidence; any step finds its nearest log lines."""
    from kvreplay.samples import sample_path as sp

    src = open_source([sp("vllm033_fcfs_heavy.reqbody.log")])
    tl = Timeline(src)
    tl.build()
    times = tl.step_times
    assert tl.has_times and len(times) == tl.num_steps
    assert list(times) == sorted(times)
    for s in (0, 1, 41, tl.num_steps // 2, tl.num_steps - 1):
        assert tl.step_time(s) == times[s]
        assert tl.step_at_time(times[s]) == s
        if s + 1 < tl.num_steps:
            assert tl.step_at_time((times[s] + times[s + 1]) / 2) == s
    assert tl.step_at_time(times[0] - 60) == 0
    assert tl.step_at_time(times[-1] + 60) == tl.num_steps - 1
    assert tl.step_time(tl.num_steps) is None
    # the preemptions and their confidence are the log replay's own records
    assert tl.preemptions is src.preemptions
    assert [tl.preemption_confidence(p) for p in tl.preemptions] == [
        p.confidence for p in src.preemptions] == ["consistent"] * 5
    # nearest log lines around a step without any
    logged = sorted(src.log_lines)
    gap = next(s for s in range(tl.num_steps) if s not in src.log_lines)
    before, after = tl.nearest_log_steps(gap)
    assert before == max(s for s in logged if s < gap)
    assert after == min(s for s in logged if s > gap)
    assert tl.nearest_log_steps(logged[0]) == (None, logged[1])
    assert tl.nearest_log_steps(logged[-1] + 5) == (logged[-1], None)


def test_workload_source_has_no_times_and_exact_confidence() -> None:
    src = open_source([sample_path("fcfs_heavy.workload.json")])
    tl = Timeline(src)
    tl.build(max_steps=200)
    assert not tl.has_times and tl.step_time(3) is None
    assert tl.preemptions and {tl.preemption_confidence(p) for p in tl.preemptions} == {"exact"}
    assert tl.nearest_log_steps(5) == (None, None)


def test_preemption_probability_comes_from_the_log_replay() -> None:
    """The Why panel's probability and the headline: the log replay's own ensemble
    (the same numbers the report prints), not a measure of the TUI's."""
    src = open_source([sample_path("vllm033_fcfs_heavy.reqbody.log")])
    tl = Timeline(src)
    tl.build()
    u = src.uncertainty
    assert u is not None and tl.headline == u.headline
    p = tl.preemptions[0]
    assert tl.preemption_probability(p) == (p.probability, u.samples + 1)
    p.probability = 0.3
    from rich.text import Text

    from kvreplay.tui.panel_text import why_one, why_text

    t = Text()
    why_one(t, tl, p, "inferred")
    assert f"probability: 0.30 of {u.samples + 1} weighted replays" in t.plain
    assert "a lead, not a fact" in t.plain
    v = tl.view(p.step)
    assert why_text(tl, v).plain.startswith("This log: " + u.headline)


def test_v0_step_views_hold_the_records_and_the_v0_engines_schedule() -> None:
    """A V0 log with swaps: each view holds the replay's StepRecord; its scheduled
    requests, admissions, resumes and swap-ins are the V0 engine's own record of the step
    (its trace), and no token budget left is made up (V0 does not keep one)."""
    log = Path(__file__).parents[2] / "data" / "v0_logs" / "v066_swap_1s.log"
    src = _open([str(log)], year=2025)
    records = src.trace()
    tl = Timeline(src, snapshot_every=16)
    tl.build()
    swapped = [r["step"] for r in records if r.get("swapped_in")]
    assert swapped, "the swap log swaps victims back in"
    for s in swapped[:5] + [0, len(records) - 1]:
        v = tl.view(s)
        rec = records[s]
        assert v.record == src.steps[s]
        assert [[x.rid, x.tokens] for x in v.scheduled] == rec.get("scheduled", [])
        assert [a.request for a in v.admitted] == rec.get("new", [])
        assert [a.request for a in v.resumed] == rec.get("resumed", [])
        assert [a.request for a in v.swapped_in] == rec.get("swapped_in", [])
        assert v.token_budget_left is None
    from kvreplay.tui.panel_text import step_text

    text = step_text(tl, tl.view(swapped[0]), None).plain
    assert "Swapped in: " + rec_ids(records[swapped[0]]["swapped_in"]) in text
    assert " left" not in text.split("\n")[1]  # "budget N tokens: M scheduled", no "left"


def rec_ids(ids: list[str]) -> str:
    return ", ".join(ids)
