"""A default log (no request lines), with or without the scrapes of its server: what the
stats lines and counters say (inference/evidence_metrics.py), the answer the workloads they
allow give (inference/default_log.py), and the counters as evidence for a full replay."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
import random
import subprocess
import sys
from types import SimpleNamespace

import pytest
from hypothesis import given, settings, strategies as st

from kvreplay.inference import evidence_metrics as EM
from kvreplay.replay.records import StepRecord

CASE = str(Path(__file__).resolve().parents[1] / "data" / "logcases" / "p1_poisson_fcfs_200")
assert os.path.exists(os.path.join(CASE, "metrics.prom.gz")), "p1's scrapes missing from tests/data"


def _stats(t, running, waiting, prompt=0.0, gen=0.0, kv=0.0):
    return SimpleNamespace(time=t, running=running, waiting=waiting, prompt_throughput=prompt,
                           generation_throughput=gen, kv_usage=kv)


def test_arrivals_are_the_change_of_running_plus_waiting_plus_finishes():
    # by hand: 3 in the system at t=10; at t=20 2 running + 4 waiting after 5 finished
    # -> 3 + (6 - 3 + 5) = 11 requests; 2 finish after the last line, 1 more came late
    stats = [_stats(10, 3, 0, 100.0, 10.0), _stats(20, 2, 4, 50.0, 20.0)]
    ev = EM.from_stats(stats, [0, 5], 5 + 7, 10.0)
    assert [w.arrivals for w in ev.windows] == [3, 8]
    assert [w.finishes for w in ev.windows] == [0, 5]
    assert ev.late_finishes == 7 and ev.late_arrivals == 1 and ev.requests == 12
    assert ev.totals() == (1500.0, 300.0)  # throughput x seconds
    assert ev.windows[0].t0 == 0.0  # the first line covers the interval before it


def test_the_counter_is_exact_only_when_scrapes_bound_the_busy_log():
    stats = [_stats(100, 0, 0), _stats(110, 5, 2, 10.0, 10.0), _stats(120, 3, 0, 0.0, 10.0), _stats(130, 0, 0)]
    done = [0, 0, 4, 7]
    bound = [EM.CounterPoint(95, 0.0), EM.CounterPoint(110, 2.0), EM.CounterPoint(125, 6.0), EM.CounterPoint(140, 9.0)]
    ev = EM.from_stats(stats, done, 7, 10.0, bound)
    assert (ev.counted, ev.counted_exact, ev.counted_until) == (9, True, None)
    early = bound[:3]  # the last scrape comes before the engine went idle
    ev = EM.from_stats(stats, done, 7, 10.0, early)
    assert (ev.counted, ev.counted_exact, ev.counted_until) == (6, False, 125)
    reset = [EM.CounterPoint(95, 0.0), EM.CounterPoint(110, 4.0), EM.CounterPoint(140, 3.0)]  # a restart
    ev = EM.from_stats(stats, done, 7, 10.0, reset)
    assert ev.counted == 7  # 4, then the new process' 3


def _rec(step, **kw):
    return StepRecord(step=step, **kw)


def test_render_follows_prometheus_stat_logger():
    steps = [_rec(0, stats_prompt_tokens=100, generated_tokens=2, num_running=2, num_waiting=1, kv_usage=0.5,
                  first_tokens=["a", "b"]),
             _rec(1, generated_tokens=2, num_running=2, kv_usage=0.6, finished=["a"], finished_output_tokens=[7]),
             _rec(2, generated_tokens=1, num_running=1, kv_usage=0.3, finished=["b"], finished_output_tokens=[30])]
    ends = [1.0, 2.0, 3.0]
    pts = EM.render(steps, ends, [0.5, 2.0, 2.5, 9.0], {"a": 60, "b": 40}, counted=[0, 1, 0])
    assert [p.preemptions for p in pts] == [0, 1, 1, 1]
    assert [p.prompt_tokens for p in pts] == [0, 100, 100, 100]
    assert [p.generation_tokens for p in pts] == [0, 4, 4, 5]
    assert [p.finished for p in pts] == [0, 1, 1, 2]
    assert [p.running for p in pts] == [0, 2, 2, 1] and pts[1].kv_usage == 0.6
    # vLLM's 1-2-5 buckets: 7 -> le=10, 30 -> le=50; 60 -> le=100, 40 -> le=50
    assert dict(pts[-1].output_len)[10.0] == 1 and dict(pts[-1].output_len)[50.0] == 2
    assert dict(pts[-1].prompt_len)[50.0] == 1 and dict(pts[-1].prompt_len)[100.0] == 2
    assert pts[-1].output_len[-1] == (math.inf, 2.0)


def test_length_buckets_are_vllms():
    assert EM.length_buckets(4096)[:8] == [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0]
    assert EM.length_buckets(4096)[-2:] == [2000.0, math.inf]


@settings(deadline=None)
@given(st.lists(st.integers(0, 40), min_size=1, max_size=8), st.integers(0, 2**31))
def test_lengths_drawn_from_a_histogram_stay_in_their_buckets(counts, seed):
    les = EM.length_buckets(4096)[: len(counts)]
    cum, acc = [], 0.0
    for le, c in zip(les, counts):
        acc += c
        cum.append((le, acc))
    xs = EM.draw_from_hist(cum, 50, random.Random(seed), 4095)
    if acc == 0:
        assert xs == []
        return
    edges = [0.0] + les
    allowed = [(lo, hi) for lo, hi, c in zip(edges, les, counts) if c]
    assert all(any(max(1, lo) <= x <= hi for lo, hi in allowed) for x in xs)


def test_p1_default_log_evidence_against_truth():
    from kvreplay.inference.default_log import evidence_of
    from kvreplay.inference.formats import log_format
    from kvreplay.sources import read_facts

    facts = read_facts([os.path.join(CASE, "server.default.log")])
    ev = evidence_of(facts, log_format(facts.vllm_version, facts.engine_version, None))
    with open(os.path.join(CASE, "workload.json")) as f:
        wl = json.load(f)
    # 200 requests served; the stats lines' prompt tokens are the prompts' sum (vLLM counts
    # a prompt once, at its first token), their generated tokens the outputs' sum
    assert ev.requests == len(wl["requests"]) == 200
    assert ev.totals() == (sum(len(r["prompt_token_ids"]) for r in wl["requests"]),
                           sum(r["max_tokens"] for r in wl["requests"]))


@pytest.fixture(scope="module")
def exact_replay():
    from kvreplay.sources import open_replay

    return open_replay([os.path.join(CASE, "server.iter.reqbody.log")], samples=0)


def test_exact_replay_reproduces_vllms_own_counters_per_scrape(exact_replay):
    from kvreplay.audit import join, prom

    rp = exact_replay
    points, how = join.scrapes_for_facts(rp.facts, prom.read_scrapes(os.path.join(CASE, "metrics.prom.gz")))
    assert how.startswith("joined")
    chk = join.scrape_check(rp, points)
    # vLLM 0.33.0's own /metrics (metrics.prom.gz) against our scheduler's run: per window
    assert [(w["preemptions_logged"], w["preemptions_replayed"]) for w in chk["windows"]] == [(0, 0), (23, 23), (31, 31)]
    assert all(w["prompt_logged"] == w["prompt_replayed"] and w["gen_logged"] == w["gen_replayed"]
               for w in chk["windows"])
    assert chk["verdict"].startswith("the preemption counter agrees with the replay in 3 of 3")


def test_a_replay_that_disagrees_with_the_counter_says_so(exact_replay):
    from kvreplay.audit import join, prom

    rp = exact_replay
    points, _ = join.scrapes_for_facts(rp.facts, prom.read_scrapes(os.path.join(CASE, "metrics.prom.gz")))
    # a counter that counted 5 more in its last window than the run has
    import msgspec

    points[-1] = msgspec.structs.replace(points[-1], preemptions=points[-1].preemptions + 5)
    chk = join.scrape_check(rp, points)
    assert chk["verdict"] == ("the replay disagrees with vllm:num_preemptions_total: 54 preemptions "
                              "replayed where the counter counted 59 over the same 3 scrape windows (2 agree)")
    text = join.scrape_check_lines(chk)
    assert "scrape 10:01:27: preemptions replayed 31 / counted 36" in text


def test_p1_default_log_with_scrapes_answer():
    from kvreplay.audit.default_report import answer_for
    from kvreplay.sources import read_facts

    facts = read_facts([os.path.join(CASE, "server.default.log")])
    ans, how = answer_for(facts, [os.path.join(CASE, "metrics.prom.gz")], samples=6)
    assert how.startswith("joined")
    # the counter saw 54 by its last scrape (10:01:27); the log ends busy after it
    assert ans.counted == 54 and not ans.counted_exact
    assert ans.preemptions.low >= 54 and ans.preemptions.low <= ans.preemptions.median <= ans.preemptions.high
    assert ans.recomputed_tokens.low <= ans.recomputed_tokens.median <= ans.recomputed_tokens.high
    assert 0 < ans.recompute_ratio.low <= ans.recompute_ratio.high < 1
    assert ans.lengths_source == "prompt and output lengths from the scraped histograms"
    assert "--enable-log-requests" in ans.headline and "--enable-logging-iteration-details" in ans.headline
    assert "VLLM_REQUEST_BODY_LOG_LEVEL=INFO" in ans.headline


def test_cli_replay_of_a_default_log_answers_instead_of_refusing(tmp_path):
    out = subprocess.run([sys.executable, "-m", "kvreplay", "replay", os.path.join(CASE, "server.default.log"),
                          "--samples", "3", "--format", "json"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert d["kind"] == "default log (no request lines)" and d["requests"] == 200
    assert d["counted"] is None and d["preemptions"]["low"] <= d["preemptions"]["high"]
    # written window by window (no dict per window held first): the bytes json.dumps gives
    from kvreplay.audit.default_report import answer_for, to_dict
    from kvreplay.sources import read_facts

    ans, how = answer_for(read_facts([os.path.join(CASE, "server.default.log")]), [], samples=3)
    assert len(d["windows"]) > 10
    assert out.stdout == json.dumps(to_dict(ans, how), indent=1, sort_keys=True) + "\n"



def test_default_log_answer_is_deterministic():
    from kvreplay.audit.default_report import answer_for, to_dict
    from kvreplay.sources import read_facts

    facts = read_facts([os.path.join(CASE, "server.default.log")])
    a = to_dict(*answer_for(facts, [], samples=2, seed=7))
    b = to_dict(*answer_for(facts, [], samples=2, seed=7))
    assert a == b and a["seed"] == 7 and a["samples"] == 2


def test_a_fresh_scrape_and_an_idle_scrape_bound_the_log():
    stats = [_stats(100, 5, 2, 10.0, 10.0), _stats(110, 3, 0, 0.0, 10.0), _stats(120, 0, 0, 0.0, 5.0)]
    done = [0, 4, 7]
    # the first scrape is inside the first interval but before any work (all counters 0);
    # the last is before the next line but shows nothing running or waiting
    pts = [EM.CounterPoint(97, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0), EM.CounterPoint(105, 3.0, 50.0, 40.0),
           EM.CounterPoint(113, 5.0, 80.0, 90.0, 7.0, 0.0, 0.0)]
    ev = EM.from_stats(stats, done, 7, 10.0, pts)
    assert (ev.counted, ev.counted_exact) == (5, True)
    # the same last scrape showing a request still waiting: not the end
    pts[-1] = EM.CounterPoint(113, 5.0, 80.0, 90.0, 6.0, 0.0, 1.0)
    ev = EM.from_stats(stats, done, 7, 10.0, pts)
    assert (ev.counted, ev.counted_exact, ev.counted_until) == (5, False, 113)


def test_check_without_detail_keeps_no_row_per_line_and_the_same_loss():
    """The ensemble checks each member against every stats line: without `detail` it keeps
    no row per line (a 1M-line log held 1M dicts and histogram tuples per member), and the
    loss is the one the rows give. By hand: line 1 sees 2 running (logged 3), line 2 one
    running with 4 tokens generated (logged 1 running, 0 tokens)."""
    steps = [_rec(0, stats_prompt_tokens=100, generated_tokens=2, num_running=2, kv_usage=0.5),
             _rec(1, generated_tokens=2, num_running=1, kv_usage=0.5)]
    stats = [_stats(10, 3, 0, 10.0, 0.0, 0.5), _stats(20, 1, 0, 0.0, 0.0, 0.5)]
    ev = EM.from_stats(stats, [0, 0], 0, 10.0)
    full = EM.check(steps, [10.2, 20.2], ev, phase=0.5)
    bare = EM.check(steps, [10.2, 20.2], ev, phase=0.5, detail=False)
    assert [r["running"] for r in full.lines] == [-1.0, 0.0]
    assert [r["gen"] for r in full.lines] == [2.0, 2.0]
    assert bare.lines == [] and bare.scrapes == [] and bare.loss == full.loss
    # running -1 -> (1/2)^2; prompt 100 - 100 = 0; KV 0.5 as logged; gen 2 over a
    # scale of 100, twice; waiting 0
    assert full.loss == pytest.approx(0.25 + 2 * (2 / 100) ** 2)


def test_default_log_intervals_are_uncertaintys_stretched():
    """One interval definition (uncertainty.interval): the weighted 5/50/95% of 10..19,
    equal weights, are 10, 14, 19 (the first value whose cumulative weight reaches the
    share); stretched 1.5 about the median: 14 - 1.5 x 4 = 8, 14 + 1.5 x 5 = 21.5 -> 22."""
    from kvreplay.inference import uncertainty as U
    from kvreplay.inference.default_log import Interval, _interval

    vals = list(range(10, 20))
    assert U.interval(vals, [1.0] * 10, stretch=1.5) == {"median": 14, "low": 8, "high": 22}
    assert _interval(vals, [1.0] * 10, widen=1.5) == Interval(14.0, 8.0, 22.0)
    assert _interval(vals, [1.0] * 10, widen=4.0).low == 0.0  # 14 - 16, never below 0
    assert U.interval(vals, [1.0] * 10) == {"median": 14, "low": 10, "high": 19}


def test_prompt_groups_give_each_interval_its_requests_prompt_tokens():
    """By hand: line 1 saw 3 arrive, 1 still waiting -> the first 2 had their first token,
    1000 prompt tokens; line 2: 2 more arrived (5), none waiting -> requests 2-4, 900
    tokens; line 3: nothing new, no tokens; 1 arrived after the last line: no tokens known."""
    from kvreplay.inference.default_log import _grouped_lengths, prompt_groups

    stats = [_stats(10, 2, 1, 100.0, 0.0), _stats(20, 0, 0, 90.0, 0.0), _stats(30, 0, 0, 0.0, 0.0)]
    ev = EM.from_stats(stats, [0, 5, 5], 6, 10.0)
    assert [w.arrivals for w in ev.windows] == [3, 2, 0] and ev.late_arrivals == 1
    assert prompt_groups(ev, 6) == [(0, 2, 1000.0), (2, 5, 900.0), (5, 6, -1.0)]
    xs = _grouped_lengths(ev, 6, random.Random(3), 4095, ("lognormal", 0.8))
    assert len(xs) == 6
    assert abs(sum(xs[:2]) - 1000) <= 1 and abs(sum(xs[2:5]) - 900) <= 2  # (rounded each)


def test_a_window_with_tokens_but_no_first_token_is_pooled_with_the_next():
    from kvreplay.inference.default_log import prompt_groups

    # line 1: 2 arrived, both still waiting, yet 50 prompt tokens counted (a victim
    # waiting again after its first token): no request of its own, pooled with line 2's
    # (both done, 150 more)
    stats = [_stats(10, 0, 2, 5.0, 0.0), _stats(20, 0, 0, 15.0, 0.0)]
    ev = EM.from_stats(stats, [0, 2], 2, 10.0)
    assert prompt_groups(ev, 2) == [(0, 2, 200.0)]


def test_busy_intervals_count_what_the_step_time_fits():
    stats = [_stats(10, 3, 0, 10.0, 50.0), _stats(20, 4, 0, 0.0, 80.0), _stats(30, 0, 0, 0.0, 20.0),
             _stats(40, 2, 0, 0.0, 10.0)]
    ev = EM.from_stats(stats, [0, 0, 7, 7], 9, 10.0)
    # running at both ends and tokens generated: only the interval ending at 20
    assert EM.busy_intervals(ev) == 1


def test_the_counter_loss_is_poisson_scaled_per_scrape_window():
    """A run whose step 1 (ending at 2.0) adds 2 preemptions to the counter, scraped at
    0.5, 3.0 and 9.0 where the counter read 0, 5, 5: window 1 logged 5 replayed 2 ->
    (2 - 5)^2 / 6 = 1.5; window 2 logged 0 replayed 0."""
    steps = [_rec(0, generated_tokens=1), _rec(1, generated_tokens=1), _rec(2, generated_tokens=1)]
    pts = [EM.CounterPoint(0.5, 0.0), EM.CounterPoint(3.0, 5.0), EM.CounterPoint(9.0, 5.0)]
    rows = EM.scrape_windows(steps, [1.0, 2.0, 3.5], pts, [0, 2, 0])
    assert [(r["preemptions_logged"], r["preemptions_replayed"]) for r in rows] == [(5.0, 2.0), (0.0, 0.0)]
    assert EM.counter_loss(rows) == pytest.approx(1.5)


def test_the_counter_weighs_members_beside_the_stats_lines():
    """noise_weights with a counter loss: a second likelihood exp(-loss/2) times the stats
    lines'. Two members with the same stats-line SSE, counter losses 0 and 2: weights in
    the ratio e^-1 (the ESS floor, 20% of 2 members, is met)."""
    from kvreplay.inference.uncertainty import noise_weights

    w = noise_weights([10.0, 10.0], 5, [0.0, 2.0])
    assert w[1] / w[0] == pytest.approx(math.exp(-1.0))
    assert noise_weights([10.0, 12.0], 5) == noise_weights([10.0, 12.0], 5, [0.0, 0.0])


def test_a_data_parallel_default_log_gives_one_record_per_engine(tmp_path):
    """Each engine's own stats lines make its record (engine 1's lines say one more
    request running than engine 0's, every time); no default-log answer, and why."""
    import re

    from kvreplay.audit.record import audit_records

    out = []
    for line in open(os.path.join(CASE, "server.default.log")):
        out.append(line)
        if "Engine 000: Avg prompt throughput" in line:
            one = line.replace("Engine 000:", "Engine 001:")
            out.append(re.sub(r"Running: (\d+) reqs", lambda m: f"Running: {int(m.group(1)) + 1} reqs", one))
    p = tmp_path / "dp2.default.log"
    p.write_text("".join(out))
    recs = audit_records(str(p), year=2026)
    assert [r["engine"] for r in recs] == [0, 1]
    assert recs[1]["running_mean"] == pytest.approx(recs[0]["running_mean"] + 1)
    for r in recs:
        assert r["preemptions_replayed_low"] is None
        assert any(x.startswith("default log not inferred: a data-parallel default log") for x in r["null_reasons"])


def test_the_counter_weighs_a_log_replays_ensemble():
    """p1's stats-line log (no prompts) with its scrapes: the ensemble's members are
    weighted by the counter too; the audit's count is the counter's 54 by its last scrape
    plus what the weighted replays count after it, the recomputed tokens that count times
    each replay's cost per preemption."""
    from kvreplay.audit import join, prom
    from kvreplay.sources import open_replay

    scrapes = prom.read_scrapes(os.path.join(CASE, "metrics.prom.gz"))
    rp = open_replay([os.path.join(CASE, "server.log")], samples=4, scrapes=scrapes)
    u = rp.uncertainty
    assert u.weighted_by == "the stats lines and the scrapes' preemption counter"
    assert any(m.counter_loss > 0 for m in u.members) and u.counted_after is not None
    rec: dict = {}
    join.counter_check(rec, rp, rp.facts, scrapes)
    tail = u.counted_after
    assert (rec["preemptions_replayed_low"], rec["preemptions_replayed_high"]) == (54 + tail["low"], 54 + tail["high"])
    assert rec["preemptions_interval_source"].startswith("the preemption counter's 54 up to its last scrape")
    assert 0 < rec["recomputed_tokens_low"] <= rec["recomputed_tokens_high"]
    assert 0 < rec["recompute_ratio_low"] <= rec["recompute_ratio_high"] < 1
    # without the scrapes: the stats lines alone weigh the members
    alone = open_replay([os.path.join(CASE, "server.log")], samples=4).uncertainty
    assert alone.weighted_by == "the stats lines" and alone.counted_after is None
    assert all(m.counter_loss == 0.0 for m in alone.members)
