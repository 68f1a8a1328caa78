"""A default log's answer (inference/default_log.py) in `kvreplay replay` and `kvreplay
audit`: the report, its JSON, and the audit record's fields.

A log written with vLLM's defaults has no request line, so there is no workload to replay
step by step; instead of refusing, the ensemble of workloads the stats lines (and the
scrapes of the same server, when given) allow gives the count, the recomputed tokens, the
recompute ratio and the storm windows as 90% intervals, the count exact when the
preemption counter bounds the log. No request is named.
"""

from __future__ import annotations

from typing import Any

import msgspec

from kvreplay.audit import metrics as M


def is_default_log(facts: Any) -> bool:
    """No request line, and stats lines to work from."""
    return not facts.requests and any(s.running is not None for s in facts.stats)


def answer_for(facts: Any, metric_paths: list[str], *, profile: str | None = None,
               samples: int | None = None, seed: int = 0, scrapes: list | None = None,
               keep: list | None = None):
    """(DefaultAnswer, how the scrapes were joined or None). `keep`: a list the weighted
    members are appended to, each with the workload it drew (the what-if's)."""
    from kvreplay.audit import join, prom
    from kvreplay.inference.default_log import answer_log

    points, how = [], None
    if scrapes is None and metric_paths:
        scrapes = prom.read_scrapes(metric_paths)
    if scrapes:
        points, how = join.scrapes_for_facts(facts, scrapes)
    ans = answer_log(facts, points, profile=None if profile in (None, "auto") else profile,
                     samples=32 if samples is None else max(1, samples), seed=seed,
                     keep=keep, draws=keep is not None)
    return ans, how


def to_dict(ans: Any, how: str | None) -> dict[str, Any]:
    d = msgspec.to_builtins(ans)
    d["kind"] = "default log (no request lines)"
    d["metrics_join"] = how
    return d


def report_text(label: str, facts: Any, ans: Any, how: str | None) -> str:
    iv = ans.preemptions
    lines = [f"kvreplay replay: {label}",
             f"  HEADLINE: {ans.headline}",
             f"  vLLM {facts.vllm_version or '?'}; {ans.requests} requests (from the stats and access "
             f"lines: running + waiting + finished); {ans.lengths_source}"]
    if how:
        lines.append(f"  scrapes: {how}")
    lines.append(f"  uncertainty: {ans.samples} workloads the log allows (seed {ans.seed}), weighted "
                 f"by how well each reproduces the stats lines{' and scrapes' if how and 'not' not in how[:4] else ''} "
                 f"(effective {ans.effective}); 90% intervals:")
    kind = " (what the draws assume: too thin to check)" if ans.thin else " (interval)"
    exact = " (exact: the preemption counter)" if ans.counted_exact else kind
    lines.append(f"    preemptions: median {iv.median:.0f}, {iv.low:.0f}-{iv.high:.0f}{exact}")
    r = ans.recomputed_tokens
    lines.append(f"    tokens recomputed: median {r.median:,.0f}, {r.low:,.0f}-{r.high:,.0f}{kind}")
    q = ans.recompute_ratio
    lines.append(f"    recompute ratio: median {q.median:.4f}, {q.low:.4f}-{q.high:.4f}{kind}")
    storms = sorted(ans.windows, key=lambda w: -w.preemptions.median)[:3]
    if storms and storms[0].preemptions.high > 0:
        lines.append("    storm windows (preemptions per stats interval, median and 90%):")
        for w in sorted(storms, key=lambda w: w.start):
            lines.append(f"      {_hms(w.start)}-{_hms(w.end)}: {w.preemptions.median:.0f} "
                         f"({w.preemptions.low:.0f}-{w.preemptions.high:.0f})")
    for n in ans.notes:
        lines.append(f"  note: {n}")
    return "\n".join(lines) + "\n"


def _hms(t: float) -> str:
    import time

    return time.strftime("%H:%M:%S", time.gmtime(t))


def fill_record(rec: dict[str, Any], ans: Any, origin: float) -> None:
    """The audit record's replay fields from a default log's answer."""
    rec["replay"] = "inferred (default log)"
    pre = ans.preemptions
    rec["preemptions_replayed"] = int(pre.median)
    rec["preemptions_replayed_median"] = int(pre.median)
    rec["preemptions_replayed_low"] = int(pre.low)
    rec["preemptions_replayed_high"] = int(pre.high)
    rec["preemptions_interval_source"] = (
        "exact: vllm:num_preemptions_total over the log" if ans.counted_exact else
        f"default log: {ans.samples} workloads consistent with the stats lines"
        + (" and scrapes" if ans.counted is not None else "") + ", 90%")
    rec["recomputed_tokens"] = int(ans.recomputed_tokens.median)
    rec["recomputed_tokens_low"] = int(ans.recomputed_tokens.low)
    rec["recomputed_tokens_high"] = int(ans.recomputed_tokens.high)
    rec["recompute_ratio"] = ans.recompute_ratio.median
    rec["recompute_ratio_low"] = ans.recompute_ratio.low
    rec["recompute_ratio_high"] = ans.recompute_ratio.high
    rec["recompute_source"] = ("inferred: median of the workloads a default log allows (see "
                               "recompute_ratio_low/high)")
    rec["requests"] = ans.requests
    rec["lengths_source"] = ans.lengths_source
    if ans.thin:  # the intervals say what the draws assume: no figure but the counter's
        keys = ["recomputed_tokens", "recomputed_tokens_low", "recomputed_tokens_high",
                "recompute_ratio", "recompute_ratio_low", "recompute_ratio_high"]
        if not ans.counted_exact:
            keys += ["preemptions_replayed", "preemptions_replayed_median", "preemptions_replayed_low",
                     "preemptions_replayed_high", "preemptions_interval_source"]
        for k in keys:
            rec[k] = None
        rec["recompute_source"] = None
        rec["null_reasons"].append(f"default log too thin to infer a workload: {ans.thin}")
    ev = [(w.start - origin, int(w.preemptions.median), -1) for w in ans.windows if w.preemptions.median > 0]
    if ev:
        rec["storms"] = M.storm_windows(ev, rec.get("interval_s") or 10.0)
    rec["null_reasons"] = [r for r in rec["null_reasons"] if not r.startswith("replay fields")]
    rec["null_reasons"].append("victims, per-request figures: a default log names no request "
                               "(start vLLM with --enable-log-requests)")


def fill_default(rec: dict[str, Any], facts: Any, scrapes: list | None, profile: str | None,
                 origin: float) -> None:
    """A log without request lines: the answer of the workloads its stats lines (and the
    scrapes) allow, instead of no replay fields."""
    from kvreplay.errors import UserError

    if not is_default_log(facts):
        return
    try:
        ans, _how = answer_for(facts, [], profile=profile, scrapes=scrapes or None)
    except UserError as exc:
        rec["null_reasons"].append(f"default log not inferred: {exc}")
        return
    fill_record(rec, ans, origin)
