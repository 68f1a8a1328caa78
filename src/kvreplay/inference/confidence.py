"""Stage 7, confidence: how sure the replay is of each preemption.

Consumes: the verification (stage 6), the V0 warnings check, the final `Run`. Produces,
on every `PreemptionRecord`:

* `confidence`: "exact-by-log" when a log line names this preemption (V0's every-50th
  warning, matched in victim, mode, count and second); "consistent" when the stats lines
  on both sides of its step agree with the replay (exactly, where the log allows an exact
  check: V1; within the tolerances otherwise); else "inferred". Estimated prompts make
  every preemption "inferred": no line can confirm a guessed length.
* Where the log allows only the tolerant check (V0), a logged second pins a step only
  when the replay runs at most PIN_STEPS steps a second around it: then a warning's
  second, or arrivals' seconds between agreeing lines, leave the row within TOL_STEPS of
  its step. Faster steps (milliseconds: tens a second) leave the victim's step open, and
  the row is "inferred" (warning-matched rows keep the warning as their basis). Measured
  with tools/research/eval_v0_labels.py: at 18 ms+ steps, exact-by-log
  rows were within 5 steps 77% of the time and consistent rows 71%; at 200 ms, 100% / 95%.

How likely each preemption is, where the log leaves it open, is the uncertainty
ensemble's (ensemble.py: `PreemptionRecord.probability`).
"""

from __future__ import annotations

from typing import Sequence

from kvreplay.inference.uncertainty import TOL_STEPS  # a row is right within this many steps
from kvreplay.replay.checks import StatsLineCheck, Verification, WarningsCheck
from kvreplay.replay.records import PreemptionRecord

PIN_STEPS = 2 * TOL_STEPS + 1  # steps a second may hold for its second to pin a step


def steps_per_second(rows: Sequence[StatsLineCheck], pre: Sequence[PreemptionRecord],
                     step: int) -> float | None:
    """How many steps a second the replay runs around `step`: between the stats lines on
    both sides of it, else over the whole run (its lines and preemptions with a clock);
    None when no second is spanned."""
    rate = _between_lines(rows, step)
    return rate if rate is not None else _whole_run(rows, pre)


def _between_lines(rows: Sequence[StatsLineCheck], step: int) -> float | None:
    """Steps a second between the stats lines on both sides of `step`, when at least a
    second apart."""
    before = [r for r in rows if r.step is not None and r.step < step and r.time is not None]
    after = [r for r in rows if r.step is not None and r.step >= step and r.time is not None]
    if before and after and after[0].time - before[-1].time >= 1.0:
        return (after[0].step - before[-1].step) / (after[0].time - before[-1].time)  # type: ignore[operator]
    return None


def _whole_run(rows: Sequence[StatsLineCheck], pre: Sequence[PreemptionRecord]) -> float | None:
    """Steps a second over the whole run: its lines and preemptions with a clock."""
    pts = [(r.step, r.time) for r in rows if r.step is not None and r.time is not None]
    pts += [(p.step, p.time) for p in pre if p.time is not None]
    if len(pts) < 2:
        return None
    span = max(t for _, t in pts) - min(t for _, t in pts)
    if span < 1.0:
        return None
    return (max(s for s, _ in pts) - min(s for s, _ in pts)) / span


def set_confidence(pre: Sequence[PreemptionRecord], check: Verification,
                   warnings: WarningsCheck | None, prompts_estimated: bool) -> None:
    rows = [r for r in check.lines if r.step is not None]
    by_log = {w.cumulative for w in (warnings.lines if warnings is not None else ()) if w.matched}
    # a V0 log (its warnings checked) is checked within tolerances, its lines and
    # arrivals pinned only to a second: a step only where the steps are slow (PIN_STEPS)
    tolerant = warnings is not None
    whole: list[float | None] = []  # the whole run's rate, taken once when first needed

    def pinned(p: PreemptionRecord) -> bool:
        if not tolerant:
            return True
        rate = _between_lines(rows, p.step)
        if rate is None:
            if not whole:
                whole.append(_whole_run(rows, pre))
            rate = whole[0]
        return rate is not None and rate <= PIN_STEPS

    for p in pre:
        if p.cumulative is not None and p.cumulative in by_log:
            p.basis = "a log line names it: the V0 engine's every-50th preemption warning"
            if pinned(p):
                p.confidence = "exact-by-log"
            else:
                p.confidence = "inferred"
                p.basis += (f", but its second holds more than {PIN_STEPS} steps: the victim "
                            "and count are logged, the step is not")
            continue
        if prompts_estimated:
            p.confidence = "inferred"
            continue
        before = [r for r in rows if r.step < p.step]  # type: ignore[operator]
        after = [r for r in rows if r.step >= p.step]  # type: ignore[operator]
        near = ([before[-1]] if before else []) + ([after[0]] if after else [])
        # exact where the line could be checked exactly, else within the tolerances
        ok = near and all(r.agrees if r.exact is None else r.exact for r in near) and pinned(p)
        p.confidence = "consistent" if ok else "inferred"


def set_iteration_confidence(pre: Sequence[PreemptionRecord], exact_until_step: int,
                             lines: int, prompts_pinned: bool, check: Verification,
                             warnings: WarningsCheck | None) -> None:
    """With iteration lines: "exact-by-log" for a preemption before the first line the
    replay cannot match, when every prompt is known (logged, or pinned by the lines);
    the stats-line rule (set_confidence) for the rest."""
    set_confidence(pre, check, warnings, not prompts_pinned)
    if not prompts_pinned:
        return
    for p in pre:
        if p.step < exact_until_step:
            p.confidence = "exact-by-log"
            p.basis = (f"every Iteration line up to this step matches the replay (of {lines}: "
                       "context and generation requests and tokens, KV usage), and each "
                       "arrival is placed where those lines put it")
