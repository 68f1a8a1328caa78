"""`kvreplay whatif` of a default log (no request lines): each setting under the workloads
its stats lines allow (audit/whatif_default.py), as ranges."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

CASE = str(Path(__file__).resolve().parents[1] / "data" / "logcases" / "p1_poisson_fcfs_200")


@pytest.fixture(scope="module")
def swept():
    from kvreplay.audit import whatif_default as WD
    from kvreplay.audit.whatif_replays import plan
    from kvreplay.sources import read_log

    path = os.path.join(CASE, "server.default.log")
    ctx = WD.load(read_log([path]), [path], [], profile=None, samples=4)
    return ctx, WD.sweep(ctx, plan({"max_num_seqs": [4, 128]}), jobs=1)


def test_as_logged_each_workload_gives_its_own_ensemble_count(swept):
    """The as-logged row re-runs each kept workload under the logged config with its own
    step time: each run's count is the one the ensemble found for that member (the same
    engine loop, not a new estimate)."""
    ctx, res = swept
    row = res["rows"][0]
    assert row["setting"] == "as logged"
    assert row["preemptions_draws"] == [m.preemptions for m in ctx.members]
    assert row["preemptions_interval"][0] <= row["preemptions"] <= row["preemptions_interval"][1]
    assert 0 < len(ctx.members) <= 4 and sum(ctx.weights) == pytest.approx(1.0)


def test_fewer_seqs_fewer_preemptions_in_every_workload(swept):
    """max_num_seqs 4 on p1 (32,000 KV tokens, prompts of ~1,000): four sequences never
    fill the pool, so no workload preempts; every row's range holds its median."""
    _, res = swept
    four = next(r for r in res["rows"] if r["max_num_seqs"] == 4)
    assert four["preemptions_draws"] == [0] * len(four["preemptions_draws"])
    assert four["preemptions_range"] == "0-0"
    assert "uncertain: a default log" in four["trust"]
    many = next(r for r in res["rows"] if r["max_num_seqs"] == 128)
    assert many["output_tput_interval"][0] <= many["output_tput"] <= many["output_tput_interval"][1]
    assert any("default log (no request lines)" in n for n in res["notes"])
