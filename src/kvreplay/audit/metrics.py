"""Pure computations shared by `audit` and `whatif`: from a replay's records, stats points
or scrapes to numbers. No I/O, no parsing, no polars.

The preemption figures (computed tokens lost, tokens recomputed, processed tokens, the
recompute ratio) are defined once, in kvreplay.replay.records; this module only
aggregates them (storm windows, the requests hurt most).
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Sequence


def quantile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolation quantile (numpy's default); None for no values."""
    xs = sorted(v for v in values if v is not None)
    if not xs:
        return None
    if len(xs) == 1:
        return float(xs[0])
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return float(xs[lo] + (xs[hi] - xs[lo]) * (pos - lo))


def mean(values: Iterable[float | None]) -> float | None:
    xs = [v for v in values if v is not None]
    return float(sum(xs) / len(xs)) if xs else None


def rnd(x: float | None, nd: int = 4) -> float | None:
    return None if x is None else round(float(x), nd)


# ---------------------------------------------------------------- preemption cost
def worst_requests(preemptions: Sequence[Any], step_time: Sequence[float] | None = None,
                   top: int = 5) -> list[dict[str, Any]]:
    """The requests hurt most: most tokens recomputed, then most time waiting to get back
    (`preemptions`: the replay's PreemptionRecords)."""
    per: dict[str, dict[str, Any]] = {}
    for p in preemptions:
        d = per.setdefault(p.victim, {"request": p.victim, "preemptions": 0,
                                      "recomputed_tokens": 0, "time_lost_s": 0.0})
        d["preemptions"] += 1
        d["recomputed_tokens"] += p.tokens_recomputed or 0
        if step_time is not None and p.readmission_step is not None:
            if p.readmission_step < len(step_time):
                d["time_lost_s"] += step_time[p.readmission_step] - step_time[p.step]
    rows = sorted(per.values(), key=lambda d: (-d["recomputed_tokens"], -d["time_lost_s"], d["request"]))
    for d in rows:
        d["time_lost_s"] = round(d["time_lost_s"], 3)
    return rows[:top]


def storm_windows(events: Sequence[tuple[float, int, int]], window_s: float, top: int = 3,
                  kv_at=None) -> list[dict[str, Any]]:
    """Windows of `window_s` seconds (aligned to 0) ranked by recomputed tokens, then by
    preemptions. `events`: (time from start, preemptions, recomputed tokens or -1 when
    unknown)."""
    if window_s <= 0:
        window_s = 10.0
    acc: dict[int, list[int]] = {}
    unknown: set[int] = set()
    for t, n, tok in events:
        k = int(math.floor(t / window_s))
        a = acc.setdefault(k, [0, 0, 0])
        a[0] += n
        if tok < 0:
            unknown.add(k)
        else:
            a[1] += tok
    ranked = sorted((k for k in acc if acc[k][0] > 0), key=lambda k: (-acc[k][1], -acc[k][0], k))
    out = []
    for k in ranked[:top]:
        row = {"start_s": round(k * window_s, 3), "end_s": round((k + 1) * window_s, 3),
               "preemptions": acc[k][0],
               "recomputed_tokens": None if k in unknown else acc[k][1],
               "kv_usage": None}
        if kv_at is not None:
            row["kv_usage"] = rnd(kv_at(k * window_s, (k + 1) * window_s))
        out.append(row)
    return out


# ---------------------------------------------------------------- latency
def latency_from_records(steps: Sequence[Any], step_end: Sequence[float],
                         arrival: dict[str, float]) -> dict[str, list[float]]:
    """TTFT of every request with a first token, and mean ITL of every finished request
    with more than one: a token is out at the end of the step that sampled it (times in
    seconds, same clock as `arrival`; a request's last token is out at its finish)."""
    first: dict[str, float] = {}
    ttft, itl = [], []
    for rec, end in zip(steps, step_end):
        for rid in rec.first_tokens:
            first.setdefault(rid, end)
            if rid in arrival:
                ttft.append(max(0.0, end - arrival[rid]))
        for rid, n in zip(rec.finished, rec.finished_output_tokens):
            if n > 1 and rid in first:
                itl.append((end - first[rid]) / (n - 1))
    return {"ttft": ttft, "itl": itl}


def decode_stalls(step_rows: Sequence[tuple[float, int, bool]], budget: int) -> dict[str, Any]:
    """Prefill interference: how much slower the steps that carry decodes get when a prefill
    chunk rides along. `step_rows`: (duration s, prefill tokens, has decodes)."""
    dec = [(d, p) for d, p, has in step_rows if has]
    if len(dec) < 20:
        return {"spike_ratio": None, "spike_share": None, "spike_prefill_share": None}
    med = quantile([d for d, _ in dec], 0.5) or 0.0
    p99 = quantile([d for d, _ in dec], 0.99) or 0.0
    spikes = [(d, p) for d, p in dec if med > 0 and d >= 2 * med]
    big = max(1, budget // 4)
    return {
        "spike_ratio": (p99 / med) if med > 0 else None,
        "spike_share": len(spikes) / len(dec),
        "spike_prefill_share": (sum(1 for _, p in spikes if p >= big) / len(spikes)) if spikes else 0.0,
    }


# ---------------------------------------------------------------- counters
def counter_increase(values: Sequence[float]) -> tuple[float, int]:
    """Total increase of a cumulative counter sampled over time, and the number of resets.
    A drop means the process restarted and the counter began again at 0, so the increase
    over that window is the new value itself (Prometheus' `increase()` does the same)."""
    total = 0.0
    resets = 0
    for a, b in zip(values, values[1:]):
        if b >= a:
            total += b - a
        else:
            resets += 1
            total += b
    return total, resets


def counter_deltas(values: Sequence[float]) -> list[float]:
    """Per-window increases (len(values) - 1 of them), reset-aware like counter_increase."""
    return [(b - a) if b >= a else b for a, b in zip(values, values[1:])]


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """PromQL's histogram_quantile over cumulative (upper bound, count) buckets."""
    bs = sorted(buckets)
    if not bs or bs[-1][1] <= 0:
        return None
    total = bs[-1][1]
    rank = q * total
    prev_le, prev_c = 0.0, 0.0
    for le, c in bs:
        if c >= rank:
            if math.isinf(le):
                return prev_le
            if c == prev_c:
                return le
            return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)
        prev_le, prev_c = le, c
    return bs[-1][0]


def knee(points: Sequence[tuple[float, float]], share: float = 0.9) -> dict[str, Any]:
    """The knee of throughput vs concurrency: the lowest concurrency that reaches `share`
    of the peak throughput (past it, more clients mostly add queueing); the peak; and
    where throughput falls by more than 5% after the peak, if it does."""
    pts = sorted((c, t) for c, t in points if t is not None)
    if not pts:
        return {"knee": None, "peak": None, "peak_throughput": None, "falls_after": None}
    peak_c, peak_t = max(pts, key=lambda p: (p[1], -p[0]))
    k = next(c for c, t in pts if t >= share * peak_t)
    falls = next((c for c, t in pts if c > peak_c and t < 0.95 * peak_t), None)
    return {"knee": k, "peak": peak_c, "peak_throughput": peak_t, "falls_after": falls}
