"""The oracle harness (tools/oracle/harness/: oracle_core.py's one step loop, one class per
vLLM release in oracle_releases.py) reproduces the published vLLM 0.33.0 traces byte for
byte, and refuses what a release cannot run.

The expected bytes are the committed traces and summaries (tests/data/conformance/cases/,
tests/data/oracle/0.33/ and incomplete/0.33/), written by the harness before it was split
into core + releases; the needs_vllm tests run vLLM 0.33.0 itself (helpers/vllm_venv.py).
"""

from __future__ import annotations

import gzip
import json
import subprocess
from pathlib import Path

import pytest

from helpers.tracecmp import case_dirs
from helpers.vllm_venv import need_vllm, vllm_env
from tools.oracle.harness import oracle_releases as R

TESTS = Path(__file__).resolve().parents[1]
HARNESS = TESTS.parent / "tools" / "oracle" / "harness"
CASES = sorted(p for p in (TESTS / "data" / "conformance" / "cases").iterdir() if p.is_dir())
# the oracle bank's 0.33 cases (tests/data/oracle/README.md), incomplete ones included
BANK = case_dirs(TESTS / "data" / "oracle" / "0.33") + case_dirs(
    TESTS / "data" / "oracle" / "incomplete" / "0.33")


def _cfg(**kw) -> dict:
    cfg = {"watermark": 0.0, "scheduler_reserve_full_isl": True}
    cfg.update(kw)
    return cfg


def test_releases_by_version() -> None:
    assert set(R.RELEASES) == {"0.33.0", "0.19.0", "0.11.0"}
    assert type(R.for_version("0.19.0")) is R.V0_19
    with pytest.raises(SystemExit, match="no oracle for vLLM 0.20.0"):
        R.for_version("0.20.0")


def test_unsupported_keys() -> None:
    """watermark exists from vLLM 0.24, scheduler_reserve_full_isl from 0.19 (spec Part E):
    a workload setting a key its release lacks to a non-default value is refused."""
    v33, v19, v11 = R.V0_33(), R.V0_19(), R.V0_11()
    for rel in (v33, v19, v11):
        assert rel.unsupported(_cfg()) is None
    assert v33.unsupported(_cfg(watermark=0.05, scheduler_reserve_full_isl=False)) is None
    assert "watermark=0.05" in v19.unsupported(_cfg(watermark=0.05))
    assert v19.unsupported(_cfg(scheduler_reserve_full_isl=False)) is None
    assert "watermark=0.05" in v11.unsupported(_cfg(watermark=0.05))
    assert "scheduler_reserve_full_isl=False" in v11.unsupported(
        _cfg(scheduler_reserve_full_isl=False))


def test_batch_queue_early_return() -> None:
    """EngineCore.step_with_batch_queue keeps a batch in flight (no update this iteration):
    0.33 iff queue not full and (the model ran or requests remain); 0.19 / 0.11 iff the model
    ran and the queue is not full (their futures taken as not done)."""

    class Sched:
        def __init__(self, has: bool) -> None:
            self.has = has

        def has_requests(self) -> bool:
            return self.has

    v33, v19, v11 = R.V0_33(), R.V0_19(), R.V0_11()
    # (model_executed, has_requests, queue_len) with a queue of size 2
    assert v33.batch_stays_queued(Sched(True), False, 1, 2) is True
    assert v19.batch_stays_queued(Sched(True), False, 1, 2) is False
    assert v11.batch_stays_queued(Sched(True), False, 1, 2) is False
    for rel in (v33, v19, v11):
        assert rel.batch_stays_queued(Sched(False), True, 1, 2) is True
        assert rel.batch_stays_queued(Sched(True), True, 2, 2) is False
        assert rel.batch_stays_queued(Sched(True), True, 1, 1) is False  # sync: size 1
    assert v33.batch_stays_queued(Sched(False), False, 1, 2) is False


@pytest.mark.needs_vllm
def test_harness_reproduces_published_traces(tmp_path: Path) -> None:
    """Every conformance workload and every 0.33 case of the oracle bank through
    run_oracle.py in ONE vLLM 0.33.0 process (batch.py): trace and summary byte-identical to
    the committed ones; the bank's incomplete cases end with exit status 2."""
    py = need_vllm()
    assert len(CASES) == 7 and len(BANK) >= 100
    jobs = []
    for i, case in enumerate(CASES + BANK):
        assert (case / "trace.jsonl.gz").is_file() and (case / "summary.json").is_file()
        d = tmp_path / str(i)
        d.mkdir()
        jobs.append({"workload": str(case / "workload.json"), "out": str(d / "trace.jsonl"),
                     "summary": str(d / "summary.json"), "meta": str(d / "meta.json")})
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    proc = subprocess.run(
        [str(py), str(HARNESS / "batch.py"), str(HARNESS / "run_oracle.py"),
         "--list", str(tmp_path / "jobs.json"), "--timeout", "120"],
        capture_output=True, text=True, env=vllm_env(), timeout=900)
    recs = [json.loads(s[8:]) for s in proc.stdout.splitlines() if s.startswith("@@BATCH ")]
    want = ["incomplete" if c.parent.parent.name == "incomplete" else "ok" for c in CASES + BANK]
    assert [r["status"] for r in recs] == want, proc.stderr[-3000:]
    for i, case in enumerate(CASES + BANK):
        d = tmp_path / str(i)
        assert (d / "trace.jsonl").read_bytes() == gzip.decompress(
            (case / "trace.jsonl.gz").read_bytes()), case
        assert (d / "summary.json").read_bytes() == (case / "summary.json").read_bytes(), case
        meta = json.loads((d / "meta.json").read_text())
        assert meta["vllm_version"] == "0.33.0"
        assert meta["platform"] == "CpuPlatform"


@pytest.mark.needs_vllm
def test_release_script_refuses_other_vllm(tmp_path: Path) -> None:
    """versions/run_oracle_0.19.0.py in vLLM 0.33.0's venv: one line, non-zero exit, nothing
    written."""
    py = need_vllm()
    wl = CASES[0] / "workload.json"
    assert wl.is_file()
    proc = subprocess.run(
        [str(py), str(HARNESS / "versions" / "run_oracle_0.19.0.py"), str(wl),
         "-o", str(tmp_path / "t.jsonl"), "--summary", str(tmp_path / "s.json"),
         "--meta", str(tmp_path / "m.json")],
        capture_output=True, text=True, env=vllm_env(), timeout=600)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == "this harness is for vLLM 0.19.0, got 0.33.0"
    assert list(tmp_path.iterdir()) == []
