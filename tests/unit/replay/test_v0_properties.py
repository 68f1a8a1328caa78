"""Random V0 workloads never break an invariant and always terminate.

The model's own invariant checks run after every schedule() and every step
(`check_invariants=True`: free + evictable + held block conservation per pool, ref counts
match block-table holders and are >= 0, queues disjoint, statuses match queues). On top of
that the trace itself is checked for conservation and counter rules.
"""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kvreplay.replay.v0 import run_workload, summarize, trace_text


@st.composite
def workloads(draw):
    bs = draw(st.sampled_from([2, 4, 8]))
    chunked = draw(st.booleans())
    caching = draw(st.booleans())
    mode = draw(st.sampled_from([None, "recompute", "swap"]))
    policy = draw(st.sampled_from(["fcfs", "priority"]))
    max_seqs = draw(st.integers(1, 6))
    mml = draw(st.sampled_from([32, 64]))
    if chunked:
        budget = bs * draw(st.integers(max(1, -(-max_seqs // bs)), 12))
    else:
        budget = draw(st.sampled_from([mml, 2 * mml]))
    cfg = {"num_gpu_blocks": draw(st.integers(2, 24)), "block_size": bs,
           "max_num_seqs": max_seqs, "max_num_batched_tokens": budget, "max_model_len": mml,
           "enable_chunked_prefill": chunked, "enable_prefix_caching": caching,
           "policy": policy, "preemption_mode": mode,
           "num_cpu_blocks": draw(st.integers(0, 40)), "max_steps": 150,
           "fake_token_mode": draw(st.sampled_from(["index", "fixed"]))}
    base = draw(st.lists(st.integers(1, 5), min_size=1, max_size=3 * bs))
    reqs = []
    for i in range(draw(st.integers(1, 6))):
        tail = draw(st.lists(st.integers(1, 5), min_size=0, max_size=2 * bs))
        prompt = (base + tail if draw(st.booleans()) else tail) or [7]
        reqs.append({"id": f"r{i}", "arrival_step": draw(st.integers(0, 6)),
                     "prompt_token_ids": prompt[: mml + 4],
                     "max_tokens": draw(st.integers(1, 20)),
                     "priority": draw(st.integers(0, 2)), "n": draw(st.integers(1, 2))})
    return {"name": "prop", "engine": "v0", "config": cfg, "requests": reqs}


@given(workloads())
def test_random_workloads_keep_invariants_and_terminate(w):
    trace = run_workload(w, check_invariants=True)          # raises on a broken invariant
    cfg = w["config"]
    assert 1 <= len(trace) <= cfg["max_steps"]
    ngpu, ncpu = cfg["num_gpu_blocks"], cfg["num_cpu_blocks"]
    prev_cum = 0
    finished = set()
    for rec in trace:
        if rec.get("idle") or "terminal_error" in rec:
            continue
        run, wait, swp = rec["running"], rec["waiting"], rec["swapped"]
        assert len(set(run) | set(wait) | set(swp)) == len(run) + len(wait) + len(swp)
        assert set(run) | set(wait) | set(swp) == set(rec["status"])
        assert not finished & set(rec["status"])
        finished |= set(rec["finished"])
        assert 0 <= rec["free_gpu_blocks"] <= ngpu and 0 <= rec["free_cpu_blocks"] <= ncpu
        if not cfg["enable_prefix_caching"]:
            # no sharing: every block is free or held by exactly one live (or ignored) group
            gpu_held = sum(n for g, n in rec["blocks_held"].items() if rec["status"][g] != "SWAPPED")
            assert rec["free_gpu_blocks"] + gpu_held == ngpu
            cpu_held = sum(n for g, n in rec["blocks_held"].items() if rec["status"][g] == "SWAPPED")
            assert rec["free_cpu_blocks"] + cpu_held <= ncpu   # ignored swapped groups leak
        for g, n in rec["num_computed_tokens"].items():
            assert n >= 0
            if rec["status"][g] == "WAITING":
                assert n == 0
        cum = rec["num_cumulative_preemption"]
        assert cum == prev_cum + len(rec["preemptions"])
        assert rec["so_preempted"] == sum(1 for p in rec["preemptions"]
                                          if p["called_from"] == "_schedule_running")
        assert sum(c for _, c in rec["scheduled"]) >= rec["num_batched_tokens"] - sum(
            rec["cached_tokens"].values())
        prev_cum = cum
    s = summarize(trace, w)
    assert s["prometheus_num_preemptions_total"] <= s["num_cumulative_preemption"]
    assert trace_text(run_workload(w)) == trace_text(trace)   # deterministic
