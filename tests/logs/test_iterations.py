"""Logs written with `--enable-logging-iteration-details`: every arrival placed by vLLM's own
`Iteration(N)` lines, every step checked against them.

The answer keys are vLLM's: truth.json and the traces of tests/data/logcases (vLLM 0.33.0's
scheduler, its lines written by its own logging code), and the oracle bank's traces
(tests/data/oracle/0.33, vLLM's scheduler) rendered as logs. Nothing here compares the
replay with an output of its own."""

from __future__ import annotations

import gzip
import json
import re
from functools import lru_cache
from pathlib import Path

import pytest

from kvreplay.replay import Engine, get_profile, parse_workload
from tools.oracle.render_log import formula_step_time, iteration_lines_of, render_log, step_starts
from kvreplay.sources import read_facts, replay_logs

DATA = Path(__file__).parents[1] / "data"
CASES = DATA / "logcases"
ORACLE = DATA / "oracle" / "0.33"
ITER = re.compile(r"Iteration\((\d+)\): (\d+) context requests, (\d+) context tokens, (\d+) "
                  r"generation requests, (\d+) generation tokens, iteration elapsed time: "
                  r"([\d.]+) ms, GPU KV cache usage: ([\d.]+)%")
LOGCASES = ["b_fcfs_heavy", "f_prefix_caching", "p1_poisson_fcfs_200"]


def _truth(case: str) -> dict:
    return json.loads((CASES / case / "truth.json").read_text())


def _trace(d: Path) -> list[dict]:
    p = d / "trace.jsonl.gz"
    with gzip.open(p, "rt") as f:
        return [json.loads(line) for line in f]


def _lines(path: Path) -> list[tuple[str, ...]]:
    """(N, the four counts, KV usage) of every Iteration line in a log."""
    out = []
    for line in path.read_text().splitlines():
        m = ITER.search(line)
        if m:
            g = m.groups()
            out.append((*g[:5], g[6]))
    return out


@lru_cache(maxsize=None)
def _replay(case: str, log: str):
    return replay_logs([str(CASES / case / log)], year=2026)


def _by_token_step(steps) -> dict[int, int]:
    """step -> N: engine steps numbered as the Iteration lines number them (only steps that
    scheduled a token)."""
    out, n = {}, 0
    for step, tokens in steps:
        out[step] = n
        n += 1 if tokens else 0
    return out


# ---------------------------------------------------------------- what a line means
@pytest.mark.parametrize("case", LOGCASES)
def test_the_model_counts_context_and_generation_as_vllm_logs_them(case: str) -> None:
    """Our scheduler on the true workload prints, step for step, the Iteration lines
    vLLM 0.33's own logging code wrote for that run (counts and KV usage)."""
    d = CASES / case
    eng = Engine(parse_workload(json.loads((d / "workload.json").read_text())), get_profile("0.33"))
    recs = list(eng.run())
    by_update = {r.updated_batch: r for r in recs if r.updated_batch is not None}
    ours = []
    n = 0
    for r in recs:
        if r.num_scheduled_tokens:
            kv = by_update[r.step].kv_usage
            ours.append((str(n), str(r.num_ctx_requests), str(r.num_ctx_tokens),
                         str(r.num_scheduled - r.num_ctx_requests),
                         str(r.num_scheduled_tokens - r.num_ctx_tokens), f"{kv * 100:.1f}"))
            n += 1
    assert ours == _lines(d / "server.iter.log")


@pytest.mark.parametrize("case", LOGCASES)
def test_renderer_writes_the_lines_vllm_wrote(case: str) -> None:
    """The renderer (used for the round trip below) turns vLLM's own trace into the lines
    vLLM's logging code wrote for that run: the renderer does not depend on our model."""
    d = CASES / case
    recs = _trace(d)
    truth = _truth(case)
    starts = step_starts(recs, formula_step_time(truth["step_time_model"]), 0.0)
    blocks = json.loads((d / "workload.json").read_text())["config"]["num_gpu_blocks"]
    rendered = [ITER.search(line).groups() for _, line in iteration_lines_of(recs, starts.__getitem__, blocks)]
    assert [(*g[:5], g[6]) for g in rendered] == _lines(d / "server.iter.log")


# ---------------------------------------------------------------- the log cases
@pytest.mark.parametrize("case", LOGCASES)
def test_every_preemption_at_its_step_with_prompts(case: str) -> None:
    rep = _replay(case, "server.iter.reqbody.log")
    truth = _truth(case)
    want = sorted((p["step"], p["victim_log_id"], truth["requests"][p["trigger"]]["log_request_id"])
                  for p in truth["preemptions"])
    assert sorted((p.step, p.victim, p.trigger) for p in rep.preemptions) == want
    assert [p.computed_tokens_lost for p in sorted(rep.preemptions, key=lambda p: p.step)] == \
        [p["num_computed_tokens_before"] for p in sorted(truth["preemptions"], key=lambda p: p["step"])]
    it = rep.verification.iterations
    assert it.matched == it.lines == truth["num_steps"]
    assert it.first_mismatch is None
    assert all(p.confidence == "exact-by-log" for p in rep.preemptions)
    assert all("Iteration line" in p.basis for p in rep.preemptions)
    assert rep.num_steps == truth["num_steps"]


def test_the_clock_puts_each_preemption_at_its_time() -> None:
    """Step times are logged: the replay's clock puts each preemption within a few ms of
    the time vLLM's run had (truth.json's simulated clock)."""
    rep = _replay("p1_poisson_fcfs_200", "server.iter.reqbody.log")
    truth = {p["step"]: p["sim_time"] for p in _truth("p1_poisson_fcfs_200")["preemptions"]}
    off = [abs(p.time - truth[p.step]) for p in rep.preemptions]
    assert max(off) < 0.05, off


@pytest.mark.slow
def test_without_prompts_the_report_says_how_sure_it_is() -> None:
    """No prompts: lengths come from the lines' context tokens. The burst case pins all
    of them (5 of 5 exact); the Poisson case cannot split two prompts admitted in one step,
    and its preemptions are not called exact."""
    b = _replay("b_fcfs_heavy", "server.iter.log")
    truth = _truth("b_fcfs_heavy")
    assert sorted((p.step, p.victim) for p in b.preemptions) == \
        sorted((p["step"], p["victim_log_id"]) for p in truth["preemptions"])
    p1 = _replay("p1_poisson_fcfs_200", "server.iter.log")
    lengths = p1.verification.iterations.prompt_lengths
    assert lengths.get("exact", 0) < 200
    assert not any(p.confidence == "exact-by-log" for p in p1.preemptions)


def test_an_altered_line_is_the_first_mismatch(tmp_path: Path) -> None:
    """One token count changed on one Iteration line: the replay reports that line as the
    first it cannot match; preemptions before it stay exact-by-log, none after."""
    src = (CASES / "p1_poisson_fcfs_200" / "server.iter.reqbody.log").read_text().splitlines()
    idx = next(i for i, line in enumerate(src) if "Iteration(700):" in line)
    m = ITER.search(src[idx])
    gen = int(m.group(5))
    src[idx] = src[idx].replace(f"{gen} generation tokens", f"{gen + 1} generation tokens")
    log = tmp_path / "server.log"
    log.write_text("\n".join(src) + "\n")
    rep = replay_logs([str(log)], year=2026)
    mm = rep.verification.iterations.first_mismatch
    assert (mm.file, mm.line, mm.iteration) == (str(log), idx + 1, 700)
    assert "generation tokens" in " ".join(mm.differences)
    step = mm.step
    before = [p for p in rep.preemptions if p.step < step]
    after = [p for p in rep.preemptions if p.step >= step]
    assert before and after
    assert all(p.confidence == "exact-by-log" for p in before)
    assert not any(p.confidence == "exact-by-log" for p in after)


def test_a_log_that_starts_mid_run_does_not_use_the_lines(tmp_path: Path) -> None:
    """Lines from Iteration(N > 0) on, with requests logged before: no exact placement is
    claimed, and a note says why."""
    src = (CASES / "b_fcfs_heavy" / "server.iter.reqbody.log").read_text().splitlines()
    first = next(i for i, line in enumerate(src) if "Iteration(" in line)
    cut = [line for i, line in enumerate(src)
           if not ("Iteration(" in line and i < first + 40)]
    log = tmp_path / "server.log"
    log.write_text("\n".join(cut) + "\n")
    rep = replay_logs([str(log)], year=2026)
    assert rep.verification.iterations is None
    assert any("Iteration lines not used" in n and "Iteration(40)" in n for n in rep.notes)
    assert not any(p.confidence == "exact-by-log" for p in rep.preemptions)


@pytest.mark.slow
def test_the_report_names_the_flag_first_when_the_lines_are_missing() -> None:
    rep = _replay("p1_poisson_fcfs_200", "server.log")
    assert any("--enable-logging-iteration-details" in m for m in rep.missing)
    assert rep.estimate is None or rep.estimate.make_it_exact.startswith(
        "start vLLM (0.14+) with --enable-logging-iteration-details")


def test_report_table_shows_the_line_check(tmp_path: Path) -> None:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "kvreplay", "replay",
                          str(CASES / "f_prefix_caching" / "server.iter.reqbody.log")],
                         capture_output=True, text=True, check=True).stdout
    assert "iteration lines: 322 of 322 match the replay step by step" in out
    assert "exact-by-log" in out


# ---------------------------------------------------------------- round trip over the bank
def _bank_cases() -> list[Path]:
    return sorted(p for p in ORACLE.iterdir() if (p / "trace.jsonl.gz").exists())


@lru_cache(maxsize=1)
def _formula():
    return formula_step_time(_truth("p1_poisson_fcfs_200")["step_time_model"])


def _round_trip(d: Path, tmp_path: Path, **kw) -> tuple[list, list, dict]:
    wl = parse_workload(json.loads((d / "workload.json").read_text()))
    recs = _trace(d)
    lines = render_log(wl, recs, step_time_s=_formula(), start=1778148060.05,
                       stats_interval_s=10.0, stats_phase_s=0.3, iteration_lines=True, **kw)
    log = tmp_path / f"{d.name}.log"
    log.write_text("\n".join(lines) + "\n")
    rep = replay_logs([str(log)], year=2026)
    tn = _by_token_step((r["step"], sum(t for _, t in r.get("scheduled", ()))) for r in recs)
    on = _by_token_step((r.step, r.num_scheduled_tokens) for r in rep.steps)
    true = sorted((tn[r["step"]], q["req"], q["trigger"]) for r in recs for q in r.get("preemptions", ()))
    ours = sorted((on[p.step], p.victim, p.trigger) for p in rep.preemptions)
    return true, ours, rep.verification.iterations


@pytest.mark.slow
def test_round_trip_over_the_oracle_bank(tmp_path: Path) -> None:
    """Every 0.33 oracle-bank run with a preemption (FCFS and priority, prefix caching,
    chunked prefill, async scheduling, thresholds), vLLM's own trace rendered as a log with
    prompts and Iteration lines (10 s stats): the replay preempts exactly as vLLM did, at
    the same step (numbered as the lines number them), victim and trigger."""
    runs = same = 0
    for d in _bank_cases():
        true, ours, it = _round_trip(d, tmp_path)
        if not true:
            continue
        runs += 1
        assert ours == true, (d.name, it.first_mismatch)
        assert it.first_mismatch is None, d.name
        same += 1
    assert runs >= 120


def test_replay_is_deterministic() -> None:
    """Two processes with different hash seeds write the same bytes (a log with Iteration
    lines and preemptions: the step-exact path)."""
    import os
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "kvreplay", "replay", "--format", "json",
           str(CASES / "b_fcfs_heavy" / "server.iter.log")]
    out = [subprocess.run(cmd, capture_output=True, check=True,
                          env={**os.environ, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")]
    assert out[0] == out[1] and b'"preemptions": 5' in out[0]


def _moved_earlier(lines: list[str], which: set[int]) -> list[str]:
    """The request lines of the `which`-th requests written one Iteration line earlier (a
    frontend that logged them ahead of a step's output): each then entered two lines after
    the last line before it, the edge of the window LogFormat.iteration_window allows."""
    out = list(lines)
    k = -1
    i = 0
    while i < len(out):
        if "Received request" in out[i]:
            k += 1
            if k in which:
                start = i - 1 if i and "JSON body" in out[i - 1] else i
                end = i + 2 if i + 1 < len(out) and "Added request" in out[i + 1] else i + 1
                block = out[start:end]
                j = start - 1
                while j >= 0 and "Iteration(" not in out[j] and "Received request" not in out[j] \
                        and "Added request" not in out[j]:
                    j -= 1
                if j >= 0 and "Iteration(" in out[j]:
                    del out[start:end]
                    out[j:j] = block
                i = end
                continue
        i += 1
    return out


from hypothesis import given, settings, strategies as st  # noqa: E402
from helpers.examples import few


@settings(few())
@given(case=st.sampled_from(["crowd_priority_bs4_s1", "crowd_fcfs_bs16_s7",
                             "crowd_priority_bs4_async_s8"]),
       which=st.sets(st.integers(0, 60), max_size=20))
def test_requests_logged_a_line_early_still_replay_exactly(tmp_path_factory, case: str,
                                                           which: set[int]) -> None:
    d = ORACLE / case
    wl = parse_workload(json.loads((d / "workload.json").read_text()))
    recs = _trace(d)
    lines = render_log(wl, recs, step_time_s=_formula(), start=1778148060.05,
                       stats_interval_s=10.0, iteration_lines=True)
    log = tmp_path_factory.mktemp("early") / "server.log"
    log.write_text("\n".join(_moved_earlier(lines, which)) + "\n")
    rep = replay_logs([str(log)], year=2026)
    tn = _by_token_step((r["step"], sum(t for _, t in r.get("scheduled", ()))) for r in recs)
    on = _by_token_step((r.step, r.num_scheduled_tokens) for r in rep.steps)
    true = sorted((tn[r["step"]], q["req"], q["trigger"]) for r in recs for q in r.get("preemptions", ()))
    assert sorted((on[p.step], p.victim, p.trigger) for p in rep.preemptions) == true
    assert rep.verification.iterations.first_mismatch is None
