"""The status class of an audited log, with the evidence that decided it.

Rules, first match wins (thresholds below; the README lists them):

1. **single-sequence-length bound** — KV pressure (preemptions, or KV usage >= 95% in at
   least 10% of the samples) and one sequence can take a large part of the pool: the pool
   holds fewer than 2 sequences of max_model_len ("Maximum concurrency ... < 2x"), or the
   longest request seen needs >= 50% of the pool.
2. **KV-block bound** — KV pressure, and requests were preempted or queued (waiting > 0)
   while the pool was full: more KV blocks (or fewer concurrent sequences) is the fix.
3. **prefill interference** — no KV pressure (KV p95 < 90%, no preemptions), and the steps
   that carry decodes spike: p99 step time >= 3x the median, >= 5% of decode steps take
   >= 2x the median, and >= 50% of those spikes carry a long prefill chunk (>= a quarter
   of max_num_batched_tokens). Step times are logged (`Iteration(...)` lines) or
   estimated by the replay's step-time model.
4. **not established** — none of the above holds, or the input cannot tell; the evidence
   says which.
"""

from __future__ import annotations

from kvreplay.words import count

from typing import Any

KV_FULL = 0.95
KV_FULL_SHARE = 0.10
KV_CALM_P95 = 0.90
MAX_CONCURRENCY_X = 2.0
LONGEST_SHARE = 0.5
SPIKE_RATIO = 3.0
SPIKE_SHARE = 0.05
SPIKE_PREFILL_SHARE = 0.5

KV_BLOCK = "KV-block bound"
SINGLE_SEQ = "single-sequence-length bound"
PREFILL = "prefill interference"
UNKNOWN = "not established"
CLASSES = (KV_BLOCK, SINGLE_SEQ, PREFILL, UNKNOWN)


def _pct(x: float | None) -> str:
    return "?" if x is None else f"{100 * x:.0f}%"


def classify(r: dict[str, Any]) -> tuple[str, str]:
    """(status, evidence) from an audit record's fields."""
    pre_logged = r.get("preemptions_logged")
    pre_replayed = r.get("preemptions_replayed")
    pre = max((p for p in (pre_logged, pre_replayed) if p is not None), default=None)
    ge95 = r.get("kv_time_ge95")
    p95 = r.get("kv_usage_p95")
    waiting_max = r.get("waiting_max")
    facts: list[str] = []
    if p95 is not None:
        facts.append(f"KV usage p95 {_pct(p95)}, >= 95% in {_pct(ge95)} of samples")
    if pre is not None:
        src = "replayed" if pre == pre_replayed and pre_replayed is not None else "logged"
        facts.append(f"{pre} preemptions ({src})")
    else:
        facts.append("preemptions unknown (" + (r.get("preemptions_logged_source") or "not in the input") + ")")
    if waiting_max is not None:
        facts.append(f"waiting up to {waiting_max}")
    kv_pressure = bool(pre) or (ge95 is not None and ge95 >= KV_FULL_SHARE)

    mcx = r.get("max_concurrency_x")
    longest = r.get("longest_seq_pool_share")
    selfp = r.get("self_preemptions") or 0
    if kv_pressure:
        why = []
        if mcx is not None and mcx < MAX_CONCURRENCY_X:
            why.append(f"the pool holds {mcx:.2f}x max_model_len ({r.get('max_model_len')} tokens)")
        if longest is not None and longest >= LONGEST_SHARE:
            why.append(f"the longest request needs {_pct(longest)} of the pool")
        if why:
            if selfp:
                why.append(f"{count(selfp, 'self-preemption')} (a request evicted itself to grow)")
            return SINGLE_SEQ, "; ".join(facts + why)
        if selfp:
            facts.append(count(selfp, "self-preemption"))
        running = r.get("running_max")
        seqs = r.get("max_num_seqs")
        extra = []
        if running is not None and seqs is not None:
            extra.append(f"running peaked at {running} of max_num_seqs {seqs}")
        if pre or (waiting_max or 0) > 0:
            return KV_BLOCK, "; ".join(facts + extra)

    ratio = r.get("step_spike_ratio")
    share = r.get("step_spike_share")
    pshare = r.get("step_spike_prefill_share")
    src = r.get("step_time_source")
    spike_txt = None
    if ratio is not None:
        spike_txt = (f"decode steps p99/p50 {ratio:.1f}x, {_pct(share)} of them >= 2x the median, "
                     f"{_pct(pshare)} of those carry a long prefill chunk ({src})")
    calm = (p95 is None or p95 < KV_CALM_P95) and not pre
    if (calm and ratio is not None and ratio >= SPIKE_RATIO and (share or 0) >= SPIKE_SHARE
            and (pshare or 0) >= SPIKE_PREFILL_SHARE):
        return PREFILL, "; ".join(facts + [spike_txt])
    if spike_txt:
        facts.append(spike_txt)
    elif ratio is None:
        facts.append("step times unknown (no Iteration lines and no replay)")
    return UNKNOWN, "; ".join(facts)
