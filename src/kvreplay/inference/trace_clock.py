"""The wall clock of a step-trace log: each step's duration from a step-time model fitted
on the step lines' whole-second stamps (inference/step_model.py `stamp_rows`), each step
placed between the seconds its line and its neighbours' lines were written.

The plugin writes step k's line as its iteration ends (update_from_output), so the line's
stamp S_k is the whole second in which step k ended: end_k in [S_k, S_k + 1). The last
step of a second, a, with the engine going on at once, ended within the next step of the
second's end: end_a in [S_a + 1 - dt_{a+1}, S_a + 1), and its midpoint is the anchor.
Between two anchors of one busy stretch the model's durations are stretched to fit; before
the first and after the last they run at the model's pace from it; every end stays in its
own second. A restart (step_model.restart: the engine ran dry and a request woke it)
starts when its end less its duration says. These are pins and windows of the one wall
clock (wall_clock.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvreplay.inference.wall_clock import ClockPin, ClockWindow, wall_clock
from kvreplay.replay.records import StepRecord

if TYPE_CHECKING:
    from kvreplay.inference.clock import StepTimeModel


def timed(steps: list[StepRecord], times: list[float | None]
          ) -> tuple[list[float] | None, StepTimeModel | None, list[float] | None]:
    """(stamps, step-time model, clock) of a step-trace replay's steps from their lines'
    time stamps (`times`, StepTrace.time); the model and clock None where the lines time
    too few busy seconds to fit one."""
    from kvreplay.inference.step_model import fit_step_model

    stamps = line_stamps(times)
    if stamps is None:
        return None, None, None
    fm = fit_step_model(steps, None, None, None, stamps=stamps, draws=0)
    if fm is None:
        return stamps, None, None
    return stamps, fm.model, stamp_clock(steps, stamps, fm.model)


def line_stamps(times: list[float | None]) -> list[float] | None:
    """The whole-second stamps of the step lines, or None when a line has no time stamp
    (a log without vLLM's envelope) or the stamps run backwards."""
    if not times or any(t is None for t in times):
        return None
    out = [float(t) for t in times]  # type: ignore[arg-type]
    if any(b < a for a, b in zip(out, out[1:])):
        return None
    return out


def stamp_clock(steps: list[StepRecord], stamps: list[float], model: StepTimeModel) -> list[float]:
    """The start of every step (Replay.clock) by the one clock (wall_clock.wall_clock) from
    the model's durations, the stamps' pins and windows (module doc)."""
    n = len(steps)
    if n == 0:
        return []
    dt = [model.dt_record(r) for r in steps]
    # busy stretches: a new one at each restart
    from kvreplay.inference.step_model import restart

    wakes = [k for k in range(1, n) if restart(steps, k)]
    pins: list[ClockPin] = []
    for i, j in zip([0, *wakes], [k - 1 for k in wakes] + [n - 1]):
        anchors = [ClockPin(a, "end", stamps[a] + 1.0 - dt[a + 1] / 2) for a in range(i, j)
                   if stamps[a + 1] != stamps[a]]
        # the whole stretch in one second: its last step mid-second
        pins += anchors or [ClockPin(j, "end", stamps[j] + 0.5)]
    # every step ends in its own line's second
    windows = [ClockWindow(k, "end", stamps[k], stamps[k] + 1.0) for k in range(n)]
    return wall_clock(dt, pins, windows, wakes).starts
