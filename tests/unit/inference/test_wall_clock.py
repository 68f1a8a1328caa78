"""The one wall clock (inference/wall_clock.py): pins met, durations stretched between them,
the durations' pace outside them, windows, busy stretches. Expected values worked by hand."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvreplay.inference.wall_clock import ClockPin, ClockWindow, wall_clock


def test_one_pin_runs_at_the_durations_pace_both_ways():
    # durations 1, 2, 3, 4; step 2 starts at 100: 97, 98, 100, 103; the last ends at 107
    c = wall_clock([1.0, 2.0, 3.0, 4.0], [ClockPin(2, "start", 100.0)])
    assert c.starts == [97.0, 98.0, 100.0, 103.0]
    assert c.end == 107.0


def test_durations_stretched_proportionally_between_pins():
    # durations 1, 1, 2 sum to 4; the pins say 8 s (10 -> 18): every step twice as long
    c = wall_clock([1.0, 1.0, 2.0], [ClockPin(0, "start", 10.0), ClockPin(2, "end", 18.0)])
    assert c.full() == [10.0, 12.0, 14.0, 18.0]
    # a third pin in the middle: 10 -> 11 over steps 0-1 (x 0.5), 11 -> 18 over step 2 (x 3.5)
    c = wall_clock([1.0, 1.0, 2.0], [ClockPin(0, "start", 10.0), ClockPin(1, "end", 11.0),
                                     ClockPin(2, "end", 18.0)])
    assert c.full() == [10.0, 10.5, 11.0, 18.0]


def test_an_end_pin_is_the_next_steps_start():
    a = wall_clock([0.5, 0.5, 0.5], [ClockPin(0, "end", 3.0)])
    b = wall_clock([0.5, 0.5, 0.5], [ClockPin(1, "start", 3.0)])
    assert a == b and a.full() == [2.5, 3.0, 3.5, 4.0]


def test_after_the_last_pin_the_durations_pace():
    c = wall_clock([1.0, 1.0, 1.0, 1.0], [ClockPin(0, "start", 0.0), ClockPin(1, "start", 3.0)])
    # stretched x3 over step 0, then 1 s a step
    assert c.full() == [0.0, 3.0, 4.0, 5.0, 6.0]


def test_a_pinless_stretch_sits_in_the_middle_of_what_its_windows_allow():
    # step 0 (0.25 s) ends in [10, 11), step 1 (0.5 s) ends in [10, 11): the start lies in
    # [9.75, 10.75) and in [9.25, 10.25): [9.75, 10.25), middle 10.0, width 0.5
    c = wall_clock([0.25, 0.5], windows=[ClockWindow(0, "end", 10.0, 11.0),
                                          ClockWindow(1, "end", 10.0, 11.0)])
    assert c.full() == [10.0, 10.25, 10.75]
    assert (c.violated, c.slack) == (0, 0.5)


def test_windows_that_allow_no_offset_are_counted():
    # step 0 (1 s) ends in [10, 11) and step 1 (1.5 s) also: start in [9, 10) and [7.5, 8.5)
    c = wall_clock([1.0, 1.5], windows=[ClockWindow(0, "end", 10.0, 11.0),
                                        ClockWindow(1, "end", 10.0, 11.0)])
    assert c.violated == 1 and c.slack == 0.0
    assert c.starts[0] == 8.75  # the middle of lo 9 and hi 8.5


def test_a_lower_bound_alone_gives_a_second_from_it():
    c = wall_clock([0.25], windows=[ClockWindow(0, "start", 5.0, math.inf)])
    assert c.full() == [5.5, 5.75] and c.slack == 1.0


def test_each_busy_stretch_on_its_own():
    # restart at step 2: stretch 0-1 ends in [10, 11); stretch 2-3 starts after 20;
    # stretch 4 has no evidence: it follows the one before
    dur = [0.5, 0.5, 0.25, 0.25, 0.1]
    wins = [ClockWindow(1, "end", 10.0, 11.0), ClockWindow(2, "start", 20.0, math.inf)]
    c = wall_clock(dur, windows=wins, restarts=[2, 4])
    assert c.starts == [9.5, 10.0, 20.5, 20.75, 21.0]
    assert c.end == pytest.approx(21.1)
    assert c.violated == 0 and c.slack == 2.0


def test_windows_move_a_pinned_stretchs_ends_into_them():
    # pinned so step 1 ends at 12.0; step 0 must end in [10, 11): the model's 10.5 stays;
    # step 2 must end in [14, 15) but the pace says 13.0: moved to 14.0; step 0's start is
    # its duration before its end
    dur = [1.0, 1.5, 1.0]
    c = wall_clock(dur, [ClockPin(1, "end", 12.0)],
                   [ClockWindow(0, "end", 10.0, 11.0), ClockWindow(2, "end", 14.0, 15.0)])
    assert c.full() == [9.5, 10.5, 12.0, 14.0]
    # an end past its window lands just before the window's end
    c = wall_clock([1.0], [ClockPin(0, "end", 20.0)], [ClockWindow(0, "end", 10.0, 11.0)])
    assert c.end == 11.0 - 1e-6 and c.starts == [c.end - 1.0]


def test_two_pins_on_one_boundary_the_later_wins_and_outside_the_run_is_refused():
    a = wall_clock([1.0, 1.0], [ClockPin(0, "end", 5.0), ClockPin(1, "start", 6.0)])
    assert a.full() == [5.0, 6.0, 7.0]
    with pytest.raises(ValueError):
        wall_clock([1.0], [ClockPin(1, "end", 5.0)])
    with pytest.raises(ValueError):
        wall_clock([1.0], windows=[ClockWindow(-1, "start", 0.0, 1.0)])


def test_no_steps():
    c = wall_clock([], [ClockPin(0, "start", 7.0)])
    assert c.starts == [] and c.end == 7.0


@st.composite
def _pinned(draw):
    n = draw(st.integers(1, 40))
    dur = draw(st.lists(st.floats(0.0, 2.0), min_size=n, max_size=n))
    bounds = sorted(draw(st.sets(st.integers(0, n), min_size=1, max_size=n + 1)))
    gaps = draw(st.lists(st.floats(1e-3, 10.0), min_size=len(bounds), max_size=len(bounds)))
    t, pins = draw(st.floats(-1e3, 1e3)), []
    for b, g in zip(bounds, gaps):
        t += g
        pins.append(ClockPin(b, "start", t) if b < n else ClockPin(n - 1, "end", t))
    return dur, pins


@settings(deadline=None)
@given(_pinned())
def test_consistent_pins_are_met_and_the_clock_never_runs_back(case):
    dur, pins = case
    c = wall_clock(dur, pins)
    full = c.full()
    assert len(c.starts) == len(dur)
    assert all(b >= a for a, b in zip(full, full[1:]))
    for p in pins:
        assert full[p.step + (p.edge == "end")] == p.time


@st.composite
def _stamped(draw):
    """A true run (busy stretches split by idle gaps of a second or more), model durations
    off from the true ones, a pin at some ends and a window around every end."""
    n = draw(st.integers(1, 40))
    true = draw(st.lists(st.floats(1e-3, 0.3), min_size=n, max_size=n))
    model = [d * draw(st.floats(0.5, 2.0)) for d in true]
    restarts = sorted(draw(st.sets(st.integers(1, max(1, n - 1)), max_size=5)) - {n})
    t, ends = 100.0, []
    for k in range(n):
        if k in restarts:
            t += draw(st.floats(1.0, 5.0))
        t += true[k]
        ends.append(t)
    # at least one pin in every stretch (a stretch without one is laid by its windows alone)
    pinned = draw(st.sets(st.integers(0, n - 1), max_size=n))
    for a, b in zip([0, *restarts], [*restarts, n]):
        pinned.add(draw(st.integers(a, b - 1)))
    pins = [ClockPin(k, "end", ends[k]) for k in sorted(pinned)]
    wins = [ClockWindow(k, "end", ends[k] - draw(st.floats(0.0, 0.5)),
                        ends[k] + draw(st.floats(1e-3, 0.5))) for k in range(n)]
    return model, pins, wins, restarts


@settings(deadline=None)
@given(_stamped())
def test_pins_and_windows_from_one_true_run_are_all_met(case):
    model, pins, wins, restarts = case
    c = wall_clock(model, pins, wins, restarts)
    full = c.full()
    assert all(b >= a for a, b in zip(full, full[1:]))
    ends = c.starts[1:] + [c.end]  # (a stretch's last end: the next start is later)
    ends = [ends[k] if k + 1 not in restarts else None for k in range(len(model))]
    for p in pins:
        if ends[p.step] is not None:
            assert ends[p.step] == p.time
    for w in wins:
        if ends[w.step] is not None:
            assert w.lo <= ends[w.step] < w.hi


@settings(deadline=None)
@given(st.lists(st.floats(1e-3, 0.3), min_size=1, max_size=30), st.floats(0.0, 0.999))
def test_a_pinless_stretch_timed_by_true_seconds_fits_them(true, phase):
    """Windows of whole seconds read from a true run at the true durations (an Iteration
    line's second holds its step's end): never violated, every end inside its second."""
    t, ends = 50.0 + phase, []
    for d in true:
        t += d
        ends.append(t)
    wins = [ClockWindow(k, "end", math.floor(e), math.floor(e) + 1.0) for k, e in enumerate(ends)]
    c = wall_clock(true, windows=wins)
    assert c.violated == 0
    got = c.starts[1:] + [c.end]
    for w, e in zip(wins, got):
        assert w.lo - 1e-9 <= e <= w.hi + 1e-9


def test_the_iteration_lines_clock_by_hand():
    """iteration_clock, a producer of windows: steps 0-1 (the first with request r0, logged
    at second 9) ran 100 ms each, their lines stamped second 10; the engine then ran dry
    and step 2 (r1, second 19; 200 ms) has its line at second 20. With no cost between
    steps (the widest fit): stretch 0 starts in [9.9, 10.8], its middle 10.35; stretch 1 in
    [19.8, 20.8], 20.3."""
    from types import SimpleNamespace as NS

    from kvreplay.inference.iteration_clock import busy_restarts, iteration_clock
    from kvreplay.replay.records import StepRecord

    steps = [StepRecord(0, ["r0"], num_scheduled_tokens=5, num_scheduled=1, num_running=1),
             StepRecord(1, [], num_scheduled_tokens=1, num_scheduled=1, num_running=0),
             StepRecord(2, ["r1"], num_scheduled_tokens=5, num_scheduled=1, num_running=1)]
    its = [NS(step=0, elapsed_ms=100.0, time=10.0), NS(step=1, elapsed_ms=100.0, time=10.0),
           NS(step=2, elapsed_ms=200.0, time=20.0)]
    facts = NS(iterations=its, requests=[NS(log_id="r0", time=9.0), NS(log_id="r1", time=19.0)])
    assert busy_restarts(steps) == [2]
    clock, end, _, overhead = iteration_clock(steps, {0: 0, 1: 1, 2: 2}, facts,
                                              NS(token_floors=(0,)))
    assert overhead == 0.0
    assert clock == pytest.approx([10.35, 10.45, 20.3]) and end == pytest.approx(20.5)
