"""Stage 4, clock: how long each engine step took, and when each step started.

Consumes: a `Run` (its step records), `LogFacts`, the `LogFormat`. Produces: a
`StepTimeModel` (a fixed cost, a cost per scheduled token with a floor where a small step
is bound by reading the weights, per scheduled request, per token of context), fitted by
least squares over the stats intervals (the steps between two lines must take that
interval), or over the request spans' engine-timed windows when there are spans; and the
pins the stats and access lines give the one wall clock (wall_clock.py): the model's
durations stretched between the stats lines' anchors and the access lines' times.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvreplay.inference.facts import LogFacts
from kvreplay.inference.formats import LogFormat
from kvreplay.inference.lines import cum_generated, line_time, spans, token_anchors
from kvreplay.inference.step_fit import FINE_FLOORS, best_fit, segments
from kvreplay.inference.wall_clock import ClockPin
from kvreplay.inference.wall_clock import wall_clock as one_clock
from kvreplay.replay.records import StepRecord

if TYPE_CHECKING:
    from kvreplay.inference.runs import Run


IDLE_PICKUP_S = 0.05  # an idle engine starts a step this soon after a request arrives
SLEEP_MIN_S = 1.0  # regression: an idle gap this long is taken out of its stats interval


@dataclass(slots=True)
class StepTimeModel:
    overhead_s: float = 0.005
    per_token_s: float = 2e-5
    per_request_s: float = 5e-5
    per_context_token_s: float = 0.0
    token_floor: int = 0

    def dt(self, tokens: int, requests: int, context: int = 0) -> float:
        if requests == 0:
            return self.overhead_s
        return (
            self.overhead_s
            + self.per_token_s * max(tokens, self.token_floor)
            + self.per_request_s * requests
            + self.per_context_token_s * context
        )

    def dt_record(self, rec: StepRecord) -> float:
        return self.dt(rec.num_scheduled_tokens, rec.num_scheduled, rec.context_tokens)

    def describe(self) -> str:
        text = f"step time = {self.overhead_s * 1e3:.3f} ms + {self.per_token_s * 1e6:.3f} us x "
        text += f"max(scheduled tokens, {self.token_floor})" if self.token_floor else "scheduled tokens"
        text += f" + {self.per_request_s * 1e6:.2f} us x scheduled requests"
        if self.per_context_token_s:
            text += f" + {self.per_context_token_s * 1e9:.2f} ns x context tokens"
        return text


def fixed_step_time(ms: float) -> StepTimeModel:
    """Every step takes `ms` milliseconds (`--step-time-ms`)."""
    return StepTimeModel(overhead_s=ms / 1000.0, per_token_s=0.0, per_request_s=0.0)


def initial_model(facts: LogFacts) -> StepTimeModel:
    """A first guess from the logged throughput: ~4 ms a step plus a cost per token that
    makes the busiest interval's tokens fit in half a second."""
    busiest = max(((s.prompt_throughput or 0) + (s.generation_throughput or 0) for s in facts.stats),
                  default=0)
    per_token = 0.5 / busiest if busiest > 0 else 2e-5
    return StepTimeModel(overhead_s=0.004, per_token_s=min(per_token, 1e-3), per_request_s=0.0)


def busy_span_model(run: Run, facts: LogFacts, fmt: LogFormat, cut: bool) -> StepTimeModel | None:
    """A first model for a log whose lines say when the engine was busy: the run's steps
    (up to the tokens the log counts, when it was cut) fill the time from the first arrival
    to the last stats line or finish showing work."""
    t0 = facts.requests[0].time if facts.requests and facts.requests[0].time is not None else None
    busy = [s.time for s in facts.stats if (s.running or 0) + (s.waiting or 0) + (s.swapped or 0) > 0]
    busy += [t for t, _ in facts.finished if t is not None]
    if t0 is None or not busy or not run.steps:
        return None
    span = max(busy) + 0.5 - t0
    n = len(run.steps)
    if facts.stats and max(busy) >= facts.stats[-1].time and cut:
        want = sum((st.generation_throughput or 0.0) * e
                   for st, e in zip(facts.stats, spans(facts, fmt)))
        c = 0
        for i, rec in enumerate(run.steps):
            c += rec.generated_tokens
            if c >= want:
                n = i + 1
                break
    if span <= 0 or n <= 0:
        return None
    return StepTimeModel(overhead_s=span / n, per_token_s=0.0, per_request_s=0.0)


def regression(run: Run, facts: LogFacts, fmt: LogFormat,
               fine_floors: bool = False) -> StepTimeModel | None:
    """Each pair of stats lines anchored to steps a < b (lines.token_anchors) closes a span
    of known length (lines.spans) in which steps a+1..b ran; least squares with
    non-negative coefficients over those spans gives the model, for each token floor the
    format tries (the best fit wins); `fine_floors` (request spans) also on a grid of 8
    tokens up to 256."""
    anchors = [(i, a) for i, a in enumerate(token_anchors(run, facts, fmt)) if a is not None]
    sp = spans(facts, fmt)
    with_spans = any(r.span is not None for r in facts.requests)
    all_spans = with_spans and all(r.span is not None for r in facts.requests)
    # request spans time whole stretches of steps: enough rows for the context term too
    nvars = 4 if fmt.context_term or with_spans else 3
    windows = []
    if with_spans:
        from kvreplay.inference.spans import span_windows

        windows = span_windows(run, facts)
    # An interval in which a clock-driven replay slept (ran dry and waited SLEEP_MIN_S or
    # more for the next arrival: an idle gap of real traffic) took longer than its steps;
    # taken whole, the sleep goes into the per-step cost and the per-token cost to 0. Such
    # a row keeps its interval less the sleep inside it (sleep_before; the lines at the
    # middle of their second). (A replay by arrival steps has no sleep on its clock.)
    sleep = [s for s in sleep_before(run) if s[2] - s[1] >= SLEEP_MIN_S]
    data: list[tuple[list[StepRecord], float]] = []
    if not (windows and all_spans):  # spans for every request time the steps to the us
        for (i0, a), (i1, b) in zip(anchors, anchors[1:]):
            if b <= a:
                continue
            slept = sum(max(0.0, min(e, line_time(facts.stats[i1], 0.5))
                            - max(s0, line_time(facts.stats[i0], 0.5))) for _, s0, e in sleep)
            data.append((run.steps[a + 1: b + 1], sum(sp[i0 + 1: i1 + 1]) - slept))
    data += [(run.steps[a: b + 1], dur) for a, b, dur in windows]  # steps a..b took dur
    if len(data) < 2:
        return None
    floors = fmt.token_floors
    if fine_floors and windows and fmt.token_floors != (0,):
        # spans time the steps to the microsecond: a finer grid of floors (a floor off by
        # a few tokens prices every decode step a few percent off, and the snapped clock
        # drifts a step where the spans' boundaries are sparse)
        floors = tuple(sorted(set(floors) | set(FINE_FLOORS)))
    best = best_fit(segments(data), floors, nvars)
    if best is None:
        return None
    _, floor, c = best
    if all(v <= 0 for v in c):
        return None
    return StepTimeModel(overhead_s=max(c[0], fmt.min_overhead_s), per_token_s=c[1],
                         per_request_s=c[2], per_context_token_s=c[3] if nvars == 4 else 0.0,
                         token_floor=floor if c[1] > 0 else 0)


def sleep_before(run: Run) -> list[tuple[int, float, float]]:
    """When the engine slept in a clock-driven replay, as (step, start, end): from the end
    of a step that left nothing running or waiting to the start of the next, which took
    the arrival that woke it (none for a run clocked by the model alone)."""
    steps, clock, m = run.steps, getattr(run, "clock", None), getattr(run, "model", None)
    n = len(steps)
    out: list[tuple[int, float, float]] = []
    if m is None or clock is None or len(clock) != n:
        return out
    for k in range(1, n):
        prev = steps[k - 1]
        if steps[k].arrivals and prev.num_running + prev.num_waiting == 0:
            end_prev = clock[k - 1] + m.dt_record(prev)
            if clock[k] > end_prev + 1e-9:
                out.append((k, end_prev, clock[k]))
    return out


def wall_clock(run: Run, facts: LogFacts, anchors: list[int | None], phase: float) -> list[float]:
    """Wall-clock start of every step (and the end of the last), by the one clock
    (wall_clock.wall_clock) from the step-time model's durations and these pins: the
    stats lines' anchors (the step after anchor i starts at stats time S_i + phase, less
    half a step), the first request's second, and the access lines' times where the log
    has them."""
    n = len(run.steps)
    m = run.model
    dur = [m.dt_record(rec) for rec in run.steps]
    cum = [0.0]
    for d in dur:
        cum.append(cum[-1] + d)
    pts = []  # (step index whose start is pinned, time)
    last = -1
    for a, s in zip(anchors, facts.stats):
        if a is None or a + 1 > n or a + 1 <= last:
            continue
        # A stats line (vLLM's LoggingStatLogger.log, spec vllm-log-formats.md) saw step
        # a's output but not step a+1's: it was printed while step a+1 ran; take the middle
        # of that step.
        pts.append((a + 1, line_time(s, phase) - 0.5 * (dur[a + 1] if a + 1 < n else 0.0)))
        last = a + 1
    if not pts:
        # nothing to pin the clock to: start it at the first arrival's second
        t0 = facts.requests[0].time if facts.requests and facts.requests[0].time else 0.0
        return one_clock(dur, [ClockPin(0, "start", t0)]).full()
    # Step 0 is the first request's step (the engine was idle before it): it started
    # inside that request's logged second. Extrapolated backwards from the first stats
    # line with the model's durations it can miss that second by far (a model fitted on
    # few stats lines); then the second bounds it and the steps up to the first line are
    # stretched to fit.
    first = facts.requests[0].time if facts.requests else None
    precise0 = facts.requests[0].precise_time if facts.requests else None
    if precise0 is not None and pts[0][0] > 0:
        pts.insert(0, (0, precise0))  # the engine was idle: step 0 starts as it comes in
    elif first is not None and pts[0][0] > 0:
        start0 = pts[0][1] - cum[pts[0][0]]
        # an idle engine picks a request up within milliseconds, so step 0 may start just
        # past the end of that second, not later
        latest = first + 1.0 + IDLE_PICKUP_S
        if start0 < first or start0 >= latest:
            pts.insert(0, (0, min(max(start0, first), latest - 1e-3)))
    if facts.completion_times:
        pts = _with_completion_pins(pts, run, facts.completion_times)
    # (a pin on step n's start is the end of the last step)
    return one_clock(dur, [ClockPin(k, "start", t) if k < n else ClockPin(n - 1, "end", t)
                           for k, t in pts]).full()


def finish_steps(steps: list[StepRecord]) -> list[int]:
    """The step of each finish, in order: the c-th is the replay's c-th access line."""
    return [rec.step for rec in steps for _ in rec.finished]


def _with_completion_pins(pts: list[tuple[int, float]], run: Run,
                          times: list[float]) -> list[tuple[int, float]]:
    """With sub-second times on the access lines, each one pins the clock too: the c-th
    access line was written once the replay's c-th finishing step had ended, as the next one
    ran. Pins that would run the clock backwards are left out."""
    fin = finish_steps(run.steps)
    n = len(run.steps)
    merged = dict(pts)
    for f, t in zip(fin, times):
        if f + 1 < n and f + 1 not in merged:
            merged[f + 1] = t
    out: list[tuple[int, float]] = []
    for step, t in sorted(merged.items()):
        if out and t <= out[-1][1]:
            continue
        out.append((step, t))
    return out


def clocked(run: Run, facts: LogFacts, fmt: LogFormat, phase: float) -> list[float]:
    """The run's wall clock read from its anchors (V1 logs) and set on the run."""
    clock = wall_clock(run, facts, token_anchors(run, facts, fmt, cum_generated(run)), phase)
    run.clock = clock[: len(run.steps)]
    run.end = clock[len(run.steps)]
    return clock
