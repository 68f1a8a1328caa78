"""The one placer (inference/placer.py) and the stats lines' windows it is given
(placement.windows). Expected steps worked by hand."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from kvreplay.inference.clock import StepTimeModel
from kvreplay.inference.formats import log_format
from kvreplay.inference.lines import token_anchors
from kvreplay.inference.placement import windows
from kvreplay.inference.placer import ArrivalWindow, place, step_at
from kvreplay.inference.rebuild import rebuild_workload
from kvreplay.inference.runs import timed_replay
from kvreplay.replay.profile import get_profile
from kvreplay.sources import read_facts

CLOCK = [float(k) for k in range(11)]  # step k starts at k s; the run ends at 10 s
P1 = str(Path(__file__).parents[2] / "data" / "logcases" / "p1_poisson_fcfs_200" / "server.log")


def _w(i: int, first: int, last: int) -> ArrivalWindow:
    return ArrivalWindow(i, first, last, "test")


def test_a_burst_enters_at_its_windows_first_step():
    assert place([_w(0, 2, 8), _w(1, 2, 8), _w(2, 5, 9)], CLOCK, burst=True) == [2, 2, 5]


def test_requests_sharing_a_window_are_spread_evenly_in_time():
    # three requests in steps 0..8 (0 s .. 8 s): at 2, 4, 6 s
    assert place([_w(i, 0, 8) for i in range(3)], CLOCK, burst=False) == [2, 4, 6]
    # one request in 4..6: the middle, 5
    assert place([_w(0, 4, 6)], CLOCK, burst=False) == [5]


def test_file_order_and_an_empty_window():
    # the second window lies before the first's choice: it goes no earlier than it;
    # an empty window (first > last) is relaxed to its last step
    assert place([_w(0, 6, 6), _w(1, 1, 3), _w(2, 9, 7)], CLOCK, burst=True) == [6, 6, 7]


def test_clamp_and_step_at():
    w = _w(0, 3, 5)
    assert [w.clamp(s) for s in (0, 4, 9)] == [3, 4, 5]
    assert _w(0, 5, 3).clamp(9) == 5  # an empty window: its first step
    assert step_at(CLOCK, 2.5) == 3 and step_at(CLOCK, 3.0) == 3


@settings(deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10), st.integers(0, 10)), min_size=1, max_size=30),
       st.booleans())
def test_consistent_windows_are_honoured_in_file_order(pairs, burst):
    """Windows whose first and last steps do not decrease in file order: every request
    inside its own, the steps never decreasing."""
    firsts = sorted(min(a, b) for a, b in pairs)
    lasts = sorted(max(a, b) for a, b in pairs)
    wins = [_w(i, f, max(f, l)) for i, (f, l) in enumerate(zip(firsts, lasts))]
    steps = place(wins, CLOCK, burst)
    assert len(steps) == len(wins)
    assert all(b >= a for a, b in zip(steps, steps[1:]))
    assert all(w.first <= s <= w.last for w, s in zip(wins, steps))


def test_the_stats_lines_windows_say_what_bounds_them():
    """On a Poisson log with stats and access lines, every arrival is bounded by some line,
    and a window's source names the evidence that set it."""
    facts = read_facts([P1], year=2026)
    fmt = log_format(facts.vllm_version, facts.engine_version)
    prof = get_profile(facts.vllm_version)
    rebuilt = rebuild_workload(facts, fmt, prof)
    model = StepTimeModel(overhead_s=0.01, per_token_s=4e-5, per_request_s=5e-5)
    run = timed_replay(rebuilt, facts, prof, model, (0.0, 1.0), order_window_s=fmt.order_window_s)
    wins = windows(run, facts, token_anchors(run, facts, fmt), run.clock + [run.end])
    assert [w.request for w in wins] == list(range(len(facts.requests)))
    assert all(w.source != "none" for w in wins)
    assert any("stats lines" in w.source for w in wins)
    assert any("arrival second" in w.source for w in wins)
    kinds = {"access lines", "stats lines", "sub-second time", "arrival second"}
    assert all(set(w.source.split("+")) <= kinds for w in wins)
