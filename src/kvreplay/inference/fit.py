"""Stage 4b, fit: the step-time model and where in its second each request arrived.

Consumes: a rebuilt workload, `LogFacts`, the `LogFormat`, the scheduler profile.
Produces a `Fit`: the model and placement whose time-driven replay (runs.timed_replay)
agrees best with the stats lines (verify.fit_loss). Each round replays, re-estimates the
output lengths where the format asks for it (outputs.py) and refits the model by
regression over the stats intervals (clock.regression), until nothing changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TYPE_CHECKING

from kvreplay.inference.clock import StepTimeModel, busy_span_model, initial_model, regression
from kvreplay.inference.facts import LogFacts
from kvreplay.inference.log_shape import cut_time, large_log
from kvreplay.inference.formats import LogFormat
from kvreplay.inference.outputs import estimate_output_lengths
from kvreplay.inference.rebuild import Rebuilt, rebuild_workload
from kvreplay.inference.runs import Run, timed_replay
from kvreplay.inference.verify import fit_loss

if TYPE_CHECKING:
    from kvreplay.inference.engines import Profile



@dataclass(slots=True)
class Fit:
    model: StepTimeModel
    placement: tuple[float, float]  # (phase, spread) of arrivals within their second
    loss: float
    run: Run
    rebuilt: Rebuilt
    tried: list[dict[str, Any]] = field(default_factory=list)

    @property
    def spread(self) -> float:
        return self.placement[1]


def first_model(rebuilt: Rebuilt, facts: LogFacts, fmt: LogFormat, profile: Profile) -> StepTimeModel:
    """From the logged throughput (V1), or from how long the log shows the engine busy
    (formats that estimate output lengths: their throughput is per elapsed time)."""
    m = initial_model(facts)
    if not fmt.estimate_output_lengths:
        return m
    run = timed_replay(rebuilt, facts, profile, m, (0.0, 1.0), cut=False,
                       order_window_s=fmt.order_window_s)
    return busy_span_model(run, facts, fmt, cut_time(facts) is not None) or m


# A large log (log_shape.large_log) starts its fit from a model regressed on a replay of its
# first stretch only: this share of its time, and at least this many stats lines. That
# model only decides where the next round's arrivals fall; every later round refits on the
# whole log.
PREFIX_SHARE = 0.125
PREFIX_MIN_LINES = 20


def prefix_end(facts: LogFacts) -> float | None:
    """The wall time a large log's first fit round replays to (None: the whole log)."""
    if facts.first_time is None or facts.last_time is None or not facts.stats:
        return None
    t = facts.first_time + PREFIX_SHARE * (facts.last_time - facts.first_time)
    t = max(t, facts.stats[min(PREFIX_MIN_LINES, len(facts.stats)) - 1].time)
    return t if t < facts.last_time else None


def fit(rebuilt: Rebuilt, facts: LogFacts, fmt: LogFormat, profile: Profile,
        placements: tuple[tuple[float, float], ...], *, model: StepTimeModel | None = None,
        rounds: int | None = None) -> Fit:
    if rounds is None:
        rounds = fmt.fit_rounds if model is None else fmt.fit_rounds_given
    tried: list[dict[str, Any]] = []
    best: Fit | None = None
    out_lens = None  # kept across placements
    m0 = model or first_model(rebuilt, facts, fmt, profile)
    head = None
    if model is None and rounds > 1 and not fmt.estimate_output_lengths and large_log(facts):
        head = prefix_end(facts)
    for placement in placements:
        m = m0
        rb = rebuilt
        if head is not None:
            # a prefix, for a model only: its loss is not comparable with a whole run's
            first = timed_replay(rb, facts, profile, m, placement, stop_after=head,
                                 order_window_s=fmt.order_window_s)
            m = regression(first, facts, fmt) or m
        for _ in range(rounds - (head is not None)):
            run = timed_replay(rb, facts, profile, m, placement, order_window_s=fmt.order_window_s,
                               record_sampled=fmt.estimate_output_lengths)
            loss = fit_loss(run, facts, fmt)
            tried.append({"placement": list(placement), "model": m.describe(),
                          "loss": round(loss, 4)})
            if best is None or loss < best.loss - 1e-12:
                best = Fit(m, placement, loss, run, rb)
            changed = False
            if fmt.estimate_output_lengths:
                new_lens = estimate_output_lengths(facts, fmt, run, out_lens)
                if new_lens is not None and new_lens != out_lens:
                    out_lens = new_lens
                    rb = rebuild_workload(facts, fmt, profile, out_lens=out_lens)
                    changed = True
            if model is None and facts.stats:
                new = regression(run, facts, fmt)
                if new is not None:
                    m = new
                    changed = True
            if not changed:
                break
    assert best is not None
    best.tried = tried
    return best
