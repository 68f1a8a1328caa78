"""Where the stats lines sit in a run (spec: log formats, stats line; A10).

Consumes: a `Run` (runs.py), `LogFacts`, the `LogFormat`. Produces: per stats line the step
it shows (`line_steps`), the step where the run's generated tokens reach what the log
counted by then (`token_anchors`), the seconds each line's throughputs cover (`spans`),
the sub-second phase of the lines, and step end times. Nothing here replays anything.
"""

from __future__ import annotations

import bisect
import math
from typing import TYPE_CHECKING

from kvreplay.inference.facts import LogFacts, StatsPoint
from kvreplay.inference.log_shape import stats_targets
from kvreplay.inference.formats import LogFormat, interval_of
from kvreplay.replay.records import cumulative

if TYPE_CHECKING:
    from kvreplay.inference.runs import Run


V0_INTERVAL_S = 5.0  # vllm/engine/metrics.py _LOCAL_LOGGING_INTERVAL_SEC


def cum_generated(run: Run) -> list[int]:
    """Cumulative generated tokens after each step (the stat logger's count)."""
    return cumulative([rec.generated_tokens for rec in run.steps])


def spans(facts: LogFacts, fmt: LogFormat) -> list[float]:
    """Seconds each stats line's throughputs average over. V1: the nominal interval. V0:
    the first step end more than 5 s after the previous line, so a little over 5 s (the
    mean over the log's regular gaps), or the gap itself after a longer one (idle)."""
    st = facts.stats
    if not fmt.throughput_over_elapsed:
        return [interval_of(facts, fmt)] * len(st)
    gaps = [b.time - a.time for a, b in zip(st, st[1:])]
    regular = [g for g in gaps if g <= 6.0]
    mean = min(6.0, max(5.0, sum(regular) / len(regular))) if regular else 5.0
    out = [mean]
    for g in gaps:
        out.append(float(g) if g > 6.0 else mean)
    return out[: len(st)]


def ends(run: Run) -> list[float]:
    """End time of every step: the start of the next, the last one the run's end."""
    return run.clock[1:] + [run.end]


def line_time(st: StatsPoint, phase: float) -> float:
    """When stats line `st` was printed: its sub-second time when the log has one, else its
    second plus the lines' phase."""
    return st.precise_time if st.precise_time is not None else st.time + phase


def step_end_lines(run: Run, facts: LogFacts) -> list[int | None]:
    """V0: the step at whose end each stats line was printed: a line stamped second S came
    at the end of a step ending in [S, S+1), the first one more than 5 s after the previous
    line; none there: the step running at S + 0.5."""
    e = ends(run)
    out: list[int | None] = []
    prev_end = -math.inf
    for s in facts.stats:
        lo = bisect.bisect_left(e, s.time)
        hi = bisect.bisect_left(e, s.time + 1.0)
        choice = None
        for k in range(lo, hi):
            if e[k] - prev_end > V0_INTERVAL_S:
                choice = k
                break
        if choice is None and hi > lo:
            choice = hi - 1
        if choice is None:
            k = bisect.bisect_left(e, s.time + 0.5)
            choice = k if k < len(e) else None
            if choice is not None and e[choice] - (s.time + 0.5) > 30.0:
                choice = None
        if choice is not None and run.clock[choice] > s.time + 1.0:
            choice = None  # the replay had not started yet
        out.append(choice)
        if choice is not None:
            prev_end = e[choice]
    return out


def token_anchors(run: Run, facts: LogFacts, fmt: LogFormat,
                  cum: list[int] | None = None) -> list[int | None]:
    """Stats line i -> the step whose output it had seen last: where the run's generated
    tokens reach the count the log shows by line i (V1: from the run's start; V0: from the
    first line the clock places, `step_end_lines`, on). None where the log shows none yet,
    or the run never generates that many."""
    if cum is None:
        cum = cum_generated(run)
    n = len(facts.stats)
    out: list[int | None] = [None] * n
    sp = spans(facts, fmt)
    start, target = 0, 0.0
    if fmt.stats_read == "step_end":
        placed = step_end_lines(run, facts)
        base = next((i for i, k in enumerate(placed) if k is not None), None)
        if base is None:
            return out
        out[base] = placed[base]
        start, target = base + 1, float(cum[placed[base]])  # type: ignore[index]
    for i in range(start, n):
        target += (facts.stats[i].generation_throughput or 0.0) * sp[i]
        if target <= 0:
            continue  # no output seen yet: says nothing about which step ran
        j = bisect.bisect_left(cum, target - 0.5)
        if j >= len(cum):
            break
        out[i] = j
    return out


def phase_estimate(facts: LogFacts) -> float | None:
    """The sub-second phase at which the stats lines are printed: the container stamps'
    median, else from arrivals logged in the same second as a stats line, before and after
    it (for arrivals spread over the second, the share before it); None with too few."""
    if facts.precise_times and facts.stats:
        offsets = sorted(st.precise_time - st.time for st in facts.stats)  # type: ignore[operator]
        return offsets[len(offsets) // 2]
    by_second: dict[float, list[int]] = {}
    for r in facts.requests:
        if r.time is not None:
            by_second.setdefault(r.time, []).append(r.stats_before)
    before = after = 0
    for st in facts.stats:
        for stats_before in by_second.get(st.time, ()):
            if stats_before <= st.index:
                before += 1
            else:
                after += 1
    if before == 0 or after == 0 or before + after < 8:
        return None
    return (before + 0.5) / (before + after + 1)


def targets(facts: LogFacts, fmt: LogFormat) -> list[tuple[float, float]]:
    """Cumulative generated and prompt tokens the log shows by each stats line."""
    return stats_targets(facts, interval_of(facts, fmt))
