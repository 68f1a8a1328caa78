"""The one placer: given, for each request, the window of engine steps the evidence allows it
to enter at, choose its step.

Consumes: `ArrivalWindow`s (one per request, in the log's file order, made by an evidence
module: placement.windows for the stats lines, the access lines and the request lines'
seconds) and the replay's wall clock (the start of every step, and the end of the last).
Produces: one arrival step per request.

The requests are placed in file order (one frontend sends them in the order of its
`Received request` / `Added request` lines, so the engine takes them in that order: the
steps never decrease). Requests sharing a window are spread evenly in time over it (a
Poisson client), or all put at its first step (a burst). An empty window (evidence that
contradicts itself: the run it was read from is off) is relaxed to its last step.

Not placed here: the Iteration-line search (iteration_search.py) chooses, step by step, how many
of the next requests enter by replaying each choice against the step's line (a search over
the lines, not a choice inside known windows); the request spans (span_clock.py) enter each
request at the first step starting at or after its engine stamp, while the engine runs
(the window is one step and depends on the clock the run is making).
"""

from __future__ import annotations

import bisect
from typing import Sequence

import msgspec


class ArrivalWindow(msgspec.Struct, frozen=True):
    """Request `request` (index in file order) may enter at steps first..last (both
    included; first > last: the evidence contradicts itself). `source`: the evidence that
    bounds it ('+'-joined, e.g. 'access lines+stats lines'; 'none': nothing did)."""

    request: int
    first: int
    last: int
    source: str = "none"

    def clamp(self, step: int) -> int:
        """`step` moved into the window (an empty one: to its first step)."""
        return min(max(step, self.first), max(self.first, self.last))


def step_at(clock: Sequence[float], t: float) -> int:
    """First step whose start is at or after wall time t."""
    return bisect.bisect_left(clock, t)


def place(windows: Sequence[ArrivalWindow], clock: Sequence[float], burst: bool) -> list[int]:
    """A step in each window, in file order (module doc): evenly spread in time inside the
    window (or at its first step for a burst); never before the request before it."""
    steps: list[int] = []
    i = 0
    prev = 0
    while i < len(windows):
        span = (windows[i].first, windows[i].last)
        j = i
        while j < len(windows) and (windows[j].first, windows[j].last) == span:
            j += 1
        lo, hi = span
        if lo > hi:  # an empty window: the constraints are relaxed
            lo, hi = hi, hi
        lo = max(lo, prev)
        hi = max(hi, lo)
        m = j - i
        for k in range(m):
            if burst:
                s = lo
            else:
                tl = clock[min(lo, len(clock) - 1)]
                th = clock[min(hi, len(clock) - 1)]
                s = step_at(clock, tl + (th - tl) * (k + 1) / (m + 1))
                s = min(max(s, lo), hi)
            s = max(s, prev)
            steps.append(s)
            prev = s
        i = j
    return steps

