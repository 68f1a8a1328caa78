"""The step-time model a what-if extrapolates with: each term fitted apart, with its spread.

step time = overhead + max(weight read, per token x scheduled tokens)
            + per request x scheduled requests + per context token x context tokens

(`StepTimeModel`: the weight read is per_token_s x token_floor.) Fitted on what the log
gives about the replay's own steps (`Replay.steps`, never recomputed):
* `Iteration(N)` lines: every step that scheduled a token has its elapsed time; the N-th
  line is the N-th such step of the replay (exact when the replay matched the lines), plus
  the cost between steps the replay's clock shows. One row per step.
* request spans (OTLP), where the log has them: the steps each span's engine stamps bound;
* step-trace lines (kvreplay's plugin), each written as its step ends and stamped with the
  whole second (`stamp_rows`): the steps after the last line of one second up to the last
  line of a later one took the seconds between, when the engine was busy throughout;
* and the stats lines: the steps between two anchored lines took the lines' interval; an
  interval in which the engine ran out of work (idle, or the run's end) says only that its
  steps took less, so it is left out. One row per interval.
At most MAX_ROWS per-step rows are fitted (an even sample: 0.8 s for 200,000 steps).
Non-negative least squares for each weight-read floor tried; the best is the model. Its
spread: the floors whose fit is about as good (residual within the noise), and for each the
coefficients drawn from the fit's covariance (sigma^2 (X'X)^-1 over the free terms),
non-negative. `members` are those models, for what-if intervals. Deterministic (seeded).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any, TYPE_CHECKING

from kvreplay.inference.clock import StepTimeModel
from kvreplay.inference.step_fit import FINE_FLOORS, NVARS, best_of, fits_by_floor, segments
from kvreplay.replay.records import StepRecord

if TYPE_CHECKING:
    from kvreplay.inference.formats import LogFormat
    from kvreplay.inference.facts import LogFacts


MAX_ROWS = 5000  # per-step rows fitted at most (a day's log has millions of steps)
STAMPS = "step-trace lines' seconds"


@dataclass(slots=True)
class FittedModel:
    model: StepTimeModel
    source: str  # "iteration lines" | "stats lines" | STAMPS ...
    rows: int
    rms_s: float  # residual per row (a step, or a stats interval)
    members: list[StepTimeModel] = field(default_factory=list)
    # the batch the fit saw: scheduled requests per step (min, max over rows' means)
    batch_range: tuple[float, float] = (0.0, 0.0)
    # the residual per row relative to a row's mean time (a timed step, a stats interval, a
    # span's window, a step-trace second): what the model's form, the lines' read noise
    # and the inferred steps miss, which no draw of the coefficients shows
    form_error: float = 0.0


def iteration_rows(steps: list[StepRecord], facts: LogFacts, clock: list[float] | None
                   ) -> list[tuple[list[StepRecord], float]] | None:
    """(steps, seconds) per timed step; None unless every busy step has its line."""
    its = sorted((it for it in getattr(facts, "iterations", None) or [] if not it.dummy),
                 key=lambda it: it.step)
    busy = [k for k, r in enumerate(steps) if r.num_scheduled_tokens > 0]
    if not its or len(its) != len(busy):
        return None
    # the cost between steps (scheduling, IPC): what the clock adds to the logged time,
    # read where a step follows one of the same busy stretch
    gaps = []
    if clock is not None and len(clock) == len(steps):
        for k, it in zip(busy, its):
            if k + 1 < len(steps) and steps[k + 1].num_scheduled_tokens > 0 and not steps[k + 1].arrivals:
                gaps.append(clock[k + 1] - clock[k] - it.elapsed_ms / 1000.0)
    c = max(0.0, sorted(gaps)[len(gaps) // 2]) if gaps else 0.0
    return [([steps[k]], it.elapsed_ms / 1000.0 + c) for k, it in zip(busy, its)]


def stats_rows(steps: list[StepRecord], facts: LogFacts, fmt: LogFormat
               ) -> list[tuple[list[StepRecord], float]]:
    from kvreplay.inference.lines import spans, token_anchors

    class _Run:  # what token_anchors reads
        pass

    run = _Run()
    run.steps = steps  # type: ignore[attr-defined]
    anchors = [(i, a) for i, a in enumerate(token_anchors(run, facts, fmt)) if a is not None]
    sp = spans(facts, fmt)
    last = len(steps) - 1
    out = []
    for (i0, a), (i1, b) in zip(anchors, anchors[1:]):
        if b <= a or b >= last:
            continue
        seg = steps[a + 1: b + 1]
        if any(r.num_running + r.num_waiting == 0 for r in steps[a: b + 1]):
            continue  # the engine ran dry in the interval: its steps took less than it
        out.append((seg, sum(sp[i0 + 1: i1 + 1])))
    return out


def span_rows(steps: list[StepRecord], facts: LogFacts) -> list[tuple[list[StepRecord], float]]:
    """Request spans (OTLP): the steps from a request's first scheduling to its first token,
    and from there to its last, took what the engine's monotonic stamps say
    (spans.span_windows)."""
    if not any(getattr(r, "span", None) is not None for r in facts.requests):
        return []
    from kvreplay.inference.spans import span_windows

    class _Run:
        pass

    run = _Run()
    run.steps = steps  # type: ignore[attr-defined]
    return [(steps[a: b + 1], dur) for a, b, dur in span_windows(run, facts) if b >= a]


def restart(steps: list[StepRecord], k: int) -> bool:
    """Step k waited for a request: the step before it left nothing running or waiting and
    k takes arrivals. (EngineCore sleeps with nothing to do; a step after it without
    arrivals ran at once, as the empty step after the last finish does.)"""
    return (k > 0 and bool(steps[k].arrivals)
            and steps[k - 1].num_running + steps[k - 1].num_waiting == 0)


def stamp_rows(steps: list[StepRecord], stamps: list[float], model: Any = None
               ) -> list[tuple[list[StepRecord], float]]:
    """(steps, seconds) from the whole-second stamps of the step-trace lines: step k's line
    is written as its iteration ends (update_from_output), stamped `stamps[k]`. The last
    step a stamped S ended in the next step's time before S + 1 when the engine went on at
    once (the next step's end is stamped later), so the steps after it up to the last step
    b stamped S' > S took S' - S seconds, to a step at either end; with a `model`, its
    durations of the steps crossing the two seconds' ends centre that:
    S' - S + (dt[a + 1] - dt[b + 1]) / 2 (stamp_weights: how well each row is known). A
    row with a `restart` among steps a + 1 .. b + 1 (the engine ran dry and waited for a
    request) says only that its steps took less: left out, as is the run's last step."""
    return [(seg, y) for seg, y, _ in _stamp_rows(steps, stamps, model)]


def stamp_weights(steps: list[StepRecord], stamps: list[float], model: Any) -> list[float]:
    """Each stamp row's weight (mean 1): 1 / the variance of its seconds, what the steps
    crossing its two ends leave open (uniform over each: dt^2 / 12), plus 1 ms^2."""
    w = [1.0 / v for _, _, v in _stamp_rows(steps, stamps, model)]
    mean = sum(w) / len(w) if w else 1.0
    return [x / mean for x in w]


def _stamp_rows(steps: list[StepRecord], stamps: list[float], model: Any
                ) -> list[tuple[list[StepRecord], float, float]]:
    n = min(len(steps), len(stamps))
    lasts = [k for k in range(n) if k + 1 == n or stamps[k + 1] != stamps[k]]
    out = []
    for a, b in zip(lasts, lasts[1:]):
        if b >= n - 1 or stamps[b] <= stamps[a]:
            continue  # the run's end, or a clock that went back
        if any(restart(steps, k) for k in range(a + 1, b + 2)):
            continue
        y, var = float(stamps[b] - stamps[a]), 1e-6
        if model is not None:
            da, db = model.dt_record(steps[a + 1]), model.dt_record(steps[b + 1])
            y += (da - db) / 2
            var += (da * da + db * db) / 12
        out.append((steps[a + 1: b + 1], y, var))
    return out


def _model(c: list[float], floor: int) -> StepTimeModel:
    return StepTimeModel(overhead_s=c[0], per_token_s=c[1], per_request_s=c[2],
                         per_context_token_s=c[3], token_floor=floor if c[1] > 0 else 0)


def fit_step_model(steps: list[StepRecord], facts: LogFacts, fmt: LogFormat, clock: list[float] | None,
                   *, draws: int = 6, seed: int = 0,
                   stamps: list[float] | None = None) -> FittedModel | None:
    """The model of the replay's `steps` (Replay.steps) on what `facts` times (module
    docstring), with `draws` models the log allows; None with fewer rows than terms + 1.
    `stamps`: a step-trace log's line stamps (Replay.stamps; `facts` None there)."""
    data = iteration_rows(steps, facts, clock) if facts is not None else None
    source = "iteration lines"
    if stamps is not None:
        # twice: the first fit's durations of the steps crossing each row's ends centre
        # and weigh the rows of the second
        first = _fit(stamp_rows(steps, stamps), STAMPS, 0, seed)
        if first is None:
            return None
        return _fit(stamp_rows(steps, stamps, first.model), STAMPS, draws, seed,
                    stamp_weights(steps, stamps, first.model))
    if data is None:
        data, source = stats_rows(steps, facts, fmt), "stats lines"
        spans = span_rows(steps, facts)
        if spans:
            data, source = data + spans, "stats lines and request spans"
    return _fit(data, source, draws, seed)


def _fit(data: list[tuple[list[StepRecord], float]], source: str, draws: int, seed: int,
         weights: list[float] | None = None) -> FittedModel | None:
    """NNLS over the floors, the best fit and `draws` models about as good (weighted rows:
    `weights`, mean 1, so the residual stays in seconds a row)."""
    if len(data) < NVARS + 1:
        return None
    if len(data) > MAX_ROWS:  # (exact per-step rows: an even sample pins the terms as well)
        every = -(-len(data) // MAX_ROWS)
        data = data[::every]
        weights = weights[::every] if weights is not None else None
    segs = segments(data, weights)
    fits = fits_by_floor(segs, FINE_FLOORS)
    if not fits:
        return None
    err, floor, coef = best_of(fits)  # type: ignore[misc]
    fits.sort(key=lambda x: (x[0], x[1]))
    m = len(segs)
    dof = max(1, m - NVARS)
    sigma2 = err / dof
    means = sorted(sum(r.num_scheduled for r in seg) / len(seg) for seg, _ in data if seg)
    lo, hi = (means[len(means) // 20], means[-1 - len(means) // 20]) if means else (0.0, 0.0)
    fm = FittedModel(_model(coef, floor), source, m, math.sqrt(err / m), batch_range=(lo, hi))
    # what the fit misses per row, relative to a row's time: it widens every throughput
    # interval (audit/whatif_replays.py). Stats-line rows too: their draws alone held vLLM's
    # throughput in 159 of 200 rows of the what-if corpus, with it in 184 (docs/accuracy.md)
    fm.form_error = fm.rms_s / max(1e-12, sum(y for _, y in data) / m)
    # floors about as good: residual within what noise of this size gives (F-like, 2 sigma)
    near = [f for f in fits if f[0] <= err * (1.0 + 4.0 / dof) + 1e-15][:8]
    rng = random.Random(seed)
    members = []
    for k in range(draws):
        _, fl, c = near[k % len(near)]
        members.append(_model(_draw([g.row(fl) for g in segs], c, sigma2, rng), fl))
    fm.members = members
    return fm


def _draw(rows: list[tuple[float, ...]], coef: list[float], sigma2: float,
          rng: random.Random) -> list[float]:
    """coef + a draw of N(0, sigma^2 (X'X)^-1) over the free (non-zero) terms, clipped at 0."""
    idx = [i for i in range(NVARS) if coef[i] > 0]
    if not idx or sigma2 <= 0:
        return list(coef)
    g = [[sum(r[i] * r[j] for r in rows) for j in idx] for i in idx]
    d = [1.0 / math.sqrt(g[a][a]) if g[a][a] > 0 else 1.0 for a in range(len(idx))]
    inv = _inverse([[g[a][b] * d[a] * d[b] for b in range(len(idx))] for a in range(len(idx))])
    if inv is None:
        return list(coef)
    cov = [[inv[a][b] * d[a] * d[b] for b in range(len(idx))] for a in range(len(idx))]
    low = _cholesky([[sigma2 * v for v in row] for row in cov])
    if low is None:
        return list(coef)
    z = [rng.gauss(0.0, 1.0) for _ in idx]
    out = list(coef)
    for a, i in enumerate(idx):
        out[i] = max(0.0, coef[i] + sum(low[a][b] * z[b] for b in range(a + 1)))
    return out


def _inverse(a: list[list[float]]) -> list[list[float]] | None:
    n = len(a)
    m = [row[:] + [1.0 if i == j else 0.0 for j in range(n)] for i, row in enumerate(a)]
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[piv][col]) < 1e-300:
            return None
        m[col], m[piv] = m[piv], m[col]
        p = m[col][col]
        m[col] = [v / p for v in m[col]]
        for r in range(n):
            if r != col and m[r][col]:
                f = m[r][col]
                m[r] = [v - f * w for v, w in zip(m[r], m[col])]
    return [row[n:] for row in m]


def _cholesky(a: list[list[float]]) -> list[list[float]] | None:
    n = len(a)
    low = [[0.0] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1):
            s = a[i][j] - sum(low[i][k] * low[j][k] for k in range(j))
            if i == j:
                if s <= 0:
                    s = 0.0
                low[i][j] = math.sqrt(s)
            else:
                low[i][j] = s / low[j][j] if low[j][j] > 0 else 0.0
    return low
