"""The one wall clock: when each engine step started, from the steps' durations and what the
evidence says of their times.

Consumes: per-step durations (a step-time model's, or the log's own), the busy stretches
(`restarts`: the steps that start a new stretch after the engine ran dry and waited), and
the evidence as typed `ClockPin`s (a step edge at a known time) and `ClockWindow`s (a step
edge somewhere in [lo, hi)). Produces a `WallClock`: the start of every step and the end of
the last.

Each kind of evidence is a small producer that turns its lines into pins and windows and
calls `wall_clock`:
* stats lines and access lines (clock.wall_clock): pins;
* Iteration lines (iteration_clock): logged durations, windows (each line's second holds
  its step's end; a stretch starts no earlier than its first request's second);
* the step-trace plugin's step lines (trace_clock): pins (the last step of each second)
  and windows (every step ends inside its own line's second).
The request spans' engine stamps (span_clock.snapped_replay) set the clock while the engine
runs (a request enters at the first step at or after its stamp, so the steps depend on the
clock): that clock is made step by step there, not here.

The rule, per busy stretch (the steps of one stretch follow each other with no gap):
* with pins: each pin is met exactly; between two pins the durations are stretched
  proportionally (the pins' interval over the durations' sum); before the first pin and
  after the last the steps run at the durations' pace. Then each window is enforced: a
  boundary outside its window is moved to the window's nearest edge (just before `hi`, and
  before any later boundary's `hi`), the clock never runs backwards, a stretch's first step
  starts its duration before its end.
* without pins: the stretch is laid rigidly at the durations' pace, its first step starting
  at the middle of the offsets every window of the stretch allows (bounded on one side
  only: ONE_SIDED_S wide from the bound; no window: at the end of the stretch before, the
  first at 0). A stretch whose windows allow no offset is counted
  (`WallClock.violated`); `slack` sums the widths of the offsets allowed.
Pins are the caller's choice of what to trust: one per step boundary (of two on one, the
later given wins; a step's end and the next step's start are one boundary); pins that run backwards in time are followed (the caller leaves them out
when it should).
"""

from __future__ import annotations

import bisect
from typing import Literal, Sequence

import msgspec

Edge = Literal["start", "end"]
ONE_SIDED_S = 1.0  # a stretch bounded only from below starts within this of its bound
WINDOW_EPS_S = 1e-6  # an end moved into a window [lo, hi) lands this far before hi
_FAR = 1e18


class ClockPin(msgspec.Struct, frozen=True):
    """Step `step`'s start (or end) was at `time` (seconds, the log's clock)."""

    step: int
    edge: Edge
    time: float


class ClockWindow(msgspec.Struct, frozen=True):
    """Step `step`'s start (or end) lies in [lo, hi) (hi may be inf)."""

    step: int
    edge: Edge
    lo: float
    hi: float


class WallClock(msgspec.Struct):
    starts: list[float]  # the start of every step
    end: float  # the end of the last step (of the run's first step with no steps)
    violated: int = 0  # pinless stretches whose windows allow no offset
    slack: float = 0.0  # sum over pinless stretches of the width of the offsets allowed

    def full(self) -> list[float]:
        """The starts and the end: the boundaries a replay's clock is read from."""
        return self.starts + [self.end]


def _edge_pos(step: int, edge: Edge) -> int:
    """A step edge as a boundary: the start of step k is boundary k, its end k + 1."""
    return step + 1 if edge == "end" else step


def wall_clock(durations: Sequence[float], pins: Sequence[ClockPin] = (),
               windows: Sequence[ClockWindow] = (), restarts: Sequence[int] = ()) -> WallClock:
    """The start of every step (module doc). `restarts`: steps k > 0 that start a stretch."""
    n = len(durations)
    cuts = sorted({k for k in restarts if 0 < k < n})
    bounds = [0, *cuts, n] if n else [0, 0]
    pin_at: dict[int, list[tuple[int, float]]] = {}
    win_at: dict[int, list[tuple[int, float, float]]] = {}

    def stretch_of(pos: int, edge: Edge) -> int:
        # an end belongs to its step's stretch, a start to the stretch it opens (the last
        # stretch holds the end of the run)
        step = pos - 1 if edge == "end" else pos
        return min(bisect.bisect_right(bounds, step) - 1, len(bounds) - 2)

    for e in (*pins, *windows):
        if not 0 <= _edge_pos(e.step, e.edge) <= n:
            raise ValueError(f"{e} lies outside the run's {n} steps")
    for p in pins:
        pos = _edge_pos(p.step, p.edge)
        s = stretch_of(pos, p.edge)
        pin_at.setdefault(s, []).append((pos - bounds[s], p.time))
    for w in windows:
        pos = _edge_pos(w.step, w.edge)
        s = stretch_of(pos, w.edge)
        win_at.setdefault(s, []).append((pos - bounds[s], w.lo, w.hi))
    starts: list[float] = []
    end = 0.0
    violated, slack = 0, 0.0
    prev_end: float | None = None
    for s in range(len(bounds) - 1):
        a, b = bounds[s], bounds[s + 1]
        cum, acc = [], 0.0
        for k in range(a, b):
            cum.append(acc)
            acc += durations[k]
        cum.append(acc)
        wins = win_at.get(s, [])
        pts = sorted(dict(pin_at.get(s, [])).items())  # (one pin per boundary: the last)
        if pts:
            out = _stretched(cum, pts)
            if wins:
                out = _into_windows(out, wins, durations[a:b], prev_end)
        else:
            t0, ok, width = _offset(cum, wins, 0.0 if prev_end is None else prev_end)
            violated += not ok
            slack += width
            out = [t0 + c for c in cum]
        starts += out[:-1]
        end = prev_end = out[-1]
    return WallClock(starts, end, violated, slack)


def _stretched(cum: list[float], pts: list[tuple[int, float]]) -> list[float]:
    """Boundaries 0..len(cum)-1 of a stretch through its pins (position, time): the
    durations' pace before the first and after the last, stretched between two."""
    last = len(cum) - 1
    out = [0.0] * (last + 1)
    p0, t0 = pts[0]
    for i in range(0, p0 + 1):  # before the first pin: the durations backwards
        out[i] = t0 - (cum[p0] - cum[i])
    for (pa, ta), (pb, tb) in zip(pts, pts[1:]):
        span = cum[pb] - cum[pa]
        scale = (tb - ta) / span if span > 0 else 1.0
        for i in range(pa, pb + 1):
            out[i] = ta + (cum[i] - cum[pa]) * scale
    pl, tl = pts[-1]
    for i in range(pl, last + 1):  # (and every pin met exactly: its own segment wrote it)
        out[i] = tl + (cum[i] - cum[pl])
    return out


def _into_windows(out: list[float], wins: list[tuple[int, float, float]],
                  dur: Sequence[float], prev_end: float | None) -> list[float]:
    """A pinned stretch's boundaries with every window enforced (module doc): each end
    clamped into its window (its upper end no later than any later boundary's), never
    before the previous end; the first step starts its duration before its end, never
    before the previous stretch's end. Windows that a monotone clock can meet are all met."""
    lo = [float("-inf")] * len(out)
    hi = [float("inf")] * len(out)
    for pos, wlo, whi in wins:
        lo[pos] = max(lo[pos], wlo)
        hi[pos] = min(hi[pos], whi - WINDOW_EPS_S)
    for k in range(len(hi) - 2, -1, -1):  # a boundary is no later than any later one's hi
        hi[k] = min(hi[k], hi[k + 1])
    res = list(out)
    prev = prev_end
    for k in range(1, len(out)):
        e = out[k]
        if lo[k] != float("-inf") or hi[k] != float("inf"):
            e = min(max(e, lo[k]), hi[k])
        if prev is not None:
            e = max(e, prev)
        if k == 1:
            st = e - dur[0]
            if lo[0] != float("-inf") or hi[0] != float("inf"):
                st = min(max(st, lo[0]), hi[0])
            if prev is not None:
                st = max(st, prev)
            res[0] = st
        res[k] = e
        prev = e
    return res


def _offset(cum: list[float], wins: list[tuple[int, float, float]],
            after: float) -> tuple[float, bool, float]:
    """(the stretch's start, whether the windows allow it, the width of what they allow):
    the middle of the offsets every window allows; with none, `after` (the end of the
    stretch before)."""
    lo, hi = -_FAR, _FAR
    for pos, wlo, whi in wins:
        lo, hi = max(lo, wlo - cum[pos]), min(hi, whi - cum[pos])
    free_lo, free_hi = lo < -_FAR / 10, hi > _FAR / 10
    if free_lo and free_hi:  # nothing times the stretch: it follows the one before
        lo = hi = after
    elif free_hi:
        hi = lo + ONE_SIDED_S
    elif free_lo:
        lo = hi - ONE_SIDED_S
    if lo > hi:
        return (lo + hi) / 2, False, 0.0
    return (lo + hi) / 2, True, hi - lo
