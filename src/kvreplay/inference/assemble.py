"""The last steps of a log replay: the arrival placement chain of formats that anchor
arrivals to the stats lines, and the `Replay` the views read.

Consumes: the stages' results. Produces: the placed and clocked final run
(`place_arrivals`), and the `Replay` with its notes and its step -> log lines map
(`make_replay`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from kvreplay.inference.clock import StepTimeModel, clocked, finish_steps
from kvreplay.inference.facts import LogFacts, make_it_exact
from kvreplay.inference.log_shape import aborts, cut_time
from kvreplay.inference.fit import Fit, fit
from kvreplay.inference.formats import LogFormat
from kvreplay.inference.lines import phase_estimate
from kvreplay.inference.placement import Anchored, anchored_replay, burst_spacing, exact_search
from kvreplay.inference.rebuild import Rebuilt
from kvreplay.inference.confidence import set_iteration_confidence
from kvreplay.inference.iteration_ensemble import MAX_STEPS as ITERATION_MAX_STEPS
from kvreplay.inference.iteration_ensemble import SAMPLES as ITERATION_SAMPLES
from kvreplay.inference.iteration_ensemble import iteration_ensemble, iteration_headline
from kvreplay.inference.iterations import iteration_replay
from kvreplay.inference.start_state import Window
from kvreplay.inference.rebuild import rebuild_workload
from kvreplay.inference.runs import Run, step_replay, timed_replay
from kvreplay.inference.verify import verify
from kvreplay.replay.checks import Verification, WarningsCheck
from kvreplay.replay.records import PreemptionRecord, preemption_records
from kvreplay.replay.result import CountEstimate, Provenance, Replay

if TYPE_CHECKING:
    from kvreplay.inference.engines import Profile
    from kvreplay.inference.uncertainty import Uncertainty


def fit_placements(fmt: LogFormat, pattern: str) -> tuple[tuple[float, float], ...]:
    """Where in its second each request may have arrived, as the fit tries it: the
    format's list, else a burst at the start of the second or spread evenly (Poisson)."""
    if fmt.placements:
        return fmt.placements
    return ((0.0, 0.0),) if pattern != "poisson" else ((0.0, 1.0),)


def place_arrivals(rebuilt: Rebuilt, facts: LogFacts, fmt: LogFormat, prof: Profile, f: Fit,
                   pattern: str, step_time: StepTimeModel | None) -> tuple[Run, float, float, Anchored | None]:
    """(final run, clock phase, loss, anchored placement): arrivals anchored to the stats
    lines (formats that do), else the fit's time-driven placement replayed once more."""
    if fmt.placement != "anchored":
        run = timed_replay(f.rebuilt, facts, prof, f.model, f.placement,
                           order_window_s=fmt.order_window_s)
        return run, 0.5, f.loss, None
    burst = pattern != "poisson"
    init = f.run
    if pattern == "burst":
        # everything arrived within a couple of seconds: start from "all at once" (the
        # iteration then moves whoever the seconds and completions say came later)
        init = step_replay(rebuilt, facts, prof, [0] * len(rebuilt.workload.requests), f.model)
    fixed = step_time is not None
    anchored = anchored_replay(rebuilt, facts, fmt, prof, init, f.model, burst=burst,
                               fixed_model=fixed, reuse_init=init is f.run and f.rebuilt is rebuilt)
    if not burst and phase_estimate(facts) is None:
        # Without a phase estimate the iteration can settle one step off; start it again
        # from a burst-like guess and keep whichever agrees better with the stats lines.
        # A global shift of every arrival is invisible to this loss, so only a clearly
        # better fit (half the disagreement) replaces the first one.
        f0 = fit(rebuilt, facts, fmt, prof, ((0.0, 0.0),), model=step_time or f.model, rounds=1)
        alt = anchored_replay(rebuilt, facts, fmt, prof, f0.run, f.model, burst=False,
                              fixed_model=fixed, iterations=3)
        if alt.loss < 0.5 * anchored.loss:
            anchored = alt
    if pattern == "burst":
        anchored = burst_spacing(rebuilt, facts, fmt, prof, anchored)
        anchored = exact_search(rebuilt, facts, fmt, prof, anchored)
    run = anchored.run
    if aborts(facts) or cut_time(facts) is not None:
        # aborts and the cut are applied by wall time: replay again on the final model
        run = step_replay(rebuilt, facts, prof, anchored.arrival_steps, run.model)
    clocked(run, facts, fmt, anchored.phase)
    return run, anchored.phase, anchored.loss, anchored


def replay_by_iterations(facts: LogFacts, fmt: LogFormat, prof: Profile, pattern: str, *,
                         samples: int | None = None, seed: int = 0,
                         window: Window | None = None) -> Replay:
    """The log replay when its Iteration lines place every arrival (iterations.py);
    `samples`: the ensemble's replays when prompts are not logged (None: ITERATION_SAMPLES,
    0: none), drawn with `seed`."""
    rebuilt = rebuild_workload(facts, fmt, prof)
    m = iteration_replay(rebuilt, facts, fmt, prof, window)
    run = m.run
    check = verify(run, facts, fmt, 0.5, prompts_known=not rebuilt.prompts_estimated)
    check.iterations = m.report()
    warnings = None
    pre = preemption_records(run.steps, run.clock)
    set_iteration_confidence(pre, m.exact_until_step, m.lines, not rebuilt.prompts_estimated,
                             check, warnings)
    rebuilt.notes.append(
        f"arrivals placed by the Iteration lines: {m.matched} of {m.lines} lines match the "
        "replay (context and generation requests and tokens" +
        (", KV usage)" if fmt.iteration_kv else ")"))
    if m.prompt_lengths:
        rebuilt.notes = [n for n in rebuilt.notes if "prompt lengths estimated" not in n]
        words = {"exact": "exact (prefilled alone in a step)", "sum": "known only as the sum of "
                 "the prompts admitted with them (split evenly)", "estimated": "not pinned by any "
                 "line (estimated)", "bound": "known as a lower bound", "block": "split to a block"}
        rebuilt.notes.append("prompt lengths from the Iteration lines: " + ", ".join(
            f"{n} {words.get(k, k)}" for k, n in sorted(m.prompt_lengths.items())))
    if m.exhausted:
        rebuilt.notes.append(
            "the Iteration lines placed the arrivals in one pass (each step its most likely "
            "arrivals), a prompt's length set from the line of the step that admitted it; a "
            "line the pass does not match was not searched further")
    if priorities_unknown(facts, rebuilt):
        rebuilt.notes.append(
            "the scheduling policy is priority but no priority is logged (vLLM 0.33 logs a "
            "request's priority only in its JSON body, VLLM_REQUEST_BODY_LOG_LEVEL=INFO): the "
            "replay takes every request as priority 0, so who is preempted follows arrival "
            "order; take each row by its probability")
    unc = None
    k = ITERATION_SAMPLES if samples is None else samples
    if rebuilt.prompts_estimated and pre is not None and k > 0:
        unc = iteration_ensemble(rebuilt, facts, fmt, prof, m, pre,
                                 priority_unknown=priorities_unknown(facts, rebuilt),
                                 samples=k, seed=seed)
        if unc is None and len(run.steps) * k > ITERATION_MAX_STEPS:
            rebuilt.notes.append(
                f"no uncertainty ensemble: {len(run.steps):,} steps x {k} "
                f"replays is over {ITERATION_MAX_STEPS:,}; the rows are inferred, without "
                "probabilities")
        if unc is not None:
            unc.assign(pre)
            for p in pre:  # a row the lines do not pin is inferred, with its probability
                if p.confidence in ("exact-by-log", "consistent"):
                    p.confidence = "inferred"
            unc.headline = iteration_headline(unc, pre, make_it_exact(facts).split(":")[0],
                                              priorities_unknown(facts, rebuilt))
            rebuilt.notes.append(
                f"the uncertainty ensemble: {unc.samples} more replays at the same arrival "
                "steps, each with prompt lengths the Iteration lines allow (a sum split "
                "another way, a length known to a block moved within it, an unpinned one "
                "redrawn)" + (" and random priorities 0-4" if priorities_unknown(facts, rebuilt)
                              else "") + ", weighted by the Iteration lines each matches")
            if unc.count_floor:
                rebuilt.notes.append(
                    f"the count is at least {unc.count_floor}: the Iteration lines show that "
                    "many preempted requests being recomputed (a generation request taking "
                    "more than one token in a step)")
    rep = make_replay(facts, fmt, prof, rebuilt, run, pre, check, loss=0.0, pattern=pattern,
                      phase=0.5, placement=(0.0, 0.0), estimate=None, warnings=warnings,
                      uncertainty=unc)
    rep.info.placement = "iteration lines"
    rep.info.step_time_model = (f"step times logged (Iteration lines) + "
                                f"{m.overhead_s * 1e3:.2f} ms between steps; fitted: "
                                + run.model.describe())
    if m.first_mismatch is None and not rebuilt.prompts_estimated:
        rep.confidence = "exact-by-log"
    rep.carried = m.carried
    return rep


def priorities_unknown(facts: LogFacts, rebuilt: Rebuilt) -> bool:
    """The priority policy, and a log without the JSON bodies that carry priorities."""
    return (rebuilt.workload.config.policy == "priority" and rebuilt.prompts_estimated
            and not any(r.priority for r in facts.requests))


def log_lines(facts: LogFacts, run: Run, check: Verification) -> dict[int, list[tuple[str, int]]]:
    """Engine step -> the log lines behind it: each request line at its arrival step, each
    access line at its finish, each stats line at the step it was read at."""
    out: dict[int, list[tuple[str, int]]] = {}
    arrival = run.arrival_steps
    for r, a in zip(facts.requests, arrival):
        out.setdefault(max(a, 0), []).append((r.file, r.line))
    for (file, line, _, _), step in zip(facts.completions, finish_steps(run.steps)):
        out.setdefault(step, []).append((file, line))
    for row in check.lines:
        if row.step is not None:
            out.setdefault(row.step, []).append((row.file, row.line))
    for lines in out.values():
        lines.sort()
    return dict(sorted(out.items()))


def make_replay(facts: LogFacts, fmt: LogFormat, prof: Profile, rebuilt: Rebuilt, run: Run,
                pre: list[PreemptionRecord], check: Verification, *, loss: float,
                pattern: str, phase: float, placement: tuple[float, float],
                estimate: CountEstimate | None, warnings: WarningsCheck | None,
                uncertainty: Uncertainty | None) -> Replay:
    notes = list(rebuilt.notes)
    if fmt.placement != "anchored":
        phase, spread = run.placement
        notes.append(f"{fmt.engine} engine replay (vLLM {getattr(prof, 'version', '')} rules)")
        notes.append(f"arrivals placed {'evenly over' if spread else 'at a burst in'} their "
                     f"logged second" + (f" (from +{phase:.2f} s)" if phase else ""))
    if warnings is not None and warnings.warnings_logged:
        div = warnings.first_divergence
        notes.append(f"every-50th preemption warnings: {warnings.warnings_matched} of "
                     f"{warnings.warnings_logged} match the replay (victim, mode, cumulative "
                     "count, time)" + ("" if not div else f"; first mismatch: line "
                                       f"{div.line}: " + "; ".join(div.differences)))
    if warnings is not None and warnings.replay_warnings_not_in_log:
        notes.append(f"{len(warnings.replay_warnings_not_in_log)} warning(s) the replay "
                     "would have printed are not in the log")
    if fmt.preemption_warnings:  # the log's own counters are the V0 engine's
        prom = sum(r.prometheus_preemptions for r in run.steps)
        notes.append(f"Prometheus vllm:num_preemptions_total (replayed): {prom}; scheduler "
                     f"cumulative count: {max((p.cumulative or 0 for p in pre), default=0)}")
    last = run.steps[-1] if run.steps else None
    if last is not None and last.terminal_error:  # vLLM itself stops in this step (V0)
        err = last.terminal_error
        at = ""
        if last.step < len(run.clock):
            t = round(run.clock[last.step], 3)  # as a PreemptionRecord gives the step's time
            at = f" ({time.strftime('%H:%M:%S', time.gmtime(t))}.{int((t % 1) * 1000):03d})"
        victim = f" at the swap-out of {err['victim']}" if err.get("victim") and err["type"] == "RuntimeError" else ""
        notes.append(f"the server would have failed at step {last.step}{at}{victim}: {err['type']}: "
                     f"{err['message']} (vLLM's own error; the replay ends there)")
    if pattern == "poisson" and pre and fmt.placement == "anchored" and \
            check.iterations is None and not facts.span_placement:
        notes.append(
            "arrivals spread over time: the log pins each one only to a window of steps, and "
            "a step off can change later victims; take the count as its interval and each "
            "preemption by its probability. To make it exact: "
            + make_it_exact(facts))
    ids = {r.log_id: r.internal_id for r in facts.requests}
    for p in pre:
        p.victim_internal_id = ids.get(p.victim)
    sure = all(p.confidence in ("consistent", "exact-by-log") for p in pre)
    return Replay(
        kind="log", label=f"log {', '.join(facts.files)}", paths=list(facts.files),
        workload=rebuilt.workload, profile=prof, inputs=run.inputs, steps=run.steps,
        preemptions=pre, clock=run.clock, verification=check, warnings=warnings,
        log_lines=log_lines(facts, run, check), estimate=estimate, uncertainty=uncertainty,
        notes=notes + list(facts.notes), missing=list(facts.missing), facts=facts,
        unfinished=run.unfinished, confidence="consistent" if sure else "inferred",
        step_time_model=run.model,
        info=Provenance(
            vllm_version=facts.vllm_version, requests=len(facts.requests),
            step_time_model=run.model.describe(), arrival_pattern=pattern,
            fit_loss=round(loss, 4), prompts="estimated" if rebuilt.prompts_estimated else "exact",
            output_lengths="estimated" if any(rebuilt.output_estimated) else "exact",
            config_sources=rebuilt.config_sources, log_format=fmt.name, stats_phase=phase,
            placement=list(placement)))
