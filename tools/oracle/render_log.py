"""Render a simulated run as the log a vLLM 0.33 server would have written.

Used for round-trip tests (simulate -> log -> replay -> same preemptions) and to make
samples. The lines follow vLLM 0.33's formats (spec: vllm-log-formats.md): the banner and
`non-default args`, the KV-cache size line, per request the JSON-body line
(VLLM_REQUEST_BODY_LOG_LEVEL=INFO), `Received request` and `Added request`, the periodic
`Engine 000:` stats line, and uvicorn's access line when a (non-streaming) request ends.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import time as _time
from typing import Any, Callable

from kvreplay.replay.workload import Workload
from tools.oracle.log_lines import TimedLines, kv_cache_lines, stamp as _ts

API = "(APIServer pid=4242)"
CORE = "(EngineCore pid=4343)"


def render_log(
    workload: Workload,
    records: list[dict[str, Any]],
    *,
    step_time_s: float | Callable[[dict[str, Any]], float],
    start: float = 1778148060.0,
    stats_interval_s: float = 10.0,
    stats_phase_s: float = 0.5,
    with_prompts: bool = True,
    model: str = "meta-llama/Llama-3.1-8B-Instruct",
    wrapper_times: bool = False,
    iteration_lines: bool = False,
) -> list[str]:
    """Lines of a 0.33 log for `records` (timed_lines: its arguments and the lines' times).
    `wrapper_times`: each line behind the time stamp `docker logs -t` puts before it."""
    out = timed_lines(workload, records, step_time_s=step_time_s, start=start,
                      stats_interval_s=stats_interval_s, stats_phase_s=stats_phase_s,
                      with_prompts=with_prompts, model=model, iteration_lines=iteration_lines)
    if wrapper_times:  # as `docker logs -t` prints it: RFC 3339, UTC, nanoseconds
        return [f"{_time.strftime('%Y-%m-%dT%H:%M:%S', _time.gmtime(t))}."
                f"{round((t % 1) * 1e9) % 1_000_000_000:09d}Z {line}" for t, line in out]
    return [line for _, line in out]


def timed_lines(
    workload: Workload,
    records: list[dict[str, Any]],
    *,
    step_time_s: float | Callable[[dict[str, Any]], float],
    start: float = 1778148060.0,
    stats_interval_s: float = 10.0,
    stats_phase_s: float = 0.5,
    with_prompts: bool = True,
    model: str = "meta-llama/Llama-3.1-8B-Instruct",
    iteration_lines: bool = False,
) -> list[tuple[float, str]]:
    """(time, line) of a 0.33 log for `records` (a `simulate` trace), step k starting at
    start + k * step_time_s, or (`step_time_s` a function of a step's record, as in
    render_v0_log) at start + the durations of steps 0..k-1. Arrivals are logged just before
    the step that adds them. In time order (ties: in the order written). `iteration_lines`:
    also the `Iteration(N)` line of every step that scheduled a token
    (--enable-logging-iteration-details; iteration_line())."""
    cfg = workload.config
    out = TimedLines()
    emit = out.emit

    boot = start - 55.0
    args = {
        "model_tag": model, "model": model, "max_model_len": cfg.max_model_len,
        "block_size": cfg.block_size, "num_gpu_blocks_override": cfg.num_gpu_blocks,
        "enable_prefix_caching": cfg.enable_prefix_caching,
        "enable_chunked_prefill": cfg.enable_chunked_prefill,
        "max_num_batched_tokens": cfg.max_num_batched_tokens,
        "max_num_seqs": cfg.max_num_seqs, "async_scheduling": cfg.async_scheduling,
        "scheduling_policy": cfg.policy, "enable_log_requests": True,
    }
    if cfg.long_prefill_token_threshold:
        args["long_prefill_token_threshold"] = cfg.long_prefill_token_threshold
    if not cfg.scheduler_reserve_full_isl:
        args["scheduler_reserve_full_isl"] = False
    if cfg.watermark:
        args["watermark"] = cfg.watermark
    emit(boot, f"{API} INFO {_ts(boot)} [startup.py:38]  version 0.33.0")
    emit(boot, f"{API} INFO {_ts(boot)} [startup.py:96] non-default args: {args!r}")
    emit(boot + 1, f"{CORE} INFO {_ts(boot + 1)} [core.py:139] Initializing a V1 LLM engine "
         f"(v0.33.0) with config: model='{model}', max_seq_len={cfg.max_model_len}, "
         f"enable_prefix_caching={cfg.enable_prefix_caching}, "
         f"enable_chunked_prefill={cfg.enable_chunked_prefill}, pooler_config=None")
    for line in kv_cache_lines(f"{CORE} INFO", boot + 25, cfg):
        emit(boot + 25, line)

    specs = {s.id: s for s in workload.requests}
    port = {s.id: 51000 + i for i, s in enumerate(workload.requests)}
    starts = step_starts(records, step_time_s, start) if callable(step_time_s) else None
    if starts is not None:
        step_start = starts.__getitem__
    else:
        step_start = lambda k: start + k * step_time_s  # noqa: E731
    first_token_seen: set[str] = set()
    lead = 0.0 if starts is not None else min(0.0005, step_time_s / 4)
    for rec in records:
        k = rec["step"]
        if starts is not None:
            lead = min(0.0005, (starts[k + 1] - starts[k]) / 4)
        for j, rid in enumerate(rec.get("arrivals", ())):
            s = specs[rid]
            t = step_start(k) - lead
            if with_prompts:
                body = {"model": model, "prompt": s.prompt_token_ids, "max_tokens": s.max_tokens,
                        "stream": False, "temperature": 0.0, "ignore_eos": True}
                if s.priority:
                    body["priority"] = s.priority
                emit(t, f"{API} INFO {_ts(t)} [request_logger.py:84] Request "
                        f"{hashlib.md5(rid.encode()).hexdigest()} JSON body: "
                        f"{json.dumps(body, separators=(',', ':'))}")
            emit(t, f"{API} INFO {_ts(t)} [request_logger.py:66] Received request {rid}: params: "
                    f"SamplingParams(n=1, temperature=0.0, top_p=1.0, top_k=0, seed=None, stop=[], "
                    f"stop_token_ids=[], ignore_eos=True, max_tokens={s.max_tokens}, min_tokens=0, "
                    f"logprobs=None, prompt_logprobs=None, skip_special_tokens=True), "
                    f"lora_request: None.")
            emit(t, f"{API} INFO {_ts(t)} [async_llm.py:587] Added request {rid}-{j:08x}.")
        end = step_start(k + 1)
        for rid in rec.get("finished", ()):
            emit(end + 0.0008, f'INFO:     127.0.0.1:{port[rid]} - '
                               f'"POST /v1/completions HTTP/1.1" 200 OK')
    if iteration_lines:
        for t, line in iteration_lines_of(records, step_start, cfg.num_gpu_blocks):
            emit(t, line)
    # stats lines: state at the end of the last step that ended before each tick
    n = len(records)
    last_end = step_start(n)
    tick = start - (start % 1) + stats_phase_s
    while tick < start:
        tick += stats_interval_s
    # prefix-cache hit at each request's first admission: its prompt tokens are counted
    # when its first token comes out (0.16+: without the cached part), which under async
    # scheduling is a later step's record
    first_hit: dict[str, int] = {}
    # prefix-cache queries and hits up to each step: first admissions only (0.11+ leaves
    # out the re-admission after a preemption); the line shows hits / queries (over the
    # last 1,000 requests) once there was a query, when caching is on
    caching = workload.config.enable_prefix_caching
    cum_queries: list[int] = []
    cum_hits: list[int] = []
    q = h = 0
    for r in records:
        for rid in r.get("new", ()):
            if rid not in first_hit:
                first_hit[rid] = r.get("prefix_hit_tokens", {}).get(rid, 0)
                q += len(specs[rid].prompt_token_ids)
                h += first_hit[rid]
        cum_queries.append(q)
        cum_hits.append(h)
    prev_k = -1
    while tick <= last_end + 2 * stats_interval_s:
        if starts is not None:  # the last step that ended before the tick
            k = min(n - 1, bisect.bisect_right(starts, tick) - 2)
        else:
            k = min(n - 1, int((tick - start) / step_time_s) - 1)
        window = records[prev_k + 1 : k + 1] if k >= 0 else []
        prev_k = max(prev_k, k)
        gen = sum(len(r.get("sampled", ())) for r in window)
        prompt = 0
        for r in window:
            for rid in r.get("sampled", ()):
                if rid not in first_token_seen:
                    first_token_seen.add(rid)
                    prompt += len(specs[rid].prompt_token_ids) - first_hit.get(rid, 0)
        state = records[k] if k >= 0 else None
        running = len(state["running"]) if state else 0
        waiting = len(state["waiting"]) if state else 0
        usage = 100 * state["kv_usage"] if state else 0.0
        hit_rate = ""
        if caching and k >= 0 and cum_queries[k] > 0:
            hit_rate = f", Prefix cache hit rate: {100 * cum_hits[k] / cum_queries[k]:.1f}%"
        emit(tick, f"{API} INFO {_ts(tick)} [loggers.py:335] Engine 000: Avg prompt throughput: "
                   f"{prompt / stats_interval_s:.1f} tokens/s, Avg generation throughput: "
                   f"{gen / stats_interval_s:.1f} tokens/s, Running: {running} reqs, Waiting: "
                   f"{waiting} reqs, GPU KV cache usage: {usage:.1f}%{hit_rate}")
        tick += stats_interval_s
    return out.in_order()


def iteration_lines_of(records: list[dict[str, Any]], step_start: Callable[[int], float],
                       num_gpu_blocks: int) -> list[tuple[float, str]]:
    """vLLM 0.33's `Iteration(N)` lines for a trace (conformance format, as vLLM's own
    scheduler writes it), each at the time the API server writes it: as the step's output
    arrives, at the end of the step that applied it (spec: log formats 4.3). Context
    requests are the scheduled ones with no output token before the step (output
    placeholders counted, as _make_cached_request_data reads them), new ones always; the
    elapsed time is the step's duration; the KV usage is the one after its output, as
    BlockPool.get_usage computes it from the free blocks (1 - free / (blocks - 1): the
    trace's rounded kv_usage can print differently)."""
    by_update = {r["updated_batch"]: r for r in records if r.get("updated_batch") is not None}
    out: list[tuple[float, str]] = []
    outputs: dict[str, int] = {}
    placeholders: dict[str, int] = {}
    n = 0
    for r in records:
        sched = r.get("scheduled", ())
        total = sum(t for _, t in sched)
        if total:
            new = set(r.get("new", ()))
            cr = ct = 0
            for rid, t in sched:
                if rid in new or outputs.get(rid, 0) + placeholders.get(rid, 0) == 0:
                    cr += 1
                    ct += t
            k = r["step"]
            upd = by_update.get(k, r)
            t = step_start(upd["step"] + 1) + 0.0003
            ms = (step_start(k + 1) - step_start(k)) * 1000.0
            out.append((t, f"{API} INFO {_ts(t)} [loggers.py:199] Engine 000: Iteration({n}): "
                           f"{cr} context requests, {ct} context tokens, {len(sched) - cr} "
                           f"generation requests, {total - ct} generation tokens, iteration "
                           f"elapsed time: {ms:.2f} ms, GPU KV cache usage: "
                           f"{(1.0 - upd['free_blocks'] / (num_gpu_blocks - 1)) * 100:.1f}%"))
            n += 1
        outputs = r.get("num_output_tokens", {})
        placeholders = r.get("num_output_placeholders", {})
    return out


def step_starts(records: list[dict[str, Any]], step_time_s: Callable[[dict[str, Any]], float],
                start: float) -> list[float]:
    """Start of every step, and the end of the last: `start` plus the durations before it."""
    out, t = [], start
    for r in records:
        out.append(t)
        t += step_time_s(r)
    out.append(t)
    return out


def formula_step_time(m: dict[str, float]) -> Callable[[dict[str, Any]], float]:
    """A step's duration as the log cases' truth.json `step_time_model` gives it (its form
    and key names): overhead + max(weight read, per token x scheduled tokens) + per context
    token x context + per request x scheduled requests; an idle iteration
    `idle_iteration_s`. For rendering runs with realistic step times."""
    def dt(r: dict[str, Any]) -> float:
        n = r.get("num_scheduled_tokens", 0)
        if n == 0:
            return m["idle_iteration_s"]
        ctx = sum(r["num_computed_tokens"].get(rid, 0) for rid, _ in r["scheduled"])
        return (m["overhead_s"] + max(m["weight_read_s"], m["per_scheduled_token_s"] * n)
                + m["per_context_token_s"] * ctx
                + m["per_scheduled_request_s"] * len(r["scheduled"]))

    return dt
