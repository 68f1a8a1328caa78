"""Output lengths the log does not give (requests without ignore_eos that stop at EOS).

Consumes: `LogFacts` (`Finished request` lines of V0 in-process engines; the logged
generation throughput), a `Run` recorded with the ids that sampled each step. Produces: a
length for each such request (`estimate_output_lengths`), used where the `LogFormat`
asks for it (V0 logs); elsewhere max_tokens stands, marked estimated (stage 3).
"""

from __future__ import annotations

import bisect
from typing import Any

from kvreplay.inference.facts import LogFacts
from kvreplay.inference.formats import LogFormat
from kvreplay.inference.lines import ends, spans


def estimate_output_lengths(facts: LogFacts, fmt: LogFormat, run: Any,
                            current: dict[str, int] | None) -> dict[str, int] | None:
    """Requests without ignore_eos: the length the replay had reached when the log shows
    them finished (`Finished request` lines), else one cap L for all of them so that the
    replay generates the tokens the stats lines logged."""
    open_ = [r for r in facts.requests if not r.ignore_eos]
    if not open_:
        return None
    out = dict(current or {})
    fin = {rid: t for t, rid in facts.finished if t is not None}
    if fin:
        produced: dict[str, list[tuple[float, int]]] = {}
        for rec, e in zip(run.steps, ends(run)):
            for rid in rec.sampled or ():
                lst = produced.setdefault(rid, [])
                lst.append((e, (lst[-1][1] if lst else 0) + 1))
        for r in open_:
            t = fin.get(r.log_id)
            if t is None:
                continue
            got = produced.get(r.log_id, [])
            if not got:
                continue
            i = bisect.bisect_right([e for e, _ in got], t + 0.5)
            n_at = got[i - 1][1] if i > 0 else 1
            if got[-1][0] > t + 1.0 or r.log_id not in out:
                out[r.log_id] = max(1, n_at)
        return out
    if len(facts.stats) < 2:
        return None
    want = sum((s.generation_throughput or 0.0) * e for s, e in zip(facts.stats, spans(facts, fmt)))
    fixed = sum(r.max_tokens or 0 for r in facts.requests if r.ignore_eos)
    caps = [r.max_tokens or 10**6 for r in open_]
    budget = want - fixed
    if budget <= 0:
        return None
    lo, hi = 1, max(caps)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if sum(min(c, mid) for c in caps) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return {r.log_id: min(r.max_tokens or lo, lo) for r in open_}
