"""`TraceWriter` (what `kvreplay simulate -o` writes) against `conformance_record`, the
whole-state trace record the conformance cases are compared with: byte for byte, every
step. The writer re-encodes only the requests a step touched, so a step that changes a
request it does not list would show here as a stale fragment."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st
from helpers.strategies import workloads
from helpers.tracecmp import case_dirs, read_trace, read_workload

from kvreplay.replay import Engine, get_profile, parse_workload
from kvreplay.replay.records import EngineInputs
from kvreplay.replay.trace import TraceWriter, conformance_record

DATA = Path(__file__).parents[1] / "data"
encode = msgspec.json.Encoder().encode
# the conformance cases, the log cases and every fourth workload of the oracle bank, each
# under the release that made its trace
SUITES = [("0.33", DATA / "conformance" / "cases"), ("0.33", DATA / "logcases"),
          ("0.19.0", DATA / "conformance" / "versions" / "0.19.0"),
          ("0.11.0", DATA / "conformance" / "versions" / "0.11.0")]
CASES = [(p, d) for p, root in SUITES for d in case_dirs(root)] + [
    (rel, d) for rel in ("0.33", "0.19.0", "0.11.0")
    for d in case_dirs(DATA / "oracle" / rel)[::4]]


def _both(data: dict, inputs: EngineInputs | None = None, profile: str = "0.33"):
    """(writer lines, encoded conformance records) of two runs of the same inputs."""
    eng = Engine(parse_workload(data, check_capacity=False), get_profile(profile), inputs=inputs)
    writer = TraceWriter(eng)
    got = [writer.line(rec) for rec in eng.run()]
    eng = Engine(parse_workload(data, check_capacity=False), get_profile(profile), inputs=inputs)
    want = [encode(conformance_record(eng, rec)) + b"\n" for rec in eng.run()]
    return got, want


def _first_difference(got: list[bytes], want: list[bytes]) -> int | None:
    for i, (a, b) in enumerate(zip(got, want)):
        if a != b:
            return i
    return None if len(got) == len(want) else min(len(got), len(want))


@pytest.mark.parametrize("profile,case", CASES,
                         ids=[f"{p}/{d.parent.name}/{d.name}" for p, d in CASES])
def test_vllm_cases_byte_identical(profile: str, case: Path) -> None:
    data = read_workload(case)
    got, want = _both(data, profile=profile)
    assert _first_difference(got, want) is None
    # and its maps and queues are vLLM's, step for step
    vllm = read_trace(case)
    mine = [msgspec.json.decode(line) for line in got]
    assert len(mine) == len(vllm)
    for a, b in zip(mine, vllm):
        for k in ("num_computed_tokens", "num_output_tokens", "status", "blocks_held",
                  "running", "waiting", "free_blocks"):
            assert a[k] == b[k], (case.name, a["step"], k)


def test_the_suites_are_present() -> None:
    assert len(CASES) > 100


@given(workloads(), st.data())
def test_random_runs_byte_identical(data: dict, draw) -> None:
    """Random configs (async scheduling, priority, prefix caching, chunking, watermark),
    arrivals out of workload order, and aborts between steps and inside a step."""
    ids = [r["id"] for r in data["requests"]]
    arrivals = [r["arrival_step"] for r in data["requests"]]
    aborts = draw.draw(st.lists(st.tuples(st.integers(0, 40), st.sampled_from(ids)), max_size=3))
    mid = draw.draw(st.lists(st.tuples(st.integers(0, 40), st.sampled_from(ids)), max_size=2))
    inputs = EngineInputs(arrivals, aborts=sorted(aborts), mid_aborts=sorted(mid))
    got, want = _both(data, inputs)
    assert _first_difference(got, want) is None


def test_a_late_low_index_arrival_keeps_workload_order() -> None:
    """Request r0 arrives after r1 and r2 are live: the maps must list it first (the
    writer rebuilds its order), as vLLM's harness does (its dicts follow the workload)."""
    data = {"name": "order", "config": {"num_gpu_blocks": 64, "block_size": 16,
                                        "max_num_seqs": 4, "max_num_batched_tokens": 256,
                                        "max_model_len": 256},
            "requests": [{"id": "r0", "arrival_step": 3, "prompt_token_ids": [1] * 20,
                          "max_tokens": 4},
                         {"id": "r1", "arrival_step": 0, "prompt_token_ids": [2] * 20,
                          "max_tokens": 8},
                         {"id": "r2", "arrival_step": 1, "prompt_token_ids": [3] * 20,
                          "max_tokens": 8}]}
    got, want = _both(data)
    assert got == want
    step3 = msgspec.json.decode(got[3])
    assert list(step3["num_computed_tokens"]) == ["r0", "r1", "r2"]
