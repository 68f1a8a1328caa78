"""Placement by the request spans' engine stamps: the spans as constraints, not checks.

vLLM 0.33's `do_tracing` writes, per request, the wall-clock arrival `a` and durations
from the engine's stamps: `time_in_queue` = scheduled_ts - queued_ts, `time_in_model_prefill`
= first_token_ts - scheduled_ts, `time_in_model_decode` = last_token_ts - first_token_ts
(engine monotonic), and `time_to_first_token` = the frontend's wall clock at the first
token - a. So, on the span exporter's clock and up to one constant (the hop from the
engine's output to the frontend, the same for every request):

    S = a + ttft - prefill    the start of the step that first scheduled the request
    E = S - time_in_queue     the start of the step it entered the waiting queue at
    F = a + ttft              the end of the step that gave its first token
    L = F + decode            the end of the step that gave its last token

Each is a step boundary of the real run, to the microsecond, and E is where the request
entered: no need to know the hop from the frontend to the engine, nor `a`'s place in a
step. `snapped_replay` drives the engine by a clock that starts each step where the
model says, snapped to the nearest such boundary when one lies within SNAP_FRAC of the
predicted step; a step in which the replay gives a request its first (last) token ends at
that request's F (L), whatever the model says; a request enters at the first step
starting at or after its E. Between boundaries the model carries the clock; at them its
error is reset to zero.

Idle steps: an engine that has run dry may still step, empty, at a fixed period (the
conformance harness and the log cases' runs do: `"idle": true` steps), and then a
request that arrives to it enters at a step of that grid: its E lies a whole number of
periods after the end of the last busy step (the last request's L). When the spans show
such a grid (idle_period: every gap from a run-dry engine's last L to the next E a
multiple of one period, to SAME_S), the replay steps the idle engine on it, so that its
step numbers are the run's; without a grid (a server that waits idle, as vLLM's engine
core does) it steps only when there is work.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvreplay.inference.clock import StepTimeModel, regression
from kvreplay.inference.engines import make_engine, num_requests
from kvreplay.inference.facts import LogFacts
from kvreplay.inference.log_shape import aborts
from kvreplay.inference.formats import LogFormat
from kvreplay.inference.runs import Run, _finish, step_limit
from kvreplay.replay.engine import without_cyclic_gc

if TYPE_CHECKING:
    from kvreplay.events import RequestSpan
    from kvreplay.inference.engines import Profile
    from kvreplay.inference.rebuild import Rebuilt


SNAP_FRAC = 0.4  # a boundary this close to a predicted step end (x the step) is its end
# ... and never farther than this share of the shortest step the model allows: a boundary
# as far as a whole step away may be the next step's end, not this one's
SNAP_SHORTEST_FRAC = 0.5
SAME_S = 1e-4  # stamps this close are the same boundary (they are exact to ~1 us)
FIT_ROUNDS = 4  # snapped replay -> regression on the spans' windows -> again
SCALES = (0.6, 0.8, 1.25)  # other starts for the model, when the first agrees poorly
GOOD_ENOUGH = 0.9  # of the first schedulings agreed (agreement): no other start tried


@dataclass(slots=True)
class SpanMarks:
    """The spans' step boundaries, on the log's clock (span time - offset)."""

    entry: list[float]  # E of each request (file order)
    scheduled: list[float]  # S
    first_token: list[float]  # F
    last_token: list[float | None]  # L (None: one output token)
    bounds: list[float]  # every E, S, F, L, sorted, the same boundary once
    has_span: list[bool] = field(default_factory=list)  # False: E estimated, S/F are NaN
    idle_s: float | None = None  # the idle engine's step period (idle_period); None: none


def _stamped(s: RequestSpan | None) -> bool:
    return s is not None and None not in (s.time_in_queue, s.time_to_first_token,
                                          s.time_in_model_prefill)


def span_marks(facts: LogFacts, offset: float = 0.0) -> SpanMarks | None:
    """The boundaries of the requests' spans; None unless every request has a span with
    the stamps needed, or (sampled spans) over half of them do: then a request without one
    enters at an E estimated from the arrivals beside it in file order (estimate_entries)."""
    m = SpanMarks([], [], [], [], [])
    bounds = m.bounds
    have = sum(_stamped(r.span) for r in facts.requests)
    if not facts.requests or 2 * have < len(facts.requests):
        return None
    nan = float("nan")
    for r in facts.requests:
        s = r.span
        m.has_span.append(_stamped(s))
        if not m.has_span[-1]:
            m.entry.append(nan)
            m.scheduled.append(nan)
            m.first_token.append(nan)
            m.last_token.append(None)
            continue
        f = s.start - offset + s.time_to_first_token
        start = f - s.time_in_model_prefill
        m.entry.append(start - s.time_in_queue)
        m.scheduled.append(start)
        m.first_token.append(f)
        bounds += [m.entry[-1], start, f]
        last = None
        if s.time_in_model_decode is not None and s.time_in_model_decode > 0:
            last = f + s.time_in_model_decode
            bounds.append(last)
        m.last_token.append(last)
    bounds.sort()
    merged: list[float] = []
    for b in bounds:
        if not merged or b - merged[-1] > SAME_S:
            merged.append(b)
    m.bounds = merged
    if have < len(facts.requests):
        estimate_entries(facts, m, offset)
    else:
        m.idle_s = idle_period(m)
    return m


IDLE_MIN_GAPS = 3  # run-dry gaps the idle grid needs (with two, half the period fits too)
IDLE_MAX_S = 0.1  # the idle period looked for lies in [IDLE_MIN_S, IDLE_MAX_S]
IDLE_MIN_S = 0.002
IDLE_TOL_S = 1e-5  # a gap fits the grid to this (+ IDLE_DRIFT_S per period): the stamps
IDLE_DRIFT_S = 1e-8  # are exact to ~1 us; a random gap fits a 2 ms grid 1 time in 100


def idle_period(m: SpanMarks) -> float | None:
    """The period an idle engine steps at, when the spans show one (module doc): each
    request entering a run-dry engine (every earlier request's last token before its E)
    gives a gap g = E - (the latest earlier L), a whole number of periods. Candidates: the
    smallest gap over 1, 2, ..; the largest in [IDLE_MIN_S, IDLE_MAX_S] that every gap fits,
    refitted by least squares. None: under IDLE_MIN_GAPS such gaps, or none fits."""
    order = sorted(range(len(m.entry)), key=lambda i: m.entry[i])
    done = float("-inf")  # the latest last token (or first, for one output token) so far
    gaps: list[float] = []
    for i in order:
        e = m.entry[i]
        if done != float("-inf") and e > done + SAME_S:
            gaps.append(e - done)
        end = m.last_token[i] if m.last_token[i] is not None else m.first_token[i]
        done = max(done, end)  # type: ignore[arg-type]
    if len(gaps) < IDLE_MIN_GAPS:
        return None
    g0 = min(gaps)
    best = None
    for k in range(max(1, int(g0 / IDLE_MAX_S)), int(g0 / IDLE_MIN_S) + 1):
        d = g0 / k
        if not IDLE_MIN_S <= d <= IDLE_MAX_S:
            continue
        if all(abs(g - round(g / d) * d) <= IDLE_TOL_S + IDLE_DRIFT_S * round(g / d)
               for g in gaps):
            best = d
            break
    if best is None:
        return None
    ks = [round(g / best) for g in gaps]
    return sum(g * k for g, k in zip(gaps, ks)) / sum(k * k for k in ks)


def estimate_entries(facts: LogFacts, m: SpanMarks, offset: float) -> None:
    """E of the requests without a span: the Received lines are in arrival order, so such
    a request arrived between the spanned ones before and after it in the file; its
    arrival is put in between (evenly by file position, inside its logged second where
    that fits) and E a typical arrival-to-entry lag (the spans' median E - a) after it."""
    reqs = facts.requests
    arr = [r.span.start - offset if ok else None for r, ok in zip(reqs, m.has_span)]
    lags = sorted(e - a for e, a in zip(m.entry, arr) if a is not None)
    lag = lags[len(lags) // 2]
    known = [i for i, a in enumerate(arr) if a is not None]
    for i, r in enumerate(reqs):
        if m.has_span[i]:
            continue
        k = bisect.bisect_left(known, i)
        p = known[k - 1] if k > 0 else None
        q = known[k] if k < len(known) else None
        if p is not None and q is not None:
            t = arr[p] + (arr[q] - arr[p]) * (i - p) / (q - p)  # type: ignore[operator]
        else:
            t = arr[p if p is not None else q]  # type: ignore[index]
        if r.time is not None:
            t = min(max(t, r.time), r.time + 0.999)  # type: ignore[type-var]
        m.entry[i] = t + lag  # type: ignore[operator]


def agreement(run: Run, rebuilt: Rebuilt, marks: SpanMarks) -> int:
    """Requests whose first scheduling step starts at their span's S (to SAME_S). (Not the
    first tokens: snapped_replay ends those steps at F by construction.)"""
    clock = run.clock
    admit: dict[str, int] = {}
    for k, rec in enumerate(run.steps):
        for a in rec.admitted:
            admit.setdefault(a.request, k)
    n = 0
    for i, spec in enumerate(rebuilt.workload.requests[:len(marks.entry)]):
        a = admit.get(spec.id)
        n += a is not None and abs(clock[a] - marks.scheduled[i]) <= SAME_S
    return n


@without_cyclic_gc
def snapped_replay(rebuilt: Rebuilt, facts: LogFacts, profile: Profile, model: StepTimeModel,
                   marks: SpanMarks, anchors: bool = True) -> Run:
    """The engine driven by the model's clock snapped to the spans' boundaries; request k
    enters at the first step starting at or after its E (ties: file order). `anchors`: a
    step that gives a request its first or last token ends at that span's F or L (the
    replay's own events re-anchor the clock, so it does not drift where boundaries are
    sparse)."""
    entry, bounds = marks.entry, marks.bounds
    ends: dict[str, float] = {}  # request id -> F (until its first token)
    lasts: dict[str, float] = {}  # request id -> L
    for i, spec in enumerate(rebuilt.workload.requests[:len(entry)] if anchors else ()):
        if not marks.has_span[i]:
            continue
        ends[spec.id] = marks.first_token[i]
        last = marks.last_token[i]
        if last is not None:
            lasts[spec.id] = last
    shortest = SNAP_SHORTEST_FRAC * model.dt(1, 1)
    eng = make_engine(rebuilt.workload, profile)
    order = sorted(range(num_requests(rebuilt.workload)), key=lambda k: (entry[k], k))
    pending = 0
    clock = entry[order[0]] if order else 0.0
    ab = aborts(facts)
    ai = 0
    steps: list = []
    starts: list[float] = []
    limit = step_limit(rebuilt.workload)
    idle_s = marks.idle_s
    while not eng.done and eng.step_index < limit:
        if not eng.has_work() and pending < len(order):
            nxt_entry = entry[order[pending]]
            if idle_s and steps and nxt_entry > clock + SAME_S:
                # the run-dry engine steps, empty, on its grid until the entry's step
                for _ in range(round((nxt_entry - clock) / idle_s)):
                    if eng.step_index >= limit:
                        break
                    steps.append(eng.step())
                    starts.append(clock)
                    clock += idle_s
            clock = max(clock, nxt_entry)
        while ai < len(ab) and ab[ai][0] <= clock:
            eng.abort(ab[ai][1])
            ai += 1
        due = []
        while pending < len(order) and entry[order[pending]] <= clock + SAME_S:
            due.append(order[pending])
            pending += 1
        for k in sorted(due):  # one step's arrivals queue in file order (their stamps tie)
            eng.submit(k)
        if not due and not eng.has_work() and pending >= len(order):
            break
        rec = eng.step()
        starts.append(clock)
        steps.append(rec)
        anchor = None
        for rid in rec.first_tokens:
            anchor = ends.pop(rid, anchor)
        for rid in rec.finished:
            anchor = lasts.get(rid, anchor)
        if anchor is not None and anchor > clock:
            clock = anchor
            continue
        # (a step that schedules nothing, the one after a run's last finish, is as long as
        # an idle one where the spans show the idle grid)
        d = idle_s if idle_s and not rec.num_scheduled_tokens else model.dt_record(rec)
        nxt = clock + d
        tol = min(SNAP_FRAC * d, shortest)
        i = bisect.bisect_right(bounds, clock + SAME_S)
        best = None
        for b in bounds[i:i + 8]:  # the boundaries just after this step's start
            if b > nxt + tol:
                break
            if abs(b - nxt) <= tol and (best is None or abs(b - nxt) < abs(best - nxt)):
                best = b
        clock = best if best is not None else nxt
    if not eng.done:
        eng.stop()
    return _finish(eng, rebuilt, steps, starts, clock, model, (0.0, 0.0), None)


def scaled(m: StepTimeModel, k: float) -> StepTimeModel:
    return StepTimeModel(m.overhead_s * k, m.per_token_s * k, m.per_request_s * k,
                         m.per_context_token_s * k, m.token_floor)


def span_placement(rebuilt: Rebuilt, facts: LogFacts, fmt: LogFormat, profile: Profile,
                   model: StepTimeModel, marks: SpanMarks,
                   fixed_model: bool = False) -> tuple[Run, int]:
    """The snapped replay's rounds from the model given, with and without the token
    anchors, and (while fewer than GOOD_ENOUGH agree) from it scaled (every request
    spanned), then each of these refitted over a finer grid of token floors: the run that agrees with the most spans wins, ties the first. Returns it and
    its agreement."""
    starts = [(model, True, False), (model, False, False)]
    if not fixed_model and all(marks.has_span):  # (sampled: the estimates, not the model,
        # keep the others from agreeing; other starts cost time and change little)
        starts += [(scaled(model, k), a, False) for k in SCALES for a in (True, False)]
    if not fixed_model:  # the same, refitted over a finer grid of token floors
        starts += [(m, a, True) for m, a, _ in starts]
    best: tuple[int, Run] | None = None
    for m, anchors, fine in starts:
        if best is not None and best[0] >= GOOD_ENOUGH * sum(marks.has_span):
            break
        alt = _rounds(rebuilt, facts, fmt, profile, m, marks, fixed_model, anchors, fine)
        if best is None or alt[0] > best[0]:
            best = alt
    assert best is not None
    return best[1], best[0]


def refitted(rebuilt: Rebuilt, facts: LogFacts, fmt: LogFormat, profile: Profile,
             model: StepTimeModel, marks: SpanMarks, anchors: bool) -> tuple[Run, int]:
    """One start of span_placement: the snapped replay from `model`, refitted on the spans'
    windows over the fine grid of token floors; (run, agreement)."""
    ag, run = _rounds(rebuilt, facts, fmt, profile, model, marks, False, anchors, True)
    return run, ag


def _rounds(rebuilt: Rebuilt, facts: LogFacts, fmt: LogFormat, profile: Profile,
            model: StepTimeModel, marks: SpanMarks, fixed_model: bool,
            anchors: bool, fine: bool = False) -> tuple[int, Run]:
    """The snapped replay, its step-time model refitted on the spans' windows a few
    rounds; the round that agrees with the most spans (agreement) wins, ties the earlier."""
    run = snapped_replay(rebuilt, facts, profile, model, marks, anchors)
    best = (agreement(run, rebuilt, marks), run)
    for _ in range(0 if fixed_model else FIT_ROUNDS):
        new = regression(run, facts, fmt, fine_floors=fine)
        if new is None:
            break
        again = snapped_replay(rebuilt, facts, profile, new, marks, anchors)
        same = again.arrival_steps == run.arrival_steps
        run = again
        score = agreement(run, rebuilt, marks)
        if score > best[0]:
            best = (score, run)
        if same:
            break
    return best
