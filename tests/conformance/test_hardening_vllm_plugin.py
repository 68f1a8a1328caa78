"""The step-trace plugin never takes vLLM down: a fault injected into kvreplay's own code
inside REAL vLLM 0.33.0's scheduler (CPU, fake model; tests/helpers/vllm_driver.py)
leaves vLLM's run identical to a run without the plugin, with one WARNING saying why the
trace stopped.

vLLM runs in its own venv (`.ci/install_vllm.sh`; helpers.vllm_venv finds it): absent,
skipped (failed under CI).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from helpers.vllm_venv import DRIVER, need_vllm, vllm_env

pytestmark = pytest.mark.needs_vllm

TESTS = Path(__file__).resolve().parents[1]
CASES = TESTS / "data" / "conformance" / "cases"

# (case, kvreplay function that fails, on which call): every wrapper's bookkeeping, sync and async
FAULTS = [
    ("a_light_load", "_kvt_setup", 1),  # start-up: vLLM runs untraced from the first step
    ("b_fcfs_heavy", "_kvt_state", 5),  # writing a step line
    ("b_fcfs_heavy", "_kvt_trigger", 1),  # inside vLLM's preemption
    ("f_prefix_caching", "short_hash", 3),  # the hash helper
    ("x_async_b_fcfs_heavy", "_kvt_added", 4),  # after add_request, async scheduler
    ("e_chunked_prefill", "_kvt_scheduled", 2),  # after schedule()
    ("d_priority", "_kvt_updated", 3),  # after update_from_output()
]



@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    py = need_vllm()
    out = tmp_path_factory.mktemp("plugin_faults")
    jobs = []
    names = sorted({c for c, _, _ in FAULTS})
    for name, fault in [(c, None) for c in names] + [(c, [f, n]) for c, f, n in FAULTS]:
        d = out / (name + ("" if fault is None else f"-{fault[0]}"))
        d.mkdir()
        jobs.append({"workload": str(CASES / name / "workload.json"), "log": str(d / "vllm.log"), "trace": str(d / "trace.jsonl"),
                     "summary": str(d / "summary.json"), "meta": str(d / "meta.json"), "plugin": fault is not None, "fault": fault})
    (out / "jobs.json").write_text(json.dumps(jobs))
    proc = subprocess.run([str(py), str(DRIVER), str(out / "jobs.json")], capture_output=True, text=True,
                          env=vllm_env(), timeout=900)
    recs = [json.loads(s[6:]) for s in proc.stdout.splitlines() if s.startswith("@@JOB ")]
    assert len(recs) == len(jobs), proc.stderr[-3000:]
    return out, recs


@pytest.mark.parametrize("case,where,n", FAULTS)
def test_fault_in_kvreplay_leaves_vllm_unchanged(runs, case, where, n):
    out, recs = runs
    plain, faulty = out / case, out / f"{case}-{where}"
    statuses = {r["workload"]: r["status"] for r in recs}
    assert set(statuses.values()) == {"ok"}, recs
    assert (faulty / "trace.jsonl").read_bytes() == (plain / "trace.jsonl").read_bytes()
    assert (faulty / "summary.json").read_bytes() == (plain / "summary.json").read_bytes()
    log = (faulty / "vllm.log").read_text().splitlines()
    warn = [i for i, s in enumerate(log) if "kvreplay step trace stopped" in s]
    assert len(warn) == 1 and "WARNING" in log[warn[0]] and f"injected fault in {where}" in log[warn[0]]
    assert not any("kvtrace " in s for s in log[warn[0] + 1:])  # tracing stopped there
    if where != "_kvt_setup":
        assert any("kvtrace " in s for s in log[: warn[0]])  # and ran until then
