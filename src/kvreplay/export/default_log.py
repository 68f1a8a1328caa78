"""A default log's answer (inference/default_log.py: no request lines) as a timeline trace:
there is no step or request to draw, so the trace holds what the log and its answer give
over time, each track named with its certainty:

- counters as logged (exact-by-log): running, waiting, KV usage at each stats line;
  prompt and generation tokens each stats interval computed (throughput x interval);
- counters of the answer's 90% interval (interval): preemptions per stats interval, its
  median, low and high, each held over the interval;
- one slice per stats interval on the engine's track, its args the interval's figures;
- the headline and the whole answer (intervals, how the scrapes joined) in the metadata.

Time: the log's clock (epoch seconds read as UTC), ns in whole microseconds as model.py.
"""

from __future__ import annotations

from typing import Any

import msgspec

from kvreplay.export.model import ENGINE, GROUP, Counter, Slice, Trace, Track

LOGGED = "exact-by-log"
INTERVAL = "interval"

# (track name, unit, value type, certainty)
DEFAULT_COUNTERS: list[tuple[str, str, str, str]] = [
    ("running (logged)", "requests", "int", LOGGED),
    ("waiting (logged)", "requests", "int", LOGGED),
    ("KV usage (logged)", "fraction", "float", LOGGED),
    ("prompt tokens per interval (logged)", "tokens", "int", LOGGED),
    ("generation tokens per interval (logged)", "tokens", "int", LOGGED),
    ("preemptions per interval: median", "preemptions", "int", INTERVAL),
    ("preemptions per interval: 90% low", "preemptions", "int", INTERVAL),
    ("preemptions per interval: 90% high", "preemptions", "int", INTERVAL),
]


def _ns(t: float) -> int:
    return round(t * 1e6) * 1000


def default_trace(facts: Any, ans: Any, how: str | None = None) -> Trace:
    """The trace of a default log's answer `ans` (DefaultAnswer) over its stats lines."""
    tracks = [Track(GROUP, "kvreplay: default log (no request lines)", "group"),
              Track(ENGINE, "engine: stats intervals (no steps or requests logged)", "engine",
                    parent=GROUP)]
    counters: dict[str, Counter] = {}
    for i, (name, unit, vt, _c) in enumerate(DEFAULT_COUNTERS):
        uid = 2 + i
        tracks.append(Track(uid, name, "counter", parent=GROUP, unit=unit, value_type=vt))
        counters[name] = Counter(uid)
    stats = sorted((s for s in facts.stats if s.time is not None and s.running is not None),
                   key=lambda s: s.time)
    # the first line's interval starts where the answer's first window does (one interval
    # before it: evidence_metrics.from_stats)
    prev = (ans.windows[0].start if ans.windows and stats and ans.windows[0].end == stats[0].time
            else None)
    for s in stats:
        ts = _ns(s.time)
        counters["running (logged)"].add(ts, int(s.running))
        if s.waiting is not None:
            counters["waiting (logged)"].add(ts, int(s.waiting))
        if s.kv_usage is not None:  # a fraction (facts.StatsPoint)
            counters["KV usage (logged)"].add(ts, round(s.kv_usage, 6))
        if prev is not None:  # the interval since the previous line, at its start
            dt = s.time - prev
            counters["prompt tokens per interval (logged)"].add(
                _ns(prev), round((s.prompt_throughput or 0.0) * dt))
            counters["generation tokens per interval (logged)"].add(
                _ns(prev), round((s.generation_throughput or 0.0) * dt))
        prev = s.time
    slices = []
    for w in ans.windows:
        a, b = _ns(w.start), _ns(w.end)
        if b <= a:
            continue
        iv = w.preemptions
        for name, v in (("median", iv.median), ("90% low", iv.low), ("90% high", iv.high)):
            counters[f"preemptions per interval: {name}"].add(a, int(v))
        slices.append(Slice(ENGINE, "stats interval", a, b, 0,
                            {"preemptions_median": int(iv.median), "preemptions_low": int(iv.low),
                             "preemptions_high": int(iv.high), "certainty": INTERVAL}))
    if ans.windows:  # each counter of the answer returns to 0 after the last interval
        end = _ns(ans.windows[-1].end)
        for name in ("median", "90% low", "90% high"):
            counters[f"preemptions per interval: {name}"].add(end, 0)
    meta = {"kind": "default log (no request lines)", "headline": ans.headline,
            "certainty": {name: c for name, _u, _v, c in DEFAULT_COUNTERS},
            "answer": msgspec.to_builtins(ans), "metrics_join": how,
            "files": list(getattr(facts, "files", []) or []),
            "stats_lines": len(stats)}
    return Trace(tracks, slices, [], [c for c in counters.values() if c.ts], meta)
