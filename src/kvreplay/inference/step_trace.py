"""Exact replay of a vLLM log written with kvreplay's step-trace plugin (an input the
inference needs no guessing for).

The plugin (kvreplay.vllm_plugin) logs every engine iteration of vLLM's scheduler: what it
scheduled, admitted, preempted (victim and trigger) and finished, and the KV pool's free
blocks. From those lines this module rebuilds the workload exactly (arrival step of every
request, prompt length, output length, priority, prompt block-hash chain), replays it
through kvreplay's scheduler, and checks every logged field of every step. The first
difference is reported with the log line that shows it.

    from kvreplay.inference.step_trace import has_step_trace, replay_step_trace
    if has_step_trace(events):
        rep = replay_step_trace(events)    # a Replay; rep.step_check says what was checked

Prefix caching: the log carries each request's prompt block-hash chain (and the hashes of
blocks completed by output tokens). The rebuilt workload gets synthetic prompt tokens in
which two full blocks are equal iff their logged hashes are equal (so any kvreplay tool
reproduces the prompt-sharing pattern); the exact replay itself goes further and gives
every block, output blocks included, the identity the log recorded.

Time: each step line is written as its iteration ends, in vLLM's envelope with its
whole-second stamp. The Replay keeps them (`stamps`), a step-time model fitted on them
(`step_time_model`, inference/step_model.py `stamp_rows`) and the clock it gives
(`clock`, inference/trace_clock.py); the step check and the records do not use them.

KV-cache event files (`kvreplay record-kv-events`) can be checked too:
`replay_step_trace(events, kv_events=records)` compares vLLM's BlockStored / BlockRemoved /
AllBlocksCleared stream with the set of cached blocks in the replay's block pool.
"""

from __future__ import annotations

from typing import Any, Iterable

from kvreplay import events as ev
from kvreplay.errors import UserError
from kvreplay.inference.step_model import STAMPS
from kvreplay.inference.trace_clock import timed
from kvreplay.replay.engine import Engine
from kvreplay.replay.profile import get_profile
from kvreplay.replay.checks import SessionCheck, StepCheck, StepDivergence
from kvreplay.replay.records import EngineInputs, preemption_records
from kvreplay.replay.result import Provenance, Replay
from kvreplay.replay.scheduler import SchedulerConfig
from kvreplay.replay.trace import conformance_record
from kvreplay.replay.workload import RequestSpec, Workload

__all__ = ["replay_step_trace", "has_step_trace", "rebuild_workload", "TraceSession", "sessions",
           "CacheState", "apply_all"]

# Synthetic token ranges: full prompt blocks from the hash map; everything else per request.
_BLOCK_TOKEN_BASE = 1_000_000
_TAIL_TOKEN_BASE = 1_000_000_000


def has_step_trace(events: Iterable[Any]) -> bool:
    """True when the events contain the plugin's step lines (cheap: stops at the first)."""
    for e in events:
        if isinstance(e, ev.StepTrace):
            return True
    return False


class TraceSession:
    """The trace events of one scheduler instance (one `kvtrace config` line onwards, one
    process)."""

    def __init__(self, config: ev.TraceConfig | None, pid: int | None) -> None:
        self.config = config
        self.pid = pid
        self.requests: dict[int, ev.RequestTrace] = {}
        self.steps: list[ev.StepTrace] = []


def sessions(events: Iterable[Any]) -> list[TraceSession]:
    """Split trace events into sessions: per process, a new one at each config line."""
    current: dict[Any, TraceSession] = {}
    out: list[TraceSession] = []
    for e in events:
        if isinstance(e, ev.TraceConfig):
            s = TraceSession(e, e.pid)
            current[e.pid] = s
            out.append(s)
        elif isinstance(e, (ev.RequestTrace, ev.StepTrace)):
            s = current.get(e.pid)
            if s is None:  # log cut before the config line
                s = TraceSession(None, e.pid)
                current[e.pid] = s
                out.append(s)
            if isinstance(e, ev.RequestTrace):
                s.requests[e.handle] = e
            else:
                s.steps.append(e)
    return out


def _config(tc: ev.TraceConfig | None) -> SchedulerConfig:
    if tc is None:
        raise UserError("the step trace has no 'kvtrace config' line (log cut at the start?)")
    unsupported = []
    if (tc.prefill_schedule_interval or 1) != 1:
        unsupported.append(f"prefill_schedule_interval={tc.prefill_schedule_interval}")
    if tc.num_spec_tokens:
        unsupported.append(f"speculative decoding ({tc.num_spec_tokens} tokens)")
    if tc.hash_block_size and tc.block_size and tc.hash_block_size != tc.block_size:
        unsupported.append(f"hash block size {tc.hash_block_size} != block size {tc.block_size}")
    if unsupported:
        raise UserError("the traced scheduler uses what kvreplay does not replay: " + ", ".join(unsupported))
    d = SchedulerConfig()
    return SchedulerConfig(
        num_gpu_blocks=tc.num_gpu_blocks or d.num_gpu_blocks,
        block_size=tc.block_size or d.block_size,
        max_num_seqs=tc.max_num_seqs or d.max_num_seqs,
        max_num_batched_tokens=tc.max_num_batched_tokens or d.max_num_batched_tokens,
        max_model_len=tc.max_model_len or d.max_model_len,
        enable_chunked_prefill=d.enable_chunked_prefill if tc.enable_chunked_prefill is None else tc.enable_chunked_prefill,
        enable_prefix_caching=bool(tc.enable_prefix_caching),
        policy=tc.policy or d.policy,
        long_prefill_token_threshold=tc.long_prefill_token_threshold or 0,
        scheduler_reserve_full_isl=d.scheduler_reserve_full_isl if tc.scheduler_reserve_full_isl is None else tc.scheduler_reserve_full_isl,
        watermark=tc.watermark or 0.0,
        async_scheduling=bool(tc.async_scheduling),
    )


class _Facts:
    """What the log says about each request, by handle."""

    def __init__(self, session: TraceSession) -> None:
        self.finished_out: dict[int, int] = {}
        self.aborted: dict[int, tuple[int, bool, int]] = {}  # handle -> (step, mid, out)
        self.output_hashes: dict[int, list[str]] = {}
        for st in session.steps:
            for h, n in st.finished or ():
                self.finished_out[h] = n
            for h, n in st.aborted_before or ():
                self.aborted.setdefault(h, (st.step, False, n))
            for h, n in st.aborted_mid or ():
                self.aborted.setdefault(h, (st.step, True, n))
            for h, hs in st.block_hashes or ():
                self.output_hashes.setdefault(h, []).extend(hs)


def rebuild_workload(session: TraceSession, name: str = "from-step-trace") -> tuple[Workload, dict[int, str], list[int]]:
    """The workload the log describes: (workload, handle -> request id, handles left out).

    Requests aborted before any schedule() saw them are left out (they changed nothing).
    `max_tokens` is the number of output tokens a request had when it finished (so stop
    strings and EOS replay as what they were); unfinished requests keep their max_tokens.
    """
    config = _config(session.config)
    facts = _Facts(session)
    bs = config.block_size
    hash_ids: dict[str, int] = {}
    specs: list[RequestSpec] = []
    names: dict[int, str] = {}
    dropped: list[int] = []
    for h in sorted(session.requests):
        r = session.requests[h]
        names[h] = r.request_id
        ab = facts.aborted.get(h)
        if ab is not None and not ab[1] and ab[0] <= r.at_step:
            dropped.append(h)
            continue
        p = r.prompt_len or 1
        tokens: list[int] = []
        for hx in (r.block_hashes or ())[: p // bs]:
            u = hash_ids.setdefault(hx, len(hash_ids))
            base = _BLOCK_TOKEN_BASE + u * bs
            tokens.extend(range(base, base + bs))
        tail = _TAIL_TOKEN_BASE + h * config.max_model_len
        tokens.extend(range(tail + len(tokens), tail + p))
        max_tokens = facts.finished_out.get(h)
        if not max_tokens:
            max_tokens = r.max_tokens or config.max_model_len
        specs.append(RequestSpec(r.request_id, r.at_step, tokens, max_tokens, r.priority or 0))
    wl = Workload(
        name=name,
        description="rebuilt from kvreplay step-trace lines",
        config=config,
        requests=specs,
        max_steps=(session.steps[-1].step + 1) if session.steps else 1,
    )
    return wl, names, dropped


class _LoggedHasher:
    """Block identities straight from the log: block i of request r gets the id of the
    hash vLLM logged for it (prompt chain + output blocks); a block the log never named
    gets a fresh id (its identity never mattered to vLLM's cache)."""

    __slots__ = ("block_size", "chains", "_ids", "_fresh")

    def __init__(self, block_size: int, chains: dict[str, list[str]]) -> None:
        self.block_size = block_size
        self._ids: dict[str, int] = {}
        self.chains = {rid: [self._ids.setdefault(x, len(self._ids)) for x in c] for rid, c in chains.items()}
        self._fresh = 1 << 62

    def __deepcopy__(self, memo: dict) -> "_LoggedHasher":
        return self

    def __call__(self, request: Any) -> None:
        hashes = request.block_hashes
        num_full = request.num_tokens // self.block_size
        chain = self.chains.get(request.request_id, ())
        for i in range(len(hashes), num_full):
            if i < len(chain):
                hashes.append(chain[i])
            else:
                self._fresh += 1
                hashes.append(self._fresh)


def _close(a: float | None, b: float | None) -> bool:
    return a is None or b is None or abs(a - b) <= 6e-5


def _compare(st: ev.StepTrace, rec: dict[str, Any], name) -> tuple[str, Any, Any] | None:
    """The first field where the logged step and the replayed record differ."""
    if st.scheduled is not None:
        if "scheduled" not in rec:
            return "scheduled", [[name(h), n] for h, n in st.scheduled], None
        logged = [[name(h), n] for h, n in st.scheduled]
        if logged != rec["scheduled"]:
            return "scheduled", logged, rec["scheduled"]
        hits = rec.get("prefix_hit_tokens", {})
        for field, pairs, ids in (("new", st.new, rec.get("new", [])), ("resumed", st.resumed, rec.get("resumed", []))):
            logged = {name(h): n for h, n in pairs or ()}
            replayed = {rid: hits.get(rid) for rid in ids}
            if logged != replayed:
                return field, logged, replayed
        logged_p = [[name(v), name(t) if t is not None else None, lost] for v, t, lost in st.preempted or ()]
        replayed_p = [[p["req"], p["trigger"], p["num_computed_tokens_before"]] for p in rec.get("preemptions", [])]
        if logged_p != replayed_p:
            return "preempted", logged_p, replayed_p
    elif "scheduled" in rec:
        return "scheduled", None, rec["scheduled"]
    if st.updated_batch != rec.get("updated_batch"):
        return "updated_batch", st.updated_batch, rec.get("updated_batch")
    logged_f = sorted(name(h) for h, _ in st.finished or ())
    replayed_f = sorted(rec.get("finished", []))
    if logged_f != replayed_f:
        return "finished", logged_f, replayed_f
    if st.free_blocks is not None and st.free_blocks != rec["free_blocks"]:
        return "free_blocks", st.free_blocks, rec["free_blocks"]
    if not _close(st.kv_usage, rec.get("kv_usage")):
        return "kv_usage", st.kv_usage, round(rec["kv_usage"], 4)
    if st.running is not None and st.running != len(rec["running"]):
        return "running", st.running, len(rec["running"])
    if st.waiting is not None and st.waiting != len(rec["waiting"]):
        return "waiting", st.waiting, len(rec["waiting"])
    return None


def _replay_session(session: TraceSession, profile, kv_events) -> dict[str, Any]:
    wl, names, dropped = rebuild_workload(session)
    cfg = wl.config
    facts = _Facts(session)
    name = names.get
    hasher = None
    if cfg.enable_prefix_caching:
        chains = {}
        for h, r in session.requests.items():
            chains[r.request_id] = list(r.block_hashes or ()) + facts.output_hashes.get(h, [])
        hasher = lambda: _LoggedHasher(cfg.block_size, chains)  # noqa: E731
    dropped_set = set(dropped)
    before: list[tuple[int, str]] = []
    mid: list[tuple[int, str]] = []
    for h, (step, is_mid, _out) in sorted(facts.aborted.items(), key=lambda x: x[1][0]):
        if h not in dropped_set:
            (mid if is_mid else before).append((step, names[h]))
    inputs = EngineInputs([s.arrival_step for s in wl.requests], before, None, mid)
    engine = Engine(wl, profile, inputs=inputs,
                    block_hasher=hasher() if hasher is not None else None)
    kv_check = None
    if kv_events is not None:
        kv_check = _KvEventCheck(kv_events, engine.block_hasher if hasher is not None else None)
    steps = []
    divergence = None
    checked = 0
    for st in session.steps:
        if engine.done or engine.step_index != st.step:
            if divergence is None:
                divergence = _div(st, "step", st.step, engine.step_index if not engine.done else "replay ended")
            break
        rec = engine.step()
        steps.append(rec)
        if divergence is None:
            diff = _compare(st, conformance_record(engine, rec), lambda h: name(h, f"#{h}"))
            if diff is None and kv_check is not None:
                diff = kv_check.check(st, engine.scheduler.pool)
            if diff is not None:
                divergence = _div(st, *diff)
            else:
                checked += 1
    # every preemption of the replay; those the log's step lines show, before any
    # divergence, are exact, with the line that shows them
    pre = preemption_records(steps)
    lines = {st.step: st for st in session.steps}
    first_bad = divergence.step if divergence else None
    for p in pre:
        st = lines.get(p.step)
        if st is not None:
            p.file, p.line = st.file, st.line
        p.confidence = "exact" if first_bad is None or p.step < first_bad else "inferred"
    return {
        "steps_logged": len(session.steps),
        "steps_checked": checked,
        "first_divergence": divergence,
        "workload": wl,
        "steps": steps,
        "preemptions": pre,
        "inputs": inputs,  # the workload's max_steps ends the run where the log ends
        "hasher": hasher,
        "requests_left_out": [names[h] for h in dropped],
        "kv_events_checked": kv_check.checked if kv_check is not None else None,
        "log_lines": {st.step: [(st.file, st.line)] for st in session.steps if st.file},
        "times": [st.time for st in session.steps[: len(steps)]],
    }


def _div(st: ev.StepTrace, field: str, logged: Any, replayed: Any) -> StepDivergence:
    return StepDivergence(step=st.step, file=st.file, line=st.line, field=field, logged=logged,
                          replayed=replayed)


class _KvEventCheck:
    """vLLM's KV-cache events (BlockStored / BlockRemoved / AllBlocksCleared, as written by
    `kvreplay record-kv-events`) against the replay's block pool: after every step whose
    line says how many event batches vLLM had published (`ev=K`), the set of blocks the
    events announce as cached must equal the set of cached blocks in kvreplay's pool."""

    def __init__(self, records: list[dict[str, Any]], hasher: "_LoggedHasher | None") -> None:
        from collections import deque

        self.state = CacheState()
        self.pending = deque(sorted(records, key=lambda r: r.get("seq", 0)))
        self.checked = 0
        self.names = {v: k for k, v in hasher._ids.items()} if hasher is not None else {}

    def check(self, st: ev.StepTrace, pool: Any):
        if st.kv_events is None or st.updated_batch is None:
            # vLLM publishes a step's events in update_from_output(): after a step without
            # an update (async scheduling's first), what schedule() cached is not out yet.
            return None
        pending = self.pending
        while pending and pending[0].get("seq", 0) < st.kv_events:
            self.state.apply(pending.popleft())
        self.checked += 1
        names = self.names
        replayed = {names.get(h, f"unlogged:{h}") for h in pool.cached_block_hash_to_block}
        logged = self.state.cached
        if replayed != logged:
            return (
                "kv_cached_blocks",
                {"cached": len(logged), "only_in_vllm": sorted(logged - replayed)[:8]},
                {"cached": len(replayed), "only_in_replay": sorted(replayed - logged)[:8]},
            )
        return None


def replay_step_trace(events: list, *, profile: str | None = None,
                      kv_events: list[dict[str, Any]] | None = None,
                      label: str = "step trace") -> Replay:
    """Replay a step-traced log through kvreplay's scheduler and check every step.

    The `Replay`'s `step_check` says how many logged steps were checked and where vLLM and
    kvreplay first differ (None: nowhere); with several scheduler instances in the log, the
    Replay is the first instance with a difference (else the first) and `step_check`
    lists them all under "sessions".
    """
    sess = [s for s in sessions(events) if s.steps]
    if not sess:
        raise UserError("no kvtrace step lines: start vLLM with --scheduler-cls kvreplay.vllm_plugin.StepTraceScheduler")
    results = []
    for s in sess:
        prof = get_profile(profile if profile is not None else (s.config.vllm_version if s.config else None))
        results.append((prof, _replay_session(s, prof, kv_events)))
    prof, top = next((x for x in results if x[1]["first_divergence"] is not None), results[0])
    check = StepCheck(
        steps_logged=top["steps_logged"],
        steps_checked=sum(r["steps_checked"] for _, r in results),
        first_divergence=top["first_divergence"], requests_left_out=top["requests_left_out"],
        kv_events_checked=top["kv_events_checked"],
        sessions=[SessionCheck(steps_logged=r["steps_logged"], steps_checked=r["steps_checked"],
                               first_divergence=r["first_divergence"]) for _, r in results])
    wl = top["workload"]
    notes = []
    if len(results) > 1:
        notes.append(f"{len(results)} scheduler instances in the log; this replay is one of them")
    if top["requests_left_out"]:
        notes.append(f"{len(top['requests_left_out'])} requests aborted before any schedule() "
                     "saw them are left out")
    exact = top["first_divergence"] is None
    stamps, model, clock = timed(top["steps"], top["times"])
    info = Provenance(vllm_version=getattr(sess[0].config, "vllm_version", None),
                      requests=len(wl.requests), prompts="exact", output_lengths="exact",
                      step_time_model=None if model is None else f"{STAMPS}: {model.describe()}")
    return Replay(
        kind="step-trace", label=label, paths=[], workload=wl, profile=prof,
        inputs=top["inputs"], steps=top["steps"], preemptions=top["preemptions"],
        step_check=check, log_lines=top["log_lines"], notes=notes, hasher=top["hasher"],
        confidence="exact" if exact else "inferred", info=info,
        clock=clock, step_time_model=model, stamps=stamps,
    )


class CacheState:
    """The set of cached blocks (by 16-hex hash) that vLLM's KV-cache events announce."""

    def __init__(self) -> None:
        self.cached: set[str] = set()
        self.batches = 0

    def apply(self, record: dict[str, Any]) -> None:
        self.batches += 1
        for e in record.get("events", ()):
            t = e.get("type")
            if e.get("medium") not in (None, "GPU"):
                continue  # offloaded tiers are not the GPU block pool
            if t == "BlockStored":
                self.cached.update(e["block_hashes"])
            elif t == "BlockRemoved":
                self.cached.difference_update(e["block_hashes"])
            elif t == "AllBlocksCleared":
                self.cached.clear()

    @property
    def num_cached(self) -> int:
        return len(self.cached)


def apply_all(records: Iterable[dict[str, Any]]) -> CacheState:
    s = CacheState()
    for r in records:
        s.apply(r)
    return s
