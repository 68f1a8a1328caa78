"""Uncertainty for an Iteration-line replay of a log without prompt bodies.

Consumes: the search's match (iterations.py: its run, the arrival steps it placed, what
the lines said of each prompt length: `IterationMatch.length_status`, `sum_groups`), the
rebuilt workload, `LogFacts`. Produces the same `Uncertainty` a stats-line log gets
(ensemble.py): intervals for the preemption count and the recomputed tokens, each
request's probability of being preempted, a probability per row.

The lines place the arrivals (their context request counts, exact) but pin a prompt only
where it was prefilled alone in a step ("exact"); a prompt admitted with others is known
as their sum ("sum"), one split by the KV usage once a member left the pool to a block
("block"), one cut by the token budget as a lower bound ("bound"), one no line reached not
at all ("estimated"). Each member replays the same arrival steps with lengths the lines
allow: exact kept, a sum split at random with its total kept (log-normal shares), a block
moved within +-1 block, a bound raised, an estimate redrawn log-normally; under the
priority policy without logged priorities, random priorities 0-4. Weight: how many
Iteration lines the member reproduces (uncertainty.noise_weights on the lines it misses).
The count's interval is over every member, at least its median +- COUNT_Z x sqrt(median),
and no lower than the recomputes the lines show
(iteration_lines.recomputes_count: a lower bound); a row's and a request's probability over the
drawn members only (the search's replay names the rows: its agreement is not evidence); a
request's calibrated (REQUEST_MAP) unless the lines pin the run, and never below a row
naming it. Seeded: the same log gives the same ensemble.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace
from typing import Any, Sequence

from kvreplay.events import Iteration
from kvreplay.inference.engines import make_engine
from kvreplay.inference.uncertainty import (NOISE_FLOOR, NOISE_K, TOL_STEPS, Member,
                                           Uncertainty, calibrated, noise_weights, summarize,
                                           temper)
from kvreplay.inference.facts import LogFacts
from kvreplay.inference.formats import LogFormat
from kvreplay.inference.iteration_lines import recomputes_count
from kvreplay.replay.records import PreemptionRecord, preemption_records, totals

# Members besides the search's own replay. Each is one whole replay of the log, as costly
# as the replay with prompts' own run (the scheduler is ~80% of it: a member recording
# only counts saved 7%, not kept), so the members set the time: 3 keep the replay within
# 2x the same log with prompts (6: 2.3-2.8x). With COUNT_Z, 3 held the count on
# tools/research/eval_iter_noprompts's 11 logs (11 of 11) and on 16 held-out renders
# (--seed-base 3100, 3200: 16 of 16), as 6 did; without it 3 and 4 lost f (5-9, true 10).
SAMPLES = 3
# The count's 90% interval is at least its median +- COUNT_Z x sqrt(median): a count's own
# noise (Poisson-like), which a few members cannot show on a log of few preemptions (f:
# median 7 of 3 members, true 10); on larger counts WIDEN is the wider.
COUNT_Z = 1.645
MAX_STEPS = 200_000  # (samples x steps) beyond which the ensemble is not run
SUM_SIGMA = 0.6  # log-normal spread of a sum's shares
EST_SIGMA = 0.5  # ... of a length no line pinned
# The members share the search's arrival steps and its errors (a preemption it puts a few
# steps off moves the following ones), so the count's spread is widened by this share of
# the median on each side. Chosen on tools/eval_iter_noprompts.py's 11 logs (the three log
# cases, 8 renders): the search undercounts by up to a third; the 16 held-out renders
# (--seed-base 3100, 3200) held too (16 of 16, with 3 members and COUNT_Z).
WIDEN = 0.35
# The drawn members' weights for the probabilities keep this share of them effective (a
# member that matches a few more lines is not much likelier to have the right victims).
# With 3 members, 0.5 let one member's say-so make a row likely (held-out renders: rows at
# p >= 0.8 right 1 of 2); 0.8: 7 of 7 on the 11 logs and the held-out 8, as with 6 at 0.5.
ROW_ESS = 0.8
# A request's `p_preempted` (the drawn members' share that preempt it at all) -> the share
# of such requests truly preempted, where the lines do not pin the run (member 0 misses a
# line): (raw share, share right), isotonic over the bins < 0.2, 0.2-0.5, 0.5-0.8, >= 0.8.
# Measured with tools/research/eval_iter_noprompts on its 11 logs and the 8 held-out
# renders (--seed-base 3100), 3 members: 91 of 407, 142 of 574, 95 of 422, 47 of 165 truly
# preempted (raw, p >= 0.8 read as 0.8+ but right 28% of the time). The members redraw
# every unpinned prompt, so who they preempt says little about who was: every bin is near
# the base rate. A request one of its rows makes likelier keeps that row's probability
# (the row's event implies the request's).
REQUEST_MAP = ((0.1, 0.22), (0.35, 0.24), (0.65, 0.24), (0.9, 0.28))


def _tokens(old: Sequence[int], n: int, i: int) -> list[int]:
    """A prompt of n tokens: the leading ones kept (their blocks keep their identity),
    new ones unique to the request."""
    if n <= len(old):
        return list(old[:n])
    start = old[-1] + 1 if old else 1_000_000 + i * 100_003
    return [*old, *range(start, start + n - len(old))]


def draw_lengths(lens: Sequence[int], status: dict[int, str], groups: Sequence[Sequence[int]],
                 cap: Sequence[int], block: int, rng: random.Random) -> list[int]:
    out = list(lens)
    in_group = set()
    for g in groups:
        live = [i for i in g if status.get(i) == "sum"]
        if len(live) < 2:
            continue
        total = sum(out[i] for i in live)
        w = [rng.lognormvariate(0.0, SUM_SIGMA) for _ in live]
        s = sum(w)
        new = [max(1, round(total * x / s)) for x in w]
        new[-1] = max(1, total - sum(new[:-1]))
        for i, n in zip(live, new):
            out[i] = n
            in_group.add(i)
    for i, st in status.items():
        if i in in_group or st == "exact":
            continue
        if st == "block":
            out[i] = out[i] + rng.randint(-block, block)
        elif st == "bound":
            out[i] = round(out[i] * (1.0 + abs(rng.gauss(0.0, 0.3))))
        elif st in ("estimated", "sum"):
            out[i] = round(out[i] * rng.lognormvariate(0.0, EST_SIGMA))
    return [min(max(1, n), c) for n, c in zip(out, cap)]


def _replay(workload: Any, profile: Any, inputs: Any) -> list:
    eng = make_engine(workload, profile, inputs=inputs)
    steps = []
    while not eng.done:
        steps.append(eng.step())
    return steps


def lines_missed(steps: Sequence[Any], facts: LogFacts,
                 by_n: dict[int, Iteration] | None = None) -> int:
    """Iteration lines whose context / generation requests and tokens the run does not
    reproduce (the N-th token step against Iteration(N)), and lines it has no step for.
    `by_n`: the lines by N (built from `facts` when not given)."""
    if by_n is None:
        by_n = {it.step: it for it in facts.iterations}
    n = missed = 0
    for rec in steps:
        if rec.num_scheduled_tokens <= 0:
            continue
        it = by_n.get(n)
        n += 1
        if it is None:
            continue
        ours = (rec.num_ctx_requests, rec.num_ctx_tokens, rec.num_scheduled - rec.num_ctx_requests,
                rec.num_scheduled_tokens - rec.num_ctx_tokens)
        if ours != (it.context_requests, it.context_tokens, it.generation_requests,
                    it.generation_tokens):
            missed += 1
    return missed + sum(1 for k in by_n if k >= n)


def _member(steps: Sequence[Any], clock: Sequence[float], facts: LogFacts,
            by_n: dict[int, Iteration]) -> Member:
    pre = preemption_records(steps, list(clock) + [clock[-1] if clock else 0.0] * max(
        0, len(steps) - len(clock)))
    by_victim: dict[str, list[int]] = {}
    for p in pre:
        by_victim.setdefault(p.victim, []).append(p.step)
    t = totals(steps, pre)
    miss = lines_missed(steps, facts, by_n)
    return Member(1.0, float(miss), float(miss), miss, t.preemptions, t.tokens_recomputed,
                  t.processed_tokens, by_victim, [t.preemptions])


def iteration_ensemble(rebuilt: Any, facts: LogFacts, fmt: LogFormat, profile: Any, m: Any,
                       pre: Sequence[PreemptionRecord], *, priority_unknown: bool,
                       samples: int = SAMPLES, seed: int = 0) -> Uncertainty | None:
    """`samples` members besides the search's replay (member 0); None when the log is too
    large for it (samples x steps over MAX_STEPS) or nothing is uncertain."""
    run = m.run
    if samples <= 0 or samples * len(run.steps) > MAX_STEPS:
        return None
    wl = rebuilt.workload
    status: dict[int, str] = dict(m.length_status)
    if not any(s != "exact" for s in status.values()) and not priority_unknown:
        return None
    cfg = wl.config
    lens = [len(s.prompt_token_ids) for s in wl.requests]
    cap = [max(1, cfg.max_model_len - s.max_tokens) for s in wl.requests]
    by_n = {it.step: it for it in facts.iterations}
    members = [_member(run.steps, run.clock, facts, by_n)]
    for k in range(samples):
        rng = random.Random(f"kvreplay-iteration-ensemble:{seed}:{k}")
        new = draw_lengths(lens, status, m.sum_groups, cap, cfg.block_size, rng)
        specs = []
        for i, (sp, n) in enumerate(zip(wl.requests, new)):
            sp2 = sp if n == lens[i] else replace(sp, prompt_token_ids=_tokens(sp.prompt_token_ids, n, i))
            if priority_unknown:
                sp2 = replace(sp2, priority=rng.randint(0, 4))
            specs.append(sp2)
        try:
            steps = _replay(replace(wl, requests=specs), profile, run.inputs)
        except ValueError:  # a drawn length the engine refuses: not a run the log allows
            continue
        mem = _member(steps, run.clock, facts, by_n)
        mem.prompt_lens = tuple(new)
        members.append(mem)
    w = noise_weights([x.sse for x in members], max(1, len(facts.iterations)))
    # The probabilities: the drawn members only. The search's replay (member 0) names the
    # rows and matches the most lines by construction (its lengths were fitted to them), so
    # its agreement with itself is no evidence; its weight would make every row sure.
    # Unless it matches every line, KV usage included: the blocks in use are then pinned
    # at every step (to the line's 0.1 %), and with them where the pool runs out.
    pinned = m.matched == m.lines and members[0].sse == 0
    if pinned:
        drawn, dw = members, w
    else:
        drawn = members[1:] or members
        dw = temper([x.sse for x in drawn], NOISE_K * max(
            NOISE_FLOOR, min(x.sse for x in drawn) / max(1, len(facts.iterations))), ROW_ESS)
    # (no storm timeline: the members are not counted per stats line)
    unc = summarize(members, w, seed=seed, lines=len(facts.iterations), voters=(drawn, dw),
                    widen=WIDEN, weighted_by="the Iteration lines",
                    p_of=None if pinned else _request_p)
    if not pinned:
        _rows_lift_requests(unc, pre)
    count_noise(unc.preemptions)
    # the recomputes the lines show are preemptions every run the log allows has: the
    # count is at least that many (a member with fewer misses lines no weight measures)
    shown = recomputes_count(facts, wl, profile)
    if shown:
        unc.count_floor = shown
        c = unc.preemptions
        for k in ("low", "median", "high"):
            c[k] = max(c[k], shown)
    return unc


def count_noise(c: dict[str, int]) -> None:
    """The count's interval `c` widened to at least its median +- COUNT_Z x sqrt(median)."""
    pad = round(COUNT_Z * math.sqrt(c["median"]))
    c["low"] = max(0, min(c["low"], c["median"] - pad))
    c["high"] = max(c["high"], c["median"] + pad)


def _request_p(raw: float) -> float:
    return calibrated(raw, REQUEST_MAP)


def _rows_lift_requests(unc: Uncertainty, pre: Sequence[PreemptionRecord]) -> None:
    """A request is at least as likely preempted as any row naming it (the rows' own
    probabilities, Uncertainty.assign, as the replay gives them); the order kept most
    likely first."""
    unc.assign(pre)
    top: dict[str, float] = {}
    for p in pre:
        if p.probability is not None:
            top[p.victim] = max(top.get(p.victim, 0.0), p.probability)
    if not top:
        return
    for r in unc.requests:
        q = top.get(r["id"], 0.0)
        if q > r["p_preempted"]:
            r["expected_preemptions"] = round(max(r["expected_preemptions"], q), 3)
            r["p_preempted"] = q
    unc.requests.sort(key=lambda r: (-r["p_preempted"], -r["expected_preemptions"], r["id"]))


def iteration_headline(unc: Uncertainty, pre: Sequence[PreemptionRecord], make_exact: str,
                       priority_unknown: bool) -> str:
    """One line: what to trust in a replay placed by Iteration lines whose prompts are not
    logged, what not, how to make it exact."""
    c = unc.preemptions
    leads = sum(1 for p in pre if (p.probability or 0.0) < 0.5)
    why = ("the Iteration lines place every arrival, but show a prompt's length only where "
           "it was prefilled alone in a step" + (", and no priority is logged" if priority_unknown
                                                  else ""))
    count = f"{c['low']}-{c['high']} preemptions, 90% interval, median {c['median']}"
    if leads:
        rows = (f"do not trust single victims: {leads} of {len(pre)} rows are leads (p < 0.5 that "
                f"the row's victim was preempted within {TOL_STEPS} steps of its step)")
    else:
        rows = "each row's victim is likely (p >= 0.5), not certain"
    return f"trust the count ({count}) and the recomputed tokens; {rows}: {why}; to make it exact: {make_exact}"


__all__ = ["iteration_ensemble", "iteration_headline", "TOL_STEPS"]
