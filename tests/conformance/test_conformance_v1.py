"""vLLM's own schedulers' traces (0.33.0, 0.19.0, 0.11.0) reproduced step for step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvreplay.replay import get_profile, parse_workload, simulate
from helpers.tracecmp import case_dirs, first_difference, read_trace, read_workload

DATA = Path(__file__).parents[1] / "data"
SUITES = [
    ("0.33", DATA / "conformance" / "cases"),
    ("0.33", DATA / "logcases"),
    ("0.19.0", DATA / "conformance" / "versions" / "0.19.0"),
    ("0.11.0", DATA / "conformance" / "versions" / "0.11.0"),
]
CASES = [
    pytest.param(profile, d, id=f"{profile}/{d.parent.name}/{d.name}")
    for profile, root in SUITES
    for d in case_dirs(root)
]


def test_suites_are_present() -> None:
    # 7 published 0.33 cases, 3 log cases, 7 workloads for each older release.
    assert len(CASES) == 7 + 3 + 7 + 7


@pytest.mark.parametrize("profile,case_dir", CASES)
def test_trace_matches_vllm(profile: str, case_dir: Path) -> None:
    workload = parse_workload(read_workload(case_dir))
    records, summary = simulate(workload, get_profile(profile), check_invariants=True)
    expected = read_trace(case_dir)
    diff = first_difference(records, expected)  # every field vLLM's trace has
    assert diff is None, f"{case_dir.name} under profile {profile}:\n{diff}"
    want = json.loads((case_dir / "summary.json").read_text())
    got = summary.to_dict()
    for key in ("num_steps", "total_preemptions", "self_preemptions", "requests_preempted",
                "total_prefix_hit_tokens", "preemption_events", "finished_step",
                "first_scheduled_step", "first_token_step"):
        assert got[key] == want[key], f"summary {key}"


def test_profiles_differ_where_part_e_says() -> None:
    """Part E: e_chunked_prefill has 39 preemptions under 0.11 (no full-sequence gate),
    1 under 0.33; the same workload run with the wrong profile must not match."""
    case = DATA / "conformance" / "cases" / "e_chunked_prefill"
    workload = parse_workload(read_workload(case))
    _, s33 = simulate(workload, get_profile("0.33"))
    _, s11 = simulate(workload, get_profile("0.11"))
    assert s33.total_preemptions == 1
    assert s11.total_preemptions == 39
