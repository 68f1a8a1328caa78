"""An answer for a default log (no request lines), with or without Prometheus scrapes.

vLLM's defaults log no request: only the startup lines, a stats line per interval and
uvicorn's access line at each finish. What those say (inference/evidence_metrics.py): how
many requests arrived in each interval, the tokens each interval computed, running,
waiting and KV usage at each line, the length histograms and the preemption counter when
scraped. This module draws workloads consistent with that (arrivals placed at random
inside their interval, for half the members inside a random stretch of it: a burst; prompt
and output lengths from the histograms, else from a family of shapes, the prompts scaled
to each interval's prompt tokens (`prompt_groups`; histogram draws put in the order that
fits them, `fit_groups`), the outputs to the logged total; with prefix caching and its
counters scraped, prompts sharing prefixes to the logged hit share (`shared_prefixes`); the
step time around the one the busy intervals' tokens imply, more loosely where few were
busy throughout), replays each through the scheduler model on a wall clock, weights each by
how well it reproduces every stats line and scrape (`evidence_metrics.check`), and reports
90% intervals: preemptions (exact when the counter bounds the log), recomputed tokens,
recompute ratio, and the preemptions per stats interval (the storm windows). No victim is
named: no run the log allows is more than one of many. Fewer than THIN_LINES stats lines
showing work are too thin to check a draw: the answer says so (`thin_evidence`).
"""

from __future__ import annotations

import math
import random
from array import array
from itertools import tee
from typing import Any, Sequence, TYPE_CHECKING

import msgspec

from kvreplay.errors import ReplayError
from kvreplay.inference import evidence_metrics as EM
from kvreplay.inference import uncertainty as U
from kvreplay.inference.clock import StepTimeModel
from kvreplay.inference.default_draws import (  # noqa: F401 (re-exported)
    _arrivals, _grouped_lengths, _lengths, fit_groups, prompt_groups, shared_prefixes, workload_of)
from kvreplay.replay.engine import Engine
from kvreplay.replay.records import EngineInputs, preemption_records, totals
from kvreplay.replay.workload import Workload

if TYPE_CHECKING:
    from kvreplay.inference.engines import Profile
    from kvreplay.inference.formats import LogFormat
    from kvreplay.inference.facts import LogFacts


# A data-parallel default log: one audit record per engine (its own stats lines), and no
# answer: each engine's arrivals are the change of its running + waiting plus its finishes,
# and the access lines (the finishes) are the API server's, not any engine's
DP_REFUSAL = ("a data-parallel default log: its stats lines are per engine (one record each), "
              "its access lines (the finishes) are the API server's, so no engine's arrivals "
              "can be told; not answered")
# half the members place each interval's arrivals inside a stretch of it (a burst), of a
# share log-uniform in [SPREAD_MIN, 1]
SPREAD_MIN = 0.05
# each member's step time: the fitted one x a log-normal factor of sigma STEP_SIGMA, or
# STEP_SIGMA_LOOSE when fewer than BUSY_MIN intervals were busy throughout (the fit is weak)
STEP_SIGMA = 0.15
STEP_SIGMA_LOOSE = 0.6
BUSY_MIN = 3

TO_MAKE_EXACT = ("start vLLM with --enable-log-requests and VLLM_REQUEST_BODY_LOG_LEVEL=INFO "
                 "(each request and its prompt), and --enable-logging-iteration-details (every "
                 "step, 0.14+)")


class Interval(msgspec.Struct, frozen=True):
    median: float
    low: float
    high: float


class Window(msgspec.Struct, frozen=True, gc=False):  # (one per stats line; holds no container:
    # not tracked by the cycle collector, 16 bytes less each)
    start: float  # the stats line's interval, log clock
    end: float
    preemptions: Interval


class DefaultAnswer(msgspec.Struct):
    requests: int
    preemptions: Interval
    recomputed_tokens: Interval
    recompute_ratio: Interval
    windows: list[Window]
    counted: int | None  # the counter's increase over the log (None: not scraped)
    counted_exact: bool
    samples: int
    effective: float  # effective sample size of the weights
    seed: int
    lengths_source: str
    headline: str
    notes: list[str]
    # why the stats lines are too few to tell a workload (then the intervals say what the
    # drawn workloads assume, not what the log shows; the count stands only when the
    # counter gives it exactly), None when they are enough
    thin: str | None = None


class Member(msgspec.Struct):
    weight: float
    loss: float
    preemptions: int
    recomputed: int
    ratio: float
    processed: int
    after_count: int  # preemptions after the last scrape (not counted by it)
    per_window: dict[int, int]  # stats window -> preemptions in it (nonzero only)
    # the 95th percentile of its requests' prompt + output: what one victim can lose at most
    # (the cost of a preemption where too few members preempt to say, `intervals`)
    longest: float = 0.0
    # the workload it drew (kept for the what-if only, `answer(draws=True)`): arrival times,
    # prompt and output lengths, its step time (seconds per step, per token)
    arrivals: list[float] = []
    prompts: list[int] = []
    outputs: list[int] = []
    step_time: tuple[float, float] = (0.0, 0.0)
    prefixes: list[tuple[int, int]] = []  # shared prompt prefixes (family, length), if drawn


def _run(wl: Workload, arrivals: list[float], profile: Profile, model: StepTimeModel,
         max_steps: int) -> tuple[list, list[float]]:
    """The scheduler model on a wall clock: a request enters at the first step that
    starts at or after its arrival; an idle engine waits for the next arrival."""
    engine = Engine(wl, profile, inputs=EngineInputs([-1] * len(wl.requests)))
    k, clock = 0, arrivals[0] if arrivals else 0.0
    steps, ends = [], []
    while not engine.done and (k < len(arrivals) or engine.has_work()) and len(steps) < max_steps:
        if not engine.has_work() and k < len(arrivals):
            clock = max(clock, arrivals[k])
        while k < len(arrivals) and arrivals[k] <= clock:
            engine.submit(k)
            k += 1
        rec = engine.step()
        clock += model.dt_record(rec)
        steps.append(rec)
        ends.append(clock)
    return steps, ends


def answer(ev: EM.MetricsEvidence, config: Any, profile: Profile, *, samples: int = 32,
           seed: int = 0, keep: list | None = None, draws: bool = False) -> DefaultAnswer:
    """The ensemble's answer for a log whose evidence is `ev`, served with `config`
    (a SchedulerConfig from the startup lines) under the scheduler rules `profile`.
    `keep`: a list the weighted members are appended to (calibration; with `draws`, each
    with the workload it drew: the what-if re-runs them)."""
    rng = random.Random(seed)
    n = ev.requests
    _, gtot = ev.totals()
    phist, ohist = ev.lengths()
    cap = config.max_model_len
    a, b = EM.step_time(ev)
    # the step time's spread: the lines pin it where intervals are busy throughout
    sigma = STEP_SIGMA if EM.busy_intervals(ev) >= BUSY_MIN else STEP_SIGMA_LOOSE
    members: list[Member] = []
    notes = []
    # prefix caching on and its counters scraped: the members' prompts share prefixes
    share = ev.cache_share() if getattr(config, "enable_prefix_caching", False) else None
    span = (ev.column("t1")[-1] - ev.column("t0")[0]) if ev.windows else 0.0
    max_steps = max(10_000, int(50 * span / max(a, 1e-3)))
    for i in range(max(1, samples)):
        r = random.Random(rng.random())
        phase = r.random()
        spread = 1.0
        if r.random() < 0.5:
            spread = math.exp(r.uniform(math.log(SPREAD_MIN), 0.0))
        arrivals = _arrivals(ev, r, phase, spread)
        m = len(arrivals)
        if m == 0:
            break
        outs = EM.draw_from_hist(ohist, m, r, cap - 1) if ohist else []
        if not outs:
            shape = (r.choice(("uniform", "lognormal")), r.uniform(0.25, 1.1))
            outs = _lengths(m, max(1.0, gtot / m), r, cap - 1, shape)
        ins = EM.draw_from_hist(phist, m, r, cap - 1) if phist else []
        if ins:
            ins = fit_groups(ins, prompt_groups(ev, m), r)
        if not ins:
            # vLLM counts a prompt's tokens once, when its first token comes out: the logged
            # prompt tokens are the prompts' sum
            shape = (r.choice(("uniform", "lognormal")), r.uniform(0.25, 1.1))
            ins = _grouped_lengths(ev, m, r, cap - 1, shape)
        jit = math.exp(r.gauss(0.0, sigma)) if i else 1.0
        model = StepTimeModel(overhead_s=a * jit, per_token_s=b * jit, per_request_s=0.0)
        pref = shared_prefixes(ins, share, config.block_size, r) if share else None
        steps, ends = _run(workload_of(config, ins, outs, pref), arrivals, profile, model, max_steps)
        counted = EM.counted_preemptions(steps, config.max_num_batched_tokens)
        chk = EM.check(steps, ends, ev, phase, counted, detail=False)
        t = totals(steps, preemption_records(steps))
        per = _per_window(steps, ends, ev, phase)  # by the step each preemption happened in
        after = 0
        if ev.counted_until is not None:
            after = sum(c for c, e in zip(counted, ends) if e > ev.counted_until)
        sizes = sorted(p + o for p, o in zip(ins, outs))
        members.append(Member(0.0, chk.loss, t.preemptions, t.tokens_recomputed,
                               t.recompute_ratio or 0.0, t.processed_tokens, after, per,
                               float(sizes[min(len(sizes) - 1, int(0.95 * len(sizes)))])))
        if draws:
            x = members[-1]
            x.arrivals, x.prompts, x.outputs = arrivals, list(ins), list(outs)
            x.step_time = (model.overhead_s, model.per_token_s)
            x.prefixes = list(pref or [])
    if not members:
        raise ReplayError("the stats lines show no request: nothing to replay")
    _weigh(members, len(ev.windows))
    if keep is not None:
        keep.extend(members)
    w = [x.weight for x in members]
    ess = 1.0 / sum(x * x for x in w) if any(w) else 0.0
    pre, rec, ratio = intervals(members, ev.counted, ev.counted_exact)
    if ev.counted is not None and not ev.counted_exact:
        notes.append(f"the preemption counter's increase ({ev.counted}) stops at the last scrape; "
                     "after it, the replays give the rest")
    wins = []
    busy = set().union(*(x.per_window for x in members))
    none = Interval(0.0, 0.0, 0.0)  # a window no member preempts in (most of a long log)
    end = None
    for k, (t0, t1) in enumerate(zip(ev.column("t0"), ev.column("t1"))):
        iv = _interval([x.per_window.get(k, 0) for x in members], w) if k in busy else none
        # a window starts where the one before ended (from_stats): one float for both
        start = end if end is not None and _same(end, t0) else t0
        end = t1
        wins.append(Window(start, t1, iv))
    if share is not None:
        notes.append(f"the prefix cache hit {share:.1%} of the prompt tokens first admitted "
                     "(vllm:prefix_cache_hits / _queries over the scrapes): each workload's prompts "
                     "share prefixes to that share, and each is weighed by the hit counter")
    thin = thin_evidence(ev)
    if thin:
        notes.append(thin)
    src = ("prompt and output lengths from the scraped histograms" if phist and ohist else
           "output lengths from the scraped histogram, prompts drawn to the logged prompt tokens"
           if ohist else "prompt and output lengths drawn to the logged token totals")
    return DefaultAnswer(n, pre, rec, ratio, wins, ev.counted, ev.counted_exact, len(members),
                         round(ess, 1), seed, src, _headline(pre, rec, ratio, ev, thin), notes, thin)


# fewer stats lines showing work than this: too thin to tell a workload (`thin_evidence`)
THIN_LINES = 3


def thin_evidence(ev: EM.MetricsEvidence) -> str | None:
    """Why the stats lines are too few to answer from, or None. The draws fill in what the
    lines do not say (how arrivals cluster, each request's lengths, the step time); with
    fewer than THIN_LINES lines showing work nothing checks those choices, and the ensemble
    agrees with itself rather than with the log (one line gave 0-0 with 9 requests
    waiting and the KV cache 90% full)."""
    k = sum(1 for row in zip(*(ev.column(c) for c in ("running", "waiting", "prompt_tokens", "gen_tokens")))
            if any(row))
    if k >= THIN_LINES:
        return None
    return (f"only {k} stats line{' shows' if k == 1 else 's show'} work (at least {THIN_LINES} "
            "are needed to check a drawn workload): the intervals say what the drawn workloads "
            "assume, not what the log shows"
            + ("; the count is the counter's" if ev.counted is not None and ev.counted_exact else ""))


def intervals(members: Sequence[Member], counted: int | None, exact: bool,
              widen: tuple[float, float, float] | None = None) -> tuple[Interval, Interval, Interval]:
    """The preemptions', recomputed tokens' and recompute ratio's intervals over weighted
    members; `counted`: the preemption counter's increase over the log (exact, or up to
    its last scrape), `widen`: (WIDEN_COUNT, WIDEN, WIDEN_COUNTED) unless given."""
    wc, wr, wk = widen or (WIDEN_COUNT, WIDEN, WIDEN_COUNTED)
    w = [x.weight for x in members]
    if counted is not None and exact:
        pre = Interval(counted, counted, counted)
    elif counted is not None:
        tail = _interval([x.after_count for x in members], w, widen=wc)
        pre = Interval(counted + tail.median, counted + tail.low, counted + tail.high)
    else:
        pre = _interval([x.preemptions for x in members], w, widen=wc)
    if counted is not None:
        # the count is the counter's: each run gives what a preemption cost (recomputed
        # tokens per preemption), the count scales it
        cost = [(x, x.recomputed / x.preemptions) for x in members if x.preemptions]
        if len(cost) < COST_MIN and pre.high > 0:
            # too few runs preempt to say what a preemption costs: a victim loses what it
            # had computed, between a token and its prompt + output (the drawn requests'
            # 95th percentile), each preemption
            top = max([x.longest for x in members] + [c for _, c in cost])
            med = U.quantiles([c for _, c in cost], [x.weight for x, _ in cost])[1] if cost else top / 2
            rec = Interval(round(pre.median * med), pre.low, round(pre.high * top))
            ratio = Interval(*(_ratio_of(members, v) for v in (rec.median, rec.low, rec.high)))
        elif cost:
            total = [pre.median * c for _, c in cost]
            cw = [x.weight for x, _ in cost]
            rec = _interval(total, cw, widen=wk)
            ratio = _interval([t / max(1, x.processed - x.recomputed + t) for (x, _), t in zip(cost, total)],
                              cw, digits=6, widen=wk)
        else:
            rec = ratio = Interval(0.0, 0.0, 0.0)
    else:
        rec = _interval([x.recomputed for x in members], w, widen=wr)
        ratio = _interval([x.ratio for x in members], w, digits=6, widen=wr)
    return pre, rec, ratio


def _ratio_of(members: Sequence[Member], recomputed: float) -> float:
    """The recompute ratio of `recomputed` tokens over the members' weighted median of
    the tokens processed but recomputed."""
    base = U.quantiles([x.processed - x.recomputed for x in members], [x.weight or 1.0 for x in members])[1]
    return round(recomputed / max(1.0, base + recomputed), 6)


# fewer runs than this preempting: the cost of a preemption is not told by them (`intervals`)
COST_MIN = 4


def _weigh(members: list[Member], lines: int) -> None:
    """Weights exp(-(loss - best) / (2 T)): no member reproduces a log exactly (its
    arrivals and lengths are drawn), so the losses' own spread sets the scale: T is half
    the gap from the best to the median member, so a median member keeps e^-1 of the
    best one's weight (measured: docs/accuracy.md, default logs)."""
    losses = sorted(x.loss for x in members)
    best, med = losses[0], losses[len(losses) // 2]
    temp = max(1.0, (med - best) / 2.0)
    ws = [math.exp(-(x.loss - best) / (2.0 * temp)) for x in members]
    tot = sum(ws)
    for x, v in zip(members, ws):
        x.weight = v / tot


# The weighted 90% range around the median (uncertainty.interval), each side's distance
# from the median scaled: the count's, the recomputed tokens' and ratio's, and (with the
# counter's count) the range of a preemption's cost scaled by it. Each the smallest of
# 0.8-2 (steps of 0.1) that holds the truth in 90% of the rendered calibration cases (0-23 of
# tools/oracle/render_default_log.py: `eval --cases 0:24 --dump`, then `calib`;
# docs/accuracy.md, section 8).
WIDEN_COUNT = 1.2
WIDEN = 1.4
WIDEN_COUNTED = 1.1


def _interval(values: Sequence[float], weights: Sequence[float], digits: int = 0,
              widen: float = 1.0) -> Interval:
    """uncertainty.interval (the one definition: weighted 5%, 50%, 95%), each side's
    distance from the median scaled by `widen`, as a typed Interval."""
    d = U.interval(values, weights, digits=digits, stretch=widen)
    return Interval(float(d["median"]), float(d["low"]), float(d["high"]))


def _per_window(steps, ends, ev: EM.MetricsEvidence, phase: float) -> dict[int, int]:
    out: dict[int, int] = {}
    if not ev.windows:
        return out
    edges = array("d", (t + phase for t in ev.column("t1")))  # (8 bytes a line)
    import bisect

    for r, e in zip(steps, ends):
        if r.preemptions:
            k = bisect.bisect_left(edges, e)
            if k < len(edges):
                out[k] = out.get(k, 0) + len(r.preemptions)
    return out


def _same(a: float, b: float) -> bool:
    """The same float (value and sign: -0.0 is not 0.0)."""
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


def _headline(pre: Interval, rec: Interval, ratio: Interval, ev: EM.MetricsEvidence,
              thin: str | None = None) -> str:
    if thin:
        count = (f"{int(pre.median)} preemptions (exact: vllm:num_preemptions_total over the log)"
                 if ev.counted is not None and ev.counted_exact else "preemptions unknown")
        return (f"default log (no request lines), too thin to infer a workload: {count}; "
                f"recomputed tokens unknown ({thin}: they give {int(pre.low)}-{int(pre.high)} "
                f"preemptions, {int(rec.low):,}-{int(rec.high):,} tokens recomputed); no victim can be "
                f"named; to make it exact: {TO_MAKE_EXACT}")
    if ev.counted is not None and ev.counted_exact:
        count = f"{int(pre.median)} preemptions (exact: vllm:num_preemptions_total over the log)"
    elif ev.counted is not None and pre.low == pre.high:
        count = (f"{int(pre.median)} preemptions (the counter's {ev.counted} up to the last scrape, "
                 "and none after it in any replay the log allows)")
    else:
        count = f"{int(pre.low)}-{int(pre.high)} preemptions (90% interval, median {int(pre.median)})"
    return (f"default log (no request lines): {count}, {int(rec.low):,}-{int(rec.high):,} tokens "
            f"recomputed, recompute ratio {ratio.low:.3f}-{ratio.high:.3f} (90% intervals over "
            f"workloads consistent with the stats lines{' and scrapes' if ev.scrapes else ''}); "
            f"no victim can be named; to make it exact: {TO_MAKE_EXACT}")


def evidence_of(facts: LogFacts, fmt: LogFormat, scrapes: Sequence[EM.CounterPoint] = ()) -> EM.MetricsEvidence:
    """The evidence of a log's stats and access lines and of scrapes on its clock."""
    from kvreplay.inference.formats import interval_of

    # read as they go by (facts.stats makes each StatsPoint as it is read: a list of them
    # would hold one object per stats line)
    timed, again = tee(s for s in facts.stats if s.time is not None)
    done = (s.completions_before for s in again)
    return EM.from_stats(timed, done, len(facts.completions), interval_of(facts, fmt), scrapes)


def answer_log(facts: LogFacts, scrapes: Sequence[EM.CounterPoint] = (), *, profile: str | None = None,
               samples: int = 32, seed: int = 0, keep: list | None = None,
               draws: bool = False) -> DefaultAnswer:
    """`answer` for a parsed default log (LogFacts) and the scrapes of the same server.
    Raises ReplayError when the log cannot be answered (no stats line, no KV cache size)."""
    from kvreplay.errors import ReplayError
    from kvreplay.inference.config import engine_config
    from kvreplay.inference.engines import scheduler_profile
    from kvreplay.inference.formats import log_format

    fmt = log_format(facts.vllm_version, facts.engine_version, profile)
    if fmt.engine != "V1":
        raise ReplayError("a log without request lines is answered for V1-engine servers only")
    if len(facts.engines) > 1:
        raise ReplayError(DP_REFUSAL)
    if not any(s.running is not None for s in facts.stats):
        raise ReplayError("the log has neither request lines nor stats lines: nothing to infer "
                          "the workload from; start vLLM with --enable-log-requests")
    cfg, _src, _notes = engine_config(facts, fmt)
    prof = scheduler_profile(facts, fmt, profile)
    ev = evidence_of(facts, fmt, scrapes)
    if ev.requests == 0:
        raise ReplayError("the stats lines show no request: nothing to replay")
    return answer(ev, cfg, prof, samples=samples, seed=seed, keep=keep, draws=draws)
