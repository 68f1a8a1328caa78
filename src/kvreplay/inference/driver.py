"""The log replay, stage by stage: from `LogFacts` to the one `Replay` every view reads.

    facts -> format, profile -> (streaming?) -> workload + fit (prompts) -> placement
          -> final run + clock -> verification -> preemption records -> confidence

Each stage is a module of this package with one job; V1 and V0 logs go through the same
stages, the differences between their log formats being data (formats.py) and between
their engines the engine protocol (engines.py).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence, TYPE_CHECKING

from kvreplay.inference.assemble import (fit_placements, make_replay, place_arrivals,
                                         replay_by_iterations)
from kvreplay.inference.clock import StepTimeModel
from kvreplay.inference.confidence import set_confidence
from kvreplay.inference.ensemble import (MAX_REQUESTS, POOR_FIT_P_MAX, ensemble, headline,
                                         samples_wanted)
from kvreplay.inference.config import check_replayable
from kvreplay.inference.engines import scheduler_profile
from kvreplay.inference.facts import LogFacts, make_it_exact, with_notes
from kvreplay.inference.log_shape import arrival_pattern, response_starts, large_log, without_access_lines
from kvreplay.inference.formats import interval_of, log_format
from kvreplay.inference.lines import phase_estimate
from kvreplay.inference.placement import LARGE_LOG_ROUNDS
from kvreplay.inference.iteration_lines import unusable
from kvreplay.inference.prompts import fit_prompts
from kvreplay.inference import span_prefix
from kvreplay.inference.span_clock import span_marks, span_placement
from kvreplay.inference.verify import check_warnings, verify
from kvreplay.replay.checks import Verification
from kvreplay.replay.engine import without_cyclic_gc
from kvreplay.replay.records import preemption_records
from kvreplay.progress import stage
from kvreplay.errors import ReplayError
from kvreplay.replay.result import Replay

if TYPE_CHECKING:
    from kvreplay.inference.runs import Run



PINNED = 0.95  # of the spanned requests' first schedulings at their S: the spans pin the run


@without_cyclic_gc
def replay_log(facts: LogFacts, *, profile: str | None = None,
               step_time: StepTimeModel | None = None, samples: int | None = None,
               seed: int = 0, counters: Sequence[Any] = (), window: Any = None) -> Replay:
    """Rebuild, fit, place and replay a log. `profile`: the scheduler rules (default: the
    log's release); `step_time`: a step-time model taken as given, not fitted; `samples`:
    the replays in the uncertainty ensemble (None: automatic, 0: none), drawn with `seed`;
    `counters`: the same server's scrapes on the log's clock (CounterPoints), whose
    preemption counter weighs the ensemble's members beside the stats lines. `window`: a
    replay by Iteration lines from a carried engine state (inference.start_state.Window)."""
    profile = None if profile in (None, "auto") else profile
    fmt = log_format(facts.vllm_version, facts.engine_version, profile)
    prof = scheduler_profile(facts, fmt, profile)
    check_replayable(facts, fmt)
    starts = response_starts(facts, interval_of(facts, fmt))
    if starts is not None:
        facts = without_access_lines(facts)
    pattern = arrival_pattern(facts)
    why_not = unusable(facts, fmt)
    if why_not is None and step_time is None:
        with stage(f"replay by {len(facts.iterations):,} Iteration lines"):
            return replay_by_iterations(facts, fmt, prof, pattern, samples=samples, seed=seed,
                                        window=window)
    if window is not None and window.start is not None:
        raise ReplayError(f"a carried engine state is replayed by Iteration lines only: {why_not}")
    if facts.iterations:
        facts = with_notes(facts, f"Iteration lines not used: {why_not or 'a step time was given'}")
    prefix = None  # prefix caching, prompts unknown: the shared prefix (span_prefix.py)
    base = None  # ... the workload before it
    hits = None  # ... and each request's hit read from its span (None: not read)
    marks = None
    agreed = 0
    with stage(f"fit the clock and place {len(facts.requests):,} arrivals"):
        rebuilt, f, unknown = fit_prompts(facts, fmt, prof, fit_placements(fmt, pattern),
                                          step_time)
        marks = span_marks(facts, facts.span_offset_s) if facts.span_placement else None
        by_spans = marks is not None and fmt.placement == "anchored"
        if by_spans != facts.span_placement:
            facts = replace(facts, span_placement=by_spans)
        if facts.span_placement:
            assert marks is not None
            if span_prefix.applies(facts, rebuilt):
                base = rebuilt
                rebuilt, prefix = span_prefix.shared_workload(rebuilt, facts, fmt)
            run, agreed = span_placement(rebuilt, facts, fmt, prof, step_time or f.model,
                                         marks, fixed_model=step_time is not None)
            phase, loss, anchored = 0.5, f.loss, None
            if prefix is not None:
                rebuilt, run, agreed, hits = span_prefix.pinned(
                    base, rebuilt, facts, fmt, prof, marks, run, agreed, step_time is not None)
                rebuilt.notes.append(span_prefix.note(prefix, hits))
            rebuilt.notes.append(
                f"arrivals placed by the request spans' engine stamps (each request enters at "
                f"the step its queue time began; the clock snapped to the spans' step "
                f"boundaries, and each first and last token's step ends at its span's "
                f"time): {agreed} of {sum(marks.has_span)} spanned requests' first "
                f"schedulings start at their span's time")
        else:
            run, phase, loss, anchored = place_arrivals(rebuilt, facts, fmt, prof, f,
                                                        pattern, step_time)
            if fmt.placement == "anchored" and large_log(facts):
                facts = with_notes(
                    facts, f"a large log ({len(facts.requests):,} requests): the placement ran "
                    f"{LARGE_LOG_ROUNDS} round after its first replay, not up to 6 (a round is "
                    "a scheduler pass over the whole log)")
    if starts is not None:
        rebuilt.notes.append(
            f"the access lines are not used: {starts}. uvicorn writes a request's access line "
            "when its response headers go out, which for a streaming response is as it "
            "starts, not when it ends; arrivals are placed by their seconds and the stats "
            "lines only")
    phase_known = phase_estimate(facts) is not None

    def judged(run: Run) -> tuple[Verification, dict[str, Any] | None, list]:
        """The run against the log: verification, V0 warnings, confident records."""
        check = verify(run, facts, fmt, phase, prompts_known=not rebuilt.prompts_estimated)
        warnings = check_warnings(run, facts) if fmt.preemption_warnings else None
        pre = preemption_records(run.steps, run.clock)
        set_confidence(pre, check, warnings, rebuilt.prompts_estimated)
        return check, warnings, pre

    check, warnings, pre = judged(run)
    # the spans' stamps pin every arrival when the replay agrees with (nearly) all of them:
    # no placement left to draw (unless asked for); else the run is not pinned, and the
    # ensemble draws the placements around it (the spanned arrivals near their steps)
    pinned = facts.span_placement and marks is not None and \
        agreed >= PINNED * sum(marks.has_span)
    k = 0 if pinned and samples is None else samples_wanted(samples, facts, fmt)
    unc = None
    if facts.span_placement and prefix is not None and samples != 0:
        # the arrivals are pinned, the prefix sharing is not: its own ensemble
        with stage("uncertainty ensemble over prefix sharings"):
            unc = span_prefix.prefix_ensemble(rebuilt, facts, fmt, prof, marks, run, phase,
                                              prefix, samples=samples or span_prefix.SAMPLES,
                                              seed=seed, hits=hits, base=base)
        if unc.representative is not None:
            # the member the stats lines and the spans' queue times weigh most is shown
            old = run.num_preemptions
            run = unc.representative
            check, warnings, pre = judged(run)
            rebuilt.notes.append(
                f"the uncertainty ensemble over prefix sharings found a replay that agrees with "
                f"the stats lines and the spans' queue times better than the first one (its "
                f"{old} preemptions): it is the replay shown")
        unc.assign(pre)
        if unc.poor_fit:
            for p in pre:
                p.probability = min(p.probability or 0.0, POOR_FIT_P_MAX)
        unc.headline = headline(unc, pre, make_it_exact(facts).split(":")[0])
    elif k > 0:
        unc = ensemble(rebuilt, facts, fmt, prof, run, phase, phase_known, pre, samples=k,
                       seed=seed, pattern=pattern, placement=f.placement,
                       lengths=unknown.lens if unknown is not None else None,
                       shared_prefix=unknown.shared if unknown is not None else 0,
                       priority_unknown=unknown is not None and unknown.priority_unknown,
                       counters=counters)
        if unc.representative is not None:
            # a member agrees far better with the stats lines than the placed run: show it
            old = run.num_preemptions
            run = unc.representative
            check, warnings, pre = judged(run)
            facts = with_notes(
                facts,
                f"the uncertainty ensemble found a placement that agrees with the stats lines "
                f"far better than the first one (its {old} preemptions): it is the replay shown")
        unc.assign(pre)
        unc.headline = headline(unc, pre, make_it_exact(facts).split(":")[0])
    elif samples is None and fmt.placement == "anchored" and len(facts.requests) > MAX_REQUESTS:
        facts = with_notes(
            facts,
            f"no uncertainty ensemble: the log has {len(facts.requests):,} requests (over "
            f"{MAX_REQUESTS:,}, where 32 more replays cost minutes); --samples N runs one")
    estimate = unknown.count_variants() if unknown is not None and unc is None else None
    if unknown is not None and unc is not None:
        rebuilt.notes.append(unknown.why + "; each replay of the uncertainty ensemble draws its "
                             "own lengths around the estimate" +
                             (" and random priorities 0-4" if unknown.priority_unknown else ""))
    rep = make_replay(facts, fmt, prof, rebuilt, run, pre, check, loss=loss, pattern=pattern,
                      phase=phase, placement=f.placement, estimate=estimate,
                      warnings=warnings, uncertainty=unc)
    return rep


def replay_facts(facts: LogFacts, **kw: Any) -> Replay:
    """The same as `replay_log` (the name the earlier API used)."""
    return replay_log(facts, **kw)
