"""Stage 5 with iteration lines: every arrival placed on its step, and every step checked,
against vLLM's own `Iteration(N)` lines (`--enable-logging-iteration-details`, 0.14+).

Consumes: the rebuilt workload (stage 3), `LogFacts` (the first engine's iteration lines,
each request's position among them), the `LogFormat` (how late a request may enter after
the line before it). Produces: an `IterationMatch`: the `Run` (its inputs are the
placement), the lines checked and matched, and the first line the replay does not match.

What a line says (vLLM 0.33 `EngineCore.capture_iteration_details`,
`compute_iteration_details`, `LoggingStatLogger._log_iteration_details`; spec:
vllm-log-formats.md 4.3):
* N counts the engine steps that scheduled a token; idle and 0-token steps have none;
* "context" requests are the scheduled ones with no output token yet (output placeholders
  included): new ones, later chunks of a first prefill, ones preempted before their first
  token; every other scheduled request is a "generation" request, a preempted one being
  recomputed included (StepRecord.num_ctx_requests / num_ctx_tokens);
* the KV usage is the scheduler's once that step's output was applied;
* 0.26+ the API server writes the line as the step's output arrives, in order with its
  request lines: a request logged after line N-1 entered after that step ended.

The arrivals are placed by the search (iteration_search.py: one frontend's order, a window
of steps per request, each step's count tried against its line, backtracking through
engine snapshots; prompts not logged: one forward pass, each prompt's length set from the
line of the step that admits it). The inputs found are replayed once more from the start:
that run, checked line by line, is the replay; where the search's own run is the run its
inputs make (it neither went back nor gave a prompt to a request the scheduler had
already tried to admit), that run is kept, checked line by line again, instead.

With a `Window` (start_state.py: `kvreplay watch` on a server never quiet) the search and
the final run start from an engine state carried out of an earlier replay, and the final
run carries one out after the step of a given line, when the lines matched it up to there.
"""

from __future__ import annotations

from functools import partial
from collections import Counter
from typing import Any

from kvreplay.inference.engines import make_engine
from kvreplay.inference.facts import LogFacts
from kvreplay.inference.formats import LogFormat
from kvreplay.inference.iteration_clock import iteration_clock
from kvreplay.inference.iteration_lines import IterationMatch, LineCheck, checked_run, running_state
from kvreplay.inference.iteration_search import Search
from kvreplay.inference.runs import Run
from kvreplay.inference.start_state import StartState, Window, capture, start_engine
from kvreplay.replay.engine import without_cyclic_gc


@without_cyclic_gc
def iteration_replay(rebuilt: Any, facts: LogFacts, fmt: LogFormat, profile: Any,
                     window: Window | None = None) -> IterationMatch:
    """Place every arrival by the iteration lines, then replay and check every step.
    `window`: start from a carried engine state, and carry one out (start_state.py)."""
    start = window.start if window is not None else None
    carry_n = window.carry_n if window is not None else None
    s = Search(rebuilt, facts, fmt, profile, start, carry_n)
    s.run()
    inputs = s.eng.inputs()
    lc = LineCheck(facts, fmt, s.cut)
    # the replay: the inputs found, from the start; with estimated prompts placed in one
    # forward pass that neither went back nor changed a prompt the scheduler had seen, that
    # is the search's own run (the engine is deterministic), checked again line by line
    own = bool(s.lengths) and not s.rerun and start is None and carry_n is None
    out: list[StartState] = []
    steps, first, bad, kv_unsure = checked_run(
        ((r, partial(s.kv_running.__getitem__, r.step)) for r in s.steps) if own
        else _replayed(rebuilt.workload, profile, inputs, start, carry_n, out),
        lc, s.lengths, s.eng.scheduler.pool.num_usable_blocks)
    last_n = lc.last_n
    checked = sum(1 for n in lc.line_of_step.values() if n <= last_n)
    matched = sum(1 for n in lc.line_of_step.values() if n <= last_n and n not in bad)
    lag: Counter[int] = Counter()
    for a, b in zip(inputs.arrival_steps, s.bound):
        n = _line_at_or_after(lc.line_of_step, a) if a >= 0 else None
        if n is not None:
            lag[n - b] += 1
    clock, end, model, overhead = iteration_clock(steps, lc.line_of_step, facts, fmt)
    ended = {rid for rec in steps for rid in (*rec.finished, *rec.aborted)}
    unfinished = [spec.id for spec in rebuilt.workload.requests if spec.id not in ended]
    run = Run(steps, clock, end, inputs, model, (0.0, 0.0),
              facts.last_time if inputs.max_steps is not None else None, unfinished)
    if not rebuilt.workload.config.enable_prefix_caching:  # else what they share is unknown
        for i in s.lengths.open:
            rebuilt.prompt_estimated[i] = s.lengths.status[i] != "exact"
    carried = None
    if out and s.lag_at_carry is not None and (first is None or first.step > out[0].step):
        carried = out[0]  # (a state the lines matched up to, the Search's lags at it)
        carried.lag_seen = s.lag_at_carry
        carried.bounds = {spec.id: b - (carried.n + 1) for spec, b, a in zip(
            rebuilt.workload.requests, s.bound, inputs.arrival_steps)
            if not 0 <= a <= carried.step and spec.id not in carried.ids
            and b <= carried.n + 1}
    return IterationMatch(run, len(facts.iterations), checked, matched, first,
                          first.step if first else len(steps), dict(lc.line_of_step),
                          dict(lag), s.backtracks, overhead, s.lengths.summary(), kv_unsure,
                          dict(s.lengths.status), s.lengths.sum_groups(), s.exhausted, carried)


def _replayed(workload: Any, profile: Any, inputs: Any, start: StartState | None = None,
              carry_n: int | None = None, out: list[StartState] | None = None) -> Any:
    """Each step of the run `inputs` make (from `start`, a carried state), with how to read
    its running requests after it (read at once, before the next step); the state after
    the step of Iteration(carry_n) is put in `out` (its N-th step that scheduled a token:
    LineCheck's numbering)."""
    eng = (make_engine(workload, profile, inputs=inputs) if start is None
           else start_engine(start, workload, inputs))
    n = 0
    while not eng.done:
        rec = eng.step()
        yield rec, partial(running_state, eng.scheduler)  # type: ignore[attr-defined]
        if rec.num_scheduled_tokens > 0:
            if n == carry_n and out is not None:
                out.append(capture(eng, n))  # type: ignore[arg-type]
            n += 1


def _line_at_or_after(line_of_step: dict[int, int], step: int) -> int | None:
    for st in range(step, step + 64):
        if st in line_of_step:
            return line_of_step[st]
    return None
