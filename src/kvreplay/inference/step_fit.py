"""The one fitter of the step-time model: least squares with non-negative coefficients.

step time = overhead + per token x max(scheduled tokens, floor) + per request x scheduled
            requests + per context token x context tokens

Every kind of evidence that times the engine gives rows of the same form, "these steps took
this many seconds": a stats interval (clock.regression), a timed step (an `Iteration(N)`
line), a request span's window, the step-trace lines' seconds (step_model's row builders).
`segments` sums each row's steps once; `best_fit` solves for each token floor the evidence
can resolve and keeps the best. Callers build the `StepTimeModel` from the coefficients.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Sequence

from kvreplay.replay.records import StepRecord

NVARS = 4  # overhead, per token (with floor), per request, per context token
# Floors a row timing single steps can resolve (a timed step, a span's window, a
# step-trace second); rows as coarse as stats intervals use their format's few floors.
FINE_FLOORS = tuple(range(0, 257, 8)) + (320, 384, 448, 512)


@dataclass(slots=True)
class Segment:
    """A row's steps, summed once: every term but the floored token count, and the busy
    steps' token counts sorted (with prefix sums) for sum(max(tokens, floor)) at any floor.
    An empty step costs the fixed cost only."""

    steps: float
    requests: float
    context: float
    tokens: list[int]
    prefix: list[int]
    y: float  # the seconds the steps took
    w: float = 1.0  # sqrt of the row's weight (its features and seconds scaled by it)

    def token_sum(self, floor: int) -> float:
        k = bisect.bisect_left(self.tokens, floor)  # steps below the floor count as floor
        return float(floor * k + self.prefix[-1] - self.prefix[k])

    def row(self, floor: int, nvars: int = NVARS) -> tuple[float, ...]:
        full = (self.steps, self.token_sum(floor), self.requests, self.context)
        return tuple(self.w * v for v in full[:nvars]) + (self.w * self.y,)


def segments(data: Sequence[tuple[Sequence[StepRecord], float]],
             weights: Sequence[float] | None = None) -> list[Segment]:
    """One `Segment` per (steps, seconds) row; `weights` (mean 1) scale a row's residual."""
    out = []
    for j, (seg, y) in enumerate(data):
        busy = [r for r in seg if r.num_scheduled > 0]
        toks = sorted(r.num_scheduled_tokens for r in busy)
        prefix = [0]
        for t in toks:
            prefix.append(prefix[-1] + t)
        out.append(Segment(float(len(seg)), float(sum(r.num_scheduled for r in busy)),
                           float(sum(r.context_tokens for r in busy)), toks, prefix, y,
                           math.sqrt(weights[j]) if weights is not None else 1.0))
    return out


def fits_by_floor(segs: list[Segment], floors: Sequence[int], nvars: int = NVARS
                  ) -> list[tuple[float, int, list[float]]]:
    """(squared residual, floor, coefficients) for each floor with a feasible fit, in the
    order of `floors`."""
    out = []
    for floor in floors:
        f = nnls_gram([g.row(floor, nvars) for g in segs], nvars)
        if f is not None:
            out.append((max(f[0], 0.0), floor, f[1]))
    return out


def best_fit(segs: list[Segment], floors: Sequence[int], nvars: int = NVARS
             ) -> tuple[float, int, list[float]] | None:
    """The best of `fits_by_floor`: the least residual; of fits within 1e-12 of each other
    the lowest floor (floors ascending)."""
    return best_of(fits_by_floor(segs, floors, nvars))


def best_of(fits: list[tuple[float, int, list[float]]]) -> tuple[float, int, list[float]] | None:
    """The least residual of `fits` (floors ascending); a fit counts as better only by more
    than 1e-12, so of near-equal fits the lowest floor wins."""
    best = None
    for f in fits:
        if best is None or f[0] < best[0] - 1e-12:
            best = f
    return best


def nnls_gram(rows: Sequence[Sequence[float]], nvars: int) -> tuple[float, list[float]] | None:
    """Least squares with non-negative coefficients of the last column on the first
    `nvars`, by trying every subset of free variables (nvars <= 4: at most 15 small solves
    on the Gram matrix, whose sums are taken once) and keeping the best feasible one."""
    g = [[0.0] * (nvars + 1) for _ in range(nvars + 1)]
    for r in rows:
        for i in range(nvars + 1):
            ri = r[i]
            gi = g[i]
            for j in range(i, nvars + 1):
                gi[j] += ri * r[j]
    for i in range(nvars + 1):
        for j in range(i):
            g[i][j] = g[j][i]
    yy = g[nvars][nvars]
    best = None
    for mask in range(1, 1 << nvars):
        idx = [i for i in range(nvars) if mask >> i & 1]
        sol = _solve([[g[i][j] for j in idx] for i in idx], [g[i][nvars] for i in idx])
        if sol is None or any(v < 0 for v in sol):
            continue
        coef = [0.0] * nvars
        for i, v in zip(idx, sol):
            coef[i] = v
        err = yy - 2 * sum(coef[i] * g[i][nvars] for i in range(nvars)) + sum(
            coef[i] * coef[j] * g[i][j] for i in range(nvars) for j in range(nvars))
        if best is None or err < best[0] - 1e-15:
            best = (err, coef)
    return best


def _solve(a: list[list[float]], y: list[float]) -> list[float] | None:
    n = len(y)
    m = [row[:] + [y[i]] for i, row in enumerate(a)]
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[piv][col]) < 1e-18:
            return None
        m[col], m[piv] = m[piv], m[col]
        for r in range(n):
            if r != col:
                f = m[r][col] / m[col][col]
                for k in range(col, n + 1):
                    m[r][k] -= f * m[col][k]
    return [m[i][n] / m[i][i] for i in range(n)]
