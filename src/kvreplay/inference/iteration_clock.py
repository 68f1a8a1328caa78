"""Stage 4 with iteration lines: the wall clock of a replay whose steps the log timed.

Consumes: the replayed steps, the step -> Iteration line map (iterations.py), `LogFacts`.
Produces: the start of every step, and a `StepTimeModel` fitted to the logged durations
(for what-if runs, which have no lines).
"""

from __future__ import annotations

from kvreplay.inference.clock import StepTimeModel
from kvreplay.inference.facts import LogFacts
from kvreplay.inference.formats import LogFormat
from kvreplay.inference.step_fit import best_fit, segments
from kvreplay.replay.records import StepRecord

OVERHEADS_S = (0.0, 0.0002, 0.0005, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.008)


def iteration_clock(steps: list[StepRecord], line_of_step: dict[int, int], facts: LogFacts,
                    fmt: LogFormat) -> tuple[list[float], float, StepTimeModel, float]:
    """Wall-clock start of every step, from the logged model time of each step plus a
    fixed cost between steps (scheduling, IPC), chosen so that each line's second holds
    the end of its step; each busy span (the engine idle before it) is placed on its own,
    after the second of the request that starts it. Also the step-time model fitted to
    the logged durations (for what-if), and the cost between steps."""
    by_n = {it.step: it for it in facts.iterations}
    elapsed = [0.0] * len(steps)
    for st, n in line_of_step.items():
        it = by_n.get(n)
        if it is not None and st < len(steps):
            elapsed[st] = it.elapsed_ms / 1000.0
    arrival_sec: dict[str, float] = {r.log_id: r.time for r in facts.requests if r.time is not None}
    # busy spans: a step starts one when the engine had nothing before it
    spans: list[tuple[int, int]] = []
    start = 0
    for k in range(1, len(steps)):
        prev = steps[k - 1]
        if prev.num_running == 0 and prev.num_waiting == 0 and steps[k].arrivals:
            spans.append((start, k))
            start = k
    if steps:
        spans.append((start, len(steps)))
    best: tuple[tuple[int, float], float, list[float]] | None = None
    for c in OVERHEADS_S:
        dur = [e + c for e in elapsed]
        out = [0.0] * (len(steps) + 1)
        bad, width = 0, 0.0
        for a, b in spans:
            cum, acc = [], 0.0
            for k in range(a, b):
                cum.append(acc)
                acc += dur[k]
            cum.append(acc)
            lo, hi = -1e18, 1e18
            for k in range(a, b):
                n = line_of_step.get(k)
                it = by_n.get(n) if n is not None else None
                if it is None or it.time is None:
                    continue
                end = cum[k + 1 - a]  # written as its output arrives
                lo, hi = max(lo, it.time - end), min(hi, it.time + 1.0 - end)
            for rid in steps[a].arrivals:
                t = arrival_sec.get(rid)
                if t is not None:
                    lo = max(lo, t)
            if lo > 1e17:
                lo = hi = 0.0
            elif hi > 1e17:
                hi = lo + 1.0
            if lo > hi:
                bad += 1
                t0 = (lo + hi) / 2
            else:
                width += hi - lo
                t0 = (lo + hi) / 2
            for k in range(a, b + 1):
                out[k] = t0 + cum[k - a]
        score = (bad, -width)
        if best is None or score < best[0]:
            best = (score, c, out)
    if best is None:
        t0 = facts.requests[0].time if facts.requests and facts.requests[0].time else 0.0
        return [], t0, StepTimeModel(), 0.0
    _, c, out = best
    model = _duration_model(steps, elapsed, c, fmt)
    return out[: len(steps)], out[len(steps)], model, c


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
