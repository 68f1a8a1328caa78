"""Stage 7, confidence: how sure the replay is of each preemption.

Consumes: the verification (stage 6), the V0 warnings check, the final `Run`. Produces,
on every `PreemptionRecord`:

* `confidence`: "exact-by-log" when a log line names this preemption (V0's every-50th
  warning, matched in victim, mode, count and second); "consistent" when the stats lines
  on both sides of its step agree with the replay (exactly, where the log allows an exact
  check: V1; within the tolerances otherwise); else "inferred". Estimated prompts make
  every preemption "inferred": no line can confirm a guessed length.

How likely each preemption is, where the log leaves it open, is the uncertainty
ensemble's (ensemble.py: `PreemptionRecord.probability`).
"""

from __future__ import annotations

from typing import Any, Sequence

from kvreplay.replay.checks import Verification
from kvreplay.replay.records import PreemptionRecord


def set_confidence(pre: Sequence[PreemptionRecord], check: Verification,
                   warnings: dict[str, Any] | None, prompts_estimated: bool) -> None:
    rows = [r for r in check.lines if r.step is not None]
    by_log = {w["cumulative"] for w in (warnings or {}).get("lines", ()) if w.get("matched")}
    for p in pre:
        if p.cumulative is not None and p.cumulative in by_log:
            p.confidence = "exact-by-log"
            p.basis = "a log line names it: the V0 engine's every-50th preemption warning"
            continue
        if prompts_estimated:
            p.confidence = "inferred"
            continue
        before = [r for r in rows if r.step < p.step]  # type: ignore[operator]
        after = [r for r in rows if r.step >= p.step]  # type: ignore[operator]
        near = ([before[-1]] if before else []) + ([after[0]] if after else [])
        # exact where the line could be checked exactly, else within the tolerances
        ok = near and all(r.agrees if r.exact is None else r.exact for r in near)
        p.confidence = "consistent" if ok else "inferred"


def set_iteration_confidence(pre: Sequence[PreemptionRecord], exact_until_step: int,
                             lines: int, prompts_pinned: bool, check: Verification,
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
