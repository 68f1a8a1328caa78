"""Stage 7b, uncertainty: what a log that cannot pin every arrival to its step still tells.

Consumes: the placed and clocked final run (stage 5), `LogFacts`, the `LogFormat`, the
rebuilt workload (and, for a log without prompts, the estimated prompt lengths).
Produces an `Uncertainty` (summarized by uncertainty.summarize, as every ensemble's): an
ensemble of replays drawn from what the log allows, each weighted by how well it reproduces
the stats lines, and from it

* the preemption count, recomputed tokens and recompute ratio: median and 90% interval;
* preemptions per stats interval (the storm timeline), with intervals;
* per request: the probability it was preempted at least once, its expected preemptions;
* per preemption of the representative replay (the placed run): the probability, over the
  ensemble, that this victim is preempted within TOL_STEPS of this step.

A member is drawn as the log allows it (spec: log formats, A10): each arrival anywhere its
logged second, the completions and the stats lines' anchors allow (arrival times inside a
second are sorted uniforms: a Poisson process given its count), the stats lines' sub-second
phase unknown, the clock between stats lines bent (the step-time model's uncertainty), the
clock before the first stats line extrapolated (a whole shift of the early arrivals), the
step-time model itself uncertain (the clock-driven replay under a model with other
coefficients: a run of another length), and near the placed run (small jitters). Where the log lacks prompts or
priorities each member also draws its own (draw_lengths, and how much of the implied common
prefix is shared, draw_sharing; priorities 0-4). Weight: the likelihood
of the stats lines under Gaussian read noise, exp(-SSE / 2T), SSE the anchored loss summed
over lines (running, waiting in requests; KV usage in points of 5%), plus INEXACT_COST per
line the member misses by the exact check; T from the best member's residual
(noise_weights()), its factor calibrated on rendered logs with known truth
(tools/research/calib_members.py; docs/accuracy.md). A member that fits far better than the placed
run (under BETTER x its SSE) becomes the replay shown. Seeded: the same log and seed give the same
ensemble.
"""

from __future__ import annotations

import bisect
import math
from array import array
import multiprocessing
import os
import random
import threading
from dataclasses import dataclass, replace
from typing import Any, Sequence

from kvreplay.inference.facts import LogFacts
from kvreplay.inference.formats import LogFormat
from kvreplay.inference.lines import cum_generated, line_time, token_anchors
from kvreplay.inference.placement import placed, windows
from kvreplay.inference.prompts import draw_lengths, draw_sharing  # (the one length draw)
from kvreplay.inference.rebuild import rebuild_workload
from kvreplay.progress import stage
from kvreplay.inference.clock import StepTimeModel
from kvreplay.inference.runs import Run, timed_replay
from kvreplay.inference.verify import anchored_loss, verify
from kvreplay.inference.uncertainty import (LEAD_BELOW, TOL_STEPS, Member, Uncertainty, calibrated,
                                           interval, noise_weights, quantiles, summarize)
from kvreplay.replay.records import PreemptionRecord, preemption_records, totals

SAMPLES = 32  # the default ensemble
MAX_REQUESTS = 2000  # beyond this the default ensemble is off (--samples N turns it on)
INEXACT_COST = 2.0  # SSE added per stats line missed by the exact check
BETTER = 0.5  # a member whose SSE is below BETTER x the placed run's is shown instead
ROUNDS = 2  # ... and the ensemble draws a second round around it
# member i draws KINDS[pattern][i % len]: Poisson arrivals anywhere in their second; a
# burst or a closed loop (requests sent together, or each after a completion) only a
# step or two from where the placement put them
KINDS = {"poisson": ("jitter", "redraw", "model", "warp", "shift", "model"), "other": ("near",)}
MODEL_SPREAD = 2.0  # "model": each step-time coefficient scaled log-uniformly in [1/2, 2]
WARP = 1.5  # "warp": inside each stats interval the clock's time -> step map is bent by
# f -> f ** g, g log-uniform in [1/WARP, WARP]: the step-time model's uncertainty


def samples_wanted(samples: int | None, facts: LogFacts, fmt: LogFormat) -> int:
    """The ensemble's size: `samples` when given; else SAMPLES for a log whose arrivals the
    stats lines anchor (V1), up to MAX_REQUESTS requests."""
    if fmt.placement != "anchored" or not facts.stats:
        return 0
    if samples is not None:
        return max(0, samples)
    return SAMPLES if len(facts.requests) <= MAX_REQUESTS else 0


# Poisson logs: the ensemble's members share the replay's errors, so its raw shares are too
# sure and its intervals too narrow. Measured on 48 rendered Poisson logs (200-600
# requests; tools/research/calib_members.py fit), the shares are mapped to the observed frequencies
# (pooled adjacent violators, linear between knots, flat beyond; checked on 48 held-out
# logs), and the intervals widened by WIDEN x the median on each side, by whether prompts
# are logged and how well the best member fits (chosen on both sets: 0.05 fitted on the
# first held 67% on the second). docs/accuracy.md, section 4.
CALIBRATION: dict[tuple[str, bool], tuple[tuple[float, float], ...]] = {
    ("requests", True): ((0.005, 0.02), (0.142, 0.205), (0.25, 0.231), (0.349, 0.356),
                         (0.444, 0.369), (0.552, 0.47), (0.702, 0.618), (0.85, 0.687),
                         (0.98, 0.907)),
    ("rows", True): ((0.111, 0.038), (0.249, 0.057), (0.35, 0.073), (0.451, 0.183),
                     (0.661, 0.202), (0.873, 0.591)),
    ("requests", False): ((0.014, 0.076), (0.146, 0.178), (0.286, 0.188), (0.507, 0.231)),
    ("rows", False): ((0.183, 0.013), (0.355, 0.019)),
}
# (prompts logged, the fit poor) -> widening; a poor fit: the best member's SSE per stats
# line at least POOR_FIT (a running count off by about 3 on every line)
WIDEN = {(True, False): 0.1, (False, False): 0.1, (True, True): 0.3, (False, True): 0.2}
# A count's own noise, which members sharing the replay's errors do not show: with prompts
# estimated, the count, recomputed tokens and ratio intervals are moved out by a further
# COUNT_NOISE / sqrt(median count) x the median on each side (about COUNT_NOISE x sqrt(n)
# preemptions: most on small counts). Chosen on the calibration part of
# tools/oracle/calib_traffic.py's corpus (bursts, idle gaps, ramps, closed loops,
# heavy-tailed prompts, a Mooncake trace sample) with prompts.draw_lengths: the smallest
# that holds 90% or more of its counts (13 of 14; 0 holds 12, 0.25 all 14); it was 0.75
# with the narrower draws before (log-normal only, each interval's total fixed);
# docs/accuracy.md, section 4. With prompts logged: re-checked on the enlarged
# calibration half (28 logs, seed bases 29000 and 31000), WIDEN fixed as chosen on
# corpora A and B: 0 already holds 26 of 28 (0.1 holds 27 at 112% of the true count
# instead of 95%), so it stays 0. Without prompts, re-checked with the prefix draw
# (prompts.draw_sharing) on the 28: 0.1 holds 27, 0.05 holds 25, so it stays 0.1.
COUNT_NOISE = {True: 0.0, False: 0.1}
POOR_FIT = 10.0
POOR_FIT_P_MAX = 0.75  # a poor fit's requests: p >= 0.8 was right 43 of 60 times (72%)


def widen_for(prompts_known: bool, fit_per_line: float) -> float:
    return WIDEN[(prompts_known, fit_per_line >= POOR_FIT)]


def count_noise(prompts_known: bool, median_count: float) -> float:
    """The widening added for a count's own noise (COUNT_NOISE)."""
    return COUNT_NOISE[prompts_known] / math.sqrt(max(1.0, median_count))


class _Draw:
    """Placements (and prompt variants) drawn from what the log allows around `run`."""

    def __init__(self, run: Run, facts: LogFacts, fmt: LogFormat, phase: float,
                 phase_known: bool) -> None:
        self.facts, self.phase, self.phase_known = facts, phase, phase_known
        anchors = token_anchors(run, facts, fmt)
        self.clock = run.clock + [run.end]
        self.wins = windows(run, facts, anchors, self.clock)
        self.base = [max(a, 0) for a in run.arrival_steps]
        first = self.clock[0] if self.clock else 0.0
        # steps in the run's first second: the scale of a whole shift of early arrivals
        self.early_steps = max(1, bisect.bisect_left(self.clock, first + 1.0))
        self.early = [i for i, r in enumerate(facts.requests) if r.stats_before == 0]
        n = len(self.clock)
        self.pins = sorted({0, n - 1, *(a + 1 for a in anchors if a is not None and a + 1 < n)})

    @staticmethod
    def _fix_order(arr: list[int]) -> list[int]:
        for i in range(1, len(arr)):
            arr[i] = max(arr[i], arr[i - 1])  # file order
        if arr:
            arr[0] = 0  # the engine was idle before the first arrival
        return arr

    def _fix(self, arr: list[int]) -> list[int]:
        """Each arrival inside its window, then in file order (_fix_order)."""
        return self._fix_order([w.clamp(a) for w, a in zip(self.wins, arr)])

    def jitter(self, rng: random.Random, j: int) -> list[int]:
        return self._fix([b + rng.randint(-j, j) for b in self.base])

    def warped(self, rng: random.Random) -> list[float]:
        """The clock bent inside each stretch between two stats lines' steps (their times
        stay): where a wrong step-time model would have put the steps."""
        out = list(self.clock)
        for a, b in zip(self.pins, self.pins[1:]):
            ta, tb = self.clock[a], self.clock[b]
            if tb <= ta:
                continue
            g = math.exp(rng.uniform(-math.log(WARP), math.log(WARP)))
            for i in range(a + 1, b):
                out[i] = ta + (tb - ta) * ((self.clock[i] - ta) / (tb - ta)) ** g
        return out

    def redraw(self, rng: random.Random, clock: list[float] | None = None) -> list[int]:
        """Each second's arrivals at sorted uniform times inside it, the stats lines' phase
        moved as far as the log leaves it open."""
        clock = clock or self.clock
        shift = rng.uniform(-0.5, 0.5) if not self.phase_known else rng.uniform(-0.05, 0.05)
        reqs = self.facts.requests
        out: list[int] = []
        i = 0
        while i < len(reqs):
            sec = reqs[i].time
            j = i
            while j < len(reqs) and reqs[j].time == sec:
                j += 1
            if sec is None or all(r.precise_time is not None for r in reqs[i:j]):
                out.extend(self.base[i:j])
            else:  # (a request with a span keeps its step; the others are redrawn)
                ts = iter(sorted(rng.random() for _ in range(j - i)))
                out.extend(self.base[k] if reqs[k].precise_time is not None else
                           bisect.bisect_left(clock, sec + next(ts) + shift)
                           for k in range(i, j))
            i = j
        return self._fix(out)

    def shift(self, rng: random.Random) -> list[int]:
        """A whole shift the stats lines cannot see: every arrival after the first moved by
        the same number of steps (the replay's anchors move with them), or only the early
        ones (before the first stats line, where the clock is extrapolated); plus a small
        jitter."""
        d = rng.randint(-self.early_steps // 2, self.early_steps // 2)
        if rng.random() < 0.5:  # (the base's windows move with the shift: not applied)
            return self._fix_order([max(0, b + d + rng.randint(-1, 1)) for b in self.base])
        arr = [b + rng.randint(-1, 1) for b in self.base]
        for i in self.early:
            arr[i] += d
        return self._fix(arr)

    def placement(self, kind: str, rng: random.Random) -> list[int]:
        if kind == "near":
            return self.jitter(rng, rng.choice((1, 2)))
        if kind == "redraw":
            return self.redraw(rng)
        if kind == "warp":
            return self.redraw(rng, self.warped(rng))
        if kind == "shift":
            return self.shift(rng)
        return self.jitter(rng, rng.choice((1, 2, 4)))


def _other_model(m: StepTimeModel, rng: random.Random) -> StepTimeModel:
    def f() -> float:
        return math.exp(rng.uniform(-math.log(MODEL_SPREAD), math.log(MODEL_SPREAD)))

    return replace(m, overhead_s=m.overhead_s * f(), per_token_s=m.per_token_s * f(),
                   per_request_s=m.per_request_s * f(),
                   per_context_token_s=m.per_context_token_s * f())


@dataclass(slots=True)
class _Context:
    """What drawing one member needs (set before the worker processes fork)."""

    rebuilt: Any
    facts: LogFacts
    fmt: LogFormat
    profile: Any
    run: Run
    phase: float
    bounds: list[float]
    known: bool
    draw: _Draw
    kinds: tuple[str, ...]
    seed: int
    rnd: int
    lengths: Sequence[int] | None
    shared_prefix: int
    priority_unknown: bool
    placement: tuple[float, float]
    keep_below: float  # return the member's run when its SSE is below this
    counters: Sequence[Any] = ()  # the scrapes of the same server (CounterPoints, log clock)


def _draw_member(c: _Context, i: int) -> tuple[Member, Run | None]:
    """Member i of round c.rnd, from its own seed: the same whatever process draws it."""
    rng = random.Random(f"kvreplay-ensemble:{c.seed}:{c.rnd}:{i}")
    kind = c.kinds[i % len(c.kinds)]
    arr = c.draw.placement(kind, rng)
    rb = c.rebuilt
    lens = prios = None
    shared = c.shared_prefix
    if c.lengths is not None or c.priority_unknown:
        if c.lengths is not None:
            lens, shared = draw_sharing(draw_lengths(c.lengths, c.facts, rng, c.shared_prefix),
                                        c.shared_prefix,
                                        c.rebuilt.workload.config.block_size, rng)
        if c.priority_unknown:
            n = len(c.rebuilt.workload.requests)
            prios = [rng.randint(0, 4) for _ in range(n)]
        rb = member_workload(c.facts, c.fmt, c.profile, lens, shared, prios)
    if kind == "model":
        # the step-time model's uncertainty: the clock-driven replay under another model
        # puts the arrivals at other steps (and the run at another length)
        timed = timed_replay(rb, c.facts, c.profile, _other_model(c.run.model, rng),
                             c.placement, order_window_s=c.fmt.order_window_s)
        arr = c.draw._fix_order([max(a, 0) for a in timed.arrival_steps])
    alt = placed(rb, c.facts, c.fmt, c.profile, arr, c.run.model, c.phase)
    m = stats_member(alt.run, c.facts, c.fmt, c.phase, c.bounds, c.known, c.counters,
                     rb.workload.config.max_num_batched_tokens)
    m.arrival_steps = array("i", alt.run.arrival_steps)
    if lens is not None:
        m.prompt_lens = tuple(lens)  # (not an int32 array: a damaged log's can overflow it)
        m.shared_prefix = shared
    if prios is not None:
        m.priorities = tuple(prios)
    # (a member with its own workload, drawn prompt lengths, is never the replay shown)
    return m, alt.run if m.sse < c.keep_below and rb is c.rebuilt else None


def member_workload(facts: LogFacts, fmt: LogFormat, profile: Any, lens: Sequence[int] | None,
                    shared_prefix: int, priorities: Sequence[int] | None) -> Any:
    """The workload a member drew (`Rebuilt`): the log's, with these prompt lengths (after
    `shared_prefix`) and priorities. The one recipe for the ensemble and the what-if."""
    rb = rebuild_workload(facts, fmt, profile, prompt_lens=list(lens) if lens is not None else None,
                          shared_prefix=shared_prefix)
    if priorities is not None:
        specs = [replace(sp, priority=p) for sp, p in zip(rb.workload.requests, priorities)]
        rb.workload = replace(rb.workload, requests=specs)
    return rb


_CTX: _Context | None = None  # the context a forked worker reads
PARALLEL_STEPS = 200_000  # member steps (samples x run steps) from which workers help


def _worker_start() -> None:
    """A pool worker leaves Ctrl-C to its parent: killed by SIGINT while it holds the result
    queue's lock, it would leave the parent's terminate() waiting on that lock for ever; the
    parent interrupts and terminates the pool (SIGTERM) instead."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _job(i: int) -> tuple[Member, Run | None]:
    assert _CTX is not None
    return _draw_member(_CTX, i)


def _map_members(c: _Context, samples: int, steps: int) -> list[tuple[Member, Run | None]]:
    """Every member of a round, in order; on a large log in forked worker processes (one
    per core; from the main thread of a process that may have children only: forking a
    threaded process, the TUI, is not safe)."""
    global _CTX
    cores = os.cpu_count() or 1
    with stage(f"uncertainty ensemble, round {c.rnd + 1}", samples) as bar:
        if (cores < 2 or samples * steps < PARALLEL_STEPS or "fork" not in
                multiprocessing.get_all_start_methods()
                or threading.current_thread() is not threading.main_thread()
                or multiprocessing.current_process().daemon):  # (a pool's worker: no children)
            out = []
            for i in range(samples):
                out.append(_draw_member(c, i))
                bar.advance()
            return out
        _CTX = c
        try:
            with multiprocessing.get_context("fork").Pool(min(cores, samples),
                                                          initializer=_worker_start) as pool:
                out = []
                for m in pool.imap(_job, range(samples), chunksize=1):  # (in order)
                    out.append(m)
                    bar.advance()
                return out
        finally:
            _CTX = None


def stats_member(run: Run, facts: LogFacts, fmt: LogFormat, phase: float, bounds: list[float],
            prompts_known: bool, counters: Sequence[Any] = (), budget: int = 0) -> Member:
    anchors = token_anchors(run, facts, fmt, cum_generated(run))
    loss, inexact = _disagreement(run, facts, fmt, phase, anchors, prompts_known)
    by_victim: dict[str, list[int]] = {}
    per_window = [0] * (len(bounds) + 1)
    times = run.clock
    pre = preemption_records(run.steps, run.clock)
    for p in pre:
        by_victim.setdefault(p.victim, []).append(p.step)
        t = times[p.step] if p.step < len(times) else run.end
        per_window[bisect.bisect_right(bounds, t)] += 1
    t = totals(run.steps, pre)  # the one definition of the cost (records.py)
    closs, after = _against_counter(run, counters, budget) if counters else (0.0, 0)
    return Member(1.0, loss + INEXACT_COST * inexact, loss, inexact, t.preemptions,
                  t.tokens_recomputed, t.processed_tokens, by_victim, per_window,
                  counter_loss=closs, counted_after=after)


def _against_counter(run: Run, counters: Sequence[Any], budget: int) -> tuple[float, int]:
    """The run against the preemption counter of the same server's scrapes, window by
    window (evidence_metrics.counter_loss; a step ends at its start + its modelled time),
    and the preemptions it would count after the last scrape."""
    from kvreplay.inference import evidence_metrics as EM

    ends = [min(s + run.model.dt_record(r), nxt) for s, r, nxt in
            zip(run.clock, run.steps, list(run.clock[1:]) + [run.end])]
    counted = EM.counted_preemptions(run.steps, budget)
    last = counters[-1].t
    after = sum(c for c, e in zip(counted, ends) if e > last)
    return EM.counter_loss(EM.scrape_windows(run.steps, ends, counters, counted)), after


def _disagreement(run: Run, facts: LogFacts, fmt: LogFormat, phase: float,
                  anchors: list[int | None], prompts_known: bool) -> tuple[float, int]:
    """The stats lines' disagreement with a member: (the anchored loss summed over lines,
    the lines the exact check misses)."""
    loss = anchored_loss(run, facts, fmt, anchors, phase) * max(1, len(facts.stats))
    check = verify(run, facts, fmt, phase, prompts_known=prompts_known)
    inexact = len(facts.stats) - check.exact_lines if check.exact_lines is not None else 0
    return loss, inexact


def ensemble(rebuilt: Any, facts: LogFacts, fmt: LogFormat, profile: Any, run: Run,
             phase: float, phase_known: bool, pre: Sequence[PreemptionRecord], *,
             samples: int, seed: int = 0, pattern: str = "poisson",
             placement: tuple[float, float] = (0.0, 1.0),
             lengths: Sequence[int] | None = None, shared_prefix: int = 0,
             priority_unknown: bool = False, counters: Sequence[Any] = ()) -> Uncertainty:
    """`samples` members besides the placed run itself (member 0); `lengths`: the
    estimated prompt lengths (after `shared_prefix`) when the log has none; `counters`:
    the scrapes of the same server on the log's clock (evidence_metrics.CounterPoint),
    whose preemption counter weighs each member too."""
    bounds = [line_time(s, phase) for s in facts.stats]
    known = not rebuilt.prompts_estimated
    counters = [p for p in counters if p.preemptions is not None]
    counters = counters if len(counters) > 1 else []
    members = [stats_member(run, facts, fmt, phase, bounds, known, counters,
                            rebuilt.workload.config.max_num_batched_tokens)]
    best_run: Run | None = None  # the best-fitting member's run, if it beats the placed one
    best_sse = members[0].sse * BETTER
    kinds = KINDS["poisson" if pattern == "poisson" else "other"]
    around = run
    for rnd in range(ROUNDS):
        # round 1 draws around the member that fitted far better than the placed run
        ctx = _Context(rebuilt, facts, fmt, profile, run, phase, bounds, known,
                       _Draw(around, facts, fmt, phase, phase_known), kinds, seed, rnd,
                       lengths, shared_prefix, priority_unknown, placement,
                       members[0].sse * BETTER, counters)
        for m, alt_run in _map_members(ctx, samples, len(run.steps)):
            members.append(m)
            if alt_run is not None and m.sse < best_sse:
                best_run, best_sse = alt_run, m.sse
        if best_run is None or best_run is around:
            break
        around = best_run
    w = noise_weights([m.sse for m in members], len(facts.stats),
                      [m.counter_loss for m in members] if counters else None)
    starts = [facts.requests[0].time if facts.requests and facts.requests[0].time is not None
              else (bounds[0] if bounds else 0.0)] + bounds
    cal = pattern == "poisson"  # calibrated on Poisson logs (bursts need no correction)
    fit = min(m.sse for m in members) / max(1, len(facts.stats))
    widen = widen_for(known, fit) if cal else 0.0
    widen_n = widen + (count_noise(known, quantiles([m.count for m in members], w)[1])
                       if cal else 0.0)
    maps = (CALIBRATION[("requests", known)], CALIBRATION[("rows", known)]) if cal else None

    def p_of(raw: float) -> float:
        p = calibrated(raw, maps[0]) if maps else raw
        return min(p, POOR_FIT_P_MAX) if cal and fit >= POOR_FIT else p

    unc = summarize(members, w, seed=seed, lines=len(facts.stats),
                     windows=(starts, bounds + [run.end]), widen=widen, widen_count=widen_n,
                     p_of=p_of, representative=best_run, row_map=maps[1] if maps else None,
                     poor_fit=cal and fit >= POOR_FIT, shared_prefix=shared_prefix,
                     weighted_by=("the stats lines and the scrapes' preemption counter" if counters
                                  else "the stats lines"))
    if counters:  # what the counter did not count yet, by its last scrape
        unc.counted_after = interval([m.counted_after for m in members], w, widen=widen_n)
    return unc


def headline(unc: Uncertainty, pre: Sequence[PreemptionRecord], make_exact: str) -> str:
    """One line: what to trust in this log's replay, what not, how to make it exact."""
    checked = bool(pre) and all(p.confidence in ("consistent", "exact-by-log") for p in pre)
    if unc.poor_fit:
        c = unc.preemptions
        return (f"no replay the log allows reproduces its stats lines (the best misfits them "
                f"by {unc.fit_per_line:.0f} per line, where {POOR_FIT:.0f} is poor): take {c['low']}-{c['high']} "
                f"preemptions (median {c['median']}) as a rough range, not a 90% interval "
                f"(on rendered logs this poorly fitted it held the true count in 33 of 43), and no row as "
                f"a fact; to make it exact: {make_exact}")
    c = unc.preemptions
    leads = sum(1 for p in pre if (p.probability or 0.0) < LEAD_BELOW)
    count = (f"{c['median']} preemptions" if c["low"] == c["high"] else
             f"{c['low']}-{c['high']} preemptions, 90% interval, median {c['median']}")
    if not pre and c["high"] == 0:
        return (f"no preemption in any of the {unc.samples + 1} replays the log allows; "
                f"to make it exact: {make_exact}")
    if leads == 0 and c["low"] == c["high"]:
        how = ("each row consistent: the stats lines on both sides match it exactly" if checked
               else "still inferred")
        return (f"trust the count ({count}) and the table: the replays the log allows "
                f"(weighted by the stats lines) agree on it and on each row within "
                f"{TOL_STEPS} steps; {how}, not logged; to make it exact: {make_exact}")
    if leads == 0:
        return (f"trust the count ({count}), the storm windows and the recomputed tokens; "
                f"each row's victim is likely (p >= {LEAD_BELOW}), not certain: the log pins "
                f"each arrival only to a window of steps; to make it exact: {make_exact}")
    return (f"trust the count ({count}), the storm windows and the recomputed tokens; do not "
            f"trust single victims: {leads} of {len(pre)} rows are leads (p < {LEAD_BELOW} that the "
            f"row's victim was preempted within {TOL_STEPS} steps of its step), "
            f"the log pins each arrival only to a window of steps; to make it exact: "
            f"{make_exact}")
