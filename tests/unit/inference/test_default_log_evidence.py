"""A default log's evidence beyond the stats lines (inference/evidence_metrics.py,
inference/default_log.py): the prefix cache's counters, the scraped prompt histogram put in
the order the stats lines' prompt tokens say, and what the answer does where the evidence
is thin."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from kvreplay.inference import default_log as D
from kvreplay.inference import evidence_metrics as EM
from kvreplay.replay.records import Admission, StepRecord


# ------------------------------------------------------------------ prefix-cache counters
def test_prefix_cache_counters_are_read_from_a_scrape(tmp_path):
    """vllm:prefix_cache_queries_total / _hits_total of a scrape reach the inference's
    CounterPoint (audit.join.counter_points)."""
    from kvreplay.audit import join, prom

    text = ""
    for t, q, h in ((100, 0, 0), (115, 4000, 1000), (130, 9000, 3000)):
        text += (f"# SCRAPE {t}\n"
                 f'vllm:prefix_cache_queries_total{{engine="0",model_name="m"}} {q}.0\n'
                 f'vllm:prefix_cache_hits_total{{engine="0",model_name="m"}} {h}.0\n'
                 f'vllm:num_preemptions_total{{engine="0",model_name="m"}} 0.0\n')
    p = tmp_path / "m.prom"
    p.write_text(text)
    pts = join.counter_points(prom.read_scrapes(str(p)), "0", 0.0)
    assert [(x.cache_queries, x.cache_hits) for x in pts] == [(0.0, 0.0), (4000.0, 1000.0), (9000.0, 3000.0)]
    ev = EM.MetricsEvidence([], pts, 10.0, 0, 0)
    assert ev.cache_share() == pytest.approx(3000 / 9000)


def test_cache_share_survives_a_reset_and_is_none_without_queries():
    pts = [EM.CounterPoint(0, cache_queries=0.0, cache_hits=0.0),
           EM.CounterPoint(15, cache_queries=1000.0, cache_hits=500.0),
           EM.CounterPoint(30, cache_queries=600.0, cache_hits=100.0)]  # a restart: 600 new
    assert EM.MetricsEvidence([], pts, 10.0, 0, 0).cache_share() == pytest.approx(600 / 1600)
    off = [EM.CounterPoint(0, cache_queries=0.0, cache_hits=0.0), EM.CounterPoint(15, cache_queries=0.0, cache_hits=0.0)]
    assert EM.MetricsEvidence([], off, 10.0, 0, 0).cache_share() is None  # prefix caching off
    assert EM.MetricsEvidence([], [EM.CounterPoint(0)], 10.0, 0, 0).cache_share() is None


def test_cache_counters_count_first_admissions_only():
    """vLLM (0.27+) records a request's query and hit once, at its first admission; a
    readmitted victim goes to preempted_*, not to vllm:prefix_cache_*: a run admitting
    a (64 tokens, 32 hit) in step 0 and b (48, 0) in step 1 and readmitting a in step 2
    reads 64/32 by 1.5 and 112/32 by 3.0 and after."""
    steps = [StepRecord(step=0, admitted=[Admission("a", 32, 64, False)]),
             StepRecord(step=1, admitted=[Admission("b", 0, 48, False)]),
             StepRecord(step=2, admitted=[Admission("a", 48, 70, True)])]
    pts = EM.render(steps, [1.0, 2.0, 3.0], [1.5, 3.0])
    assert [(p.cache_queries, p.cache_hits) for p in pts] == [(64.0, 32.0), (112.0, 32.0)]
    logged = [EM.CounterPoint(0.5, 0.0, cache_queries=0.0, cache_hits=0.0),
              EM.CounterPoint(3.5, 0.0, cache_queries=112.0, cache_hits=432.0)]
    rows = EM.scrape_windows(steps, [1.0, 2.0, 3.0], logged, [0, 0, 0])
    assert (rows[0]["cache_queries_logged"], rows[0]["cache_queries_replayed"]) == (112.0, 112.0)
    assert (rows[0]["cache_hits_logged"], rows[0]["cache_hits_replayed"]) == (432.0, 32.0)
    # 400 tokens apart at a scale of max(10% of 432, 400) = 400: a loss of 1
    assert EM.cache_loss(rows) == pytest.approx(1.0)
    assert EM.counter_loss(rows) == pytest.approx(1.0)  # the preemption counter agrees


def test_shared_prefixes_give_the_logged_hit_share():
    """The share the prefixes give, counted here directly: per family, every request after
    its first hits the full blocks of min(L, prompt - 1)."""
    rng = random.Random(3)
    ins = [rng.randint(100, 2000) for _ in range(150)]
    for share in (0.1, 0.35, 0.6):
        pref = D.shared_prefixes(ins, share, 16, random.Random(7))
        seen, hit = set(), 0
        for p, (fam, n) in zip(ins, pref):
            if fam in seen:
                hit += (min(n, p - 1) // 16) * 16
            seen.add(fam)
        # within half a block per request of the share (the prefix grows a block at a time)
        assert abs(hit / sum(ins) - share) <= 16 * len(ins) / sum(ins) / 2
        assert len({n for _, n in pref}) == 1


def test_members_prompts_share_their_family_prefix():
    cfg = SimpleNamespace(max_model_len=4096)
    wl = D.workload_of(cfg, [40, 50, 30], [5, 5, 5], [(0, 32), (0, 32), (1, 32)])
    a, b, c = (r.prompt_token_ids for r in wl.requests)
    assert a[:32] == b[:32] and a[32:40] != b[32:40]
    assert c[:16] != a[:16]  # another family
    plain = D.workload_of(cfg, [40, 50], [5, 5])
    assert plain.requests[0].prompt_token_ids[:16] != plain.requests[1].prompt_token_ids[:16]


# ------------------------------------------------------------------ histogram draws in order
def test_histogram_draws_are_ordered_to_each_intervals_prompt_tokens():
    """fit_groups keeps the drawn multiset and brings each group's sum near its tokens:
    groups of 3 requests with 300 and 3000 tokens, lengths 100 x3 and 1000 x3 shuffled."""
    groups = [(0, 3, 300.0), (3, 6, 3000.0)]
    for seed in range(5):
        out = D.fit_groups([1000, 100, 1000, 100, 1000, 100], groups, random.Random(seed))
        assert sorted(out) == [100] * 3 + [1000] * 3
        assert out[:3] == [100, 100, 100]
    # a group of no known tokens takes part freely; nothing to fit: the order is a shuffle
    free = D.fit_groups([5, 6, 7], [(0, 3, -1.0)], random.Random(0))
    assert sorted(free) == [5, 6, 7]


# ------------------------------------------------------------------ thin evidence
def _window(t, running, waiting, prompt=0.0, gen=0.0):
    return EM.StatsWindow(t - 10, t, prompt, gen, running, waiting, 0.5, 0, running + waiting)


def test_one_stats_line_is_thin_three_are_not():
    one = EM.MetricsEvidence([_window(10, 3, 9, 8000, 3320)], [], 10.0, 0, 0)
    why = D.thin_evidence(one)
    assert why and why.startswith("only 1 stats line shows work")
    idle = [_window(0, 0, 0)]
    two = EM.MetricsEvidence(idle + [_window(10, 3, 9, 800), _window(20, 2, 0, 0, 50)], [], 10.0, 0, 0)
    assert D.thin_evidence(two).startswith("only 2 stats lines show work")
    three = EM.MetricsEvidence(two.windows + [_window(30, 1, 0, 0, 20)], [], 10.0, 0, 0)
    assert D.thin_evidence(three) is None


def test_the_one_line_sample_says_it_is_too_thin():
    """The sample with one stats line (3 running, 9 waiting, KV 90.5%): every drawn
    workload gives 0 preemptions, which one line cannot check; the headline says unknown
    and the audit record has no figure."""
    from kvreplay.audit.record import audit_records
    from kvreplay.samples import sample_path
    from kvreplay.sources import read_facts

    path = str(sample_path("synthetic_v032_json_format.log"))
    ans = D.answer_log(read_facts([path], year=2026), samples=8)
    assert ans.thin and "only 1 stats line shows work" in ans.thin
    assert "preemptions unknown" in ans.headline and "recomputed tokens unknown" in ans.headline
    rec, = audit_records(path)
    assert rec["preemptions_replayed"] is None and rec["recomputed_tokens"] is None
    assert any(r.startswith("default log too thin") for r in rec["null_reasons"])


def _member(pre, rec, longest=0.0, weight=1.0):
    return D.Member(weight, 0.0, pre, rec, 0.0, 10_000, 0, {}, longest)


def test_a_preemption_cost_told_by_too_few_runs_spans_a_token_to_the_longest_request():
    """With the counter's 5 and a single run preempting (2 preemptions, 700 tokens: 350
    a preemption), the tokens are 5 x 350 median, 5 x 1 to 5 x the drawn requests' 95th
    percentile (3000); with COST_MIN runs preempting, the runs' own range."""
    ms = [_member(0, 0, 3000.0)] * 5 + [_member(2, 700, 2500.0)]
    _, rec, ratio = D.intervals(ms, 5, True)
    assert (rec.low, rec.median, rec.high) == (5, 1750, 15000)
    assert ratio.low < ratio.median < ratio.high
    many = [_member(2, 700 + 20 * k, 2500.0) for k in range(D.COST_MIN)]
    _, rec2, _ = D.intervals(many, 5, True)
    assert 1500 < rec2.low <= rec2.high < 2200
