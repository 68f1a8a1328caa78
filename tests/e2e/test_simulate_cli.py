"""`kvreplay simulate` as a user runs it: output formats, determinism, bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvreplay.cli import main
from helpers.tracecmp import first_difference, read_trace

DATA = Path(__file__).parents[1] / "data"
CASE = DATA / "conformance" / "cases" / "g_self_preempt_fcfs"


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kvreplay", *args], capture_output=True, text=True, timeout=120
    )


def test_trace_to_file_matches_vllm(tmp_path: Path) -> None:
    out = tmp_path / "trace.jsonl"
    assert main(["simulate", str(CASE / "workload.json"), "-o", str(out)]) == 0
    ours = [json.loads(line) for line in out.read_text().splitlines()]
    assert first_difference(ours, read_trace(CASE)) is None


def test_two_runs_are_byte_identical(tmp_path: Path) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    case = DATA / "conformance" / "cases" / "f_prefix_caching" / "workload.json"
    assert main(["simulate", str(case), "-o", str(a)]) == 0
    assert main(["simulate", str(case), "-o", str(b)]) == 0
    assert a.read_bytes() == b.read_bytes()


def test_stdout_and_profile_flag() -> None:
    case = DATA / "conformance" / "versions" / "0.11.0" / "e_chunked_prefill"
    proc = run_cli("simulate", str(case / "workload.json"), "--profile", "0.11.0")
    assert proc.returncode == 0, proc.stderr
    ours = [json.loads(line) for line in proc.stdout.splitlines()]
    assert first_difference(ours, read_trace(case)) is None


def test_report_on_embedded_sample() -> None:
    proc = run_cli("simulate", "--format", "report")
    assert proc.returncode == 0, proc.stderr
    # The sample is b_fcfs_heavy: 5 preemptions, the first a self-preemption of r3 at step 41.
    assert "5 preemptions (1 self-preemption)" in proc.stdout
    assert "     41  r3       r3       fcfs self    240        241      0      150  exact" in proc.stdout


def test_summary_file(tmp_path: Path) -> None:
    summary = tmp_path / "s.json"
    assert main(["simulate", str(CASE / "workload.json"), "-o", str(tmp_path / "t"),
                 "--summary", str(summary)]) == 0
    want = json.loads((CASE / "summary.json").read_text())
    got = json.loads(summary.read_text())
    assert got["preemption_events"] == want["preemption_events"]


@pytest.mark.parametrize(
    "content,message",
    [
        ("{not json", "not JSON"),
        ('{"config": {"num_gpu_blocks": 8, "bogus": 1}, "requests": []}', "unknown config keys: bogus"),
        ('{"config": {"max_model_len": 8}, "requests": [{"id": "a", "arrival_step": 0, '
         '"prompt_token_ids": [1,2,3,4,5,6,7,8,9], "max_tokens": 1}]}', "longer than max_model_len"),
        ('{"config": {"num_gpu_blocks": 3, "block_size": 4}, "requests": [{"id": "a", '
         '"arrival_step": 0, "prompt_token_ids": [1,2,3,4,5,6,7,8,9,10], "max_tokens": 1}]}',
         "only 2 usable blocks"),
        ('{"config": {}, "requests": [{"id": "a", "arrival_step": 0, "max_tokens": 1}]}',
         "lacks prompt_token_ids"),
        ('[1, 2]', "JSON that is not a workload"),
        ('{"config": {"policy": "lifo"}, "requests": []}', "policy must be"),
    ],
)
def test_bad_workloads_get_one_line_and_exit_2(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "w.json"
    path.write_text(content)
    proc = run_cli("simulate", str(path))
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_missing_file_and_bad_profile() -> None:
    proc = run_cli("simulate", "/no/such/workload.json")
    assert proc.returncode == 2 and "no such file" in proc.stderr
    proc = run_cli("simulate", str(CASE / "workload.json"), "--profile", "banana")
    assert proc.returncode == 2 and "unknown profile" in proc.stderr


def test_unfinishable_request_can_be_replayed_on_request(tmp_path: Path) -> None:
    case = DATA / "oracle" / "incomplete" / "0.33" / "overflow_pool_bs4_s1"
    assert (case / "workload.json").is_file(), case
    proc = run_cli("simulate", str(case / "workload.json"))
    assert proc.returncode == 2 and "could never finish" in proc.stderr
    out = tmp_path / "t.jsonl"
    proc = run_cli("simulate", str(case / "workload.json"), "--allow-unfinishable", "-o", str(out))
    assert proc.returncode == 1 and "max_steps" in proc.stderr
    ours = [json.loads(line) for line in out.read_text().splitlines()]
    assert first_difference(ours, read_trace(case)) is None


def test_v0_workload_through_the_cli_is_byte_identical(tmp_path: Path) -> None:
    case = DATA / "conformance" / "v0" / "v0_f_swap_enough_cpu"
    out = tmp_path / "t.jsonl"
    assert main(["simulate", str(case / "workload.json"), "-o", str(out)]) == 0
    assert out.read_bytes() == (case / "trace.jsonl").read_bytes()
    proc = run_cli("simulate", str(case / "workload.json"), "--format", "report")
    assert proc.returncode == 0
    assert "14 preemptions (2 self-preemptions)" in proc.stdout
    assert "      5  r6       r1       last running  swap           0          0      -       17" in proc.stdout
