"""Stage 7, confidence: how sure the replay is of each preemption.

Consumes: the verification (stage 6), the V0 warnings check, the final `Run`. Produces,
on every `PreemptionRecord`:

* `confidence`: "exact-by-log" when a log line names this preemption (V0's every-50th
  warning, matched in victim, mode, count and second); "consistent" when the stats lines
  on both sides of its step agree with the replay (exactly, where the log allows an exact
  check: V1; within the tolerances otherwise); else "inferred". Estimated prompts make
  every preemption "inferred": no line can confirm a guessed length.
* `support` (Poisson arrivals, logged prompts): the share of a few replays the log cannot
  tell apart from this one (each arrival moved up to 2 steps inside its window) that
  preempt the same victim within 5 steps. Measured on the published Poisson log: 25 of 26
  fully supported preemptions were true, 4 of 11 under half support; it cannot see a
  replay that is off as a whole (docs/accuracy.md).
"""

from __future__ import annotations

from typing import Any, Sequence

from kvreplay.inference.facts import LogFacts
from kvreplay.inference.formats import LogFormat
from kvreplay.inference.lines import token_anchors
from kvreplay.inference.placement import alternative_placements, windows
from kvreplay.inference.runs import Run, step_replay
from kvreplay.replay.records import PreemptionRecord

SUPPORT_REPLAYS = 10
SUPPORT_JITTER = 2  # steps each arrival moves, inside the window the log allows
SUPPORT_MAX_REQUESTS = 2000  # beyond this the extra replays cost more than the replay
SUPPORT_TOL = 5  # steps


def set_confidence(pre: Sequence[PreemptionRecord], check: dict[str, Any],
                   warnings: dict[str, Any] | None, prompts_estimated: bool) -> None:
    rows = [r for r in check["lines"] if r.get("step") is not None]
    by_log = {w["cumulative"] for w in (warnings or {}).get("lines", ()) if w.get("matched")}
    for p in pre:
        if p.cumulative is not None and p.cumulative in by_log:
            p.confidence = "exact-by-log"
            p.basis = "a log line names it: the V0 engine's every-50th preemption warning"
            continue
        if prompts_estimated:
            p.confidence = "inferred"
            continue
        before = [r for r in rows if r["step"] < p.step]
        after = [r for r in rows if r["step"] >= p.step]
        near = ([before[-1]] if before else []) + ([after[0]] if after else [])
        # exact where the line could be checked exactly, else within the tolerances
        ok = near and all(r.get("exact", r.get("agrees")) for r in near)
        p.confidence = "consistent" if ok else "inferred"


def support_wanted(support: int | None, pattern: str, prompts_estimated: bool,
                   facts: LogFacts, fmt: LogFormat) -> int:
    """How many alternative replays measure support: `support` when given, else 10 for
    Poisson arrivals with logged prompts (bursts and closed loops pin arrivals by other
    means; estimated prompts are a larger uncertainty than a step or two)."""
    if fmt.placement != "anchored":
        return 0
    if support is not None:
        return support
    if pattern == "poisson" and not prompts_estimated and len(facts.requests) <= SUPPORT_MAX_REQUESTS:
        return SUPPORT_REPLAYS
    return 0


def add_support(pre: Sequence[PreemptionRecord], rebuilt: Any, facts: LogFacts, fmt: LogFormat,
                profile: Any, run: Run, k: int) -> None:
    """Give each preemption its `support` over `k` alternative placements."""
    anchors = token_anchors(run, facts, fmt)
    wins = windows(run, facts, anchors, run.clock + [run.end])
    found: list[dict[str, list[int]]] = []
    base = [max(a, 0) for a in run.arrival_steps]
    for arr in alternative_placements(base, wins, k, SUPPORT_JITTER):
        alt = step_replay(rebuilt, facts, profile, arr, run.model)
        by_victim: dict[str, list[int]] = {}
        for rec in alt.steps:
            for e in rec.preemptions:
                by_victim.setdefault(e.victim, []).append(rec.step)
        found.append(by_victim)
    for p in pre:
        n = sum(1 for f in found
                if any(abs(s - p.step) <= SUPPORT_TOL for s in f.get(p.victim, ())))
        p.support = round(n / k, 2)


def set_iteration_confidence(pre: Sequence[PreemptionRecord], exact_until_step: int,
                             lines: int, prompts_pinned: bool, check: dict[str, Any],
                             warnings: dict[str, Any] | None) -> None:
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
