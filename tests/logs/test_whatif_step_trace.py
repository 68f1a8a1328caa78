"""`kvreplay whatif` on a step-trace log: the step lines' whole-second stamps give the
step-time model (inference/step_model.py stamp_rows) and the Replay's clock
(inference/trace_clock.py); the arrival steps are the log's own.

The log is the step-trace variant of the p1 log case (tests/data/logcases/
p1_poisson_fcfs_200/server.trace.log.gz, written by tools/oracle/render_step_trace.py: the case's
workload run by our scheduler, which is vLLM 0.33's step for step, each step's line stamped
with the case's clock). Its what-if rows are checked against the case's whatif.jsonl (vLLM
0.33.0's own scheduler under the changed setting) and against our scheduler run directly at
the case's wall-clock arrival times."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvreplay.audit import whatif_replays as W
from kvreplay.cli import main
from kvreplay.errors import UserError
from kvreplay.inference.clock import StepTimeModel
from kvreplay.inference.step_model import STAMPS, restart, stamp_rows
from kvreplay.inference.trace_clock import stamp_clock
from kvreplay.replay.records import StepRecord
from kvreplay.sources import open_replay

TESTS = Path(__file__).parents[1]
P1 = TESTS / "data" / "logcases" / "p1_poisson_fcfs_200"
LOG = P1 / "server.trace.log.gz"
TRUTH = json.loads((P1 / "truth.json").read_text())


@pytest.fixture(scope="module")
def rp():
    return open_replay([str(LOG)], year=2026)


@pytest.fixture(scope="module")
def ctx():
    return W.load([str(LOG)], year=2026, draws=2)


def test_the_data_file_is_the_tools_render_of_the_case():
    """tools/oracle/render_step_trace.py writes these bytes again (deterministic), and each step's
    line is stamped with the whole second in which the case's clock ends that step."""
    import gzip

    from tools.oracle import render_step_trace as R

    from kvreplay.replay import parse_workload

    wl = parse_workload(json.loads((P1 / "workload.json").read_text()))
    lines, recs = R.render(wl, TRUTH["step_time_model"], stats_interval_s=2.0,
                           stats_phase_s=0.5, with_prompts=False)
    assert gzip.decompress(LOG.read_bytes()).decode() == "\n".join(lines) + "\n"
    ends = TRUTH["step_start_sim_time"][1:] + [None]
    steps = [s for s in lines if " kvtrace step " in s]
    assert len(steps) == TRUTH["num_steps"] == len(recs)
    import time as _t

    for s, k in ((steps[k], k) for k in (0, 500, 1200, len(steps) - 2)):
        assert f"kvtrace step {k} " in s
        assert _t.strftime("%m-%d %H:%M:%S", _t.gmtime(math.floor(ends[k]))) in s


def test_replay_exact_with_a_clock(rp):
    """The step-trace replay is unchanged (every step checked, the case's 54 preemptions)
    and now has a clock: each step's start within 0.1 s of the case's (measured: 58 ms at
    most, at the steps the stamps pin least)."""
    assert rp.kind == "step-trace" and rp.step_check.first_divergence is None
    assert rp.step_check.steps_checked == TRUTH["num_steps"] == len(rp.steps)
    assert len(rp.preemptions) == TRUTH["total_preemptions"] == 54
    assert rp.stamps is not None and len(rp.clock) == len(rp.steps)
    err = [abs(a - b) for a, b in zip(rp.clock, TRUTH["step_start_sim_time"])]
    assert max(err) < 0.1 and sum(err) / len(err) < 0.02
    assert rp.info.step_time_model.startswith(STAMPS)


def test_stamps_give_the_cases_step_time_terms(ctx):
    """Fitted on 26 one-second rows, the terms are truth.json's step_time_model within
    what the seconds allow (measured: 0.11 ms + 41.5 us x max(tokens, 152) + 52.5 us a
    request + 32.2 ns a context token against 1.5 ms + 40 us x max(tokens, 120) + 50 us +
    40 ns): the small step (overhead + weight read) within 3%, the per-token cost 5%, the
    per-request 10%, the per-context-token 25%."""
    m = TRUTH["step_time_model"]
    got = ctx.model
    assert ctx.fit_source == STAMPS and "26 rows" in ctx.fit_text
    small = got.overhead_s + got.per_token_s * got.token_floor
    assert small == pytest.approx(m["overhead_s"] + m["weight_read_s"], rel=0.03)
    assert got.per_token_s == pytest.approx(m["per_scheduled_token_s"], rel=0.05)
    assert got.per_request_s == pytest.approx(m["per_scheduled_request_s"], rel=0.1)
    assert got.per_context_token_s == pytest.approx(m["per_context_token_s"], rel=0.25)
    # a decode step of 30 requests with 30,000 context tokens, and a 2,048-token prefill
    for tok, req, c in ((30, 30, 30_000), (2048, 8, 8_000)):
        want = (m["overhead_s"] + max(m["weight_read_s"], m["per_scheduled_token_s"] * tok)
                + m["per_scheduled_request_s"] * req + m["per_context_token_s"] * (c + tok))
        assert got.dt(tok, req, c) == pytest.approx(want, rel=0.03)


def test_as_logged_row_is_the_replay(ctx, rp):
    assert ctx.model == rp.step_time_model  # the what-if's model is the replay's clock's
    row = W.run_one(ctx, W.Setting("as logged"), None)
    assert row["preemptions"] == rp.totals().preemptions == 54
    assert row["steps"] == len(rp.steps) and row["completed"] == 200


def test_rows_match_vllms_own_scheduler(ctx):
    """The case's five rows of vLLM 0.33.0's scheduler (whatif.jsonl): measured 0/52/41/33/52
    preemptions against vLLM's 0/52/41/32/53, throughput within 0.4%; asserted at
    max(3, 10%) and 1%."""
    for line in (P1 / "whatif.jsonl").read_text().splitlines():
        key = json.loads(line)
        k, v = key["set"][0].split("=")
        row = W.run_one(ctx, W.Setting(key["set"][0], {k: int(v)}), None)
        want = key["total_preemptions"]
        assert abs(row["preemptions"] - want) <= max(3, 0.1 * want), key
        assert row["output_tput"] == pytest.approx(key["gen_tok_per_s"], rel=0.01), key
        lo, hi = row["preemptions_interval"]
        assert lo <= row["preemptions"] <= hi


def test_changed_setting_is_our_scheduler_at_the_cases_arrival_times(ctx):
    """max-num-seqs 16: the what-if row against our scheduler driven directly with the
    case's requests at their wall-clock arrival times (truth.json) and the case's step-time
    terms (the log's context is before the step, truth's after: 40 ns x the step's tokens
    folded into the per-token cost)."""
    import dataclasses

    m = TRUTH["step_time_model"]
    model = StepTimeModel(overhead_s=m["overhead_s"],
                          per_token_s=m["per_scheduled_token_s"] + m["per_context_token_s"],
                          per_request_s=m["per_scheduled_request_s"],
                          per_context_token_s=m["per_context_token_s"],
                          token_floor=round(m["weight_read_s"] / m["per_scheduled_token_s"]))
    wl = dataclasses.replace(ctx.workload, config=dataclasses.replace(ctx.workload.config,
                                                                      max_num_seqs=16))
    arrivals = [TRUTH["requests"][s.id]["arrival_sim_time"] for s in wl.requests]
    direct = W.drive(wl, ctx.profile, model, arrivals=arrivals)
    row = W.run_one(ctx, W.Setting("--max-num-seqs 16", {"max_num_seqs": 16}), None)
    assert direct["preemptions"] == row["preemptions"] == 0
    assert row["output_tput"] == pytest.approx(direct["output_tput"], rel=0.005)
    assert abs(row["steps"] - direct["steps"]) <= 0.01 * direct["steps"]


def test_cli_whatif_on_a_step_trace(capsys):
    assert main(["whatif", str(LOG), "--year", "2026", "--max-num-seqs", "32", "--draws", "0",
                 "--format", "json", "-j", "1"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["fit"].startswith(STAMPS) and "2166/2166 steps checked" in res["fit"]
    assert [r["preemptions"] for r in res["rows"]] == [54, 52]


def test_step_trace_without_time_stamps_is_refused(tmp_path):
    """Step lines without vLLM's envelope carry no second: a clear message, no traceback."""
    import gzip

    text = gzip.decompress(LOG.read_bytes()).decode()
    bare = [s[s.index("kvtrace "):] for s in text.splitlines() if "kvtrace " in s]
    p = tmp_path / "bare.log"
    p.write_text("\n".join(bare) + "\n")
    with pytest.raises(UserError, match="no time stamps"):
        W.load([str(p)], year=2026)


def _rec(k: int, dry: bool = False, tokens: int = 10, woke: bool = False) -> StepRecord:
    return StepRecord(k, ["r"] if woke else [], num_scheduled_tokens=tokens, num_scheduled=2,
                      num_running=0 if dry else 2)


def test_stamp_rows_by_hand():
    """Stamps 0,0,1,1,1,2,3,3 (steps 0-7): the last steps of their seconds are 1, 4, 5, 7;
    rows: steps 2-4 took 1 s, step 5 took 1 s; 6-7 end at the run's last step (left out).
    A restart at step 4 (step 3 left the engine dry, step 4 takes a request) drops the row
    2-4; a restart at step 5 drops the row of step 5 too (its start waited). A dry step
    whose next step takes no request (it ran at once) drops nothing."""
    def rows(steps):
        return [([r.step for r in seg], y) for seg, y in stamp_rows(steps, stamps)]

    steps = [_rec(k) for k in range(8)]
    stamps = [0, 0, 1, 1, 1, 2, 3, 3]
    assert rows(steps) == [([2, 3, 4], 1.0), ([5], 1.0)]
    steps[3] = _rec(3, dry=True)
    assert rows(steps) == [([2, 3, 4], 1.0), ([5], 1.0)]
    steps[4] = _rec(4, woke=True)
    assert rows(steps) == [([5], 1.0)]
    steps[4], steps[5] = _rec(4, dry=True), _rec(5, woke=True)
    assert rows(steps) == []
    # a model centres each row on the steps crossing its ends: + (dt[2] - dt[5]) / 2
    steps = [_rec(k, tokens=100 if k == 2 else 10) for k in range(8)]
    m = StepTimeModel(overhead_s=0.0, per_token_s=1e-3, per_request_s=0.0)
    (seg, y), _ = stamp_rows(steps, stamps, m)
    assert y == pytest.approx(1.0 + (0.1 - 0.01) / 2)


@given(st.lists(st.tuples(st.integers(1, 400), st.booleans(), st.booleans(),
                          st.integers(0, 2)), min_size=1, max_size=60))
def test_stamp_clock_puts_each_step_in_its_second(spec):
    """Whatever the stamps (non-decreasing), the dry steps and the arrivals: the clock
    never runs back, and a step followed at once by the next one (no restart) ends, where
    the next one starts, within the second its line is stamped with."""
    steps, stamps, t = [], [], 100.0
    for k, (tok, dry, woke, gap) in enumerate(spec):
        t += gap
        steps.append(_rec(k, dry=dry, tokens=tok, woke=woke))
        stamps.append(t)
    model = StepTimeModel(overhead_s=0.002, per_token_s=2e-4, per_request_s=0.0)
    clock = stamp_clock(steps, stamps, model)
    assert len(clock) == len(steps)
    assert all(b >= a for a, b in zip(clock, clock[1:]))
    for k in range(len(steps) - 1):
        if not restart(steps, k + 1):
            assert stamps[k] <= clock[k + 1] < stamps[k] + 1


def test_audit_of_a_step_trace_has_latencies(capsys):
    """With the clock, the audit's record of a step-trace log has the latency figures (None
    before) and names where its step time comes from."""
    assert main(["audit", str(LOG), "--year", "2026", "--format", "json"]) == 0
    (rec,) = json.loads(capsys.readouterr().out)
    assert rec["step_time_model"].startswith(STAMPS)
    assert 0 < rec["ttft_p50_s"] < rec["ttft_p95_s"] and rec["itl_p50_s"] > 0


def test_an_engine_that_ran_dry_restarts_at_the_wall_clock(tmp_path):
    """Two bursts 14 s apart (tools/oracle/render_step_trace.py: the idle iterations between them
    get no line and no number, as in vLLM). The step after the gap is a restart: its start
    is the clock's, whatever the model, so the second burst arrives when it did (the model
    alone would put it straight after the first burst)."""
    import dataclasses

    from tools.oracle import render_step_trace as R
    from tools.oracle.calib_corpus import poisson_workload
    from tools.oracle.whatif_corpus import step_dt

    from kvreplay.audit.whatif_inputs import timed_arrivals
    from kvreplay.replay import parse_workload
    from tools.oracle.render_log import step_starts

    m = TRUTH["step_time_model"]
    wd = poisson_workload(7, 30, "fcfs", False, False, 600, 4.0, 32)
    for r in wd["requests"][15:]:
        r["arrival_step"] += 2000
    wl = parse_workload(wd)
    lines, recs = R.render(wl, m, stats_interval_s=2.0, stats_phase_s=0.5, with_prompts=False)
    path = tmp_path / "gap.log"
    path.write_text("\n".join(lines) + "\n")
    busy = [r for r in recs if not r.get("idle")]
    assert len(busy) < len(recs) - 1000  # a long idle stretch, dropped from the trace
    assert R.check(str(path), recs).steps_checked == len(busy)
    f = step_dt(m)
    dts = [f(r) for r in recs]
    starts = step_starts(recs, lambda r: dts[r["step"]], R.START)
    ctx = W.load([str(path)], year=2026, draws=2)
    (k,) = ctx.restarts  # one restart: the first step of the second burst
    first_late = next(r for r in busy if set(r["arrivals"]) & {x["id"] for x in wd["requests"][15:]})
    assert k == busy.index(first_late)
    assert abs(ctx.restarts[k] - starts[first_late["step"]]) < 1.0
    truth = {rid: starts[r["step"]] for r in recs for rid in r.get("arrivals", ())}
    late = [i for i, s in enumerate(ctx.workload.requests) if s.id in {x["id"] for x in wd["requests"][15:]}]
    got = timed_arrivals(ctx, ctx.model)
    assert all(abs(got[i] - truth[ctx.workload.requests[i].id]) < 1.0 for i in late)
    squeezed = timed_arrivals(dataclasses.replace(ctx, restarts={}), ctx.model)
    assert all(truth[ctx.workload.requests[i].id] - squeezed[i] > 10.0 for i in late)
    # as logged, the run is the replay again (the engine idles through the gap)
    rp = open_replay([str(path)], year=2026)
    row = W.run_one(ctx, W.Setting("as logged"), None)
    assert row["preemptions"] == len(rp.preemptions) > 0 and row["steps"] == len(rp.steps)
    assert row["makespan_s"] == pytest.approx(rp.clock[-1] - rp.clock[0], abs=1.0)
