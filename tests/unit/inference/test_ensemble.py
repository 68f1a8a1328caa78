"""The uncertainty ensemble (inference/ensemble.py): what a log that cannot pin every arrival
still tells, with numbers that mean what they say."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from helpers.examples import many

from kvreplay.cli.replay_report import render_table, to_json
from kvreplay.inference import replay_facts
from kvreplay.inference.uncertainty import LEAD_BELOW, TOL_STEPS, interval, quantiles
from kvreplay.sources import read_facts

CASES = Path(__file__).parents[2] / "data" / "logcases"


def _replay(case: str, name: str, **kw):
    return replay_facts(read_facts([str(CASES / case / name)], year=2026), **kw)


def _truth(case: str) -> dict:
    return json.loads((CASES / case / "truth.json").read_text())


def _is_true(p, truth: dict) -> bool:
    return any(p.victim == t["victim_log_id"] and abs(p.step - t["step"]) <= TOL_STEPS
               for t in truth["preemptions"])


@pytest.fixture(scope="module")
def poisson():
    return _replay("p1_poisson_fcfs_200", "server.reqbody.log")


def test_weighted_quantiles_by_hand() -> None:
    # equal weights: the 5%, 50%, 95% order statistics of 20 values 1..20
    vals = list(range(1, 21))
    assert quantiles(vals, [1.0] * 20) == (1, 10, 19)
    # all the weight on one value: it is the whole interval
    assert quantiles([3, 7, 9], [0.0, 1.0, 0.0]) == (7, 7, 7)
    # 60% of the weight on 9: the median is 9, the 5% quantile the lightest low value
    assert quantiles([3, 7, 9], [0.1, 0.3, 0.6]) == (3, 9, 9)


@settings(many())
@given(st.lists(st.tuples(st.integers(0, 100), st.floats(0.001, 10.0)), min_size=1, max_size=40))
def test_quantiles_are_ordered_members(pairs) -> None:
    vals, ws = zip(*pairs)
    lo, med, hi = quantiles(vals, ws)
    assert lo <= med <= hi
    assert {lo, med, hi} <= set(vals)


@pytest.mark.slow
def test_poisson_report_leads_with_the_headline(poisson) -> None:
    """p1 with prompts, no Iteration lines: the report's first line after the title is the
    headline, naming what to trust, what not, and the flag that makes it exact."""
    rep = poisson
    report = to_json(rep)
    table = render_table(rep, report, 1.0).splitlines()
    assert table[1].startswith("  HEADLINE: trust the count (")
    assert "--enable-logging-iteration-details" in table[1]
    assert "preemptions in this replay:" in "\n".join(table)
    u = report["uncertainty"]
    assert set(u) >= {"preemptions", "recomputed_tokens", "requests", "windows", "samples", "seed"}
    for k in ("preemptions", "recomputed_tokens"):
        assert u[k]["low"] <= u[k]["median"] <= u[k]["high"]
    assert u["samples"] == 32 and u["seed"] == 0


def test_rows_below_one_half_are_marked_leads(poisson) -> None:
    rep = poisson
    table = render_table(rep, to_json(rep), 1.0)
    rows = [line for line in table.splitlines() if re.match(r"\s+\d+\s+\d\d:\d\d:", line)]
    assert len(rows) == len(rep.preemptions)
    for p, line in zip(rep.preemptions, rows):
        assert 0.0 <= p.probability <= 1.0
        assert line.rstrip().endswith("lead") == (p.probability < LEAD_BELOW), line


def test_row_probability_never_exceeds_the_requests(poisson) -> None:
    """A row counts the replays that preempt its victim near its step; the request's
    probability counts those that preempt it at all: never less."""
    u = poisson.uncertainty
    for p in poisson.preemptions:
        assert p.probability <= u.p_preempted(p.victim) + 1e-9
    for r in u.requests:
        assert 0.0 <= r["p_preempted"] <= 1.0
        assert r["expected_preemptions"] >= r["p_preempted"] - 1e-9  # at least once, if at all


def test_windows_add_up_to_the_count(poisson) -> None:
    """The storm timeline covers the whole run: each member's preemptions per stats
    interval sum to its count."""
    u = poisson.uncertainty
    for m in u.members:
        assert sum(m.windows) == m.count
    starts = [w["start"] for w in u.windows]
    assert starts == sorted(starts)


@pytest.mark.slow
def test_same_seed_same_report_other_seed_other_draws() -> None:
    a = _replay("p1_poisson_fcfs_200", "server.reqbody.log", samples=8, seed=3)
    b = _replay("p1_poisson_fcfs_200", "server.reqbody.log", samples=8, seed=3)
    c = _replay("p1_poisson_fcfs_200", "server.reqbody.log", samples=8, seed=4)
    assert json.dumps(to_json(a), sort_keys=True) == json.dumps(to_json(b), sort_keys=True)
    assert [m.count for m in a.uncertainty.members] != [m.count for m in c.uncertainty.members]
    # member 0 is the representative replay itself, whatever the seed
    assert a.uncertainty.members[0].count == c.uncertainty.members[0].count == len(a.preemptions)


def test_iteration_lines_need_no_ensemble() -> None:
    rep = _replay("p1_poisson_fcfs_200", "server.iter.reqbody.log")
    assert rep.uncertainty is None and rep.confidence == "exact-by-log"
    assert all(p.probability is None for p in rep.preemptions)


def test_samples_flag(tmp_path: Path) -> None:
    log = CASES / "b_fcfs_heavy" / "server.reqbody.log"
    out = tmp_path / "r.json"
    cmd = [sys.executable, "-m", "kvreplay.cli", "replay", str(log), "--year", "2026",
           "--format", "json", "-o", str(out), "--samples", "0"]
    assert subprocess.run(cmd, capture_output=True, text=True).returncode == 0
    report = json.loads(out.read_text())
    assert report["uncertainty"] is None
    assert all(p["probability"] is None for p in report["preemptions"])
    bad = subprocess.run(cmd[:-1] + ["-1"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--samples" in bad.stderr and "Traceback" not in bad.stderr
    table = subprocess.run(cmd[:7] + ["--samples", "4", "--seed", "2"], capture_output=True,
                           text=True).stdout
    assert "HEADLINE" in table and "5 replays the log allows (seed 2)" in table


def test_workers_give_the_same_ensemble(monkeypatch) -> None:
    """A large log's members are drawn in forked workers: each from its own seed, so the
    report is byte-identical to the one drawn in one process."""
    import kvreplay.inference.ensemble as ens

    one = to_json(_replay("f_prefix_caching", "server.reqbody.log", samples=6, seed=5))
    monkeypatch.setattr(ens, "PARALLEL_STEPS", 0)
    monkeypatch.setattr(ens.os, "cpu_count", lambda: 2)
    many = to_json(_replay("f_prefix_caching", "server.reqbody.log", samples=6, seed=5))
    assert json.dumps(one, sort_keys=True) == json.dumps(many, sort_keys=True)


def test_long_stages_report_progress() -> None:
    """The core reports its stages to a sink (the console script's bar on a terminal);
    without one nothing is printed. A log replay reports parsing, the fit and placement,
    and the ensemble member by member."""
    from kvreplay import progress
    from kvreplay.sources import open_replay

    seen: list[tuple[str, int | None, int]] = []

    class Sink:
        def start(self, name, total):
            seen.append((name, total, 0))
            return len(seen) - 1

        def advance(self, handle, n):
            name, total, done = seen[handle]
            seen[handle] = (name, total, done + n)

        def finish(self, handle):
            pass

    old = progress.set_sink(Sink())
    try:
        open_replay([str(CASES / "f_prefix_caching" / "server.reqbody.log")], year=2026,
                    samples=5)
    finally:
        progress.set_sink(old)
    names = [s[0] for s in seen]
    assert names[0].startswith("parse server.reqbody.log")
    assert any(n.startswith("fit the clock and place 10 arrivals") for n in names)
    ens = [s for s in seen if s[0].startswith("uncertainty ensemble")]
    assert ens and all(total == done == 5 for _, total, done in ens)


def test_the_bar_is_only_for_a_terminal(capsys) -> None:
    from kvreplay.cli import main

    assert main(["replay", str(CASES / "b_fcfs_heavy" / "server.reqbody.log"), "--year",
                 "2026", "--samples", "3"]) == 0
    err = capsys.readouterr().err
    assert "\x1b[" not in err and "ensemble" not in err  # (stderr is no terminal here)


def test_the_bar_leaves_the_report_on_stdout(capsys, monkeypatch) -> None:
    """With the bar on (stderr a terminal), the report still goes to stdout, whole: rich
    must not take stdout over for its live display."""
    import sys

    from kvreplay.cli import main

    args = ["replay", str(CASES / "b_fcfs_heavy" / "server.reqbody.log"), "--year", "2026",
            "--samples", "3"]
    assert main(args) == 0
    plain = capsys.readouterr().out
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    assert main(args) == 0
    out = capsys.readouterr().out
    strip = [line for line in out.splitlines() if "replayed in" not in line]
    assert strip == [line for line in plain.splitlines() if "replayed in" not in line]
    assert len(strip) > 10


def test_interval_moves_a_share_of_the_widening_up():
    # quantiles of 8, 10, 12 at equal weights: 5% -> 8, median 10, 95% -> 12; the pad is
    # 0.2 x 10 = 2 a side, `up` 0.5 moves half the low side's to the high side
    vals, w = [8, 10, 12], [1.0, 1.0, 1.0]
    assert interval(vals, w, widen=0.2) == {"median": 10, "low": 6, "high": 14}
    assert interval(vals, w, widen=0.2, up=0.5) == {"median": 10, "low": 7, "high": 15}
    # never below 0
    assert interval([0, 1, 2], w, widen=1.0, up=0.0)["low"] == 0
