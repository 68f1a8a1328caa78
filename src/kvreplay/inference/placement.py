"""Stage 5, placement: the engine step each request entered at.

Consumes: a fitted time-driven run (stage 4b), `LogFacts`, the `LogFormat`. Produces an
`Anchored` replay: arrivals at fixed steps chosen so that the replay agrees with every
ordering fact the log gives (the stats lines' anchors, the access lines, the arrival
seconds), with its wall clock. The iteration: replay -> anchors, completions, clock ->
a window of steps for each arrival (`ArrivalWindow`) -> a step in each window (the one
placer, placer.place) -> replay again. Bursts also
try spacings inside the burst and a short search for stats lines matched exactly.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvreplay.inference.clock import StepTimeModel, clocked, finish_steps, regression
from kvreplay.inference.facts import LogFacts
from kvreplay.inference.log_shape import large_log
from kvreplay.inference.formats import LogFormat
from kvreplay.inference.lines import cum_generated, phase_estimate, token_anchors
from kvreplay.inference.placer import ArrivalWindow, place, step_at
from kvreplay.inference.runs import Run, as_step_replay, step_replay
from kvreplay.inference.verify import anchored_loss, verify

if TYPE_CHECKING:
    from kvreplay.inference.engines import Profile
    from kvreplay.inference.rebuild import Rebuilt


PRECISE_TOL_S = 0.005  # a sub-second stamp's slack: the request reaches the engine a few ms after its line
BURST_GAPS = (0.02, 0.05, 0.1, 0.15, 0.25, 1 / 3, 0.5, 1.0, 2.0)
EXACT_SEARCH_MOVES = 400  # replays a burst's exact-line search may spend
EXACT_SEARCH_MAX_REQUESTS = 64
LARGE_LOG_ROUNDS = 1  # a large log's anchoring rounds after its first replay (log_shape.large_log)


@dataclass(slots=True)
class Anchored:
    """A replay whose arrivals sit at fixed engine steps, and its wall clock."""

    arrival_steps: list[int]
    phase: float  # sub-second phase of the stats lines
    run: Run  # clocked: run.clock is the stretched wall clock
    loss: float
    iterations: int


def windows(run: Run, facts: LogFacts, anchors: list[int | None], clock: list[float],
            use_seconds: bool = True) -> list[ArrivalWindow]:
    """For each arrival, the steps it may enter at (for the one placer, placer.place):
    after the completions and stats lines the log shows before it, before the ones it shows
    after it, inside its logged second."""
    fin_steps = finish_steps(run.steps)
    n = len(run.steps)
    out = []
    first_time = facts.requests[0].time if facts.requests else None
    if first_time is None:
        first_time = float("-inf")
    for idx, r in enumerate(facts.requests):
        lo, hi = 0, n
        by: list[str] = []
        # A request entering at step a was received while step a-1 ran; the access line
        # of a request finished at step f is written once step f has ended, i.e. while
        # step f+1 runs. So a line after finish f means a >= f+2, a line before it a <= f+1
        # (on the log cases' own traces this holds for every arrival; f+1 / f do not).
        c = r.completions_before
        access = False
        if c > 0 and c - 1 < len(fin_steps):
            lo = max(lo, fin_steps[c - 1] + 2)
            access = True
        if c < min(len(fin_steps), len(facts.completions)):
            # the next access line the log shows (none when the access log is off or its
            # lines are response starts: then the replay's finishes bound nothing)
            hi = min(hi, fin_steps[c] + 1)
            access = True
        if access:
            by.append("access lines")
        # A stats line saw the output of its anchor step, not the next one's: a request
        # logged after it entered after that step, one logged before it by the next step.
        i = r.stats_before
        stats = False
        if i > 0 and i - 1 < len(anchors) and anchors[i - 1] is not None:
            lo = max(lo, anchors[i - 1] + 1)  # type: ignore[operator]
            stats = True
        if i < len(anchors) and anchors[i] is not None:
            hi = min(hi, anchors[i] + 1)  # type: ignore[operator]
            stats = True
        if stats:
            by.append("stats lines")
        if use_seconds and r.precise_time is not None:
            slo = step_at(clock, r.precise_time - PRECISE_TOL_S)
            shi = step_at(clock, r.precise_time + PRECISE_TOL_S)
            if max(lo, slo) <= min(hi, shi):
                lo, hi = max(lo, slo), min(hi, shi)
                by.append("sub-second time")
        elif use_seconds and r.time is not None:
            # step 0 lies in the first request's second, whatever the clock says
            slo = 0 if r.time <= first_time else step_at(clock, r.time)
            shi = step_at(clock, r.time + 1.0)
            if max(lo, slo) <= min(hi, shi):
                lo, hi = max(lo, slo), min(hi, shi)
                by.append("arrival second")
        out.append(ArrivalWindow(idx, lo, hi, "+".join(by) or "none"))
    return out


def placed(rebuilt: Rebuilt, facts: LogFacts, fmt: LogFormat, profile: Profile, arrival: list[int],
           model: StepTimeModel, phase: float, iterations: int = 0) -> Anchored:
    """A placement's replay, clocked by the stats lines, and its anchored loss."""
    run = step_replay(rebuilt, facts, profile, arrival, model)
    clocked(run, facts, fmt, phase)
    anchors = token_anchors(run, facts, fmt, cum_generated(run))
    return Anchored(list(arrival), phase, run, anchored_loss(run, facts, fmt, anchors, phase),
                    iterations)


def anchored_replay(rebuilt: Rebuilt, facts: LogFacts, fmt: LogFormat, profile: Profile, init: Run,
                    model: StepTimeModel, *, burst: bool, iterations: int = 6,
                    fixed_model: bool = False, reuse_init: bool = False) -> Anchored:
    """Iterate: replay -> anchors, completions, clock -> arrival windows -> placement.
    Returns the iteration that agrees best with the stats lines. `reuse_init`: `init` is a
    replay of `rebuilt` (not of another rebuild of the workload), so round 0 may reuse it."""
    arrival = [max(a, 0) for a in init.arrival_steps]  # (a cut log: some never arrived)
    base = min(arrival) if arrival else 0
    arrival = [a - base for a in arrival]
    best: Anchored | None = None
    phase = phase_estimate(facts)
    if phase is None:
        # the middle of the second: the guess with the smallest worst-case error
        phase = 0.5
    if large_log(facts):
        iterations = min(iterations, LARGE_LOG_ROUNDS)
    for it in range(iterations + 1):
        # round 0 replays the arrivals `init` ran with: reuse it when it is that replay
        run = (as_step_replay(init, facts, arrival, model) if it == 0 and reuse_init else None) \
            or step_replay(rebuilt, facts, profile, arrival, model)
        new_model = None if fixed_model else regression(run, facts, fmt)
        if new_model is not None:
            model = new_model
            run.model = model
        anchors = token_anchors(run, facts, fmt, cum_generated(run))
        clock = clocked(run, facts, fmt, phase)
        loss = anchored_loss(run, facts, fmt, anchors, phase)
        if best is None or loss <= best.loss:  # ties: the later, more refined placement
            best = Anchored(list(arrival), phase, run, loss, it)
        if it == iterations:
            break
        new = place(windows(run, facts, anchors, clock), clock, burst)
        # Step 0 is the first arrival's step by definition (the engine was idle before);
        # the clock before the first stats line is extrapolated, so do not trust it there.
        if new:
            new[0] = 0
        moved = sum(1 for a, b in zip(new, arrival) if a != b)
        if moved == 0 or (it >= 2 and moved <= 0.002 * len(arrival)):
            break  # (nearly) a fixed point: another round would replay about the same
        arrival = new
    assert best is not None
    return best


def burst_spacing(rebuilt: Rebuilt, facts: LogFacts, fmt: LogFormat, profile: Profile,
                  anchored: Anchored) -> Anchored:
    """A burst is rarely one instant: a client sends its requests a step or two apart.
    Try a few spacings inside each group of requests placed at the same step and keep the
    one that agrees best with the stats lines (ties: the tightest)."""
    base = anchored.arrival_steps
    best = anchored
    for gap in BURST_GAPS:
        arr = []
        k = 0
        for i, a in enumerate(base):
            k = k + 1 if i > 0 and a == base[i - 1] else 0
            arr.append(a + int(k * gap))
        for i in range(1, len(arr)):
            arr[i] = max(arr[i], arr[i - 1])
        cand = placed(rebuilt, facts, fmt, profile, arr, anchored.run.model, anchored.phase,
                      anchored.iterations)
        if cand.loss < best.loss - 1e-9:
            best = cand
    return best


def exact_search(rebuilt: Rebuilt, facts: LogFacts, fmt: LogFormat, profile: Profile,
                 anchored: Anchored) -> Anchored:
    """Inside a burst the log cannot say which step each request came in at: its lines all
    share a second, and the tolerant check (the loss) is often 0 for several spacings. The
    exact check can still tell them apart (verify._exact_agreement): move one arrival at a
    time by a few steps, keep file order and each arrival's window, walk on while no line
    is lost, and take the placement with the most stats lines matched exactly (then the
    lowest loss). Nothing changes unless that beats the placement found so far. Seeded:
    the same log gives the same search."""
    n = len(anchored.arrival_steps)
    if n < 2 or n > EXACT_SEARCH_MAX_REQUESTS or not facts.stats or rebuilt.prompts_estimated:
        return anchored  # (estimated prompts: no line can be matched exactly)
    phase = anchored.phase
    loss = anchored.loss

    def exact_lines(run: Run) -> int:
        return verify(run, facts, fmt, phase, prompts_known=True).exact_lines or 0

    start_exact = exact_lines(anchored.run)  # (its run is clocked already)
    if start_exact >= len(facts.stats):
        return anchored
    run0 = anchored.run
    wins = windows(run0, facts, token_anchors(run0, facts, fmt), run0.clock + [run0.end])
    rng = random.Random(0)
    cur = list(anchored.arrival_steps)
    cur_key = (start_exact, -loss)
    best: tuple[int, float, Anchored] | None = None
    for _ in range(EXACT_SEARCH_MOVES):
        cand = list(cur)
        i = rng.randrange(1, n)
        cand[i] = wins[i].clamp(cand[i] + rng.choice((-3, -2, -1, 1, 2, 3)))
        for j in range(1, n):
            cand[j] = max(cand[j], cand[j - 1])
        if cand == cur:
            continue
        a = placed(rebuilt, facts, fmt, profile, cand, run0.model, phase, anchored.iterations)
        exact = exact_lines(a.run)
        if (exact, -a.loss) >= cur_key:
            cur, cur_key = cand, (exact, -a.loss)
            if best is None or (exact, -a.loss) > (best[0], -best[1]):
                best = (exact, a.loss, a)
            if exact == len(facts.stats) and a.loss <= loss:
                break  # every line matched, no worse by the tolerant check
    if best is None or best[0] <= start_exact:
        return anchored
    return best[2]
