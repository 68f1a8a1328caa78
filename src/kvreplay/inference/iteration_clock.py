"""Stage 4 with iteration lines: the wall clock of a replay whose steps the log timed.

Consumes: the replayed steps, the step -> Iteration line map (iterations.py), `LogFacts`.
Produces: the windows the lines give the one wall clock (wall_clock.py) and, from it, the
start of every step; and a `StepTimeModel` fitted to the logged durations
(for what-if runs, which have no lines).
"""

from __future__ import annotations

from kvreplay.inference.clock import StepTimeModel
from kvreplay.inference.facts import LogFacts
from kvreplay.inference.formats import LogFormat
from kvreplay.inference.step_fit import best_fit, segments
from kvreplay.inference.wall_clock import ClockWindow, WallClock, wall_clock
from kvreplay.replay.records import StepRecord

OVERHEADS_S = (0.0, 0.0002, 0.0005, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.008)


def iteration_clock(steps: list[StepRecord], line_of_step: dict[int, int], facts: LogFacts,
                    fmt: LogFormat) -> tuple[list[float], float, StepTimeModel, float]:
    """Wall-clock start of every step by the one clock (wall_clock.wall_clock), from the
    logged model time of each step plus a fixed cost between steps (scheduling, IPC),
    chosen so that each line's second holds the end of its step; each busy span (the engine
    idle before it) is placed on its own, after the second of the request that starts it.
    Also the step-time model fitted to the logged durations (for what-if), and the cost
    between steps."""
    by_n = {it.step: it for it in facts.iterations}
    elapsed = [0.0] * len(steps)
    for st, n in line_of_step.items():
        it = by_n.get(n)
        if it is not None and st < len(steps):
            elapsed[st] = it.elapsed_ms / 1000.0
    wins = clock_windows(steps, line_of_step, facts)
    restarts = busy_restarts(steps)
    best: tuple[tuple[int, float], float, WallClock] | None = None
    for c in OVERHEADS_S:
        clock = wall_clock([e + c for e in elapsed], windows=wins, restarts=restarts)
        score = (clock.violated, -clock.slack)
        if best is None or score < best[0]:
            best = (score, c, clock)
    assert best is not None
    _, c, clock = best
    model = _duration_model(steps, elapsed, c, fmt)
    return clock.starts, clock.end, model, c


def busy_restarts(steps: list[StepRecord]) -> list[int]:
    """The steps that start a busy span: the engine had nothing before them."""
    return [k for k in range(1, len(steps))
            if steps[k - 1].num_running == 0 and steps[k - 1].num_waiting == 0
            and steps[k].arrivals]


def clock_windows(steps: list[StepRecord], line_of_step: dict[int, int],
                  facts: LogFacts) -> list[ClockWindow]:
    """What the lines say of the clock: 0.26+ the API server writes a step's Iteration line
    as its output arrives (spec vllm-log-formats.md 4.3), so the line's whole second holds
    the step's end; a busy span's first step starts no earlier than the logged second of a
    request it takes."""
    by_n = {it.step: it for it in facts.iterations}
    arrival_sec: dict[str, float] = {r.log_id: r.time for r in facts.requests if r.time is not None}
    out = []
    for k in range(len(steps)):
        n = line_of_step.get(k)
        it = by_n.get(n) if n is not None else None
        if it is not None and it.time is not None:
            out.append(ClockWindow(k, "end", it.time, it.time + 1.0))
    for a in [0, *busy_restarts(steps)] if steps else []:
        for rid in steps[a].arrivals:
            t = arrival_sec.get(rid)
            if t is not None:
                out.append(ClockWindow(a, "start", t, float("inf")))
    return out


def _duration_model(steps: list[StepRecord], elapsed: list[float], c: float,
                    fmt: LogFormat) -> StepTimeModel:
    """Least squares (non-negative) of each logged step duration on the step-time
    model's terms, for each token floor the format tries."""
    data = [([r], e + c) for r, e in zip(steps, elapsed) if r.num_scheduled_tokens > 0 and e > 0]
    best = best_fit(segments(data), fmt.token_floors) if len(data) >= 4 else None
    if best is None:
        return StepTimeModel(overhead_s=c + 0.005)
    _, floor, k = best
    return StepTimeModel(overhead_s=k[0], per_token_s=k[1], per_request_s=k[2],
                         per_context_token_s=k[3], token_floor=floor if k[1] > 0 else 0)
