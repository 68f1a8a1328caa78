"""The one uncertainty summary: an ensemble of replays a log allows -> `Uncertainty`.

Every ensemble (the stats lines' in ensemble.py, the Iteration lines' in
iteration_ensemble.py, the prefix sharings' in span_prefix.py, each drawing its members as
its evidence allows) weighs its members by how well each reproduces that evidence
(`noise_weights`: the likelihood under Gaussian read noise) and summarizes them here
(`summarize`): the count, recomputed tokens and recompute ratio as medians with 90%
intervals, the preemptions per stats interval, each request's probability of having been
preempted, and (`Uncertainty.assign`) each row's probability. One definition of each.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

from kvreplay.replay.records import PreemptionRecord

if TYPE_CHECKING:
    from kvreplay.inference.runs import Run

TOL_STEPS = 5  # a preemption "found again": same victim within this many steps
NOISE_K = 4.0  # the weights' temperature in units of the best member's loss per line
NOISE_FLOOR = 0.5  # ... at least this (a best member that fits every line exactly)
ESS_MIN = 0.2  # ... and high enough that this share of the members stays effective
LEAD_BELOW = 0.5  # a row with a lower probability is a lead, not a fact


@dataclass(slots=True)
class Member:
    weight: float
    sse: float  # loss + INEXACT_COST * inexact
    loss: float  # the anchored loss summed over the stats lines
    inexact: int  # stats lines the exact check misses
    count: int
    recomputed: int
    processed: int
    by_victim: dict[str, list[int]]
    windows: list[int]
    # the member's arrival step per request (what-if runs re-run it under other settings)
    arrival_steps: array | None = None
    # what it drew of its own workload (member_workload rebuilds it): prompt lengths after
    # the shared prefix, priorities; None where it kept the replay's
    prompt_lens: tuple[int, ...] | None = None
    priorities: tuple[int, ...] | None = None
    shared_prefix: int | None = None  # ... and the common prefix (None: the Uncertainty's)
    # the preemption counter's disagreement with it over the scrapes of the same server
    # (evidence_metrics.counter_loss; 0 without scrapes)
    counter_loss: float = 0.0
    counted_after: int = 0  # ... and its preemptions the counter counts after its last scrape


@dataclass(slots=True)
class Uncertainty:
    samples: int
    seed: int
    effective_samples: float
    preemptions: dict[str, int]
    recomputed_tokens: dict[str, int]
    recompute_ratio: dict[str, float]
    windows: list[dict[str, Any]]
    requests: list[dict[str, Any]]
    headline: str = ""  # what to trust, what not, how to make it exact (headline())
    fit_per_line: float = 0.0  # the best member's SSE per stats line
    poor_fit: bool = False  # no member reproduces the stats lines (>= POOR_FIT per line)
    members: list[Member] = field(default_factory=list, repr=False)
    # a member that agrees far better with the stats lines than the placed run (< BETTER x
    # its SSE): the replay to show instead; None when the placed run is the best
    representative: Run | None = field(default=None, repr=False)
    row_map: Sequence[tuple[float, float]] | None = field(default=None, repr=False)
    shared_prefix: int = 0  # the tokens every estimated prompt shares (member_workload)
    weighted_by: str = "the stats lines"  # the evidence each member's weight measures
    # preemptions the evidence itself shows, whatever the members say (e.g. the recomputes
    # Iteration lines show): the count's interval never goes below it; 0 when none
    count_floor: int = 0
    # with scrapes: the preemptions counted after the last scrape (median, low, high)
    counted_after: dict[str, int] | None = None

    def assign(self, pre: Sequence[PreemptionRecord]) -> None:
        """Each row's probability: the weighted share of members that preempt its victim
        within TOL_STEPS of its step."""
        total = sum(m.weight for m in self.members)
        for p in pre:
            hit = sum(m.weight for m in self.members
                      if any(abs(s - p.step) <= TOL_STEPS for s in m.by_victim.get(p.victim, ())))
            q = hit / total
            if self.row_map is not None:
                q = min(calibrated(q, self.row_map), self.p_preempted(p.victim))
            p.probability = round(q, 3)

    def to_json(self) -> dict[str, Any]:
        return {"headline": self.headline, "samples": self.samples, "seed": self.seed,
                "fit_per_line": round(self.fit_per_line, 2), "poor_fit": self.poor_fit,
                "effective_samples": round(self.effective_samples, 1),
                "preemptions": self.preemptions, "recomputed_tokens": self.recomputed_tokens,
                "recompute_ratio": self.recompute_ratio, "windows": self.windows,
                "requests": self.requests, "weighted_by": self.weighted_by,
                **({"count_floor": self.count_floor} if self.count_floor else {})}

    def p_preempted(self, request: str) -> float:
        return next((r["p_preempted"] for r in self.requests if r["id"] == request), 0.0)


def request_probabilities(members: Sequence[Member], total: float,
                          p_of: Callable[[float], float] | None = None) -> list[dict[str, Any]]:
    """Each request some member of weight preempts: `p_preempted`, the weighted share of
    members that preempt it (mapped by `p_of`, e.g. calibrated, the expected count scaled
    with it), and `expected_preemptions`; the most likely first."""
    reqs = []
    for rid in dict.fromkeys(v for m in members for v in m.by_victim):
        raw = sum(m.weight for m in members if rid in m.by_victim) / total
        if raw <= 0.0:
            continue  # only members of no weight preempt it
        e = sum(m.weight * len(m.by_victim.get(rid, ())) for m in members) / total
        p = raw if p_of is None else p_of(raw)
        reqs.append({"id": rid, "p_preempted": round(p, 3),
                     "expected_preemptions": round(e if p_of is None else e * p / raw, 3)})
    reqs.sort(key=lambda r: (-r["p_preempted"], -r["expected_preemptions"], r["id"]))
    return reqs


def ess(w: Sequence[float]) -> float:
    return sum(w) ** 2 / sum(x * x for x in w)


def calibrated(p: float, knots: Sequence[tuple[float, float]]) -> float:
    """A raw ensemble share through a calibration map; 0 stays 0 (no replay the log
    allows has it)."""
    if p <= 0.0:
        return 0.0
    if p <= knots[0][0]:
        return knots[0][1]
    for (x0, y0), (x1, y1) in zip(knots, knots[1:]):
        if p <= x1:
            return y0 + (y1 - y0) * (p - x0) / (x1 - x0)
    return knots[-1][1]


def noise_weights(sse: Sequence[float], lines: int,
                  counter: Sequence[float] | None = None) -> list[float]:
    """exp(-(SSE - best) / 2T): the stats lines' likelihood under Gaussian read noise whose
    variance is estimated from the best member's residual (T = NOISE_K x its SSE per line,
    at least NOISE_FLOOR). Where every member misfits alike (estimated prompts, a model
    that cannot hit the lines) the weights stay broad; where one member fits far better
    than the rest it takes most of the weight, but never all: T is raised until ESS_MIN of
    the members stay effective (the members cover what the log allows only coarsely, and
    one lucky draw is not the truth). Calibrated on rendered logs (docs/accuracy.md).
    `counter`: each member's counter loss (the scrapes' preemption counter,
    evidence_metrics.counter_loss), a second, independent likelihood exp(-loss / 2) that
    multiplies the stats lines' (the ESS floor then applies to the product)."""
    best = min(sse)
    t = NOISE_K * max(NOISE_FLOOR, best / max(1, lines))
    if counter is None or not any(counter):
        return temper(sse, t, ESS_MIN)
    return temper([x / t + c for x, c in zip(sse, counter)], 1.0, ESS_MIN)


def temper(sse: Sequence[float], t: float, share: float) -> list[float]:
    """exp(-(SSE - best) / 2T) with T = `t`, or higher, the lowest that keeps `share` of
    the members effective (ESS)."""
    best = min(sse)
    n = len(sse)

    def at(t: float) -> list[float]:
        return [math.exp(-(x - best) / (2.0 * t)) for x in sse]

    if n > 1 and ess(at(t)) < share * n:
        lo, hi = t, 1e12
        for _ in range(80):  # bisection on log T: the ESS grows with T
            mid = math.sqrt(lo * hi)
            if ess(at(mid)) >= share * n:
                hi = mid
            else:
                lo = mid
        t = hi
    return at(t)


def quantiles(values: Sequence[float], weights: Sequence[float]) -> tuple[float, float, float]:
    """Weighted 5%, 50%, 95% quantiles (the lower value at a tie)."""
    pairs = sorted(zip(values, weights))
    total = sum(w for _, w in pairs) or 1.0
    out = []
    for q in (0.05, 0.5, 0.95):
        acc = 0.0
        pick = pairs[-1][0]
        for v, w in pairs:
            acc += w
            if acc >= q * total - 1e-12:
                pick = v
                break
        out.append(pick)
    return out[0], out[1], out[2]


def interval(values: Sequence[float], weights: Sequence[float], digits: int | None = 0,
             widen: float = 0.0, up: float = 0.0, stretch: float = 1.0) -> dict[str, Any]:
    """Median and 90% interval, each side moved out by `widen` x the median (the replay's
    own error the ensemble does not cover, measured: WIDEN); `up` moves that share of the
    low side's pad to the high side (tried for replays that undercount; not used).
    `stretch` scales each side's distance from the median instead (the default-log
    ensemble's widening, default_log.py: its members draw whole workloads, so its spread,
    not its median, sets the scale of what it misses)."""
    lo, med, hi = quantiles(values, weights)
    if stretch != 1.0:
        lo, hi = med - stretch * (med - lo), med + stretch * (hi - med)
    pad_lo, pad_hi = widen * med * (1.0 - up), widen * med * (1.0 + up)
    if digits == 0:
        pad_lo, pad_hi = round(pad_lo), round(pad_hi)
    lo, hi = max(0, lo - pad_lo), hi + pad_hi
    f = (lambda x: int(round(x))) if digits == 0 else (lambda x: round(x, digits or 6))
    return {"median": f(med), "low": f(lo), "high": f(hi)}


def summarize(members: Sequence[Member], w: Sequence[float], *, seed: int, lines: int,
              voters: tuple[Sequence[Member], Sequence[float]] | None = None,
              windows: tuple[Sequence[float], Sequence[float]] | None = None,
              widen: float = 0.0, widen_count: float | None = None,
              p_of: Callable[[float], float] | None = None, **fields: Any) -> Uncertainty:
    """The `Uncertainty` of `members` weighted `w` (member 0: the replay shown). `lines`:
    the log lines the weights measure (the fit per line); `voters`: the members (and
    weights) whose shares give the request and row probabilities, all by default;
    `windows`: the stats intervals' (starts, ends) for the storm timeline, each member's
    `windows` counting its preemptions in them; `widen` moves every interval's sides out by
    that share of its median, `widen_count` the count, recomputed-token and ratio intervals
    instead; `p_of` maps a raw share to a probability (a calibration). `fields`: the rest
    of the `Uncertainty` (representative, row_map, poor_fit, shared_prefix, weighted_by)."""
    wc = widen if widen_count is None else widen_count
    ratios = [m.recomputed / m.processed if m.processed else 0.0 for m in members]
    rows = []
    if windows is not None:
        starts, ends = windows
        for k in range(len(starts)):
            iv = interval([m.windows[k] for m in members], w, widen=widen)
            if k == len(starts) - 1 and iv["high"] == 0:
                continue  # nothing after the last stats line
            rows.append({"start": round(starts[k], 3), "end": round(ends[k], 3), **iv})
    vm, vw = voters if voters is not None else (members, w)
    for m, x in zip(vm, vw):
        m.weight = x
    return Uncertainty(
        samples=len(members) - 1, seed=seed, effective_samples=ess(w),
        preemptions=interval([m.count for m in members], w, widen=wc),
        recomputed_tokens=interval([m.recomputed for m in members], w, widen=wc),
        recompute_ratio=interval(ratios, w, digits=4, widen=wc), windows=rows,
        requests=request_probabilities(vm, sum(vw), p_of), members=list(vm),
        fit_per_line=min(m.sse for m in members) / max(1, lines), **fields)
