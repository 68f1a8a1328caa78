"""`kvreplay whatif`: settings, closed-loop concurrency, knees, refusals, CLI."""

from __future__ import annotations

import dataclasses
import json
import statistics

import pytest

from kvreplay.audit import whatif_replays as W
from tools.oracle.synth_log import make_workload, render_log
from kvreplay.cli import main
from kvreplay.replay import get_profile, simulate
from kvreplay.inference.clock import StepTimeModel

CASE = dict(seed=11, rate=10, prompt=(200, 700), output=(80, 250), num_gpu_blocks=300,
            max_num_seqs=32, max_model_len=2048)


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    wl, arr = make_workload(40, **CASE)
    text, run = render_log(wl, arr, interval_s=2.0)
    p = tmp_path_factory.mktemp("whatif") / "server.log"
    p.write_text(text)
    return str(p), run.truth


@pytest.fixture(scope="module")
def ctx(logged):
    return W.load([logged[0]], samples=0)  # (ranges: tests/logs/test_whatif_keys.py)


def test_plan_one_at_a_time_and_grid():
    s = W.plan({"max_num_seqs": [16, 32], "enable_prefix_caching": [False]})
    assert [x.label for x in s] == ["as logged", "--max-num-seqs 16", "--max-num-seqs 32",
                                    "--no-enable-prefix-caching"]
    g = W.plan({"max_num_seqs": [16, 32], "num_gpu_blocks": [100, 200]}, grid=True)
    assert len(g) == 5 and g[4].overrides == {"max_num_seqs": 32, "num_gpu_blocks": 200}
    assert g[1].label == "--max-num-seqs 16 --num-gpu-blocks 100"


def test_closed_loop_with_every_client_equals_simulate():
    """N >= requests clients all send at step 0: exactly the simulate() run, with the same
    preemption figures as that run's records (kvreplay.replay.records)."""
    from kvreplay.replay.result import replay_workload

    wl, _ = make_workload(30, **CASE)
    prof = get_profile("0.33")
    records, summary = simulate(wl, prof)
    model = StepTimeModel(0.008, 3e-5, 0.0)
    res = W.drive(wl, prof, model, clients=30)
    data = {"config": {**dataclasses.asdict(wl.config), "max_steps": 10**6},
            "requests": [{"id": s.id, "arrival_step": 0, "prompt_token_ids": s.prompt_token_ids,
                          "max_tokens": s.max_tokens} for s in wl.requests]}
    truth = replay_workload(data, profile="0.33").totals()
    assert res["completed"] == 30 and res["steps"] == len(records)
    assert res["preemptions"] == summary.total_preemptions == truth.preemptions > 0
    assert res["self_preemptions"] == summary.self_preemptions
    assert res["processed_tokens"] == truth.processed_tokens
    assert res["recomputed_tokens"] == truth.tokens_recomputed
    assert res["recompute_ratio"] == pytest.approx(truth.recompute_ratio, abs=1e-6)
    assert res["output_tokens"] == sum(len(r.get("sampled", ())) for r in records)
    makespan = sum(model.dt(r.get("num_scheduled_tokens", 0), len(r.get("scheduled", ())))
                   if r.get("scheduled") else model.overhead_s for r in records)
    assert res["makespan_s"] == pytest.approx(makespan, abs=2e-3)


def test_closed_loop_one_client_is_sequential():
    wl, _ = make_workload(6, **CASE)
    prof = get_profile("0.33")
    model = StepTimeModel(0.01, 0.0, 0.0)
    res = W.drive(wl, prof, model, clients=1)
    assert res["completed"] == 6 and res["preemptions"] == 0
    # one request at a time, one token per step after its prefill chunks: ITL = one step
    assert res["itl_p50_s"] == pytest.approx(0.01)
    # open loop with everything arriving at once runs them together: more throughput
    burst = W.drive(wl, prof, model, arrivals=[0.0] * 6)
    assert burst["output_tput"] > 3 * res["output_tput"]


def test_refused_and_rejected_settings(ctx):
    row = W.run_one(ctx, W.Setting("x", {"num_gpu_blocks": 50}), None)
    assert row["note"].startswith("vLLM would not start") and row.get("preemptions") is None
    row = W.run_one(ctx, W.Setting("y", {"enable_chunked_prefill": False, "max_num_batched_tokens": 512}), None)
    assert "chunked prefill off" in row["note"]
    row = W.run_one(ctx, W.Setting("z", {"max_model_len": 600}), None)
    assert "rejected" in row["note"] and row["completed"] < 40


def test_open_loop_sweep_more_blocks_fewer_preemptions(ctx, logged):
    _, truth = logged
    settings = W.plan({"num_gpu_blocks": [150, 1200]})
    res = W.sweep(ctx, settings, jobs=1)
    rows = {r["setting"]: r for r in res["rows"]}
    base = rows["as logged"]
    assert truth["preemptions"] > 0 and base["preemptions"] > 0
    assert rows["--num-gpu-blocks 1200"]["preemptions"] == 0
    # as logged, each request arrives when its step of the base replay starts (timed by the
    # same model): the run is the base replay again, preemption for preemption
    from kvreplay.sources import open_replay

    assert base["preemptions"] == len(open_replay([logged[0]], samples=0).preemptions)
    assert rows["--num-gpu-blocks 150"]["preemptions"] > 0
    assert rows["--num-gpu-blocks 1200"]["recompute_ratio"] == 0.0
    assert all(r["completed"] == 40 for r in res["rows"])
    assert "step time" in res["model"] and "loss" in res["fit"]
    # the same sweep in two processes gives the same rows
    assert W.sweep(ctx, settings, jobs=2)["rows"] == res["rows"]


def test_concurrency_sweep_and_knee(ctx):
    settings = W.plan({"max_num_seqs": [4]})
    res = W.sweep(ctx, settings, [1, 4, 16, 40], jobs=2)
    rows = res["rows"]
    assert len(rows) == 8 and res["knees"]
    base = [r["output_tput"] for r in rows if r["setting"] == "as logged"]
    assert base[0] < base[1] < base[2]  # more clients, more throughput until the knee
    capped = [r for r in rows if r["setting"] == "--max-num-seqs 4"]
    assert capped[3]["output_tput"] == pytest.approx(capped[1]["output_tput"], rel=0.05)
    k4 = next(k for k in res["knees"] if k["setting"] == "--max-num-seqs 4")
    assert k4["knee"] == 4
    assert any(k["setting"] is None and "knee" in k["text"] for k in res["knees"])


def test_whatif_cli(logged, tmp_path, capsys):
    out = tmp_path / "w.json"
    assert main(["whatif", logged[0], "--max-num-seqs", "8,32", "--concurrency", "4,16",
                 "--samples", "0", "--format", "json", "-o", str(out)]) == 0
    res = json.loads(out.read_text())
    assert [r["setting"] for r in res["rows"]][::2] == ["as logged", "--max-num-seqs 8",
                                                         "--max-num-seqs 32 (= logged)"]
    html = (tmp_path / "w.html").read_text()
    assert "Output throughput vs concurrency" in html and "knee" in html
    capsys.readouterr()
    assert main(["whatif", logged[0], "--no-enable-prefix-caching", "--samples", "0"]) == 0
    text = capsys.readouterr().out
    assert "--no-enable-prefix-caching" in text and "open loop" in text


def test_whatif_cli_errors(logged, capsys):
    with pytest.raises(SystemExit) as e:
        main(["whatif", logged[0], "--max-num-seqs", "16,x"])
    assert e.value.code == 2
    assert "'x' is not an integer" in capsys.readouterr().err
    assert main(["whatif", logged[0]]) == 2
    assert "give at least one setting" in capsys.readouterr().err


def test_ranges_rerun_ensemble_members(logged):
    """A log that cannot pin every arrival: a row's range re-runs members of the replay's
    uncertainty ensemble (their own arrival steps), drawn by weight, the same each time."""
    from kvreplay.sources import open_replay

    rp = open_replay([logged[0]], samples=6)
    ens = [list(m.arrival_steps) for m in W.ensemble_members(rp, 4)]
    assert len(ens) == 4 and all(len(a) == len(rp.workload.requests) for a in ens)
    again = open_replay([logged[0]], samples=6)
    assert ens == [list(m.arrival_steps) for m in W.ensemble_members(again, 4)]
    ctx = W.load([logged[0]], samples=6)
    assert len(ctx.variants) == W.ENSEMBLE_RUNS and "uncertainty ensemble" in " ".join(ctx.notes)
    row = W.run_one(ctx, W.Setting("x", {"max_num_seqs": 8}), None)
    lo, hi = row["preemptions_interval"]
    assert lo <= row["preemptions"] <= hi
    # the central run, one per variant, and the arrivals at the other end of their steps
    assert len(row["preemptions_draws"]) == 1 + len(ctx.variants) + 1
    assert row["trust"].startswith(("trustworthy", "uncertain"))
    # a thin log: the row is the median run of those the log allows, whole
    assert ctx.thin
    pre, tput = row["preemptions_draws"], row["output_tput_draws"]
    k = W.median_run(pre, tput)
    assert (row["preemptions"], row["output_tput"]) == (pre[k], tput[k])
    assert abs(row["preemptions"] - statistics.median(pre)) <= min(abs(p - statistics.median(pre)) for p in pre)
    if k:
        assert f"replay's own arrivals: {pre[0]} preemptions" in row["note"]


def test_median_run_picks_the_middle_count_then_throughput():
    # counts 10, 30, 20: the median 20 is run 2
    assert W.median_run([10, 30, 20], [1.0, 2.0, 3.0]) == 2
    # counts 5, 7, 7, 9 (median 7): runs 1 and 2 tie; throughputs 4, 6, 5, 5 (median 5)
    # -> run 2, whose throughput is the median
    assert W.median_run([5, 7, 7, 9], [4.0, 6.0, 5.0, 5.0]) == 2
    # a full tie keeps the first: the replay's own arrivals
    assert W.median_run([3, 3, 3], [1.0, 1.0, 1.0]) == 0
