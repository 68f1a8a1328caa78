"""V0 log replays: a row labelled exact-by-log or consistent is right (its victim
preempted within 5 steps of its step in the simulated run the log was rendered from).

A V0 log pins lines and arrivals to a second only; with millisecond steps a second holds
tens of steps, and neither a matched every-50th warning nor agreeing stats lines pin a
row's step (tools/research/eval_v0_labels.py measures the labels over all V0
workloads). With 1 s steps both labels stay."""

from __future__ import annotations

import json
from pathlib import Path

from kvreplay.inference import replay_facts
from tools.oracle.render_v0_log import render_v0_log
from kvreplay.replay.v0 import run_workload
from kvreplay.sources import read_facts
from tools.research.eval_v0_labels import ms_dt, true_preemptions
from tools.research.matching import match_preemptions

CASE = Path(__file__).parents[1] / "data" / "conformance" / "v0" / "v0_c_chunked_decode_first"


def _replay(tmp_path: Path, step_time) -> tuple[list[tuple[int, str]], list]:
    assert (CASE / "workload.json").is_file()
    w = json.loads((CASE / "workload.json").read_text())
    w.setdefault("config", {})["fake_token_mode"] = "index"
    trace = run_workload(w)
    log = tmp_path / "v0.log"
    log.write_text("\n".join(render_v0_log(w, trace, step_time_s=step_time)) + "\n")
    rep = replay_facts(read_facts([str(log)], year=2025))
    return true_preemptions(trace), rep.preemptions


def test_ms_steps_no_sure_label_on_a_wrong_row(tmp_path):
    true, pre = _replay(tmp_path, ms_dt)
    # the warning is matched (victim, count, second) but the replay's step is off: the
    # row it names must not read as exact
    assert any(p.basis and "warning" in p.basis for p in pre)
    right = match_preemptions(true, [(p.step, p.victim) for p in pre], tol=5)
    for j, p in enumerate(pre):
        if p.confidence in ("exact-by-log", "consistent"):
            assert j in right, (p.step, p.victim, p.confidence)


def test_one_second_steps_keep_exact_labels(tmp_path):
    true, pre = _replay(tmp_path, 1.0)
    # (the step-time model is fitted: a step off at most, every row within 5 steps)
    right = match_preemptions(true, [(p.step, p.victim) for p in pre], tol=5)
    assert len(right) == len(pre) == len(true)
    warned = [p for p in pre if p.basis and "warning" in p.basis]
    assert warned and all(p.confidence == "exact-by-log" for p in warned)
    assert all(p.confidence in ("exact-by-log", "consistent") for p in pre)
