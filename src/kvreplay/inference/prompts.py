"""Prompts the log does not give (no JSON bodies, no DEBUG lines): their lengths, and how
far the preemption count can be trusted without them.

Consumes: `LogFacts` (the stats lines' prompt throughput and prefix-cache hit rate), the
`LogFormat`, the scheduler profile. Produces: estimated prompt lengths, rescaled per
stats interval as vLLM counts prompt tokens (each prompt when its first token comes out,
0.16+ without its first admission's prefix-cache hit); a prefix every prompt shares when
the hit rate implies one; and a count interval over plausible variants (lengths x0.8-1.2,
two log-normal mixes, unknown priorities), each replayed by the clock and at the anchored
placement. Formats without rescaling (V0) take the mean length the throughput implies.
The uncertainty ensemble's members draw their own lengths around the estimate
(draw_lengths: heavy-tailed shapes, each interval's share moved, each prompt capped at
max_model_len - max_tokens).
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any, Sequence

from kvreplay.inference.facts import LogFacts, make_it_exact
from kvreplay.inference.fit import Fit, fit
from kvreplay.inference.formats import LogFormat, interval_of
from kvreplay.inference.lines import token_anchors
from kvreplay.inference.rebuild import Rebuilt, rebuild_workload
from kvreplay.inference.runs import Run, step_replay, timed_replay
from kvreplay.inference.verify import _state_at
from kvreplay.replay.result import CountEstimate



def shared_prefix_estimate(facts: LogFacts, fmt: LogFormat, cfg: Any) -> int:
    """Prompt tokens every request shares (a system prompt), as the prefix-cache hit rate
    implies. From 0.16 on the prompt throughput leaves out what the prefix cache supplied,
    so the logged total P is the computed part only; the last line's hit rate h (hits over
    queried prompt tokens, over the last 1,000 requests) gives the queried total
    Q = P / (1 - h) and the hits C = Q - P. One prefix shared by every request after the
    first explains C with (n - 1) hits of C / (n - 1) tokens each, full blocks only."""
    if not cfg.enable_prefix_caching or len(facts.requests) < 2:
        return 0
    rates = [s.prefix_cache_hit_rate for s in facts.stats if s.prefix_cache_hit_rate is not None]
    if not rates or not 0.0 < rates[-1] < 100.0:
        return 0
    h = rates[-1] / 100.0
    computed = sum((s.prompt_throughput or 0.0) * interval_of(facts, fmt) for s in facts.stats)
    hits = computed / (1.0 - h) - computed
    per_request = hits / (len(facts.requests) - 1)
    bs = cfg.block_size
    return max(0, min(int(per_request // bs) * bs, (cfg.max_model_len - 2) // bs * bs))


def first_tokens(run: Run) -> tuple[dict[str, int], dict[str, int]]:
    """(request -> step of its first token, request -> prefix-cache hit at its first
    admission)."""
    first_token: dict[str, int] = {}
    first_hit: dict[str, int] = {}
    for rec in run.steps:
        for a in rec.admitted:
            if not a.resumed:
                first_hit.setdefault(a.request, a.prefix_hit)
        for rid in rec.first_tokens:
            first_token.setdefault(rid, rec.step)
    return first_token, first_hit


def rescale_lengths(run: Run, facts: LogFacts, fmt: LogFormat, lens: list[int],
                    shared_prefix: int = 0) -> list[int]:
    """Scale the estimated prompt lengths so that each stats interval's prompt tokens match
    the logged prompt throughput, counted as vLLM counts them: a request's prompt when its
    first token comes out, less what the prefix cache supplied at its first admission.
    `lens` are the lengths after the shared prefix; an interval is (previous line's
    anchor, this line's anchor], by the clock where a line has none."""
    interval = interval_of(facts, fmt)
    first_token, hit = first_tokens(run)
    pos = {r.log_id: i for i, r in enumerate(facts.requests)}
    bounds = []
    for s, a in zip(facts.stats, token_anchors(run, facts, fmt)):
        if a is None:
            rec = _state_at(run, s.time + 0.5)
            a = rec.step if rec else -1
        bounds.append(a)
    new = list(lens)
    lo = -1
    for s, hi in zip(facts.stats, bounds):
        members = [pos[r] for r, st in first_token.items() if lo < st <= hi and r in pos]
        lo = max(lo, hi)
        want = (s.prompt_throughput or 0.0) * interval
        if not members or want <= 0:
            continue
        # computed tokens = shared + own - hit; only the own parts are scaled
        fixed = sum(shared_prefix - hit.get(facts.requests[i].log_id, 0) for i in members)
        have = sum(lens[i] for i in members)
        if have > 0 and want - fixed > 0:
            f = (want - fixed) / have
            for i in members:
                new[i] = max(1, round(lens[i] * f))
    return new


def length_variants(lens: list[int]) -> list[tuple[str, list[int]]]:
    """Plausible prompt lengths around an estimate: its total x0.8-1.2, as estimated
    (alike within a stats interval) and in two log-normal mixes (sigma 0.5: real prompt
    lengths vary widely), renormalised to the same total. Seeded: same log, same variants."""
    out: list[tuple[str, list[int]]] = []
    for factor in (0.8, 0.9, 1.0, 1.1, 1.2):
        out.append((f"lengths x{factor}", [max(1, round(n * factor)) for n in lens]))
        for seed in (1, 2):
            rng = random.Random(seed)
            raw = [n * rng.lognormvariate(0.0, 0.5) for n in lens]
            k = sum(lens) / max(1e-9, sum(raw))
            out.append((f"lengths x{factor}, mix {seed}",
                        [max(1, round(x * k * factor)) for x in raw]))
    return out


class UnknownPrompts:
    """The estimate for a log without prompts: the rebuilt workload with estimated
    lengths, its fit, and the count interval over the variants."""

    def __init__(self, facts: LogFacts, fmt: LogFormat, profile: Any,
                 placements: tuple[tuple[float, float], ...]) -> None:
        self.facts, self.fmt, self.profile = facts, fmt, profile
        rebuilt = rebuild_workload(facts, fmt, profile)
        shared = shared_prefix_estimate(facts, fmt, rebuilt.workload.config)
        if shared:
            rebuilt = rebuild_workload(facts, fmt, profile, shared_prefix=shared)
        f = fit(rebuilt, facts, fmt, profile, placements, rounds=3)
        lens = [len(s.prompt_token_ids) - shared for s in rebuilt.workload.requests]
        for _ in range(2):
            lens = rescale_lengths(f.run, facts, fmt, lens, shared)
            rebuilt = rebuild_workload(facts, fmt, profile, prompt_lens=lens, shared_prefix=shared)
            f = fit(rebuilt, facts, fmt, profile, (f.placement,), rounds=3)
        self.rebuilt, self.fit, self.shared = rebuilt, f, shared
        self.lens = lens
        cfg = rebuilt.workload.config
        # 0.33 logs a request's priority only in its JSON body, which this log lacks: the
        # priority policy then orders by priorities nobody knows
        self.priority_unknown = cfg.policy == "priority" and not any(
            r.priority for r in facts.requests)
        why = ("prompt lengths are not in this log; they were estimated from the stats "
               "lines' prompt throughput")
        if shared:
            why += (f"; which prompts share what is unknown too: the prefix-cache hit rate is "
                    f"replayed as one {shared}-token prefix every prompt shares")
        elif cfg.enable_prefix_caching:
            why += "; prefix-cache sharing between prompts is unknown too"
        if self.priority_unknown:
            why += "; the scheduling policy is priority but no priority is logged"
        self.why = why
        self.estimate: CountEstimate | None = None

    def count_variants(self) -> CountEstimate:
        """The count interval over the variants (lengths x0.8-1.2, two log-normal mixes,
        random priorities 0-4 when they are unknown), each replayed by the clock: the
        estimate of formats without an ensemble (ensemble.py)."""
        facts, fmt, profile, f, shared = self.facts, self.fmt, self.profile, self.fit, self.shared
        counts: dict[str, int] = {}
        for name, var in length_variants(self.lens):
            rb = rebuild_workload(facts, fmt, profile, prompt_lens=var, shared_prefix=shared)
            counts[name] = timed_replay(rb, facts, profile, f.model, f.placement,
                                        order_window_s=fmt.order_window_s).num_preemptions
        if self.priority_unknown:
            for seed in (1, 2, 3, 4, 5, 6):
                rng = random.Random(100 + seed)
                rb = rebuild_workload(facts, fmt, profile, prompt_lens=self.lens,
                                      shared_prefix=shared)
                specs = [replace(sp, priority=rng.randint(0, 4)) for sp in rb.workload.requests]
                rb.workload = replace(rb.workload, requests=specs)
                counts[f"priorities mix {seed}"] = timed_replay(
                    rb, facts, profile, f.model, f.placement,
                    order_window_s=fmt.order_window_s).num_preemptions
        why = self.why + "; the count is replayed over plausible variants of them (total and mix)"
        if self.priority_unknown:
            why += " and over random priorities 0-4"
        values = sorted(counts.values())
        self.estimate = CountEstimate(
            preemptions_low=values[0], preemptions_high=values[-1],
            preemptions_median=values[len(values) // 2], variants=counts, why=why,
            make_it_exact=make_it_exact(facts))
        return self.estimate


def fit_prompts(facts: LogFacts, fmt: LogFormat, profile: Any, placements, step_time=None
                ) -> tuple[Rebuilt, Fit, UnknownPrompts | None]:
    """The workload and its fit: with the logged prompts, or with estimated lengths and
    their count interval (formats that rescale them; others take the mean)."""
    if facts.prompt_lengths_known or not fmt.rescale_unknown_prompts:
        rebuilt = rebuild_workload(facts, fmt, profile)
        return rebuilt, fit(rebuilt, facts, fmt, profile, placements, model=step_time), None
    unknown = UnknownPrompts(facts, fmt, profile, placements)
    return unknown.rebuilt, unknown.fit, unknown


# The estimated total's uncertainty. Wider than the throughput leaves it (on corpus C's 28
# calibration logs without prompts the estimate was 0.945-1.07 of the true prompt tokens),
# but narrowing it to 0.95-1.05 was tried and not adopted: on the calibration half counts
# held 27 of 28 instead of 26, recomputed tokens 24 instead of 25; held out, counts held
# 23 of 28 as before, recomputed tokens 20 instead of 24, the ratio 20 instead of 25
# (docs/accuracy.md, section 4). The members' undercount is not in the total.
LENGTH_FACTORS = (0.8, 0.9, 1.0, 1.1, 1.2)
# The spread of prompt lengths around the estimate, one shape drawn per member: real
# prompts range from alike (a benchmark) through log-normal (chat) to heavy-tailed (code
# pasted whole: a few prompts hold most of the tokens and most of the KV cache). A
# log-normal with sigma 1.5 gives the longest tenth of the prompts about 60% of the
# tokens; a Pareto tail with alpha 1.1 over 80% (before the cap), as code-like prompts have.
LENGTH_SIGMAS = (0.5, 1.0, 1.5)
LENGTH_ALPHAS = (1.1, 1.5)
LENGTH_SHAPES = tuple([("lognormal", s) for s in LENGTH_SIGMAS] +
                      [("pareto", a) for a in LENGTH_ALPHAS])
# Each stats interval's share of the tokens, moved log-normally by one of these per member
# (the whole total kept): the throughput counts a prompt in the interval of its first
# token, which the estimate takes from the placed run; a run that queues otherwise puts a
# long prompt on the other side of a line (on a calibration log with code-like prompts,
# moving a fifth of an interval's tokens to the next one took the count from 10 to 2)
INTERVAL_SPREADS = (0.0, 0.15, 0.3)


# How much of the common prefix the hit rate implies (shared_prefix_estimate) a member
# keeps as one prefix every prompt shares, one share drawn per member; the rest becomes each
# prompt's own tokens (the prompt's length unchanged). The hit rate says how many tokens
# came from the cache, not how they were shared: prompts sharing prefixes in groups (a
# system prompt per application, a conversation's history) hold several prefixes in the
# KV cache where one common prefix holds one. On the 14 calibration logs of corpus C with
# prefix caching and no prompts, with one common prefix in every member the true count lay
# above the ensemble's median in 10 and below it in none; drawing the share from these,
# 9 and 3, the counts held 14 of 14 instead of 13 (mean width 20.1 instead of 20.2), the
# recomputed tokens 13 instead of 12; the best member fitted the stats lines 10% better on
# 5 of the 14, worse on 3
# (docs/accuracy.md, section 4).
PREFIX_SHARES = (1.0, 0.5, 0.0)


def draw_sharing(lens: Sequence[int], shared_prefix: int, block_size: int,
                 rng: random.Random) -> tuple[list[int], int]:
    """A member's common prefix, one of PREFIX_SHARES of `shared_prefix` (whole blocks), and
    its prompt lengths after it (`lens` are after `shared_prefix`: each grows by what is no
    longer shared). No draw when nothing is shared."""
    if shared_prefix <= 0:
        return list(lens), shared_prefix
    keep = int(shared_prefix * rng.choice(PREFIX_SHARES)) // block_size * block_size
    return [n + shared_prefix - keep for n in lens], keep


def _shape_draw(shape: tuple[str, float], rng: random.Random) -> float:
    kind, x = shape
    if kind == "pareto":
        return (1.0 - rng.random()) ** (-1.0 / x)
    return rng.lognormvariate(0.0, x)


def length_caps(facts: LogFacts, n: int, shared_prefix: int = 0) -> list[int] | None:
    """The longest prompt (after `shared_prefix`) each request can have had: vLLM refuses
    a request whose prompt and max_tokens exceed max_model_len, so a served request's prompt
    is at most max_model_len - max_tokens. None when the log lacks either."""
    mml = facts.config.max_model_len if facts.config is not None else None
    if mml is None or len(facts.requests) != n:
        return None
    return [max(1, int(mml) - (r.max_tokens or 0) - shared_prefix) for r in facts.requests]


def _cap(xs: list[float], caps: Sequence[int] | None, total: float) -> list[float]:
    """`xs` (summing to `total`) with none above its cap, the excess given to the others in
    proportion (a few rounds; what no request can take is dropped)."""
    if caps is None:
        return xs
    out = list(xs)
    for _ in range(8):
        over = sum(max(0.0, x - c) for x, c in zip(out, caps))
        if over <= 0.5:
            break
        out = [min(x, c) for x, c in zip(out, caps)]
        room = sum(x for x, c in zip(out, caps) if x < c)
        if room <= 0:
            break
        out = [x * (1.0 + over / room) if x < c else x for x, c in zip(out, caps)]
    return [min(x, c) for x, c in zip(out, caps)]


def draw_lengths(lens: Sequence[int], facts: LogFacts, rng: random.Random,
                 shared_prefix: int = 0) -> list[int]:
    """Plausible prompt lengths around an estimate that the stats lines' prompt throughput
    fixed per interval: the total scaled by one of LENGTH_FACTORS, each interval's share
    moved by one of INTERVAL_SPREADS, and inside each stats interval (requests logged
    between the same two stats lines) the lengths redrawn with one of LENGTH_SHAPES
    (log-normal or a Pareto tail), the interval's total kept and each prompt at most its
    cap (length_caps: max_model_len - max_tokens)."""
    factor = rng.choice(LENGTH_FACTORS)
    shape = rng.choice(LENGTH_SHAPES)
    spread = rng.choice(INTERVAL_SPREADS)
    raw = [n * _shape_draw(shape, rng) for n in lens]
    # (a workload with more requests than request lines, n > 1: one group)
    keys = ([r.stats_before for r in facts.requests] if len(facts.requests) == len(lens)
            else [0] * len(lens))
    caps = length_caps(facts, len(lens), shared_prefix)
    groups: dict[int, list[int]] = {}
    for i, k in enumerate(keys):
        groups.setdefault(k, []).append(i)
    est = {k: float(sum(lens[i] for i in idx)) for k, idx in groups.items()}
    moved = {k: t * rng.lognormvariate(0.0, spread) if spread else t for k, t in est.items()}
    scale = factor * sum(est.values()) / max(1e-9, sum(moved.values()))
    out = [0.0] * len(lens)
    for k, idx in groups.items():
        total = moved[k] * scale
        have = sum(raw[i] for i in idx)
        xs = [raw[i] * total / max(1e-9, have) for i in idx]
        for i, x in zip(idx, _cap(xs, [caps[i] for i in idx] if caps else None, total)):
            out[i] = x
    return [max(1, round(x)) for x in out]
