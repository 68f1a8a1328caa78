"""The stats-line calibration corpus of production-like traffic (tools/oracle/calib_traffic.py)
and what it made us fix: the step-time regression leaves the engine's sleeps out, and the
ensemble's length draws reach heavy tails."""

from __future__ import annotations

import collections
import random
import statistics

from kvreplay.inference import ensemble, prompts
from kvreplay.inference.clock import StepTimeModel, sleep_before
from kvreplay.replay import parse_workload, simulate
from kvreplay.replay.records import StepRecord
from tools.oracle import calib_traffic as ct


def test_split_is_fixed_and_names_unique():
    specs = ct.combos()
    assert len(specs) == 56
    per = collections.Counter(s["split"] for s in specs)
    assert per == {"calib": 28, "heldout": 28}
    # every traffic kind and prompts setting has one log on each side of the split
    keys = collections.Counter((s["arrivals"], s["lengths"], s["with_prompts"], s["split"])
                               for s in specs)
    for (a, l, wp, sp), n in keys.items():
        other = "heldout" if sp == "calib" else "calib"
        assert keys[(a, l, wp, other)] == n
    assert len({s["seed"] for s in specs}) == len(specs)


def test_another_seed_base_is_a_new_set_with_the_same_split():
    first, second = ct.combos(), ct.combos(31000)
    assert [s["seed"] for s in first][:4] == [29002, 29003, 29000, 29001]  # (unchanged)
    assert not {s["seed"] for s in first} & {s["seed"] for s in second}
    assert collections.Counter(s["split"] for s in second) == {"calib": 28, "heldout": 28}
    # the same traffic kinds on each side, the other settings crossed differently
    key = lambda s: (s["arrivals"], s["lengths"], s["with_prompts"], s["split"])
    assert sorted(map(key, first)) == sorted(map(key, second))
    settings = lambda specs: [(s["policy"], s["pc"], s["interval"]) for s in specs]
    assert settings(first) != settings(second)


def test_closed_loop_keeps_at_most_c_requests_in_flight():
    wl = ct.workload("t", 7, 40, "poisson", "lognormal", "fcfs", False, False, 800, 32)
    arr = ct.closed_loop(wl, clients=4, think=(1, 5), rng=random.Random(1))
    d = dict(wl, requests=[dict(r, arrival_step=a) for r, a in zip(wl["requests"], arr)])
    _, summary = simulate(parse_workload(d))
    fin = summary.finished_step
    ids = [r["id"] for r in d["requests"]]
    for s in range(max(arr) + 1):
        live = sum(1 for rid, a in zip(ids, arr) if a <= s and fin[rid] >= s)
        assert live <= 4 + 1  # (a request finishing in step s and its successor)
    # after the first four, each request enters a think time of 1-5 steps after the step
    # that finished its predecessor was over (the step after it, counted from 1)
    finish_steps = sorted(fin.values())
    for a in sorted(arr)[4:]:
        assert any(2 <= a - f <= 6 for f in finish_steps), a


def test_workloads_are_deterministic_and_heavy_tailed():
    a = ct.workload("t", 3, 120, "onoff", "code", "priority", True, False, 900, 48)
    b = ct.workload("t", 3, 120, "onoff", "code", "priority", True, False, 900, 48)
    assert a == b
    lens = [len(r["prompt_token_ids"]) for r in a["requests"]]
    outs = [r["max_tokens"] for r in a["requests"]]
    assert max(lens) > 5 * statistics.median(lens)  # a heavy tail
    assert max(outs) <= 80
    # on-off: idle gaps of at least 400 steps between bursts
    steps = sorted(r["arrival_step"] for r in a["requests"])
    assert sum(1 for x, y in zip(steps, steps[1:]) if y - x >= 400) >= 2


def test_mooncake_sample_is_read_and_scaled():
    rows = ct.mooncake_rows()
    assert len(rows) == 132 and rows[0] == (0, 6758, 500)
    reqs = ct.mooncake_requests(150, random.Random(0), step_ms=20.0)
    assert len(reqs) == 150
    assert all(16 <= p <= ct.MAX_PROMPT and o >= 1 for _, p, o in reqs)
    assert [a for a, _, _ in reqs] == sorted(a for a, _, _ in reqs)


class _Run:
    def __init__(self, steps, clock, model):
        self.steps, self.clock, self.model = steps, clock, model


def _rec(step, arrivals=(), running=1, waiting=0, tokens=10, reqs=1):
    r = StepRecord(step, list(arrivals))
    r.num_running, r.num_waiting = running, waiting
    r.num_scheduled_tokens, r.num_scheduled = tokens, reqs
    return r


def test_sleep_before_times_only_a_restart_of_a_clock_driven_run():
    m = StepTimeModel(overhead_s=0.01, per_token_s=0.0, per_request_s=0.0)
    steps = [_rec(0, ["a"]), _rec(1, running=0), _rec(2, ["b"]), _rec(3), _rec(4, ["c"])]
    # step 1 left nothing running; b woke the engine 5 s later; c came while busy
    clock = [0.0, 0.01, 5.02, 5.03, 5.04]
    assert sleep_before(_Run(steps, clock, m)) == [(2, 0.02, 5.02)]
    # a run clocked by the model alone (no gap on its clock): no sleep to take out
    assert sleep_before(_Run(steps, [0.0, 0.01, 0.02, 0.03, 0.04], m)) == []


def _facts(n, per_interval=10, max_model_len=None, max_tokens=None):
    class F:
        config = (None if max_model_len is None else
                  type("C", (), {"max_model_len": max_model_len})())
        requests = [type("R", (), {"stats_before": k // per_interval,
                                   "max_tokens": max_tokens})() for k in range(n)]
    return F


def _top_tenth_share(xs):
    xs = sorted(xs, reverse=True)
    return sum(xs[:max(1, len(xs) // 10)]) / sum(xs)


def test_length_draws_keep_the_interval_total_without_a_spread(monkeypatch):
    monkeypatch.setattr(prompts, "INTERVAL_SPREADS", (0.0,))
    lens = [500] * 20 + [300] * 20
    for seed in range(40):
        out = prompts.draw_lengths(lens, _facts(40), random.Random(seed))
        t = [sum(out[i:i + 10]) for i in range(0, 40, 10)]
        factor = t[0] / 5000
        assert any(abs(factor - f) < 1e-3 for f in prompts.LENGTH_FACTORS)
        # one factor for the whole log: each interval keeps its share (within rounding)
        assert abs(t[1] - 5000 * factor) <= 10 and abs(t[2] - 3000 * factor) <= 10
        assert abs(t[3] - 3000 * factor) <= 10


def test_length_draws_move_tokens_between_intervals_keeping_the_total():
    lens = [500] * 40
    moved = 0
    for seed in range(40):
        out = prompts.draw_lengths(lens, _facts(40), random.Random(seed))
        total = sum(out)
        assert any(abs(total - 20000 * f) <= 40 for f in prompts.LENGTH_FACTORS)
        t = [sum(out[i:i + 10]) for i in range(0, 40, 10)]
        moved += max(t) > 1.1 * min(t)
    assert 10 <= moved < 40  # some members keep each interval's share, most move it


def test_the_ensemble_draws_with_the_one_length_draw():
    assert ensemble.draw_lengths is prompts.draw_lengths  # (either name works for callers)


def test_length_draws_reach_heavy_tails_and_alike_prompts():
    lens = [500] * 40
    shares = [_top_tenth_share(prompts.draw_lengths(lens, _facts(40, 40), random.Random(s)))
              for s in range(80)]
    # alike prompts (the longest tenth holds about 20% of the tokens at sigma 0.5) and
    # code-like ones (a Pareto tail of alpha 1.1: the longest tenth holds most of them)
    assert min(shares) < 0.3
    assert max(shares) > 0.7
    assert max(prompts.LENGTH_SIGMAS) >= 1.5 and min(prompts.LENGTH_ALPHAS) <= 1.2


def test_length_draws_respect_max_model_len_less_max_tokens():
    # max_model_len 2,000, max_tokens 200, a shared prefix of 300: at most 1,500 tokens of
    # its own; an interval of 10 prompts of 500 has room (15,000) for its 5,000 at any shape
    lens = [500] * 40
    for seed in range(80):
        out = prompts.draw_lengths(lens, _facts(40, max_model_len=2000, max_tokens=200),
                                    random.Random(seed), shared_prefix=300)
        assert max(out) <= 1500
        total = sum(out)
        assert any(abs(total - 20000 * f) <= 40 for f in prompts.LENGTH_FACTORS), total


def test_members_draw_how_much_of_the_common_prefix_is_shared():
    lens = [100, 700, 40]
    kept = set()
    for seed in range(40):
        out, keep = prompts.draw_sharing(lens, 208, 16, random.Random(seed))
        kept.add(keep)
        assert keep % 16 == 0 and 0 <= keep <= 208
        # each prompt keeps its length: what is no longer shared is its own
        assert [n + keep for n in out] == [n + 208 for n in lens]
    assert kept == {208, 96, 0}  # all, half (whole blocks), none
    # nothing shared: nothing drawn (and no random number used)
    rng = random.Random(1)
    assert prompts.draw_sharing(lens, 0, 16, rng) == (lens, 0)
    assert rng.random() == random.Random(1).random()
