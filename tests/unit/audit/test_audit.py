"""`kvreplay audit`: record fields, status classes, known answers, Prometheus scrapes."""

from __future__ import annotations

import json

import polars as pl
import pytest

from kvreplay.audit import audit_log, audit_many, records_to_frame
from kvreplay.audit import metrics as M
from kvreplay.audit.record import COLUMNS, audit_records
from kvreplay.audit.status import KV_BLOCK, PREFILL, SINGLE_SEQ, UNKNOWN, classify
from tools.oracle.synth_log import make_workload, render_log
from kvreplay.replay import parse_workload, simulate

DATA = "tests/data"

# Synthetic serving runs with known answers (the scheduler model runs them on a clock and
# the 0.33 log is rendered from the run). Sizes keep each audit to a few seconds.
CASES = {
    "kv": dict(n=80, seed=3, rate=12, prompt=(200, 800), output=(100, 300), num_gpu_blocks=400,
               max_num_seqs=32, max_model_len=2048),
    "single": dict(n=10, seed=4, rate=3, prompt=(600, 900), output=(300, 500), num_gpu_blocks=100,
                   max_num_seqs=16, max_model_len=1500),
    "prefill": dict(n=40, seed=5, rate=1.5, prompt=(5000, 6000), output=(80, 120),
                    num_gpu_blocks=4000, max_num_seqs=32, max_model_len=8192),
    "calm": dict(n=40, seed=6, rate=2, prompt=(50, 150), output=(20, 60), num_gpu_blocks=2000,
                 max_num_seqs=32, max_model_len=2048),
}


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    """name -> (log path, truth, audit record)."""
    d = tmp_path_factory.mktemp("synth")
    out = {}
    for name, kw in CASES.items():
        kw = dict(kw)
        n = kw.pop("n")
        wl, arr = make_workload(n, **kw)
        text, run = render_log(wl, arr, interval_s=2.0)
        p = d / f"{name}.log"
        p.write_text(text)
        out[name] = (str(p), run.truth, audit_records(str(p))[0])
    return out


# ---------------------------------------------------------------- pure computations
@pytest.mark.slow
def test_audit_figures_are_the_replays_totals(synth):
    """The audit prints the Replay's own totals (kvreplay.replay.records), no figure of its
    own: the same log replayed gives the same preemptions, tokens and ratio."""
    from kvreplay.sources import open_replay

    path, _truth, r = synth["kv"]
    t = open_replay([path], samples=0).totals()
    assert (r["preemptions_replayed"], r["self_preemptions"], r["requests_preempted"]) == (
        t.preemptions, t.self_preemptions, t.requests_preempted)
    assert (r["computed_tokens_lost"], r["recomputed_tokens"], r["processed_tokens"]) == (
        t.computed_tokens_lost, t.tokens_recomputed, t.processed_tokens)
    assert r["recompute_ratio"] == round(t.recompute_ratio, 6)


def test_counter_increase_handles_resets():
    assert M.counter_increase([0, 5, 12, 3, 10]) == (5 + 7 + 3 + 7, 1)
    assert M.counter_increase([4, 4, 4]) == (0, 0)
    assert M.counter_deltas([10, 2, 2, 9]) == [2, 0, 7]
    assert M.counter_increase([7]) == (0, 0)


def test_quantile_and_histogram_quantile():
    assert M.quantile([1, 2, 3, 4], 0.5) == 2.5
    assert M.quantile([], 0.5) is None
    b = [(0.1, 10), (0.5, 60), (1.0, 100), (float("inf"), 100)]
    assert M.histogram_quantile(0.5, b) == pytest.approx(0.1 + 0.4 * 40 / 50)
    assert M.histogram_quantile(0.99, b) == pytest.approx(0.5 + 0.5 * 39 / 40)


def test_knee():
    k = M.knee([(16, 1000), (32, 1900), (48, 2300), (64, 2350), (96, 2000)])
    assert k["knee"] == 48 and k["peak"] == 64 and k["falls_after"] == 96


# ---------------------------------------------------------------- status rules
def test_status_rules_on_fields():
    base = {k: None for k in COLUMNS}
    kv = dict(base, kv_usage_p95=0.99, kv_time_ge95=0.4, preemptions_replayed=30, waiting_max=12,
              max_concurrency_x=8.0, longest_seq_pool_share=0.1)
    assert classify(kv)[0] == KV_BLOCK
    assert classify(dict(kv, max_concurrency_x=1.5))[0] == SINGLE_SEQ
    assert classify(dict(kv, longest_seq_pool_share=0.6))[0] == SINGLE_SEQ
    calm = dict(base, kv_usage_p95=0.5, kv_time_ge95=0.0, preemptions_replayed=0, waiting_max=0)
    assert classify(calm)[0] == UNKNOWN
    spiky = dict(calm, step_spike_ratio=5.0, step_spike_share=0.1, step_spike_prefill_share=0.9,
                 step_time_source="logged")
    status, evidence = classify(spiky)
    assert status == PREFILL and "5.0x" in evidence
    # no step times at all: the evidence says so
    assert "step times unknown" in classify(calm)[1]


# ---------------------------------------------------------------- known answers (synthetic)
def test_kv_block_bound_known_answer(synth):
    _, truth, r = synth["kv"]
    assert r["status"] == KV_BLOCK
    assert truth["preemptions"] > 10
    assert abs(r["preemptions_replayed"] - truth["preemptions"]) <= 0.25 * truth["preemptions"]
    assert r["recompute_ratio"] == pytest.approx(truth["recompute_ratio"], abs=0.05)
    assert r["kv_usage_p95"] > 0.95 and r["waiting_max"] > 0
    assert r["requests"] == 80 and r["replay"] == "ok"
    assert r["storms"] and r["storms"][0]["recomputed_tokens"] >= r["storms"][-1]["recomputed_tokens"]
    assert r["worst_requests"] and r["worst_requests"][0]["recomputed_tokens"] > 0


def test_single_sequence_bound_known_answer(synth):
    _, truth, r = synth["single"]
    assert r["status"] == SINGLE_SEQ
    assert r["max_concurrency_x"] == pytest.approx(1600 / 1500, abs=1e-3)
    assert r["preemptions_replayed"] == truth["preemptions"]
    assert r["recompute_ratio"] == pytest.approx(truth["recompute_ratio"], abs=0.02)


def test_prefill_interference_known_answer(synth):
    _, truth, r = synth["prefill"]
    assert truth["preemptions"] == 0 and r["preemptions_replayed"] == 0
    assert r["status"] == PREFILL, r["status_evidence"]
    assert r["step_time_source"].startswith("estimated")
    assert r["kv_usage_p95"] < 0.9


def test_calm_is_not_established(synth):
    _, truth, r = synth["calm"]
    assert truth["preemptions"] == 0 and r["preemptions_replayed"] == 0
    assert r["recompute_ratio"] == 0.0
    assert r["status"] == UNKNOWN


def test_logged_preemption_field(tmp_path):
    """0.11.1-0.32 print `Preemptions: N`: the audit sums it and compares with the replay."""
    kw = dict(CASES["single"])
    n = kw.pop("n")
    wl, arr = make_workload(n, **kw)
    text, run = render_log(wl, arr, interval_s=2.0, version="0.19.0", stats_preemptions=True)
    p = tmp_path / "v019.log"
    p.write_text(text)
    r = audit_records(str(p), replay=False)[0]
    assert r["vllm_version"] == "0.19.0"
    assert r["preemptions_logged"] == run.truth["preemptions"]
    assert r["replay"] == "skipped" and r["preemptions_replayed"] is None
    assert any("not requested" in x for x in r["null_reasons"])
    assert r["status"] == SINGLE_SEQ
    assert r["storms"]  # from the logged per-interval counts
    assert r["storms"][0]["recomputed_tokens"] is None


# ---------------------------------------------------------------- real logs and excerpts
def test_logcase_b_fcfs_heavy():
    r = audit_records(f"{DATA}/logcases/b_fcfs_heavy/server.reqbody.log")[0]
    assert r["status"] == SINGLE_SEQ  # 1,024-token pool for max_model_len 1,008
    assert r["vllm_version"] == "0.33.0" and r["max_num_seqs"] == 16 and r["max_num_seqs_source"] == "log"
    assert r["num_gpu_blocks"] == 64 and r["block_size"] == 16 and r["chunked_prefill"] is True
    assert r["preemption_mode"] == "recompute" and r["policy"] == "fcfs"
    assert 3 <= r["preemptions_replayed"] <= 7  # the log case's truth: 5
    assert r["preemptions_logged"] is None
    assert any("0.33" in x and "never prints" in x for x in r["null_reasons"])
    assert r["requests"] == 12 and r["input_len_max"] == 200 and r["output_len_max"] == 150
    assert r["latency_source"].startswith("estimated")
    # the replay is vLLM's run: every stats line matched, and exactly
    assert r["replay_agreement"] == 1.0 and r["replay_exact"] == 1.0


def test_corpus_dp_log_gives_one_record_per_engine():
    rows = audit_records(f"{DATA}/corpus/27-v014-dp8-waiting-skew.log")
    assert [r["engine"] for r in rows] == sorted(r["engine"] for r in rows)
    assert len(rows) >= 2 and rows[0]["engine"] == 0
    for r in rows:
        assert r["replay"] == "skipped" and r["recompute_ratio"] is None
        assert any("data-parallel" in x for x in r["null_reasons"])
    # engines 0 and 1 full at 100.0% / 98.6% with a queue; engine 2's only line is cut after
    # its prompt throughput (truncated): nothing to classify it by
    assert [(r["engine"], r["status"]) for r in rows] == [(0, KV_BLOCK), (1, KV_BLOCK), (2, UNKNOWN)]
    assert rows[0]["waiting_max"] == 117 and rows[0]["running_max"] == 51 and rows[2]["waiting_max"] is None


def test_thin_log_still_gives_a_record():
    r = audit_records(f"{DATA}/corpus/29-v016-queue-drain-full-isl.log")[0]
    assert r["replay"] == "skipped"
    assert any("request lines" in x for x in r["null_reasons"])
    assert r["samples"] == 6 and r["interval_s"] == 10.0 and r["waiting_max"] == 90  # (the 6th line cut: truncated)
    assert r["preemptions_logged"] == 0 and r["status"] == UNKNOWN
    assert len(r["timeline"]) == 6 and r["timeline"][-1]["prompt_tput"] == 19999.5 and r["timeline"][-1]["kv_usage"] is None


def test_v0_swap_preemption_warning():
    r = audit_records(f"{DATA}/corpus/05-v050-tqdm-interleaved-swap-preemption.log")[0]
    assert r["engine_version"] == "V0"
    assert r["preemptions_logged"] == 151 and "lower bound" in r["preemptions_logged_source"]
    assert r["preemption_mode"] == "swap"
    assert r["status"] == KV_BLOCK


# ---------------------------------------------------------------- frames, fleets, Parquet
def test_frame_schema_parquet_round_trip(tmp_path, synth):
    df = audit_log(f"{DATA}/corpus/29-v016-queue-drain-full-isl.log")
    assert df.columns == list(COLUMNS) and df.height == 1
    path = tmp_path / "a.parquet"
    both = pl.concat([df, records_to_frame([synth["single"][2]])])
    both.write_parquet(path)
    back = pl.read_parquet(path)
    assert back.equals(both)
    assert back["status"].to_list()[1] == SINGLE_SEQ


def test_audit_many_is_parallel_and_ordered():
    paths = [f"{DATA}/corpus/29-v016-queue-drain-full-isl.log",
             f"{DATA}/corpus/27-v014-dp8-waiting-skew.log",
             f"{DATA}/corpus/05-v050-tqdm-interleaved-swap-preemption.log"]
    serial = audit_many(paths, jobs=1)
    par = audit_many(paths, jobs=2)
    assert serial.equals(par)
    assert par["log"].to_list()[0] == paths[0] and par["log"].to_list()[-1] == paths[2]


def test_audit_many_reports_unreadable_logs(tmp_path):
    bad = tmp_path / "empty.log"
    bad.write_text("")
    seen = []
    df = audit_many([str(bad)], on_error=lambda p, m: seen.append((p, m)))
    assert df.height == 1 and seen and "empty" in seen[0][1]
    assert df["status"][0] == UNKNOWN
    assert df["error"][0].endswith("empty log") and df["error_kind"][0] == "input"
    # a file with no vLLM line is not a quiet server: an error row, not a row of nulls
    junk = tmp_path / "notes.txt"
    junk.write_text("hello\nworld\n")
    df = audit_many([str(junk), f"{DATA}/corpus/29-v016-queue-drain-full-isl.log"], jobs=1,
                    year=2025)
    assert df["error"].to_list() == [f"{junk}: not a vLLM log (no vLLM log line in its 2 lines)",
                                     None]
    assert df["log_start"].to_list() == [None, "2025-03-17 15:38:10"]  # its first stats line


# ---------------------------------------------------------------- Prometheus scrapes
def _scrape(t, running, waiting, kv, pre, deferred=0, engine="0", gen=0.0, prompt=0.0):
    lab = f'engine="{engine}",model_name="m"'
    return f"""# SCRAPE {t}
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{{lab}}} {running}
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{{lab}}} {waiting}
# HELP vllm:num_requests_waiting_by_reason Waiting requests by reason.
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{{{lab},reason="capacity"}} {waiting - deferred}
vllm:num_requests_waiting_by_reason{{{lab},reason="deferred"}} {deferred}
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{{lab}}} {kv}
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{{{lab}}} {pre}
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{{{lab}}} {gen}
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{{{lab}}} {prompt}
"""


def test_prometheus_scrapes_with_counter_reset(tmp_path):
    # the server restarts between the 3rd and 4th scrape: the counter drops 40 -> 6
    pre = [0, 10, 40, 6, 16]
    kv = [0.5, 0.97, 0.99, 0.96, 0.98]
    text = "".join(_scrape(1000 + 10 * i, 20, 5 + i, kv[i], pre[i], deferred=1, gen=1000 * i, prompt=500 * i)
                   for i in range(5))
    p = tmp_path / "vllm.prom"
    p.write_text(text)
    r = audit_records(str(p))[0]
    assert r["source"] == "prometheus" and r["engine"] is None and r["model"] == "m"
    assert r["samples"] == 5 and r["interval_s"] == 10.0 and r["duration_s"] == 40.0
    assert r["preemptions_logged"] == 10 + 30 + 6 + 10
    assert "1 counter reset" in r["preemptions_logged_source"]
    assert r["kv_time_ge95"] == 0.8 and r["kv_usage_p95"] == pytest.approx(0.988, abs=1e-3)
    assert r["waiting_max"] == 9 and r["deferred_max"] == 1 and r["waiting_capacity_mean"] == 6.0
    assert r["gen_tput_mean"] == 100.0 and r["prompt_tput_mean"] == 50.0
    assert r["status"] == KV_BLOCK
    assert [t["preemptions"] for t in r["timeline"]] == [None, 10, 30, 6, 10]
    assert r["storms"][0]["preemptions"] == 30
    assert r["recompute_ratio"] is None and any("recomputed" in x for x in r["null_reasons"])


def test_prometheus_engines_and_unmarked_scrapes(tmp_path):
    # no SCRAPE markers: split where a family repeats; two DP engines -> two records
    text = ""
    for i in range(3):
        s0 = _scrape(0, 4, 0, 0.2, 0, engine="0").split("\n", 1)[1]
        s1 = _scrape(0, 8, 3, 0.99, 5 * i, engine="1").split("\n", 1)[1]
        text += s0 + "".join(l + "\n" for l in s1.splitlines() if not l.startswith("#"))
    p = tmp_path / "dp.prom"
    p.write_text(text)
    rows = audit_records(str(p))
    assert [r["engine"] for r in rows] == [0, 1]
    assert rows[0]["samples"] == 3 and rows[0]["interval_s"] is None
    assert rows[1]["preemptions_logged"] == 10
    assert any("no time" in x for x in rows[0]["null_reasons"])


def test_prometheus_garbage_is_a_user_error(tmp_path):
    from kvreplay.errors import UserError

    p = tmp_path / "bad.prom"
    p.write_text("# HELP x y\nthis is not { a metric\n")
    with pytest.raises(UserError):
        audit_records(str(p))
