"""`kvreplay whatif`: settings, closed-loop concurrency, knees, refusals, CLI."""

from __future__ import annotations

import dataclasses
import json

import pytest

from kvreplay.audit import whatif as W
from kvreplay.audit.synth import make_workload, render_log
from kvreplay.cli import main
from kvreplay.replay import get_profile, simulate
from kvreplay.replay.from_log import StepTimeModel

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
    return W.load([logged[0]])


def test_plan_one_at_a_time_and_grid():
    s = W.plan({"max_num_seqs": [16, 32], "enable_prefix_caching": [False]})
    assert [x.label for x in s] == ["as logged", "--max-num-seqs 16", "--max-num-seqs 32",
                                    "--no-enable-prefix-caching"]
    g = W.plan({"max_num_seqs": [16, 32], "num_gpu_blocks": [100, 200]}, grid=True)
    assert len(g) == 5 and g[4].overrides == {"max_num_seqs": 32, "num_gpu_blocks": 200}
    assert g[1].label == "--max-num-seqs 16 --num-gpu-blocks 100"


def test_closed_loop_with_every_client_equals_simulate():
    """N >= requests clients all send at step 0: exactly the simulate() run."""
    wl, _ = make_workload(30, **CASE)
    prof = get_profile("0.33")
    records, summary = simulate(wl, prof)
    model = StepTimeModel(0.008, 3e-5, 0.0)
    recs, starts, ends, issued, done = W.closed_loop(wl, prof, model, clients=30)
    assert done == 30
    assert len(recs) == len(records)
    pre = sum(len(r.get("preemptions", ())) for r in recs)
    assert pre == summary.total_preemptions > 0
    assert all(t == 0.0 for t in issued.values())
    assert ends[-1] == pytest.approx(sum(model.dt(r.get("num_scheduled_tokens", 0), len(r.get("scheduled", ())))
                                         if r.get("scheduled") else model.overhead_s for r in recs))


def test_closed_loop_one_client_is_sequential():
    wl, _ = make_workload(6, **CASE)
    prof = get_profile("0.33")
    recs, starts, ends, issued, done = W.closed_loop(wl, prof, StepTimeModel(0.01, 0, 0), clients=1)
    assert done == 6
    assert sum(len(r.get("preemptions", ())) for r in recs) == 0
    assert max(len(r.get("scheduled", ())) for r in recs) == 1
    times = [issued[s.id] for s in wl.requests]
    assert times == sorted(times) and len(set(times)) == 6


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
    assert rows["--num-gpu-blocks 150"]["preemptions"] >= base["preemptions"]
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
                 "--format", "json", "-o", str(out)]) == 0
    res = json.loads(out.read_text())
    assert [r["setting"] for r in res["rows"]][::2] == ["as logged", "--max-num-seqs 8",
                                                         "--max-num-seqs 32 (= logged)"]
    html = (tmp_path / "w.html").read_text()
    assert "Output throughput vs concurrency" in html and "knee" in html
    capsys.readouterr()
    assert main(["whatif", logged[0], "--no-enable-prefix-caching"]) == 0
    text = capsys.readouterr().out
    assert "--no-enable-prefix-caching" in text and "open loop" in text


def test_whatif_cli_errors(logged, capsys):
    with pytest.raises(SystemExit) as e:
        main(["whatif", logged[0], "--max-num-seqs", "16,x"])
    assert e.value.code == 2
    assert "'x' is not an integer" in capsys.readouterr().err
    assert main(["whatif", logged[0]]) == 2
    assert "give at least one setting" in capsys.readouterr().err
