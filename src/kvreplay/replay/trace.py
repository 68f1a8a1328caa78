"""The conformance trace: one JSON object per engine iteration, in the field names and
order of the oracle harness that drove vLLM's own scheduler (tests/data/conformance).

Unlike a `StepRecord`, a trace record holds the whole state after the step (every live
request's num_computed_tokens, status and blocks), so it is written while the engine runs:
`conformance_record(engine, rec)` right after `rec = engine.step()`.
"""

from __future__ import annotations

from operator import attrgetter
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
    out_rec = conformance_head(engine, rec)
    _state(engine, out_rec)
    return out_rec


def conformance_head(engine: Any, rec: StepRecord) -> dict[str, Any]:
    """The record's fields up to `finished`: what the step did (no per-request state)."""
    out_rec: dict[str, Any] = {"step": rec.step, "arrivals": rec.arrivals}
    if rec.idle:
        out_rec["idle"] = True
    out = engine.last_output
    if out is not None:
        out_rec["scheduled"] = list(map(list, out.num_scheduled_tokens.items()))
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
        out_rec["sampled"] = list(map(_rid, sorted(result.sampled, key=_by_index)))
        out_rec["finished"] = rec.finished
    else:
        out_rec["sampled"] = []
        out_rec["finished"] = []
    return out_rec


def _queues_and_pool(sched: Any) -> dict[str, Any]:
    """The record's fields after the per-request maps: the queues and the pool's counts."""
    return {"running": list(map(_rid, sched.running)), "waiting": list(map(_rid, sched.waiting)),
            "free_blocks": sched.pool.get_num_free_blocks(),
            "kv_usage": round(sched.kv_cache_usage, 6),
            "cached_blocks": sched.pool.num_cached_hashes()}


_by_index = attrgetter("index")  # trace dicts are in workload order
_rid = attrgetter("request_id")


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
    rec.update(_queues_and_pool(sched))
    if sched.async_scheduling:
        rec["num_output_placeholders"] = {
            r.request_id: r.num_output_placeholders for r in live if r.num_output_placeholders
        }
        rec["in_flight_batches"] = [b[0] for b in engine.batch_queue]


class TraceWriter:
    """The conformance record of each step as one JSON line, byte-identical to
    `msgspec.json.encode(conformance_record(engine, rec))`, at a cost that grows with what
    the step touched rather than with every live request.

    The per-request maps (num_computed_tokens, num_output_tokens, status, blocks_held,
    num_output_placeholders) are kept between steps as one encoded fragment per live request.
    After a step only the requests it touched are encoded again: arrivals, aborts, the ids
    this step's schedule() scheduled or preempted, the ids of the batch update_from_output()
    applied (sampled or not), and the finished. Invariants: each fragment map holds exactly
    the live requests (checked by length every step; a miss rebuilds it) in index order
    (an arrival with a lower index than a live one rebuilds it in order); a request's
    fragment changes only when the scheduler touches it (tests/conformance/test_trace_writer.py checks
    every step of the conformance cases and random workloads against conformance_record).
    """

    def __init__(self, engine: Any) -> None:
        import msgspec

        self.engine = engine
        self.encode = msgspec.json.Encoder().encode
        self.keys: dict[str, bytes] = {}  # request id -> b'"id":' (exactly the maps' ids)
        # request id -> encoded fragment, in index order ("" for blocks/placeholders of 0)
        self.maps: tuple[dict[str, bytes], ...] = ({}, {}, {}, {}, {})
        self.last: dict[str, tuple[Any, int]] = {}  # request id -> (status, blocks held)
        self.max_index = -1
        self.outputs: dict[int, Any] = {}  # step -> SchedulerOutput still in flight
        # (the manager's table map: the engine never replaces it, it only edits it)
        self.tables = engine.scheduler.kv_cache_manager.req_to_blocks
        self.placeholders = engine.scheduler.async_scheduling
        if not _DIGITS:
            _DIGITS.extend(b"%d" % n for n in range(1 << 15))
        self._encode = self._encoder()

    def _encoder(self) -> Any:
        """encode(req): the request's fragment of each map (appended if it is new). A
        closure over the maps: it runs for every request every step touches."""
        keys, last, maps = self.keys, self.last, self.maps
        ntc, nout, status, blocks, holders = maps
        tables = self.tables
        async_ = self.placeholders
        digits = _DIGITS
        ndigits = len(digits)
        json_key = self.encode

        def encode(req: Any) -> None:
            rid = req.request_id
            key = keys.get(rid)
            if key is None:  # new to the maps (appended after every live request)
                key = keys[rid] = json_key(rid) + b":"
                holders[rid] = b""
                if req.index > self.max_index:
                    self.max_index = req.index
            n = req.num_computed_tokens
            ntc[rid] = key + digits[n] if n < ndigits else b"%b%d" % (key, n)
            n = req.num_output_tokens
            nout[rid] = key + digits[n] if n < ndigits else b"%b%d" % (key, n)
            table = tables.get(rid)
            now = (req.status, len(table) if table else 0)
            if now != last.get(rid):  # status and blocks held change less often
                last[rid] = now
                status[rid] = b'%b"%b"' % (key, _STATUS[now[0]])
                blocks[rid] = b"%b%d" % (key, now[1]) if now[1] else b""
            if async_:
                p = req.num_output_placeholders
                holders[rid] = b"%b%d" % (key, p) if p else b""

        return encode

    def line(self, rec: StepRecord) -> bytes:
        """The record of the step `engine` just ran, as JSON bytes plus a newline."""
        engine = self.engine
        head = conformance_head(engine, rec)
        self._refresh(rec.arrivals, self._touched(rec))
        sched = engine.scheduler
        tail = _queues_and_pool(sched)
        ntc, nout, status, blocks, holders = self.maps
        parts = [self.encode(head)[:-1],
                 b',"num_computed_tokens":{', b",".join(ntc.values()),
                 b'},"num_output_tokens":{', b",".join(nout.values()),
                 b'},"status":{', b",".join(status.values()),
                 b'},"blocks_held":{', b",".join(filter(None, blocks.values())),
                 b"},", self.encode(tail)[1:-1]]
        if sched.async_scheduling:
            parts += [b',"num_output_placeholders":{', b",".join(filter(None, holders.values())),
                      b'},"in_flight_batches":', self.encode([b[0] for b in engine.batch_queue])]
        parts.append(b"}\n")
        return b"".join(parts)

    def _touched(self, rec: StepRecord) -> set[str]:
        engine = self.engine
        touched = set(rec.aborted)
        out = engine.last_output
        outputs = self.outputs
        if out is not None:
            touched.update(out.num_scheduled_tokens)
            touched.update(out.preempted_req_ids)
            outputs[rec.step] = out
        update = engine.last_update
        if update is not None:
            b_step, result = update
            applied = outputs.pop(b_step, None)
            if applied is not None:
                touched.update(applied.num_scheduled_tokens)
            touched.update(r.request_id for r in result.sampled)
            touched.update(r.request_id for r in result.finished)
        in_flight = {b[0] for b in engine.batch_queue}
        for s in [s for s in outputs if s not in in_flight]:
            del outputs[s]  # a batch no update will apply (nothing left to run)
        return touched

    def _refresh(self, arrivals: list[str], touched: set[str]) -> None:
        requests = self.engine.scheduler.requests
        ntc = self.maps[0]
        rebuild = False
        encode = self._encode
        for rid in arrivals:  # new keys first, in the order they arrived
            req = requests.get(rid)
            if req is not None:
                if req.index < self.max_index:
                    rebuild = True  # it would land after a live request with a higher index
                encode(req)
        for rid in touched:
            req = requests.get(rid)
            if req is None:
                for m in (*self.maps, self.keys, self.last):
                    m.pop(rid, None)
            elif rid in ntc:  # (else an arrival gone again in its own step, or rebuilt below)
                encode(req)
        if rebuild or len(ntc) != len(requests):
            self._rebuild()

    def _rebuild(self) -> None:
        for m in self.maps:
            m.clear()
        self.last.clear()
        self.keys.clear()
        self.max_index = -1
        for req in sorted(self.engine.scheduler.requests.values(), key=_by_index):
            self._encode(req)


def _status_names() -> dict[Any, bytes]:
    from kvreplay.replay.request import RequestStatus

    return {s: s.name.encode() for s in RequestStatus}


_STATUS = _status_names()
_DIGITS: list[bytes] = []  # the JSON text of the counts below 2**15 (TraceWriter makes it)
