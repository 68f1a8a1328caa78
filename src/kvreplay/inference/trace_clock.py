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
starts when its end less its duration says.
"""

from __future__ import annotations

from typing import Any

from kvreplay.replay.records import StepRecord


def timed(steps: list[StepRecord], times: list[float | None]
          ) -> tuple[list[float] | None, Any, list[float] | None]:
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


def stamp_clock(steps: list[StepRecord], stamps: list[float], model: Any) -> list[float]:
    """The start of every step (Replay.clock) from the stamps and the model (docstring)."""
    n = len(steps)
    if n == 0:
        return []
    dt = [model.dt_record(r) for r in steps]
    cum = [0.0]
    for d in dt:
        cum.append(cum[-1] + d)  # cum[k + 1]: the model's end of step k
    # busy stretches: a new one at each restart
    from kvreplay.inference.step_model import restart

    wakes = [restart(steps, k) for k in range(n)]
    stretches, i = [], 0
    for k in range(n):
        if k == n - 1 or wakes[k + 1]:
            stretches.append((i, k))
            i = k + 1
    end = [0.0] * n
    for i, j in stretches:
        anchors = [(a, stamps[a] + 1.0 - dt[a + 1] / 2) for a in range(i, j)
                   if stamps[a + 1] != stamps[a]]
        if not anchors:  # the whole stretch in one second: its last step mid-second
            anchors = [(j, stamps[j] + 0.5)]
        a0, t0 = anchors[0]
        for k in range(i, a0 + 1):
            end[k] = t0 - (cum[a0 + 1] - cum[k + 1])
        for (a, ta), (b, tb) in zip(anchors, anchors[1:]):
            span = cum[b + 1] - cum[a + 1]
            for k in range(a + 1, b + 1):
                f = (cum[k + 1] - cum[a + 1]) / span if span > 0 else 1.0
                end[k] = ta + (tb - ta) * f
        b, tb = anchors[-1]
        for k in range(b + 1, j + 1):
            end[k] = tb + (cum[k + 1] - cum[b + 1])
    start = [0.0] * n
    prev = None
    for k in range(n):
        e = min(max(end[k], stamps[k]), stamps[k] + 1.0 - 1e-6)  # ends in its own second
        if prev is not None:
            e = max(e, prev)
        follows = k > 0 and not wakes[k]
        s = prev if follows else e - dt[k]
        if prev is not None:
            s = max(s, prev)  # type: ignore[type-var]
        start[k] = s  # type: ignore[assignment]
        prev = e
    return start
