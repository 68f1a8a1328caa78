"""Randomised and hand-made workloads run through vLLM's own schedulers (tools/oracle/oracle.py,
tests/data/oracle/README.md), reproduced by kvreplay on every field of every step."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvreplay.replay import get_profile, parse_workload, simulate
from helpers.tracecmp import case_dirs, first_difference, read_trace, read_workload

ROOT = Path(__file__).parents[1] / "data" / "oracle"
RELEASES = {"0.33": "0.33", "0.19.0": "0.19", "0.11.0": "0.11"}
CASES = [
    pytest.param(RELEASES[rel], d, False, id=f"{rel}/{d.name}")
    for rel in RELEASES
    for d in case_dirs(ROOT / rel)
] + [
    # vLLM itself never finishes these (a request that can never fit); kvreplay must
    # still make the same decisions up to max_steps.
    pytest.param(RELEASES[d.parent.name], d, True, id=f"incomplete/{d.parent.name}/{d.name}")
    for rel in RELEASES
    for d in case_dirs(ROOT / "incomplete" / rel)
]


def test_bank_is_present() -> None:
    assert len(CASES) >= 100


@pytest.mark.parametrize("profile,case_dir,incomplete", CASES)
def test_oracle_case(profile: str, case_dir: Path, incomplete: bool) -> None:
    workload = parse_workload(read_workload(case_dir), check_capacity=not incomplete)
    records, summary = simulate(workload, get_profile(profile), check_invariants=True)
    diff = first_difference(records, read_trace(case_dir))
    assert diff is None, f"{case_dir.name} under profile {profile}:\n{diff}"
    assert summary.completed is not incomplete
