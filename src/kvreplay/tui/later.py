"""What the TUI computes after the steps are shown: the uncertainty ensemble of a log whose
arrivals the stats lines only anchor (inference/ensemble.py). The point replay
(`--samples 0`) is opened first and stepped through at once; the same log's full replay
(the ensemble, as `kvreplay replay` computes it: same seed, same figures) comes in later.

Invariant: the full replay's run is the point replay's run unless the ensemble found a
member that fits the stats lines far better (driver.replay_log shows that one instead);
`same_run` tells which, and the app adopts the ensemble onto the shown timeline or swaps
in the other run's timeline.
"""

from __future__ import annotations

from typing import Any

from kvreplay.inference.ensemble import MAX_REQUESTS


def ensemble_pending(rep: Any) -> bool:
    """The point replay of a log whose full replay would add an uncertainty ensemble
    (stats lines anchor the arrivals, not Iteration lines; at most MAX_REQUESTS requests)."""
    facts = getattr(rep, "facts", None)
    if rep.kind != "log" or rep.uncertainty is not None or facts is None:
        return False
    if not facts.stats or not facts.requests or len(facts.requests) > MAX_REQUESTS:
        return False
    by_iterations = bool(facts.iterations) and not any(
        str(n).startswith("Iteration lines not used") for n in facts.notes)
    return not by_iterations


def same_run(a: Any, b: Any) -> bool:
    """The two replays ran the same steps: same arrivals, preemptions and step records
    (the shown timeline re-runs and checks its steps against the replay's)."""
    return (len(a.steps) == len(b.steps)
            and list(a.inputs.arrival_steps) == list(b.inputs.arrival_steps)
            and [(p.step, p.victim) for p in a.preemptions] ==
            [(p.step, p.victim) for p in b.preemptions]
            and all(x == y for x, y in zip(a.steps, b.steps)))


def adopt(tl: Any, full: Any) -> None:
    """Show `full` (the same run with its ensemble) through the built timeline `tl`: its
    records (with probabilities), uncertainty, estimate and notes. Call on the UI thread."""
    with tl.lock:
        tl.replay = full
        tl.preemptions = full.preemptions
        tl._cache.clear()  # its views hold the point replay's records
