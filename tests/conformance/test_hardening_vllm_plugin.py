"""The step-trace plugin never takes vLLM down: a fault injected into kvreplay's own code
inside REAL vLLM 0.33.0's scheduler (CPU, fake model; tests/test_vllm_plugin_driver.py)
leaves vLLM's run identical to a run without the plugin, with one WARNING saying why the
trace stopped.

vLLM runs in its own venv (`.ci/install_vllm.sh`): $KVREPLAY_VLLM_PYTHON, else
${XDG_CACHE_HOME:-~/.cache}/kvreplay/vllm-0.33/bin/python; absent, skipped (failed under CI).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
CASES = TESTS / "data" / "conformance" / "cases"
DRIVER = TESTS / "test_vllm_plugin_driver.py"
VLLM_VERSION = "0.33.0"

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


def _vllm_python() -> Path | None:
    env = os.environ.get("KVREPLAY_VLLM_PYTHON")
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvreplay"
    for py in ([Path(env)] if env else []) + [cache / "vllm-0.33" / "bin" / "python"]:
        if py.exists() and any(py.parent.parent.glob(f"lib/python3*/site-packages/vllm-{VLLM_VERSION}.dist-info")):
            return py
    return None


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    py = _vllm_python()
    if py is None:
        msg = f"vLLM {VLLM_VERSION} venv not found (set KVREPLAY_VLLM_PYTHON or run .ci/install_vllm.sh)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    out = tmp_path_factory.mktemp("plugin_faults")
    jobs = []
    names = sorted({c for c, _, _ in FAULTS})
    for name, fault in [(c, None) for c in names] + [(c, [f, n]) for c, f, n in FAULTS]:
        d = out / (name + ("" if fault is None else f"-{fault[0]}"))
        d.mkdir()
        jobs.append({"workload": str(CASES / name / "workload.json"), "log": str(d / "vllm.log"), "trace": str(d / "trace.jsonl"),
                     "summary": str(d / "summary.json"), "meta": str(d / "meta.json"), "plugin": fault is not None, "fault": fault})
    (out / "jobs.json").write_text(json.dumps(jobs))
    env = {**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1", "VLLM_LOGGING_COLOR": "0"}
    proc = subprocess.run([str(py), str(DRIVER), str(out / "jobs.json")], capture_output=True, text=True, env=env, timeout=900)
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
