"""V0 engine conformance: every step of every V0 oracle trace reproduced.

Cases: the four published ones (tests/data/conformance/v0/, copied from
../shared/conformance/v0/) and the ones generated from vLLM 0.6.6.post1's own scheduler by
tools/oracle/make_v0_cases.py (tests/data/v0_oracle/). Each step is compared on the fields the
oracle README lists; the whole trace must also be byte-identical to the oracle's file.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvreplay.replay.v0 import run_workload, summarize, trace_text

DATA = Path(__file__).parents[1] / "data"
CASE_DIRS = sorted((DATA / "conformance" / "v0").glob("*/workload.json")) + sorted(
    (DATA / "v0_oracle").glob("*/workload.json"))
CASES = [p.parent for p in CASE_DIRS]
FIELDS = ["scheduled", "preempted", "finished", "running", "waiting", "swapped",
          "free_gpu_blocks", "free_cpu_blocks", "num_computed_tokens"]


def _load(case: Path):
    workload = json.loads((case / "workload.json").read_text())
    expected = [json.loads(line) for line in (case / "trace.jsonl").read_text().splitlines()]
    return workload, expected


def test_cases_present():
    names = {c.name for c in CASES}
    assert {"v0_a_recompute_basic", "v0_c_chunked_decode_first", "v0_f_swap_enough_cpu",
            "v0_i_watermark_later_never"} <= names
    assert len(CASES) >= 20


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_v0_case_step_for_step(case: Path):
    workload, expected = _load(case)
    got = run_workload(workload, check_invariants=True)
    for i, (g, e) in enumerate(zip(got, expected)):
        assert g["step"] == e["step"], f"record {i}: step {g['step']} != {e['step']}"
        fields = FIELDS if "terminal_error" not in e else ["preempted", "terminal_error"]
        for f in fields:
            if g.get(f) != e.get(f):
                pytest.fail(f"{case.name}: first difference at step {e['step']}, field {f!r}\n"
                            f"  replay: {json.dumps(g.get(f))[:600]}\n"
                            f"  vLLM:   {json.dumps(e.get(f))[:600]}")
    assert len(got) == len(expected), f"{case.name}: {len(got)} records, vLLM has {len(expected)}"


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_v0_case_byte_identical_and_summary(case: Path):
    workload, _ = _load(case)
    got = run_workload(workload)
    text = trace_text(got)
    exp_text = (case / "trace.jsonl").read_text()
    if text != exp_text:
        for i, (a, b) in enumerate(zip(text.splitlines(), exp_text.splitlines())):
            if a != b:
                ga, eb = json.loads(a), json.loads(b)
                keys = [k for k in eb if ga.get(k) != eb.get(k)] or ["(key order)"]
                pytest.fail(f"{case.name}: line {i} differs in {keys}")
        pytest.fail(f"{case.name}: line count differs")
    summary = summarize(got, workload)
    expected = json.loads((case / "summary.json").read_text())
    assert summary == expected


def test_deterministic_output():
    workload, _ = _load(DATA / "conformance" / "v0" / "v0_c_chunked_decode_first")
    assert trace_text(run_workload(workload)) == trace_text(run_workload(workload))
