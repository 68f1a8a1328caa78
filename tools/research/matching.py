"""How the dev tools score a replay: each true preemption is matched, in order, to the first
not yet matched replayed one with the same victim within `tol` steps (the issue's
"right victim within +-5 steps")."""
from __future__ import annotations


def match_preemptions(true: list[tuple[int, str]], found: list[tuple[int, str]],
                      tol: int = 5) -> set[int]:
    """Indices into `found` of the replayed preemptions matched to a true one; both lists
    hold (step, victim)."""
    used: set[int] = set()
    for step, victim in true:
        for j, (s2, v2) in enumerate(found):
            if j not in used and v2 == victim and abs(s2 - step) <= tol:
                used.add(j)
                break
    return used
