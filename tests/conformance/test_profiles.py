"""Version profiles (spec Part C/E): release -> profile, and for the profiles with no vLLM
oracle here, the spec's version notes as asserted differences from a neighbouring release
whose behaviour *is* checked against vLLM's own traces."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvreplay.errors import UserError
from kvreplay.replay import PROFILES, Engine, get_profile, parse_workload, simulate
from helpers.tracecmp import first_difference, read_trace, read_workload

DATA = Path(__file__).parents[1] / "data"


@pytest.mark.parametrize(
    "release,profile",
    [("0.8.5", "0.8.5"), ("0.9.0", "0.8.5"), ("0.9.2", "0.9"), ("0.10.1", "0.9"),
     ("0.10.2", "0.11"), ("0.11.0", "0.11"), ("0.12.0", "0.12"), ("0.18.1", "0.12"),
     ("0.19.0", "0.19"), ("0.23.0", "0.19"), ("0.24.0", "0.24"), ("0.27.1", "0.24"),
     ("0.28.0", "0.28"), ("0.29.0", "0.28"), ("0.30.0", "0.30"), ("0.31.0", "0.31"),
     ("0.32.0", "0.31"), ("0.33.0", "0.33"), ("0.33", "0.33"), ("v0.19.0", "0.19"),
     ("0.14.1.dev0+gb17039bcc.d20260311", "0.12"), ("0.40.0", "0.33")],
)
def test_release_selects_profile(release: str, profile: str) -> None:
    assert get_profile(release).name == profile


def test_bad_and_old_releases() -> None:
    with pytest.raises(UserError, match="unknown profile"):
        get_profile("banana")
    with pytest.raises(UserError, match="V0 engine"):
        get_profile("0.6.3")


def test_each_profile_switches_back_exactly_its_part_c_rows() -> None:
    """Neighbouring profiles differ in exactly the rows the spec dates between them."""
    def diff(a: str, b: str) -> set[str]:
        pa, pb = PROFILES[a], PROFILES[b]
        skip = {"name", "releases", "notes"}
        return {f for f in pa.__dataclass_fields__ if f not in skip and getattr(pa, f) != getattr(pb, f)}

    assert diff("0.33", "0.31") == {"priority_self_preempt_continues"}  # C6-self, from 0.33
    assert diff("0.31", "0.30") == {"threshold_lone_request_exempt"}  # C3, from 0.31
    assert diff("0.30", "0.28") == {"async_stale_output"}  # A9, from 0.30
    assert diff("0.28", "0.24") == {"free_unhashed_to_head", "rollback_index"}  # C15, C6 (0.28)
    assert diff("0.24", "0.19") == {"watermark", "prefix_stats_at_admission"}  # C13 (0.24), C14 (0.27)
    assert diff("0.19", "0.12") == {"full_sequence_gate"}  # C12, from 0.19
    assert diff("0.12", "0.11") == {  # C6, C7, C8, E24, E25
        "priority_rollback", "rollback_index", "unchunked_overflow", "preempted_prefix_stats",
        "skipped_requeued_reversed", "async_skip_final_token",
    }
    assert diff("0.11", "0.9") == {"priority_rollback", "usage_excludes_null_block",
                                   "skipped_requeued_reversed"}  # C6, C16
    assert diff("0.9", "0.8.5") == {"priority_policy", "unchunked_overflow", "max_model_len_cap"}


def _wl(config: dict, requests: list[dict]) -> dict:
    return {"name": "t", "config": config, "requests": requests}


def _req(rid: str, n: int, out: int, step: int = 0, prio: int = 0, base: int = 0) -> dict:
    return {"id": rid, "arrival_step": step, "prompt_token_ids": list(range(base, base + n)),
            "max_tokens": out, "priority": prio}


def test_lone_request_threshold_c3() -> None:
    """0.31+: the threshold is off when only one request is present; 0.30 and before chunk
    even a lone request (spec A7, C3)."""
    data = _wl({"long_prefill_token_threshold": 16, "block_size": 16}, [_req("a", 64, 2)])
    first = lambda p: simulate(parse_workload(data), get_profile(p))[0][0]["scheduled"]  # noqa: E731
    assert first("0.31") == [["a", 64]]
    assert first("0.30") == [["a", 16]]
    assert first("0.12") == [["a", 16]]


def test_priority_self_preemption_ends_the_scan_before_0_33() -> None:
    """C6-self: vLLM 0.33's own trace (oracle bank) keeps scanning after a PRIORITY request
    preempts itself; with the 0.31 profile the later running requests get nothing that
    step, so the traces part at the first such step."""
    case = DATA / "oracle" / "0.33" / "prio_rollback_bs4_thr8_chunked_s2"
    data = read_workload(case)
    vllm = read_trace(case)
    ours33, _ = simulate(parse_workload(data), get_profile("0.33"))
    ours31, _ = simulate(parse_workload(data), get_profile("0.31"))
    assert first_difference(ours33, vllm) is None
    step = next(r["step"] for r in vllm for p in r.get("preemptions", ())
                if p["self_preempt"] and r["scheduled"] and r["scheduled"][-1][0] != p["req"])
    assert ours31[step]["scheduled"] != vllm[step]["scheduled"]
    assert [r.get("scheduled") for r in ours31[:step]] == [r.get("scheduled") for r in vllm[:step]]


def test_watermark_exists_from_0_24() -> None:
    """C13: an FCFS, cache-off watermark case runs the same under 0.24 as under vLLM 0.33's
    own scheduler (no other 0.24-0.33 difference applies), and is refused before 0.24."""
    case = DATA / "oracle" / "0.33" / "watermark_wm1_bs8_s6"
    data = read_workload(case)
    ours, _ = simulate(parse_workload(data), get_profile("0.24"))
    assert first_difference(ours, read_trace(case)) is None
    with pytest.raises(UserError, match="watermark"):
        simulate(parse_workload(data), get_profile("0.23"))


def test_append_only_free_queue_before_0_28() -> None:
    """C15 / A12 example 1: after A finishes, the free queue is [3,4,2,1] up to 0.27 and
    [4,2,1,3] from 0.28; the decisions are the same, the block ids differ."""
    data = _wl({"num_gpu_blocks": 5, "block_size": 4, "max_num_batched_tokens": 64,
                "max_model_len": 256},
               [_req("A", 6, 6), _req("B", 6, 6, base=100)])
    queues = {}
    for p in ("0.24", "0.28"):
        e = Engine(parse_workload(data), get_profile(p))
        for _ in range(6):
            e.step()
        queues[p] = e.scheduler.pool.free_block_queue.block_ids()
    assert queues == {"0.24": [3, 4, 2, 1], "0.28": [4, 2, 1, 3]}


def test_no_full_sequence_gate_before_0_19() -> None:
    """C12: without the gate, e_chunked_prefill preempts 39 times (Part E); none of the
    other 0.11-0.12 differences applies to this FCFS, sync, chunked workload, so 0.12's
    trace equals vLLM 0.11.0's own."""
    case = DATA / "conformance" / "versions" / "0.11.0" / "e_chunked_prefill"
    ours, summary = simulate(parse_workload(read_workload(case)), get_profile("0.12"))
    assert first_difference(ours, read_trace(case)) is None
    assert summary.total_preemptions == 39


def test_usage_denominator_before_0_10_2() -> None:
    """C16: kv usage is 1 - free/N up to 0.10.1 (the null block counted as used)."""
    data = _wl({"num_gpu_blocks": 11, "block_size": 4}, [_req("a", 8, 3)])
    u9 = simulate(parse_workload(data), get_profile("0.9"))[0][0]["kv_usage"]
    u11 = simulate(parse_workload(data), get_profile("0.11"))[0][0]["kv_usage"]
    assert (u9, u11) == (round(1 - 8 / 11, 6), round(1 - 8 / 10, 6))


def test_unchunked_overflow_c7() -> None:
    """C7: chunked prefill off and a prompt larger than the budget left: 0.12+ stops the
    waiting scan (break), 0.9.2-0.11 skip it and admit the next, <= 0.9.0 chunk anyway."""
    data = _wl({"enable_chunked_prefill": False, "max_num_batched_tokens": 64,
                "max_model_len": 64, "block_size": 4, "num_gpu_blocks": 100},
               [_req("a", 40, 4), _req("b", 40, 4, base=100), _req("c", 10, 4, base=200)])
    first = lambda p: simulate(parse_workload(data), get_profile(p))[0][0]["scheduled"]  # noqa: E731
    assert first("0.12") == [["a", 40]]
    assert first("0.11") == [["a", 40], ["c", 10]]
    assert first("0.8.5") == [["a", 40], ["b", 24]]


def test_no_priority_policy_before_0_9_2() -> None:
    data = _wl({"policy": "priority"}, [_req("a", 8, 1)])
    with pytest.raises(UserError, match="PRIORITY"):
        simulate(parse_workload(data), get_profile("0.8.5"))


def test_every_profile_runs_the_published_cases() -> None:
    """Every profile replays every published workload to completion with invariants on."""
    for case in sorted((DATA / "conformance" / "cases").iterdir()):
        data = json.loads((case / "workload.json").read_text())
        for name, prof in PROFILES.items():
            if data["config"].get("policy") == "priority" and not prof.priority_policy:
                continue
            _, s = simulate(parse_workload(data), prof, check_invariants=True)
            assert s.completed, (case.name, name)
