"""The conformance trace: one JSON object per engine iteration, in the field names and
order of the oracle harness that drove vLLM's own scheduler (tests/data/conformance).

Unlike a `StepRecord`, a trace record holds the whole state after the step (every live
request's num_computed_tokens, status and blocks), so it is written while the engine runs:
`conformance_record(engine, rec)` right after `rec = engine.step()`.
"""

from __future__ import annotations

from typing import Any

from kvreplay.replay.records import AdmissionBlocked, PreemptionEvent, StepRecord


def preemption_dict(p: PreemptionEvent) -> dict[str, Any]:
    """A preemption in the trace's key order (the oracle's, plus kvreplay's own keys)."""
    d: dict[str, Any] = {
        "req": p.victim,
        "trigger": p.trigger,
        "self_preempt": p.self_preempt,
        "num_computed_tokens_before": p.num_computed_tokens,
        "num_tokens": p.num_tokens,
        "num_output_tokens": p.num_output_tokens,
        "blocks_held_before": p.blocks_held,
        "free_blocks_before": p.free_blocks_before,
        "called_from": p.called_from,
        "free_blocks_after": p.free_blocks_after,
        "victim_rule": p.victim_rule,
        "rolled_back_tokens": p.rolled_back_tokens,
        "was_scheduled_this_step": p.was_scheduled_this_step,
    }
    if p.blocks_needed is not None:
        d["blocks_needed"] = p.blocks_needed
        d["free_blocks_at_failure"] = p.free_blocks_at_failure
    return d


def blocked_dict(b: AdmissionBlocked) -> dict[str, Any]:
    d: dict[str, Any] = {"req": b.request, "reason": b.reason, "num_new_tokens": b.num_new_tokens,
                         "token_budget": b.token_budget}
    if b.blocks_needed is not None:
        d["blocks_needed"] = b.blocks_needed
        d["free_blocks"] = b.free_blocks
        d["watermark_blocks"] = b.watermark_blocks
    return d


def conformance_record(engine: Any, rec: StepRecord) -> dict[str, Any]:
    """The trace record of the step `engine` just ran (`rec` is what step() returned)."""
    out_rec: dict[str, Any] = {"step": rec.step, "arrivals": rec.arrivals}
    if rec.idle:
        out_rec["idle"] = True
    out = engine.last_output
    if out is not None:
        out_rec["scheduled"] = [[rid, n] for rid, n in out.num_scheduled_tokens.items()]
        out_rec["num_scheduled_tokens"] = out.total_num_scheduled_tokens
        out_rec["new"] = out.new_req_ids
        out_rec["resumed"] = out.resumed_req_ids
        out_rec["running_scheduled"] = out.running_req_ids
        out_rec["so_resumed_req_ids"] = sorted(out.resumed_req_ids)
        out_rec["prefix_hit_tokens"] = out.prefix_hit_tokens
        out_rec["preempted"] = out.preempted_req_ids
        out_rec["preemptions"] = [preemption_dict(p) for p in out.preemptions]
        out_rec["will_sample"] = engine.last_sample_ids
        out_rec["free_blocks_after_schedule"] = out.free_blocks_after
        out_rec["token_budget_left"] = out.token_budget_left
        if out.admission_blocked is not None:
            out_rec["admission_blocked"] = blocked_dict(out.admission_blocked)
    update = engine.last_update
    if update is not None:
        b_step, result = update
        out_rec["updated_batch"] = b_step
        out_rec["sampled"] = [r.request_id for r in sorted(result.sampled, key=_by_index)]
        out_rec["finished"] = rec.finished
    else:
        out_rec["sampled"] = []
        out_rec["finished"] = []
    _state(engine, out_rec)
    return out_rec


def _by_index(r: Any) -> int:
    return r.index


def _state(engine: Any, rec: dict[str, Any]) -> None:
    sched = engine.scheduler
    kv = sched.kv_cache_manager
    live = sorted(sched.requests.values(), key=_by_index)
    rec["num_computed_tokens"] = {r.request_id: r.num_computed_tokens for r in live}
    rec["num_output_tokens"] = {r.request_id: r.num_output_tokens for r in live}
    rec["status"] = {r.request_id: r.status.name for r in live}
    rec["blocks_held"] = {
        r.request_id: nb for r in live if (nb := kv.num_blocks(r.request_id))
    }
    rec["running"] = [r.request_id for r in sched.running]
    rec["waiting"] = [r.request_id for r in sched.waiting]
    rec["free_blocks"] = sched.pool.get_num_free_blocks()
    rec["kv_usage"] = round(sched.kv_cache_usage, 6)
    rec["cached_blocks"] = sched.pool.num_cached_hashes()
    if sched.async_scheduling:
        rec["num_output_placeholders"] = {
            r.request_id: r.num_output_placeholders for r in live if r.num_output_placeholders
        }
        rec["in_flight_batches"] = [b[0] for b in engine.batch_queue]
