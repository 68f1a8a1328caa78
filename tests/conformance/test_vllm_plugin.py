"""The step-trace plugin on REAL vLLM 0.33.0 (CPU, fake model): vLLM's own Scheduler /
AsyncScheduler run every conformance workload with kvreplay.vllm_plugin as the scheduler
class; the log vLLM's logger wrote is parsed, replayed by kvreplay, and every step must be
equal. A deliberately altered line must be reported as a divergence at that step.

vLLM runs in its own venv (`.ci/install_vllm.sh` makes it): $KVREPLAY_VLLM_PYTHON, else
${XDG_CACHE_HOME:-~/.cache}/kvreplay/vllm-0.33/bin/python, else the oracle venv of
tools/oracle/oracle.py. Absent, these tests are skipped, except under CI=true where that fails.
All workloads run in ONE vLLM process (the import costs ~6 s).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from kvreplay.events import Log, RequestTrace, StepTrace, TraceConfig, Unparsed
from kvreplay.parsers import parse_files
from kvreplay.inference.step_trace import has_step_trace, replay_step_trace

from helpers.tracecmp import CONFORMANCE_FIELDS, first_difference, read_trace
from helpers.vllm_venv import DRIVER, VLLM_VERSION, need_vllm, vllm_env

TESTS = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.needs_vllm
CASES = sorted(p for p in (TESTS / "data" / "conformance" / "cases").iterdir() if (p / "workload.json").exists())


@pytest.fixture(scope="module")
def vllm_runs(tmp_path_factory):
    """Every conformance workload through vLLM 0.33.0 with the plugin, in one process."""
    py = need_vllm()
    out = tmp_path_factory.mktemp("vllm_plugin")
    jobs = []
    for case in CASES:
        d = out / case.name
        d.mkdir()
        jobs.append({"workload": str(case / "workload.json"), "log": str(d / "vllm.log"),
                     "trace": str(d / "trace.jsonl"), "summary": str(d / "summary.json"),
                     "meta": str(d / "meta.json"), "plugin": True})
    jobs_path = out / "jobs.json"
    jobs_path.write_text(json.dumps(jobs))
    proc = subprocess.run([str(py), str(DRIVER), str(jobs_path)], capture_output=True, text=True,
                          env=vllm_env(), timeout=600)
    recs = [json.loads(line[6:]) for line in proc.stdout.splitlines() if line.startswith("@@JOB ")]
    assert len(recs) == len(jobs), proc.stderr[-3000:]
    for rec in recs:
        assert rec["status"] == "ok", rec
    return {case.name: out / case.name for case in CASES}


@pytest.fixture(scope="module")
def parsed(vllm_runs):
    return {name: list(parse_files([str(d / "vllm.log")], year=2026)) for name, d in vllm_runs.items()}


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("case", [c.name for c in CASES])
def test_plugin_changes_no_decision(vllm_runs, case):
    """vLLM with the plugin makes exactly the decisions of the published vLLM trace."""
    ours = _jsonl(vllm_runs[case] / "trace.jsonl")
    want = read_trace(TESTS / "data" / "conformance" / "cases" / case)
    assert first_difference(ours, want, CONFORMANCE_FIELDS) is None


@pytest.mark.parametrize("case", [c.name for c in CASES])
def test_log_lines_parse(vllm_runs, parsed, case):
    evs = parsed[case]
    assert has_step_trace(evs)
    assert not [e for e in evs if isinstance(e, Unparsed)]
    assert not [e for e in evs if isinstance(e, Log) and "kvtrace" in e.message]
    raw = (vllm_runs[case] / "vllm.log").read_text().splitlines()
    assert sum("kvtrace step " in s for s in raw) == sum(isinstance(e, StepTrace) for e in evs)
    assert sum("kvtrace req " in s for s in raw) == sum(isinstance(e, RequestTrace) for e in evs)
    (cfg,) = [e for e in evs if isinstance(e, TraceConfig)]
    assert cfg.vllm_version == VLLM_VERSION
    wl = json.loads((TESTS / "data" / "conformance" / "cases" / case / "workload.json").read_text())
    assert cfg.num_gpu_blocks == wl["config"].get("num_gpu_blocks", 64)
    assert cfg.async_scheduling == wl["config"].get("async_scheduling", False)
    # every line is vLLM's own format: "(MainProcess pid=N) INFO mm-dd hh:mm:ss [file:line] kvtrace"
    steps = [e for e in evs if isinstance(e, StepTrace)]
    assert all(e.level == "INFO" and e.pid and e.source for e in steps)
    # no token id is ever logged: request lines carry lengths and hashes only
    text = (vllm_runs[case] / "vllm.log").read_text()
    prompt = wl["requests"][0]["prompt_token_ids"]
    assert ",".join(map(str, prompt[:8])) not in text


@pytest.mark.parametrize("case", [c.name for c in CASES])
def test_exact_replay_every_step_equal(vllm_runs, parsed, case):
    rep = replay_step_trace(parsed[case])
    res = rep.step_check
    steps = [e for e in parsed[case] if isinstance(e, StepTrace)]
    assert res.first_divergence is None, res.first_divergence
    assert res.steps_checked == len(steps) > 0
    # the vLLM-side facts agree with what the harness recorded independently
    summary = json.loads((vllm_runs[case] / "summary.json").read_text())
    want = [(p["step"], p["req"], p["trigger"], p["self_preempt"]) for p in summary["preemption_events"]]
    got = [(p.step, p.victim, p.trigger, p.self_preemption) for p in rep.preemptions]
    assert got == want
    assert all(p.confidence == "exact" for p in rep.preemptions)
    assert len(rep.steps) == len(steps)
    # the Replay re-runs from its inputs to exactly its records (what the TUI does)
    assert [r for _, r in rep.rerun()] == rep.steps


def _alter(log: Path, out: Path, step: int, old: str, new: str) -> int:
    """Copy `log` with `old` replaced by `new` in the line of `step`; return its line number."""
    lines = log.read_text().splitlines(keepends=True)
    for i, s in enumerate(lines):
        if f"kvtrace step {step} " in s:
            assert old in s, s
            lines[i] = s.replace(old, new, 1)
            out.write_text("".join(lines))
            return i + 1
    raise AssertionError(f"no step {step}")


def _first_step_with(evs, pred):
    return next(e for e in evs if isinstance(e, StepTrace) and pred(e))


@pytest.mark.parametrize(
    "case,what",
    [
        ("b_fcfs_heavy", "free"),
        ("b_fcfs_heavy", "tokens"),
        ("g_self_preempt_fcfs", "victim"),
        ("f_prefix_caching", "prefix_hit"),
        ("x_async_b_fcfs_heavy", "finished"),
        ("d_priority", "trigger"),
    ],
)
def test_altered_line_is_a_divergence_at_that_step(vllm_runs, parsed, tmp_path, case, what):
    evs = parsed[case]
    log = vllm_runs[case] / "vllm.log"
    if what == "free":
        st = _first_step_with(evs, lambda e: e.step == 100)
        old, new, field = f"free={st.free_blocks} ", f"free={st.free_blocks + 1} ", "free_blocks"
    elif what == "tokens":
        st = _first_step_with(evs, lambda e: e.new)
        h, n = st.scheduled[-1]
        old, new, field = f",{h}:{n} ", f",{h}:{n - 1} ", "scheduled"
    elif what == "victim":
        st = _first_step_with(evs, lambda e: e.preempted)
        v, t, lost = st.preempted[0]
        other = next(h for h, _ in st.scheduled if h != v)
        old, new, field = f"pre={v}/", f"pre={other}/", "preempted"
    elif what == "trigger":
        st = _first_step_with(evs, lambda e: e.preempted and e.preempted[0][1] is not None)
        v, t, lost = st.preempted[0]
        old, new, field = f"pre={v}/{t}/", f"pre={v}/{v + 100 if t != v + 100 else v + 101}/", "preempted"
    elif what == "prefix_hit":
        st = _first_step_with(evs, lambda e: e.resumed and e.resumed[0][1] > 0)
        h, hit = st.resumed[0]
        old, new, field = f"res={h}:{hit}", f"res={h}:{hit - 16}", "resumed"
    else:
        st = _first_step_with(evs, lambda e: e.finished)
        h, n = st.finished[0]
        other = next(o for o, _ in st.scheduled or [(h + 1, 1)] if o != h) if st.scheduled else h + 1
        old, new, field = f"f={h}:{n}", f"f={other}:{n}", "finished"
    bad = tmp_path / "altered.log"
    lineno = _alter(log, bad, st.step, old, new)
    res = replay_step_trace(list(parse_files([str(bad)], year=2026))).step_check
    div = res.first_divergence
    assert div is not None
    assert (div.step, div.line, div.file, div.field) == (st.step, lineno, str(bad), field)
    assert res.steps_checked == st.step  # every step before it was equal


def test_enable_by_class_path_and_by_environment_variable(tmp_path):
    """`--scheduler-cls kvreplay.vllm_plugin.StepTraceScheduler` resolves through vLLM's own
    argument parser and SchedulerConfig; KVREPLAY_STEP_TRACE=1 with the
    `vllm.general_plugins` entry point makes vLLM's default choice the traced one."""
    py = need_vllm()
    proc = subprocess.run([str(py), str(DRIVER), "--check-entry-points", str(tmp_path)],
                          capture_output=True, text=True, env=vllm_env(), timeout=300)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("@@EP ")]
    assert lines, proc.stderr[-3000:]
    got = json.loads(lines[0][5:])
    assert got == {
        "sync": "StepTraceScheduler",
        "async": "StepTraceAsyncScheduler",
        "scheduler_cls_path": "StepTraceScheduler",
        "cli_scheduler_cls": "kvreplay.vllm_plugin.StepTraceScheduler",
    }


SYNC_CASES = [c.name for c in CASES if not c.name.startswith("x_async")]


@pytest.mark.parametrize("case", SYNC_CASES)
def test_rendered_step_trace_is_what_the_plugin_writes(vllm_runs, case):
    """tools/oracle/render_step_trace.py (the step-trace variant of a rendered log) writes, from
    our scheduler's run, the lines vLLM with the plugin wrote: message and `[file:line]`,
    in order (block hashes compared by first appearance: ours are not vLLM's bytes)."""
    import re

    from tools.oracle import render_step_trace as R

    from kvreplay.replay import parse_workload

    wl = parse_workload(json.loads((TESTS / "data" / "conformance" / "cases" / case
                                    / "workload.json").read_text()))
    recs, made = R.run_traced(wl)
    ours = [s for _, s in R.trace_lines(wl, recs, made, [0.0] * (len(recs) + 1))]
    real = [s for s in (vllm_runs[case] / "vllm.log").read_text().splitlines() if "] kvtrace " in s]
    hexes = re.compile(r"\b[0-9a-f]{16}\b")

    def canon(lines: list[str]) -> list[str]:
        ids: dict[str, int] = {}
        return [hexes.sub(lambda m: f"H{ids.setdefault(m.group(0), len(ids))}", s[s.index("["):])
                for s in lines]

    assert len(ours) == len(real) > 0
    assert canon(ours) == canon(real)
