"""Stage 1, facts: what a vLLM log says about a serving run, from parsed events (A13).

Consumes: events (kvreplay.events); this module never reads text. Produces: `LogFacts`
(requests, stats lines, access lines, aborts, config, version), with what the log cannot
tell listed in `missing` and the vLLM flag that would tell it. The judgements made on facts
alone (arrival pattern, cut, aborts, access lines) are in log_shape.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from itertools import pairwise
from typing import Any, Iterable, Sequence

from kvreplay import events as ev
from kvreplay.inference.columns import Table


@dataclass(slots=True)
class LogRequest:
    index: int
    log_id: str  # the id on the "Received request" line
    time: float | None  # epoch seconds, whole-second resolution
    file: str
    line: int
    internal_id: str | None = None  # "Added request" id (0.14+: log id + "-<8 hex>")
    max_tokens: int | None = None
    min_tokens: int | None = None
    ignore_eos: bool | None = None
    priority: int = 0
    n: int = 1
    prompt_token_ids: list[int] | None = None
    prompt_len: int | None = None
    stream: bool | None = None
    output_len: int | None = None  # from a "Generated response" line
    finish_reason: str | None = None
    # Ordering facts: completions (access lines) and stats lines seen before this request.
    completions_before: int = 0
    stats_before: int = 0
    aborted_time: float | None = None
    # Position among all arrivals, completions and stats lines of the log, in file order.
    seq: int = 0
    # when within its second the line was written, from a container runtime's time stamp
    # (LogFacts.precise_times); None without one
    precise_time: float | None = None
    # `Iteration(N)` lines (of LogFacts.iterations) written before this request reached
    # the engine: before its `Added request` line, else its `Received request` line
    iterations_before: int = 0
    aborted_iterations: int | None = None  # the same, for its `Aborted request` line
    # its request span (events.RequestSpan, joined by inference.spans; its arrival, on the
    # log's clock, is precise_time); None without one
    span: Any = None


@dataclass(slots=True)
class StatsPoint:
    """One stats line of the first engine. `LogFacts.stats` holds them as columns
    (columns.Table): each read gives a new, equal StatsPoint."""

    index: int
    time: float  # whole second printed
    file: str
    line: int
    running: int | None
    waiting: int | None
    kv_usage: float | None  # fraction
    prompt_throughput: float | None
    generation_throughput: float | None
    preemptions: int | None
    prefix_cache_hit_rate: float | None
    swapped: int | None = None  # V0
    cpu_kv_usage: float | None = None  # V0, fraction
    arrivals_before: int = 0
    completions_before: int = 0
    seq: int = 0
    precise_time: float | None = None  # as LogRequest.precise_time


@dataclass(slots=True, frozen=True)
class LogFacts:
    """What a log says, collected once (`collect`) and never changed after: a stage that
    knows more (the request spans' join, an access-line cut) makes new facts
    (`dataclasses.replace`); a stage's notes are its own return values."""

    config: ev.EngineConfig | None
    vllm_version: str | None
    engine_version: str | None
    requests: list[LogRequest]
    # a Table (columns: one line costs ~70 bytes, not an object of ~250), or any sequence
    stats: Sequence[StatsPoint]
    completions: list[tuple[str, int, int, int]]  # (file, line, arrivals before it, seq)
    v0_preemptions: list[ev.Preemption]
    iterations: list[ev.Iteration]
    interval_s: float | None
    first_time: float | None
    last_time: float | None
    num_cpu_blocks: int | None  # V0 swap space, from "# GPU blocks: N, # CPU blocks: M"
    finished: list[tuple[float | None, str]]  # "Finished request X" lines (V0 in-process)
    num_events: int
    num_unparsed: int
    files: list[str]
    missing: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    # settings the `non-default args` line names (0.9+: the user set them); None: no such line
    non_default: frozenset[str] | None = None
    # engine indices the stats lines name (`Engine 001:`); `stats` holds the first one's
    engines: tuple[int, ...] = ()
    # the request and stats lines carry sub-second times (a container runtime's stamps,
    # shifted to the log's own clock): `precise_time` is set on all of them
    precise_times: bool = False
    # the access lines' sub-second times, on the same clock (None unless all have one)
    completion_times: list[float] | None = None
    # `Iteration(N)` lines written before each access line (as `completions`)
    completion_iterations: list[int] = field(default_factory=list)
    # the engines the iteration lines name; `iterations` holds the first one's
    iteration_engines: tuple[int, ...] = ()
    # request spans (inference/spans.py): the span exporter's clock minus the log's, and
    # whether their engine stamps place the arrivals (inference/span_clock.py)
    span_offset_s: float = 0.0
    span_placement: bool = False

    @property
    def prompts_known(self) -> bool:
        return bool(self.requests) and all(r.prompt_token_ids is not None for r in self.requests)

    @property
    def prompt_lengths_known(self) -> bool:
        return bool(self.requests) and all(
            r.prompt_token_ids is not None or r.prompt_len is not None for r in self.requests
        )


def _fraction(pct: float | None) -> float | None:
    """pct / 100 (vLLM prints usage in percent)."""
    return None if pct is None else pct / 100.0


def _precise_times(wrapped: list) -> tuple[list[float] | None, float]:
    """Sub-second times for the request and stats lines from the stamps a container runtime
    wrote before them (UTC), shifted onto the log's own clock (local time read as UTC, whole
    seconds): the shift is whole quarter hours (a time zone); each line's own second bounds
    its time. None unless every one of those lines has such a stamp that agrees with its
    second (a few ms late at most: the runtime reads the line after vLLM wrote it). Also
    the shift."""
    if not wrapped or any(t is None or w is None for _, t, w in wrapped):
        return None, 0.0
    shifts: dict[float, int] = {}
    for _, t, w in wrapped:
        q = round((t - w + 0.5) / 900.0) * 900.0
        shifts[q] = shifts.get(q, 0) + 1
    tz = max(shifts, key=lambda q: (shifts[q], -abs(q)))
    out = []
    for _, t, w in wrapped:
        x = w + tz
        if not (t - 0.05 <= x < t + 1.05):
            return None, 0.0
        out.append(min(max(x, t), t + 0.999))
    return out, tz


def collect(
    events: Iterable[ev.Event],
    files: list[str],
    *,
    config: ev.EngineConfig | None,
    vllm_version: str | None,
    engine_version: str | None,
) -> LogFacts:
    """One pass over the events of a (merged) log. The caller merges the config and detects
    the release (kvreplay.parsers.merge_config / detect_version): replay never imports the
    parsers."""
    requests: list[LogRequest] = []
    by_id: dict[str, LogRequest] = {}
    bodies: list[ev.RequestBody] = []  # JSON-body lines waiting for their Received line
    details: dict[str, ev.RequestDetails] = {}
    stats: Table[StatsPoint] = Table(StatsPoint)
    completions: list[tuple[str, int, int, int]] = []
    completion_wrappers: list[float | None] = []
    v0_pre: list[ev.Preemption] = []
    iterations: list[ev.Iteration] = []
    iter_engine: int | None = None
    iter_engines: set[int] = set()
    completion_iters: list[int] = []
    abort_iters: list[int] = []
    outputs: dict[str, ev.GeneratedResponse] = {}
    num_cpu_blocks: int | None = None
    finished: list[tuple[float | None, str]] = []
    dup_ids: list[str] = []
    aborts: list[ev.RequestAborted] = []
    first_time = last_time = None
    n_events = n_unparsed = 0
    non_default: set[str] = set()
    saw_non_default = False
    stats_engine: int | None = None
    engines: set[int] = set()
    # None once a line lacks its stamp (_precise_times needs every one): kept for none then
    wrapped: list[tuple[LogRequest | None, float | None, float | None]] | None = []  # (request or
    # None for a stats line, its time, its wrapper time), in order
    seq = 0
    for e in events:
        n_events += 1
        if e.time is not None:
            first_time = e.time if first_time is None else min(first_time, e.time)
            last_time = e.time if last_time is None else max(last_time, e.time)
        if isinstance(e, ev.Unparsed):
            n_unparsed += 1
        elif isinstance(e, (ev.EngineConfig, ev.KvCapacity)):
            if isinstance(e, ev.KvCapacity) and e.num_cpu_blocks is not None:
                num_cpu_blocks = e.num_cpu_blocks
            if isinstance(e, ev.EngineConfig) and e.origin == "non_default_args":
                non_default |= {k for k in ev.EngineConfig.__struct_fields__
                                if k != "origin" and k not in ev.LINE_FIELDS
                                and getattr(e, k) is not None}
                saw_non_default = True
        elif isinstance(e, ev.RequestBody):
            bodies.append(e)
        elif isinstance(e, ev.RequestDetails):
            details[e.request_id] = e
        elif isinstance(e, ev.RequestReceived):
            seq += 1
            r = LogRequest(
                index=len(requests), log_id=e.request_id, time=e.time, file=e.file, line=e.line,
                max_tokens=e.max_tokens, min_tokens=e.min_tokens, ignore_eos=e.ignore_eos,
                priority=e.priority or 0, n=e.n or 1, prompt_token_ids=e.prompt_token_ids,
                prompt_len=e.prompt_len, completions_before=len(completions),
                stats_before=len(stats), seq=seq, iterations_before=len(iterations),
            )
            # The JSON-body line (0.31+) comes just before its Received line, under another
            # id: pair them in order.
            if bodies:
                body = bodies.pop(0)
                if r.prompt_token_ids is None and body.prompt_token_ids is not None:
                    r.prompt_token_ids = body.prompt_token_ids
                    r.prompt_len = body.prompt_len
                if r.max_tokens is None:
                    r.max_tokens = body.max_tokens
                if r.ignore_eos is None:
                    r.ignore_eos = body.ignore_eos
                if body.priority is not None:
                    r.priority = body.priority
                r.stream = body.stream
            if r.log_id in by_id:
                # a client may reuse a request id (X-Request-Id); keep both, told apart
                k = 2
                while f"{e.request_id}#{k}" in by_id:
                    k += 1
                r.log_id = f"{e.request_id}#{k}"
                dup_ids.append(e.request_id)
            requests.append(r)
            by_id[r.log_id] = r
            if wrapped is not None:
                if e.time is None or e.wrapper_time is None:
                    wrapped = None
                else:
                    wrapped.append((r, e.time, e.wrapper_time))
        elif isinstance(e, ev.RequestAdded):
            r = _match(by_id, e.request_id)
            if r is not None and r.internal_id is None:
                r.internal_id = e.request_id
                r.iterations_before = len(iterations)
        elif isinstance(e, ev.RequestAborted):
            aborts.append(e)
            abort_iters.append(len(iterations))
        elif isinstance(e, ev.RequestFinished):
            finished.append((e.time, e.request_id))
        elif isinstance(e, ev.GeneratedResponse):
            outputs[e.request_id] = e
        elif isinstance(e, ev.HttpAccess):
            if e.method == "POST" and e.status == 200 and _is_generation(e.path):
                seq += 1
                completions.append((e.file, e.line, len(requests), seq))
                completion_iters.append(len(iterations))
                completion_wrappers.append(e.wrapper_time)
        elif isinstance(e, ev.Stats):
            if e.time is None:
                continue
            # one engine's lines: the first one seen (engine 0 of a data-parallel log, or
            # the only engine of one rank's own log under external load balancing)
            engine = e.engine or 0
            if stats_engine is None:
                stats_engine = engine
            engines.add(engine)
            if engine != stats_engine:
                continue
            seq += 1
            if wrapped is not None:
                if e.wrapper_time is None:
                    wrapped = None
                else:
                    wrapped.append((None, e.time, e.wrapper_time))
            stats.add(
                index=len(stats), time=e.time, file=e.file, line=e.line,
                running=e.running, waiting=e.waiting,
                kv_usage=_fraction(e.gpu_kv_usage),
                prompt_throughput=e.prompt_throughput,
                generation_throughput=e.generation_throughput,
                preemptions=e.preemptions, prefix_cache_hit_rate=e.prefix_cache_hit_rate,
                swapped=e.swapped,
                cpu_kv_usage=_fraction(e.cpu_kv_usage),
                arrivals_before=len(requests), completions_before=len(completions), seq=seq,
            )
        elif isinstance(e, ev.Preemption):
            v0_pre.append(e)
        elif isinstance(e, ev.Iteration):
            engine = e.engine or 0
            iter_engines.add(engine)
            if iter_engine is None:
                iter_engine = engine
            if engine == iter_engine and not e.dummy:
                iterations.append(e)
    for rid, d in details.items():
        r = _match(by_id, rid)
        if r is not None and r.prompt_token_ids is None and d.prompt_token_ids is not None:
            r.prompt_token_ids = d.prompt_token_ids
            r.prompt_len = d.prompt_len
    for rid, out in outputs.items():
        r = _match(by_id, rid)
        if r is not None and out.num_output_tokens is not None and out.streaming != "delta":
            r.output_len = out.num_output_tokens
            r.finish_reason = out.finish_reason
    for a, k in zip(aborts, abort_iters):
        for rid in a.request_ids:
            r = _match(by_id, rid)
            if r is not None and r.aborted_time is None:
                r.aborted_time = a.time
                r.aborted_iterations = k
    precise, tz = _precise_times(wrapped or [])
    completion_times = None
    if precise is not None and completion_wrappers and all(w is not None for w in completion_wrappers):
        completion_times = [w + tz for w in completion_wrappers]  # type: ignore[operator]
    if precise is not None:
        stats_precise = []
        for (r, _, _), t in zip(wrapped, precise):
            if r is not None:
                r.precise_time = t
            else:
                stats_precise.append(t)
        stats.set_column("precise_time", stats_precise)
    gaps = [b - a for a, b in pairwise(stats.column("time")) if b > a]
    interval = None
    if gaps:
        gaps.sort()
        interval = float(gaps[len(gaps) // 2])
    facts = LogFacts(
        config=config,
        vllm_version=vllm_version,
        engine_version=engine_version,
        requests=requests,
        stats=stats,
        completions=completions,
        v0_preemptions=v0_pre,
        iterations=iterations,
        interval_s=interval,
        first_time=first_time,
        last_time=last_time,
        num_cpu_blocks=num_cpu_blocks,
        finished=finished,
        num_events=n_events,
        num_unparsed=n_unparsed,
        files=files,
        non_default=frozenset(non_default) if saw_non_default else None,
        engines=tuple(sorted(engines)),
        precise_times=precise is not None,
        completion_times=completion_times,
        completion_iterations=completion_iters,
        iteration_engines=tuple(sorted(iter_engines)),
    )
    notes = []
    if dup_ids:
        notes.append(
            f"{len(dup_ids)} request id(s) appear on more than one Received line (e.g. "
            f"{dup_ids[0]}); repeats are named <id>#2, <id>#3 ..."
        )
    return replace(facts, missing=tuple(_missing(facts)), notes=tuple(notes))


def with_notes(facts: LogFacts, *notes: str) -> LogFacts:
    """The same facts with more notes (a new value: facts are never changed)."""
    return replace(facts, notes=facts.notes + notes)


def _is_generation(path: str) -> bool:
    return any(p in path for p in ("/completions", "/generate", "/responses", "/chat"))


def _match(by_id: dict[str, LogRequest], rid: str) -> LogRequest | None:
    """Join an engine-side id to the Received id: equal, or "<id>-<8 hex>" (0.14+)."""
    r = by_id.get(rid)
    if r is not None:
        return r
    head, sep, tail = rid.rpartition("-")
    if sep and len(tail) == 8:
        return by_id.get(head)
    return None


def make_it_exact(f: LogFacts) -> str:
    """What to turn on, in the order it helps, so that the next log replays exactly."""
    steps = []
    if not f.iterations and (f.engine_version != "V0"):
        steps.append("start vLLM (0.14+) with --enable-logging-iteration-details: one line "
                     "per engine step, which pins every arrival to its step")
    if not f.requests:
        steps.append("--enable-log-requests")
    if not f.prompts_known:
        steps.append("VLLM_REQUEST_BODY_LOG_LEVEL=INFO (0.31+; or --log-level DEBUG) so every "
                     "prompt is logged")
    if not steps:
        return ("the log has what a replay needs; for a log that names every scheduling "
                "decision, use kvreplay's step-trace scheduler plugin")
    return "; ".join(steps) + "; or use kvreplay's step-trace scheduler plugin"


def _missing(f: LogFacts) -> list[str]:
    """What the log lacks for an exact replay, and the flag that would give it."""
    missing: list[str] = []
    if not f.requests:
        missing.append(
            "request lines: start vLLM with --enable-log-requests (off by default since 0.10.1) "
            "so each request's arrival and sampling params are logged"
        )
        return missing
    if not f.prompts_known:
        if f.prompt_lengths_known:
            missing.append(
                "prompt token ids (only lengths are logged): prefix-cache hits cannot be "
                "replayed; VLLM_REQUEST_BODY_LOG_LEVEL=INFO (0.31+) or --log-level DEBUG logs them"
            )
        else:
            missing.append(
                "prompts: 0.11.1+ logs prompts only at DEBUG; set VLLM_REQUEST_BODY_LOG_LEVEL=INFO "
                "(0.31+) or --log-level DEBUG, or use kvreplay's step-trace scheduler plugin"
            )
    if any(r.max_tokens is None for r in f.requests):
        missing.append("max_tokens for some requests (defaults to max_model_len - prompt)")
    if any(not r.ignore_eos and r.output_len is None for r in f.requests):
        missing.append(
            "output lengths (requests without ignore_eos stop at EOS): --enable-log-outputs "
            "logs each response, or the step-trace plugin records every finish"
        )
    if not f.stats:
        missing.append("periodic stats lines: keep --disable-log-stats off")
    if not f.iterations and f.engine_version != "V0" and f.requests:
        missing.append("per-step lines: --enable-logging-iteration-details (vLLM 0.14+) "
                       "logs every engine step, and the replay places each arrival by them")
    if f.config is None or f.config.num_gpu_blocks is None and f.config.kv_cache_tokens is None:
        missing.append("the KV cache size (GPU KV cache size / # GPU blocks startup line)")
    return missing
