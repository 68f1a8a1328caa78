"""The replay's fields of a log's audit record: every one read from the `Replay` (its
totals, records, uncertainty, verification, provenance), none computed here.
"""

from __future__ import annotations

from typing import Any

from kvreplay.audit import metrics as M
from kvreplay.audit.record import fill_lengths


def fill_replay(rec, rp, origin: float) -> None:
    """The replay's figures: every one read from the Replay (its totals and records)."""
    steps = rp.steps
    cost = rp.totals()
    info = rp.info
    estimated = info.prompts == "estimated"
    rec["profile"] = rp.profile.name
    rec["preemptions_replayed"] = cost.preemptions
    unc = rp.uncertainty
    if unc is not None:  # the 90% intervals over the ensemble (inference/ensemble.py)
        rec["preemptions_replayed_low"] = unc.preemptions["low"]
        rec["preemptions_replayed_high"] = unc.preemptions["high"]
        rec["preemptions_replayed_median"] = unc.preemptions["median"]
        rec["recomputed_tokens_low"] = unc.recomputed_tokens["low"]
        rec["recomputed_tokens_high"] = unc.recomputed_tokens["high"]
        rec["preemptions_interval_source"] = f"ensemble of {unc.samples + 1} replays, 90%"
    elif rp.estimate is not None:
        rec["preemptions_replayed_low"] = rp.estimate.preemptions_low
        rec["preemptions_replayed_high"] = rp.estimate.preemptions_high
        rec["preemptions_replayed_median"] = rp.estimate.preemptions_median
        rec["preemptions_interval_source"] = "prompt-length variants (min-max)"
    rec["self_preemptions"] = cost.self_preemptions
    rec["requests_preempted"] = cost.requests_preempted
    rec["computed_tokens_lost"] = cost.computed_tokens_lost
    rec["recomputed_tokens"] = cost.tokens_recomputed
    rec["processed_tokens"] = cost.processed_tokens
    rec["recompute_ratio"] = M.rnd(cost.recompute_ratio, 6)
    rec["recompute_source"] = "replay" + (" (prompt lengths estimated)" if estimated else "")
    ver = rp.verification
    if ver is not None and ver.stats_lines:
        rec["replay_agreement"] = round(ver.agreeing_lines / ver.stats_lines, 4)
        if ver.exact_lines is not None:  # matched without tolerance at the step each line saw
            rec["replay_exact"] = round(ver.exact_lines / ver.stats_lines, 4)
    model = rp.step_time_model
    if model is not None:
        rec["step_time_model"] = (info.step_time_model if rp.kind == "step-trace" else
                                  f"{model.describe()} (fit loss {info.fit_loss or 0.0:.3g})")

    # workload from the replayed requests (exact or estimated lengths)
    wl = rp.workload
    ins = [len(s.prompt_token_ids) for s in wl.requests]
    outs = [s.max_tokens for s in wl.requests]
    rec["requests"] = len(wl.requests) if info.requests is None else info.requests
    facts = rp.facts
    times = [r.time for r in facts.requests if r.time is not None] if facts is not None else []
    if len(times) > 1 and times[-1] > times[0]:
        rec["arrival_rate_rps"] = round((len(times) - 1) / (times[-1] - times[0]), 4)
    fill_lengths(rec, ins, outs)
    rec["lengths_source"] = ("input " + ("estimated" if estimated else "logged")
                             + ", output " + ("estimated (max_tokens)"
                                              if info.output_lengths == "estimated"
                                              else "logged"))
    cfg = wl.config
    usable = (cfg.num_gpu_blocks - 1) * cfg.block_size
    if usable > 0 and ins:
        longest = max(min(i + o, cfg.max_model_len) for i, o in zip(ins, outs))
        rec["longest_seq_pool_share"] = round(longest / usable, 4)
    if rec["max_num_batched_tokens"] is None:
        rec["max_num_batched_tokens"] = cfg.max_num_batched_tokens
    if rec["block_size"] is None:
        rec["block_size"] = cfg.block_size
    if rec["num_gpu_blocks"] is None:
        rec["num_gpu_blocks"] = cfg.num_gpu_blocks
    if rp.clock is None or model is None:
        return

    # step times (estimated) -> latency and decode spikes
    starts = rp.clock
    ends = []
    rows = []
    for i, r in enumerate(steps):
        dt = model.dt_record(r)
        ends.append(starts[i] + dt)
        if r.num_scheduled:
            rows.append((dt, r.prefill_tokens, r.decode_tokens > 0))
    lat = M.latency_from_records(steps, ends, _arrival_times(rp, starts))
    rec["ttft_p50_s"] = M.rnd(M.quantile(lat["ttft"], 0.5))
    rec["ttft_p95_s"] = M.rnd(M.quantile(lat["ttft"], 0.95))
    rec["itl_p50_s"] = M.rnd(M.quantile(lat["itl"], 0.5), 5)
    rec["itl_p95_s"] = M.rnd(M.quantile(lat["itl"], 0.95), 5)
    rec["latency_source"] = "estimated: replay with the fitted step-time model"
    st = M.decode_stalls(rows, cfg.max_num_batched_tokens)
    rec["step_spike_ratio"] = M.rnd(st["spike_ratio"])
    rec["step_spike_share"] = M.rnd(st["spike_share"])
    rec["step_spike_prefill_share"] = M.rnd(st["spike_prefill_share"])
    rec["step_time_source"] = "estimated by the replay's step-time model"

    # storms and the requests hurt most
    window = rec["interval_s"] or 10.0
    ev_ = [(starts[p.step] - origin, 1, p.tokens_recomputed or 0) for p in rp.preemptions]

    def kv_at(a, b):
        xs = [steps[i].kv_usage for i in range(len(steps)) if a <= starts[i] - origin < b]
        return M.mean(xs)

    rec["storms"] = M.storm_windows(ev_, window, kv_at=kv_at)
    rec["worst_requests"] = M.worst_requests(rp.preemptions, starts)
    rec["replay_timeline"] = _replay_timeline(steps, starts, origin)


def _arrival_times(rp, starts) -> dict[str, float]:
    """Request (or V0 sequence group) id -> the wall-clock start of its arrival step."""
    parent = getattr(rp.workload, "parent", {})
    logged = list(dict.fromkeys(parent.get(s.id, s.id) for s in rp.workload.requests))
    at = {rid: a for rid, a in zip(logged, rp.inputs.arrival_steps)}
    out = {}
    for s in rp.workload.requests:
        a = at.get(parent.get(s.id, s.id), -1)
        if 0 <= a < len(starts):
            out[s.id] = starts[a]
    return out


def _replay_timeline(records, starts, origin, buckets: int = 300) -> list[dict[str, Any]]:
    if not records:
        return []
    t0 = starts[0] - origin
    span = max(1e-9, starts[-1] - starts[0])
    width = span / buckets
    out: dict[int, dict[str, Any]] = {}
    for r, s in zip(records, starts):
        k = min(buckets - 1, int((s - starts[0]) / width)) if width > 0 else 0
        b = out.get(k)
        if b is None:
            b = out[k] = {"t": round(t0 + k * width, 3), "kv_usage": 0.0, "running": 0,
                          "waiting": 0, "preemptions": 0}
        b["kv_usage"] = max(b["kv_usage"], round(r.kv_usage, 4))
        b["running"] = max(b["running"], r.num_running)
        b["waiting"] = max(b["waiting"], r.num_waiting)
        b["preemptions"] += len(r.preemptions)
    return [out[k] for k in sorted(out)]
