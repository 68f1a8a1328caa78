"""The log replay, stage by stage: from `LogFacts` to the one `Replay` every view reads.

    facts -> format, profile -> (streaming?) -> workload + fit (prompts) -> placement
          -> final run + clock -> verification -> preemption records -> confidence

Each stage is a module of this package with one job; V1 and V0 logs go through the same
stages, the differences between their log formats being data (formats.py) and between
their engines the engine protocol (engines.py).
"""

from __future__ import annotations

from typing import Any

from kvreplay.inference.assemble import (fit_placements, make_replay, place_arrivals,
                                         replay_by_iterations)
from kvreplay.inference.clock import StepTimeModel
from kvreplay.inference.confidence import (SUPPORT_MAX_REQUESTS, add_support, set_confidence,
                                           support_wanted)
from kvreplay.inference.config import check_replayable
from kvreplay.inference.engines import scheduler_profile
from kvreplay.inference.facts import (LogFacts, arrival_pattern, response_starts,
                                      without_access_lines)
from kvreplay.inference.formats import interval_of, log_format
from kvreplay.inference.iterations import unusable
from kvreplay.inference.prompts import fit_prompts
from kvreplay.inference.verify import check_warnings, verify
from kvreplay.replay.engine import without_cyclic_gc
from kvreplay.replay.records import preemption_records
from kvreplay.replay.result import Replay


@without_cyclic_gc
def replay_log(facts: LogFacts, *, profile: str | None = None,
               step_time: StepTimeModel | None = None, support: int | None = None) -> Replay:
    """Rebuild, fit, place and replay a log. `profile`: the scheduler rules (default: the
    log's release); `step_time`: a step-time model taken as given, not fitted; `support`:
    alternative replays behind each preemption's support (None: automatic, 0: none)."""
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
        return replay_by_iterations(facts, fmt, prof, pattern)
    if facts.iterations:
        facts.notes.append(f"Iteration lines not used: {why_not or 'a step time was given'}")
    rebuilt, f, unknown = fit_prompts(facts, fmt, prof, fit_placements(fmt, pattern), step_time)
    if starts is not None:
        rebuilt.notes.append(
            f"the access lines are not used: {starts}. uvicorn writes a request's access line "
            "when its response headers go out, which for a streaming response is as it "
            "starts, not when it ends; arrivals are placed by their seconds and the stats "
            "lines only")
    run, phase, loss, anchored = place_arrivals(rebuilt, facts, fmt, prof, f, pattern, step_time)
    estimate = None
    if unknown is not None:
        if anchored is not None and len(facts.requests) <= SUPPORT_MAX_REQUESTS:
            unknown.add_placed_variants(anchored.arrival_steps, run.model)
        estimate = unknown.estimate
    check = verify(run, facts, fmt, phase, prompts_known=not rebuilt.prompts_estimated)
    warnings = check_warnings(run, facts) if fmt.preemption_warnings else None
    pre = preemption_records(run.steps, run.clock)
    set_confidence(pre, check, warnings, rebuilt.prompts_estimated)
    k = support_wanted(support, pattern, rebuilt.prompts_estimated, facts, fmt)
    if k > 0 and pre:
        add_support(pre, rebuilt, facts, fmt, prof, run, k)
    return make_replay(facts, fmt, prof, rebuilt, run, pre, check, loss=loss, pattern=pattern,
                       phase=phase, placement=f.placement, estimate=estimate,
                       warnings=warnings, support=k)


def replay_facts(facts: LogFacts, **kw: Any) -> Replay:
    """The same as `replay_log` (the name the earlier API used)."""
    return replay_log(facts, **kw)
