"""The event model: what kvreplay knows about one line (or one multi-line record) of a vLLM log.

Every event is a msgspec Struct in ONE tagged union (`Event`), tagged by the field `kind`.
Invariants shared by all kinds:

* `file` and `line` (1-based) locate the first physical line of the record; `lines` is the
  number of physical lines the event accounts for (>1 for tracebacks and re-joined wrapped
  lines). Summed over a file's events, `lines` equals the file's physical line count.
* `time` is epoch seconds of the server's *local* wall clock read as if it were UTC (vLLM logs
  carry no zone); the year is inferred (file mtime or `--year`) and kept monotonic across a
  new year. `time_text` is the time stamp exactly as written (`05-07 10:00:05`).
* `wrapper_time` is the time stamp a container runtime put before the line (RFC 3339, UTC,
  sub-second), when there is one: it says when within its second a line was written.
* `process`/`pid` come from the `(APIServer pid=N)` prefix or the JSON record; `engine` is the
  data-parallel rank from `Engine 003:` or from the process name (`EngineCore_DP3`).
* Optional fields are `None` when the log did not say; nothing is guessed here.
* `truncated` marks a line cut short (the fields before the cut are kept); `repeat` is Ray's
  `[repeated Nx across cluster]` count.

JSON Lines in and out: `encode_jsonl(events) -> bytes`, `decode_jsonl(data) -> list[Event]`.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Union

import msgspec


class Base(msgspec.Struct, tag_field="kind", kw_only=True, omit_defaults=True, gc=False):
    # gc=False: an event never takes part in a reference cycle (it holds strings, numbers
    # and lists of them); untracked, a million events cost 16 bytes less each and no
    # garbage-collector pass walks them
    file: str
    line: int
    lines: int = 1
    time: float | None = None
    time_text: str | None = None
    level: str | None = None
    process: str | None = None
    pid: int | None = None
    engine: int | None = None
    source: str | None = None  # "loggers.py:335" as printed inside [..]
    note: str | None = None  # reader remarks: truncated, invalid UTF-8, re-joined ...
    # the time stamp a container runtime or log shipper wrote before the line (`docker logs
    # -t`, `kubectl logs --timestamps`): epoch seconds, UTC, with its sub-second digits
    wrapper_time: float | None = None
    # the line was cut short (terminal width, a paste limit, a crash): the event has the
    # fields before the cut, the rest are None
    truncated: bool = False
    # Ray's log de-duplication: `... [repeated 3x across cluster]`, the line stands for 3
    # more lines like it (the event is the first; None: not de-duplicated)
    repeat: int | None = None


# the fields every event has (where and when its line was written), as opposed to what the
# line says
LINE_FIELDS: frozenset[str] = frozenset(Base.__struct_fields__)


# ---------------------------------------------------------------- startup / configuration


class EngineConfig(Base, tag="engine_config", kw_only=True):
    """Configuration facts from one startup line; `origin` says which line kind.

    origins: banner, args (Namespace), non_default_args, init (Initializing ... with config),
    chunked_prefill, max_model_len, version (API server version line), json_config.
    Use `kvreplay.parsers.merge_config(events)` for the merged view.
    """

    origin: str
    vllm_version: str | None = None
    engine_version: str | None = None  # "V0" | "V1"
    model: str | None = None
    block_size: int | None = None
    num_gpu_blocks: int | None = None
    kv_cache_tokens: int | None = None
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enable_chunked_prefill: bool | None = None
    enable_prefix_caching: bool | None = None
    scheduling_policy: str | None = None
    gpu_memory_utilization: float | None = None
    async_scheduling: bool | None = None
    data_parallel_size: int | None = None
    data_parallel_rank: int | None = None
    tensor_parallel_size: int | None = None
    pipeline_parallel_size: int | None = None
    swap_space: float | None = None
    preemption_mode: str | None = None
    num_gpu_blocks_override: int | None = None
    num_scheduler_steps: int | None = None
    kv_cache_dtype: str | None = None
    long_prefill_token_threshold: int | None = None
    max_num_partial_prefills: int | None = None
    watermark: float | None = None
    scheduler_reserve_full_isl: bool | None = None
    speculative: str | None = None  # repr of speculative_config when not None


class KvCapacity(Base, tag="kv_capacity", kw_only=True):
    """KV-cache sizing: `GPU KV cache size`, `# GPU blocks`, `Maximum concurrency`,
    `cache_config_info ... num_gpu_blocks is`, `Overriding num_gpu_blocks`, `Available KV cache memory`."""

    device: str | None = None  # GPU, XPU, "GPU + host" ...
    kv_cache_tokens: int | None = None
    num_gpu_blocks: int | None = None
    num_cpu_blocks: int | None = None
    max_concurrency: float | None = None
    concurrency_tokens: int | None = None  # the "for N tokens per request" (= max_model_len)
    num_gpu_blocks_profiled: int | None = None  # before num_gpu_blocks_override
    num_gpu_blocks_override: int | None = None
    available_kv_gib: float | None = None
    num_engines: int | None = None  # "%d Engines: vllm cache_config_info"


# ---------------------------------------------------------------- request lifecycle


class RequestReceived(Base, tag="request_received", kw_only=True):
    request_id: str
    prompt: str | None = None
    prompt_token_ids: list[int] | None = None
    prompt_len: int | None = None  # len(prompt_token_ids) when logged (may be cut by --max-log-len)
    n: int | None = None
    best_of: int | None = None
    max_tokens: int | None = None
    min_tokens: int | None = None
    ignore_eos: bool | None = None
    temperature: float | None = None
    stop: list[str] | None = None
    stop_token_ids: list[int] | None = None
    priority: int | None = None
    lora: str | None = None
    params: str | None = None  # "SamplingParams" | "PoolingParams" ...


class RequestDetails(Base, tag="request_details", kw_only=True):
    """DEBUG `Request X details: prompt: ..., prompt_token_ids: [...]` (0.11.1+)."""

    request_id: str
    prompt: str | None = None
    prompt_token_ids: list[int] | None = None
    prompt_len: int | None = None


class RequestBody(Base, tag="request_body", kw_only=True):
    """`Request X JSON body: {...}` (0.31+, VLLM_REQUEST_BODY_LOG_LEVEL)."""

    request_id: str
    model: str | None = None
    prompt_token_ids: list[int] | None = None
    prompt_len: int | None = None
    prompt_text_len: int | None = None  # characters when the prompt is text
    num_messages: int | None = None
    max_tokens: int | None = None
    min_tokens: int | None = None
    ignore_eos: bool | None = None
    priority: int | None = None
    n: int | None = None
    stream: bool | None = None
    temperature: float | None = None


class RequestAdded(Base, tag="request_added", kw_only=True):
    request_id: str


class RequestAborted(Base, tag="request_aborted", kw_only=True):
    """`Aborted request X.` / `Aborted request(s) a,b.` / `Request X aborted.`"""

    request_ids: list[str]


class RequestFinished(Base, tag="request_finished", kw_only=True):
    """v0 in-process engines only: `Finished request X.`"""

    request_id: str


class RequestFailed(Base, tag="request_failed", kw_only=True):
    request_id: str
    reason: str | None = None  # "engine dead", "bad request", not enough kv cache blocks ...


class GeneratedResponse(Base, tag="generated_response", kw_only=True):
    """`--enable-log-outputs`: `Generated response X[ (streaming ...)]: output: ..., output_token_ids: [...], finish_reason: ...`."""

    request_id: str
    streaming: str | None = None  # "delta" | "complete"
    output: str | None = None
    output_token_ids: list[int] | None = None
    num_output_tokens: int | None = None
    finish_reason: str | None = None


# ---------------------------------------------------------------- scheduler observations


class Stats(Base, tag="stats", kw_only=True):
    """The periodic stats line; v0 (`Pending`, `Swapped`, CPU usage) and every v1 variant.

    `waiting` holds v0 `Pending`. Usages and hit rates are percentages as printed.
    """

    era: str  # "v0" | "v1"
    prompt_throughput: float | None = None
    generation_throughput: float | None = None
    running: int | None = None
    waiting: int | None = None
    swapped: int | None = None
    deferred: int | None = None
    preemptions: int | None = None
    kv_device: str | None = None
    gpu_kv_usage: float | None = None
    cpu_kv_usage: float | None = None
    prefix_cache_hit_rate: float | None = None
    external_prefix_cache_hit_rate: float | None = None
    mm_cache_hit_rate: float | None = None
    corrupted: int | None = None
    kv_fetch_waiting: int | None = None
    kv_fetch_in_progress: int | None = None
    kv_fetch_completed: int | None = None
    aggregated_engines: int | None = None
    max_iteration_ms: float | None = None
    avg_time_per_token_ms: float | None = None


class PrefixCacheStats(Base, tag="prefix_cache_stats", kw_only=True):
    """v0 `Prefix cache hit rate: GPU: x%, CPU: y%` (its own line)."""

    gpu_hit_rate: float | None = None
    cpu_hit_rate: float | None = None


class Preemption(Base, tag="preemption", kw_only=True):
    """v0 WARNING, printed for the 1st, 51st, 101st ... preemption; `cumulative` includes this one."""

    request_id: str
    mode: str | None = None  # "RECOMPUTE" | "SWAP"
    cumulative: int | None = None


class PreemptionWarning(Base, tag="preemption_warning", kw_only=True):
    """V1 per-victim WARNING proposed by vLLM PR #42827 (`Scheduler._preempt_request`):
    `Preempting request <id>: <N> computed tokens lost (recompute on resume), kv_cache_...`.
    Not in any release yet; typed when a patched server prints it. Fields after the cut
    of a pasted line are None."""

    request_id: str
    computed_tokens_lost: int | None = None
    kv_usage_before: float | None = None  # percent, as printed
    kv_usage_after: float | None = None
    num_preemptions: int | None = None  # this request's preemptions so far, this one included


class Iteration(Base, tag="iteration", kw_only=True):
    """`--enable-logging-iteration-details` per-step line (0.14+)."""

    step: int
    context_requests: int
    context_tokens: int
    generation_requests: int
    generation_tokens: int
    elapsed_ms: float
    dummy: bool = False
    kv_device: str | None = None
    kv_usage: float | None = None
    encoder_inputs: int | None = None
    encoder_output_embeddings: int | None = None


class SpecDecode(Base, tag="spec_decode", kw_only=True):
    mean_acceptance_length: float | None = None
    acceptance_rate: float | None = None  # percent (v1) or fraction (v0 "Draft acceptance rate: 0.x")
    accepted_throughput: float | None = None
    drafted_throughput: float | None = None
    accepted: int | None = None
    drafted: int | None = None
    per_position: list[float] | None = None
    emitted: int | None = None
    system_efficiency: float | None = None


# ---------------------------------------------------------------- kvreplay step trace
# Lines written by kvreplay's vLLM scheduler plugin (kvreplay.vllm_plugin; format in
# vllm_plugin/lineformat.py). Requests are named by a small per-scheduler handle.


class TraceConfig(Base, tag="trace_config", kw_only=True):
    """`kvtrace config ...`: the scheduler's configuration, once per scheduler instance."""

    vllm_version: str | None = None
    scheduler: str | None = None  # vLLM base class: Scheduler | AsyncScheduler
    num_gpu_blocks: int | None = None
    block_size: int | None = None
    hash_block_size: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None  # the scheduler's per-step token budget
    max_model_len: int | None = None
    enable_chunked_prefill: bool | None = None
    enable_prefix_caching: bool | None = None
    policy: str | None = None
    long_prefill_token_threshold: int | None = None
    scheduler_reserve_full_isl: bool | None = None
    watermark: float | None = None
    async_scheduling: bool | None = None
    prefill_schedule_interval: int | None = None
    num_spec_tokens: int | None = None
    extra: dict[str, str] | None = None  # keys this kvreplay does not know


class RequestTrace(Base, tag="trace_request", kw_only=True):
    """`kvtrace req H ...`: a request arrived (add_request); `at_step` is the step line whose
    schedule() first sees it. `block_hashes`: the prompt's full blocks (16 hex digits each)."""

    request_id: str
    handle: int = -1
    at_step: int = -1
    prompt_len: int | None = None
    max_tokens: int | None = None
    priority: int = 0
    block_hashes: list[str] | None = None


class StepTrace(Base, tag="trace_step", kw_only=True):
    """`kvtrace step N ...`: one engine iteration. Requests are handles (RequestTrace.handle).

    `scheduled` is None when schedule() did not run in this iteration; `updated_batch` is
    the step whose batch update_from_output() applied (None: no update). Pairs are
    (handle, tokens): scheduled tokens, prefix-hit tokens (new/resumed), output tokens
    (finished/aborted). `preempted`: (victim, trigger or None, computed tokens lost).
    """

    step: int
    aborted_before: list[tuple[int, int]] | None = None
    scheduled: list[tuple[int, int]] | None = None
    new: list[tuple[int, int]] | None = None
    resumed: list[tuple[int, int]] | None = None
    preempted: list[tuple[int, int | None, int]] | None = None
    aborted_mid: list[tuple[int, int]] | None = None
    updated_batch: int | None = None
    finished: list[tuple[int, int]] | None = None
    block_hashes: list[tuple[int, list[str]]] | None = None
    kv_events: int | None = None  # KV-cache event batches published so far (seq < this)
    free_blocks: int | None = None
    kv_usage: float | None = None  # fraction 0..1
    running: int | None = None
    waiting: int | None = None


# ---------------------------------------------------------------- other lines


class HttpAccess(Base, tag="http_access", kw_only=True):
    client: str | None = None
    method: str
    path: str
    http_version: str | None = None
    status: int
    status_text: str | None = None


class Error(Base, tag="error", kw_only=True):
    """A line that matters for replay: KV cache too small, engine dead, OOM, prompt too long ..."""

    category: str
    message: str
    request_id: str | None = None
    tokens: int | None = None
    limit: int | None = None


class Traceback(Base, tag="traceback", kw_only=True):
    """A multi-line record (logger.exception or raw Python traceback); `lines` is its span."""

    head: str
    exc_type: str | None = None
    exc_message: str | None = None
    category: str | None = None  # same vocabulary as Error.category when recognised


class Log(Base, tag="log", kw_only=True):
    """A well-formed vLLM log record whose message has no typed kind (routes, model loading ...)."""

    message: str


class Noise(Base, tag="noise", kw_only=True):
    """A recognised non-record line: blank, progress bar, banner art, uvicorn lifecycle, fence."""

    what: str
    text: str | None = None


class Unparsed(Base, tag="unparsed", kw_only=True):
    reason: str
    text: str


# ---------------------------------------------------------------- request spans (OpenTelemetry)


class RequestSpan(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One `llm_request` span of vLLM's `OutputProcessor.do_tracing` (an exported trace, not
    a log line; so not in `Event`). `start` is the request's arrival, epoch seconds UTC of the
    span exporter's clock (nanoseconds in the file); the latencies are seconds as vLLM wrote
    them (queue, prefill, decode, inference: engine monotonic stamps; ttft, e2e: against the
    wall-clock arrival). None: the span lacks the attribute."""

    file: str
    line: int  # the span's line in the file (1-based; Jaeger: the document's first line)
    request_id: str  # gen_ai.request.id: the id of the `Received request` line
    start: float
    end: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    max_tokens: int | None = None
    n: int | None = None
    time_in_queue: float | None = None
    time_to_first_token: float | None = None
    time_in_model_prefill: float | None = None
    time_in_model_decode: float | None = None
    time_in_model_inference: float | None = None
    e2e: float | None = None


Event = Union[
    EngineConfig,
    KvCapacity,
    RequestReceived,
    RequestDetails,
    RequestBody,
    RequestAdded,
    RequestAborted,
    RequestFinished,
    RequestFailed,
    GeneratedResponse,
    Stats,
    PrefixCacheStats,
    Preemption,
    PreemptionWarning,
    Iteration,
    SpecDecode,
    TraceConfig,
    RequestTrace,
    StepTrace,
    HttpAccess,
    Error,
    Traceback,
    Log,
    Noise,
    Unparsed,
]

EVENT_TYPES: tuple[type, ...] = Event.__args__  # type: ignore[attr-defined]
KINDS: dict[str, type] = {t.__struct_config__.tag: t for t in EVENT_TYPES}

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Event)


def encode_jsonl(events: Iterable[Any]) -> bytes:
    """Events -> JSON Lines bytes (one object per line, each ending in `\\n`)."""
    return _encoder.encode_lines(list(events))


def iter_encode_jsonl(events: Iterable[Any], batch: int = 256) -> Iterator[bytes]:
    """Stream events as JSON Lines chunks; memory stays flat in the number of events.

    Small batches keep the events of a batch in the CPU cache between parsing and encoding
    (256: ~20% faster than 2048 on a log with token-id lists)."""
    buf: list[Any] = []
    for ev in events:
        buf.append(ev)
        if len(buf) >= batch:
            yield _encoder.encode_lines(buf)
            buf.clear()
    if buf:
        yield _encoder.encode_lines(buf)


def decode_jsonl(data: bytes | str) -> list[Event]:
    """JSON Lines -> events (blank lines ignored). Raises msgspec.ValidationError on bad input."""
    return _decoder.decode_lines(data)


def to_builtins(event: Any) -> dict[str, Any]:
    return msgspec.to_builtins(event)
