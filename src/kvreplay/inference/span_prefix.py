"""Prefix caching with the request spans but not the prompts' tokens: the spans give every
arrival's step (span_clock.py) and every prompt's length (`gen_ai.usage.prompt_tokens`);
which prompts share which prefix they do not give, and vLLM's preemptions depend on it
(a shared prefix is KV computed once and held once, spec A5). What the spans do give is
each request's prefill window: S (the start of the step that first scheduled it) to F
(the end of the step of its first token), vLLM's engine stamps, so the steps a..f of that
window took F - S; a prefix-cache hit is tokens those steps did not compute (spec A5, A9).

* First replay (`shared_workload`): every prompt (after the first) starts with one prefix
  of the length the stats lines' prefix-cache hit rate implies
  (prompts.shared_prefix_estimate), the arrivals placed by the spans' engine stamps.
* Hits read from the windows (`pinned`): the step-time model fitted to the windows'
  envelope (`hit_model`: the requests that computed their whole prompt, hit 0, sit on it;
  the model fitted over every window prices the hits the first replay gave and is off by
  what they are off) prices each window whose steps the run has at S with no other first
  admission in them; the tokens it did not compute, in whole blocks, are the hit
  (`span_hits`). Requests with the same hit share one prefix, first computed by the latest
  earlier request with hit 0 long enough to hold it (`groups_from_hits`); unread hits share
  nothing. Replayed by the spans' clock, this is the replay shown when at least MIN_HITS
  hits were read and it agrees with the spans' first schedulings as well as the first.
  On the span_harness renders (docs/accuracy.md, section 5) the synchronous runs' windows
  give 30-60 hits of 150, none wrong by more than a block; asynchronous scheduling's
  windows gave 10-30, nearly all wrong, and are not read (`windows_read`): an async run
  keeps the one prefix, and its ensemble draws the sharing freely.
* The ensemble (`prefix_ensemble`): with hits read, each member keeps them and draws every
  unread hit from the hits read; without, members draw another sharing: G groups (1-20)
  opened over the run, each arrival joining one of the latest LIVE, each group with its
  own prefix, of the estimate x 0-1.5 x U(0.25, 1.75). Each member is replayed by the same
  snapped clock (the arrivals do not move: the spans pin them), half of them with the
  step-time model refitted from a scaled start (`member_run`: the shown run's model was
  fitted with the first replay's guessed sharing and can be far off), and weighted by the
  stats lines times the spans' queue times (`span_weights`: each request the member admits
  over EARLY_S before its span's S costs a factor e^(-1/SPAN_T); the real run kept it
  waiting, so the member lacks the real run's memory pressure there). The member weighed
  most is the replay shown; the weighted members give the count interval (widened by WIDEN
  x its median) and each row's probability, the share of the other members (`voters`);
  rows at most *inferred*.

pc-sync-poisson-s1 (span_harness; no preemption in any member before, 31 true) was the
step-time model: fitted to the spans' windows of the one-prefix replay it came out 2.4 ms +
35 us per token, nothing per request or context token (the render's: 1.5 ms + 40 us + 50 us
per request + 0.04 us per context token, floor 120); by it steps are short, requests finish
early, the engine runs dry between arrivals (4,597 steps against 1,817) and memory never
fills. With the true prompts and that model still 0 preemptions; with the true model 31
and all 150 first schedulings at their S. Its members refitted from scaled starts preempt
24-34 times and admit 15-26 requests early, against 50 for the no-preemption ones.

Tried and not kept: hits read with the model fitted over every window (not the envelope),
refined by replaying: the hits absorb the model's error, the per-token cost drifts (33,
30, 18 us against the render's 40) and the hits with it (pc-sync-poisson-s0: 5 of 61 read
hits right, 48 wrong; with the envelope model 59 of 59 right).
"""

from __future__ import annotations

import bisect
import math
import random
from dataclasses import replace
from typing import Any, Sequence, TYPE_CHECKING

import msgspec

from kvreplay.inference.clock import StepTimeModel
from kvreplay.inference.facts import LogFacts
from kvreplay.inference.runs import Run
from kvreplay.inference.step_fit import FINE_FLOORS, NVARS, best_fit, segments
from kvreplay.inference.spans import TTFT_TOL_S
from kvreplay.inference.span_clock import SAME_S, SpanMarks, refitted, scaled, span_placement

if TYPE_CHECKING:
    from kvreplay.inference.engines import Profile
    from kvreplay.inference.rebuild import Rebuilt
    from kvreplay.inference.formats import LogFormat


SAMPLES = 16  # members besides the replay shown
GROUPS = (1, 3, 5, 10, 20)  # a member's number of prefix groups over the run
LIVE = 5  # ... of which the latest this many take new members
SCALES = (0.0, 0.5, 0.75, 1.0, 1.25, 1.5)  # a member's mean prefix length / the estimate
SPREAD = 0.75  # each group's prefix: the member's mean x U(1 - SPREAD, 1 + SPREAD)
# every interval's sides moved out by this x its median (uncertainty.interval): the least
# that makes the count interval hold on the calibration renders (span_harness seeds 0 and 2,
# caching on, plain logs: 6 of 8 held unwidened, 8 of 8 so); held out: docs/accuracy.md 5
WIDEN = 0.1
MODEL_SHARE = 0.5  # members whose step-time model is refitted from a scaled start (member_run)
MODEL_SCALES = (0.5, 0.8, 1.25, 2.0)
SPAN_T = 20.0  # early admissions per e-fold of a member's weight (span_weights; calibrated
# on span_harness seeds 0 and 2, caching on, plain logs: docs/accuracy.md 5)
# a first admission more than this before its span's S is early (admitted_early): the
# spans' verification's slack for the same contradiction (spans.check_spans)
EARLY_S = TTFT_TOL_S


def applies(facts: LogFacts, rebuilt: Rebuilt) -> bool:
    """Prefix caching on, some prompt's tokens unknown, one workload request per log
    request (no n > 1 fan-out), every request spanned with its prompt length."""
    cfg = rebuilt.workload.config
    return (bool(getattr(cfg, "enable_prefix_caching", False)) and not facts.prompts_known
            and len(rebuilt.workload.requests) == len(facts.requests)
            and all(r.span is not None for r in facts.requests))


def with_prefixes(rebuilt: Rebuilt, facts: LogFacts, group: Sequence[int],
                  prefix: int | Sequence[int]) -> Any:
    """The workload with each unknown prompt's first tokens its group's prefix (up to
    `prefix` tokens, or prefix[group], whole blocks, at most all its full blocks but the
    last token's), the rest its own tokens; prompts logged stay. Marks the unknown prompts
    estimated."""
    specs = list(rebuilt.workload.requests)
    bs = rebuilt.workload.config.block_size
    unknown = [r.prompt_token_ids is None for r in facts.requests]
    new = []
    for i, (s, g) in enumerate(zip(specs, group)):
        p = list(s.prompt_token_ids)
        x = prefix if isinstance(prefix, int) else prefix[g]
        if unknown[i] and x > 0:
            h = min(x // bs * bs, (len(p) - 1) // bs * bs)
            p = [3_000_000 + 50_000 * g + j for j in range(h)] + p[h:]
        new.append(replace(s, prompt_token_ids=p))
    return replace(rebuilt, workload=replace(rebuilt.workload, requests=new),
                   prompt_estimated=[a or b for a, b in zip(rebuilt.prompt_estimated, unknown)])


MAX_PREFILL_STEPS = 3  # a request's prefill read from at most this many steps
QUANT_TOL = 0.25  # of a block: a window priced this far off whole blocks is not read
# hits read (span_hits) for the sharing they imply to replace the one prefix. Few windows
# read means few priced at all: the envelope fit (hit_model) is then loosely held and every
# hit read moves with its error. On span_harness's calibration seeds (0, 2, 6-9, 12-17;
# caching on, plain logs, sync) the logs with 27-64 hits read had all 267 within a block;
# those with 11-18, 42 of 46 off by more (docs/accuracy.md, section 5). It was 8.
MIN_HITS = 25


def span_hits(run: Run, rebuilt: Rebuilt, marks: SpanMarks, model: StepTimeModel) -> list[int | None]:
    """Each request's prefix-cache hit (tokens, whole blocks) as its span's prefill says, or
    None where it does not say. vLLM stamps the request at its first scheduling (S, the
    start of step a) and its first token (F, the end of step f): F - S is the duration of
    steps a..f, and the step-time model prices each scheduled token (spec A9; the renders'
    formula is the same form). Where the run's steps a..f are the real ones (its step a
    starts at S) and no other request is first admitted in them, the gap between F - S and
    the model's price of the run's steps a..f is this request's computed tokens the run got
    wrong: hit = prompt - (the run's computed + gap / per-token cost), in whole blocks.
    None: no span, the run's step a not at S, another first admission in a..f (the gap is
    their sum), a step under the token floor (its price does not depend on its tokens), or
    the gap saying more tokens than the prompt (the real prefill took other steps)."""
    bs = rebuilt.workload.config.block_size
    out: list[int | None] = [None] * len(rebuilt.workload.requests)
    if model.per_token_s <= 0:
        return out
    for i, a, f, hit, n, dur in _prefill_rows(run, rebuilt, marks):
        if run.steps[a].num_scheduled_tokens <= model.token_floor:
            continue
        computed = _computed(run, model, a, f, hit, n, dur)
        if computed > n + bs / 2 or \
                run.steps[a].num_scheduled_tokens + computed - (n - hit) < model.token_floor + bs:
            continue  # (the real step under the floor: its price says nothing of its tokens)
        blocks = (n - computed) / bs
        if abs(blocks - round(blocks)) > QUANT_TOL and round(blocks) > 0:
            continue  # a hit is whole blocks: a window off the grid is priced wrong
        full = (n - 1) // bs * bs
        out[i] = max(0, min(full, int(round(blocks)) * bs))
    return out


HIT_MODEL_ROUNDS = 8
MIN_FOUNDERS = 4  # prefill windows read as computing their whole prompt, for a refit


def hit_model(run: Run, rebuilt: Rebuilt, marks: SpanMarks, model: StepTimeModel) -> StepTimeModel:
    """The step-time model the prefill windows price hits by. The model fitted over every
    span window (span_clock) prices each prefill with the hits the replay shown gave, and a
    per-token cost off by x% moves every hit read from it (span_hits) by x% of its prompt:
    the hits absorb the error. What does not move: a request that computed its whole prompt
    (the first of its sharing, or its prefix evicted) has hit 0, so the right model puts
    those windows exactly at their whole prompt's price, and none above it. Fitted to that
    envelope: each round, the windows read as hit 0 or less (within half a block) are
    refitted with their whole prompt computed, together with the single steps between two
    span boundaries that schedule only decodes (their price exact, their composition the
    run's), until the set stops changing."""
    bs = rebuilt.workload.config.block_size
    rows = _prefill_rows(run, rebuilt, marks)
    singles = []
    bounds = marks.bounds
    for k in range(len(run.steps) - 1):
        rec = run.steps[k]
        if rec.admitted or rec.recomputed or not rec.num_scheduled or \
                rec.num_scheduled_tokens != rec.num_scheduled:
            continue
        if _on(bounds, run.clock[k]) and _on(bounds, run.clock[k + 1]):
            singles.append(([rec], run.clock[k + 1] - run.clock[k]))
    found: frozenset[int] = frozenset()
    for _ in range(HIT_MODEL_ROUNDS):
        if model.per_token_s <= 0:
            break
        now = []
        for j, (i, a, f, hit, n, dur) in enumerate(rows):
            if _computed(run, model, a, f, hit, n, dur) >= n - bs / 2:
                now.append(j)
        if len(now) < MIN_FOUNDERS or frozenset(now) == found:
            break
        found = frozenset(now)
        data = list(singles)
        for j in now:
            i, a, f, hit, n, dur = rows[j]
            steps = list(run.steps[a:f + 1])
            steps[0] = msgspec.structs.replace(
                steps[0], num_scheduled_tokens=steps[0].num_scheduled_tokens + hit,
                context_tokens=max(0, steps[0].context_tokens - hit))
            data.append((steps, dur))
        best = best_fit(segments(data), FINE_FLOORS, NVARS)
        if best is None or best[2][1] <= 0:
            break
        c = best[2]
        model = StepTimeModel(c[0], c[1], c[2], c[3], best[1])
    return model


def _computed(run: Run, model: StepTimeModel, a: int, f: int, hit: int, n: int,
              dur: float) -> float:
    """The prompt tokens a prefill window (steps a..f, `dur` long by the span) computed, by
    `model`: the run's computed (n - hit) plus what the model's price of the run's steps
    leaves of `dur`, at its per-token cost (> 0)."""
    pred = sum(model.dt_record(run.steps[k]) for k in range(a, f + 1))
    return n - hit + (dur - pred) / model.per_token_s


def _on(bounds: Sequence[float], t: float) -> bool:
    k = bisect.bisect_left(bounds, t - SAME_S)
    return k < len(bounds) and abs(bounds[k] - t) <= SAME_S


def _prefill_rows(run: Run, rebuilt: Rebuilt, marks: SpanMarks
                  ) -> list[tuple[int, int, int, int, int, float]]:
    """(request, first admission step a, first-token step f, the run's hit, prompt tokens,
    F - S) of each request whose prefill window the run has at its span's S, with no other
    first admission in steps a..f (span_hits)."""
    first: dict[str, tuple[int, int]] = {}
    news: list[int] = []
    tok: dict[str, int] = {}
    for k, rec in enumerate(run.steps):
        n = 0
        for a in rec.admitted:
            if not a.resumed and a.request not in first:
                first[a.request] = (k, a.prefix_hit)
                n += 1
        news.append(n)
        for rid in rec.first_tokens:
            tok.setdefault(rid, k)
    rows = []
    for i, spec in enumerate(rebuilt.workload.requests):
        if i >= len(marks.has_span) or not marks.has_span[i]:
            continue
        if spec.id not in first or spec.id not in tok:
            continue
        a, hit = first[spec.id]
        f = tok[spec.id]
        if not 0 <= f - a < MAX_PREFILL_STEPS or abs(run.clock[a] - marks.scheduled[i]) > SAME_S:
            continue
        if sum(news[a:f + 1]) != 1:
            continue
        rows.append((i, a, f, hit, len(spec.prompt_token_ids),
                     marks.first_token[i] - marks.scheduled[i]))
    return rows


def groups_from_hits(hits: Sequence[int | None], lengths: Sequence[int], marks: SpanMarks,
                     bs: int) -> tuple[list[int], list[int]]:
    """A sharing that gives each request its hit: (group of each request, prefix of each
    group; group 0 shares nothing). Requests with the same hit h > 0 share one prefix of h
    tokens; its first holder (the founder, whose prefill computed it: hit 0, a prompt of
    more than h tokens, its first token before the first sharer was scheduled, not
    another's founder) is the latest such request before the first sharer. Unknown hits
    share nothing."""
    group = [0] * len(hits)
    sizes = [0]
    key: dict[int, int] = {}
    founders: set[int] = set()
    order = sorted(range(len(hits)), key=lambda i: (marks.entry[i], i))
    for pos, i in enumerate(order):
        h = hits[i]
        if not h:
            continue
        if h in key:
            group[i] = key[h]
            continue
        key[h] = g = len(sizes)
        sizes.append(h)
        group[i] = g
        for j in reversed(order[:pos]):
            if j not in founders and hits[j] == 0 and lengths[j] - 1 >= h and \
                    marks.first_token[j] <= marks.scheduled[i] + SAME_S:
                founders.add(j)
                group[j] = g
                break
    return group, sizes


def pinned(base: Rebuilt, shown: Rebuilt, facts: LogFacts, fmt: LogFormat, profile: Profile,
           marks: SpanMarks, run: Run, agreed: int, fixed_model: bool
           ) -> tuple[Rebuilt, Run, int, list[int | None] | None]:
    """The replay shown with each request's hit as its prefill window says: the hits read
    from the one-prefix run (`shown`, `run`) by the envelope model (hit_model, span_hits),
    the sharing they imply (groups_from_hits) on the workload without the one prefix
    (`base`), replayed by the spans' clock. Kept when at least MIN_HITS hits are read and
    the new run agrees with the spans' first schedulings at least as well; else the
    one-prefix run, and None for the hits. Under asynchronous scheduling no window is read
    (`windows_read`)."""
    if not windows_read(shown):
        return shown, run, agreed, None
    hm = hit_model(run, shown, marks, run.model)
    hits = span_hits(run, shown, marks, hm) if hm is not run.model else []
    if sum(h is not None for h in hits) < MIN_HITS:
        return shown, run, agreed, None
    rb = hits_workload(base, facts, filled(hits, base, marks), marks)
    alt, ag = span_placement(rb, facts, fmt, profile, run.model, marks, fixed_model=fixed_model)
    if ag < agreed:
        return shown, run, agreed, None
    return rb, alt, ag, hits


def windows_read(rebuilt: Rebuilt) -> bool:
    """Whether the prefill windows are read for hits: not under asynchronous scheduling
    (spec A9: step k+1 is scheduled before step k's output is processed, so the steps
    between a request's S and F are not the ones the window prices as its prefill). On
    span_harness's calibration seeds (0, 2, 6-9, 12-17; caching on, plain logs) the async
    runs' windows read 71 hits on 5 logs, 68 of them off by more than a block; the sync
    runs' 271 of 313 within a block (the 42 others on 3 logs reading 11-18: MIN_HITS)."""
    return not rebuilt.workload.config.async_scheduling


def filled(hits: Sequence[int | None], base: Rebuilt, marks: SpanMarks) -> list[int | None]:
    """Each unread hit the latest earlier (by entry) read hit over 0 that its prompt holds:
    prompts arriving together mostly share the prefixes then live."""
    out = list(hits)
    lens = [len(s.prompt_token_ids) for s in base.workload.requests]
    last: list[int] = []
    for i in sorted(range(len(out)), key=lambda i: (marks.entry[i], i)):
        if out[i] is None:
            out[i] = next((h for h in reversed(last) if lens[i] - 1 >= h), 0)
        elif out[i]:
            last.append(out[i])  # type: ignore[arg-type]
    return out


def note(prefix: int, hits: Sequence[int | None] | None) -> str:
    """What the replay shown assumed of the sharing (the report's note)."""
    if hits is None:
        return (f"prefix caching on, prompts not logged: the spans give each prompt's length, "
                f"not what it shares; the replay shown gives every prompt one shared prefix "
                f"of {prefix} tokens (what the stats lines' prefix-cache hit rate implies), and "
                f"the uncertainty ensemble draws other sharings")
    return (f"prefix caching on, prompts not logged: {sum(h is not None for h in hits)} of "
            f"{len(hits)} requests' prefix-cache hits read from their spans' prefill times "
            f"(the step-time model prices the tokens computed); the replay shown gives those "
            f"hits, each other request the latest earlier hit read that its prompt holds, and "
            f"the uncertainty ensemble draws the others' from the hits read")


def hits_workload(base: Rebuilt, facts: LogFacts, hits: Sequence[int | None],
                  marks: SpanMarks) -> Rebuilt:
    """`base`'s workload with the sharing groups_from_hits makes of `hits`."""
    lens = [len(s.prompt_token_ids) for s in base.workload.requests]
    group, sizes = groups_from_hits(hits, lens, marks, base.workload.config.block_size)
    return with_prefixes(base, facts, group, sizes)


def shared_workload(rebuilt: Rebuilt, facts: LogFacts, fmt: LogFormat) -> tuple[Any, int]:
    """The replay shown's workload: one prefix of the estimated length (module doc)."""
    from kvreplay.inference.prompts import shared_prefix_estimate

    s = shared_prefix_estimate(facts, fmt, rebuilt.workload.config)
    return with_prefixes(rebuilt, facts, [0] * len(facts.requests), s), s


def member_run(rb: Rebuilt, facts: LogFacts, fmt: LogFormat, profile: Profile, model: StepTimeModel,
               marks: SpanMarks, rng: random.Random) -> tuple[Run, int]:
    """A member's replay of its sharing `rb` by the spans' clock, and its agreement with the
    spans' first schedulings: from the shown run's step-time model as it is, or (one member
    in MODEL_SHARE) from it scaled by one of MODEL_SCALES and refitted on the spans' windows
    (span_clock.refitted). The model the shown run was fitted to was fitted with its own
    guessed sharing; where that sharing is far off, so is the model, and every member kept
    to it replays alike (pc-sync-poisson-s1: no preemption in any member, 31 true)."""
    if rng.random() < MODEL_SHARE:
        return refitted(rb, facts, fmt, profile, scaled(model, rng.choice(MODEL_SCALES)), marks,
                        rng.random() < 0.5)
    return span_placement(rb, facts, fmt, profile, model, marks, fixed_model=True)


def admitted_early(run: Run, rebuilt: Rebuilt, marks: SpanMarks) -> int:
    """Spanned requests whose first admission in `run` starts more than EARLY_S before
    their span's S: the real run kept them waiting (spec A7: a request is admitted only
    when the KV cache has its blocks and the batch its tokens) where this replay did not,
    so this replay has less memory pressure than the real one had at that time."""
    first: dict[str, float] = {}
    for k, rec in enumerate(run.steps):
        for a in rec.admitted:
            first.setdefault(a.request, run.clock[k])
    n = 0
    for i, spec in enumerate(rebuilt.workload.requests[:len(marks.scheduled)]):
        t = first.get(spec.id)
        n += t is not None and marks.has_span[i] and t < marks.scheduled[i] - EARLY_S
    return n


def span_weights(w: Sequence[float], early: Sequence[int]) -> list[float]:
    """The stats lines' weights times the spans' likelihood exp(-(early - fewest) / SPAN_T),
    `early` each member's admitted_early: a member that admits requests the spans show
    waiting is that much less likely."""
    if SPAN_T <= 0 or not early:
        return list(w)
    fewest = min(early)
    return [x * math.exp(-(e - fewest) / SPAN_T) for x, e in zip(w, early)]


def voters(w: Sequence[float], shown: int) -> list[float]:
    """The weights the rows' and requests' probabilities are shares of: every member's but
    the replay shown's (it is shown for being weighed most, and would vote for its own
    rows: on the calibration renders a row's share counting it named the true victim 5
    times in 36 at 0.8 or more; without it no row reached 0.6), unless no other member
    weighs anything."""
    out = [0.0 if k == shown else x for k, x in enumerate(w)]
    return out if sum(out) > 0 else list(w)


def prefix_ensemble(rebuilt: Rebuilt, facts: LogFacts, fmt: LogFormat, profile: Profile, marks: SpanMarks,
                    run: Run, phase: float, prefix: int, *, samples: int = SAMPLES,
                    seed: int = 0, hits: Sequence[int | None] | None = None,
                    base: Rebuilt | None = None) -> Any:
    """The ensemble over prefix sharings (module doc): an uncertainty.Uncertainty, member 0
    the replay shown (`run`)."""
    from kvreplay.inference.ensemble import POOR_FIT, stats_member
    from kvreplay.inference.uncertainty import noise_weights, summarize
    from kvreplay.inference.lines import line_time

    bounds = [line_time(s, phase) for s in facts.stats]
    members = [stats_member(run, facts, fmt, phase, bounds, False)]
    early = [admitted_early(run, rebuilt, marks)]
    runs = [run]
    n = len(facts.requests)
    known = [h for h in hits or () if h is not None]
    for k in range(samples):
        rng = random.Random(f"kvreplay-span-prefix:{seed}:{k}")
        if hits is not None and base is not None and known:
            # the hits the windows read stay; each unread one drawn from those read
            drawn = [h if h is not None else rng.choice(known) for h in hits]
            rb = hits_workload(base, facts, drawn, marks)
        else:
            g = rng.choice(GROUPS)
            scale = rng.choice(SCALES)
            group, opened = [], 1
            for i in range(n):  # arrivals join one of the latest LIVE groups, or open one
                if opened < g and rng.random() < g / max(1, n):
                    opened += 1
                group.append(rng.randrange(max(0, opened - LIVE), opened))
            sizes = [int(prefix * scale * rng.uniform(1 - SPREAD, 1 + SPREAD)) for _ in range(g)]
            rb = with_prefixes(rebuilt, facts, group, sizes)
        alt, _ = member_run(rb, facts, fmt, profile, run.model, marks, rng)
        members.append(stats_member(alt, facts, fmt, phase, bounds, False))
        early.append(admitted_early(alt, rb, marks))
        runs.append(alt)
    w = span_weights(noise_weights([m.sse for m in members], len(facts.stats)), early)
    top = max(range(len(w)), key=lambda k: (w[k], -k))
    # no member reproduces the stats lines: the headline calls the range rough, not a 90%
    # interval, and no row likely (driver.py caps the rows' p as ensemble.py does)
    fit = min(m.sse for m in members) / max(1, len(facts.stats))
    return summarize(members, w, seed=seed, lines=len(facts.stats),
                     windows=([facts.requests[0].time or 0.0] + bounds, bounds + [run.end]),
                     poor_fit=fit >= POOR_FIT, shared_prefix=prefix, widen=WIDEN,
                     voters=(members, voters(w, top)), representative=runs[top] if top else None)
