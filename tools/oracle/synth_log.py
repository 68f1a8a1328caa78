"""Logs with known answers: run a workload through the scheduler model on a wall clock and
write what vLLM 0.33's `vllm serve --enable-log-requests` would have printed.

Used by the audit/what-if tests and benchmarks; the truth comes from the same run
(every preemption, the tokens it cost, the per-step KV usage), so an audit of the rendered
log can be checked against it. The lines are the ones `kvreplay.parsers` reads: banner,
non-default args, engine config, KV cache size, `JSON body` (with
VLLM_REQUEST_BODY_LOG_LEVEL=INFO), `Received request`, `Added request`, the periodic
stats line and uvicorn's access line at each finish.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

from kvreplay.inference.clock import StepTimeModel
from kvreplay.replay.engine import Engine
from kvreplay.replay.profile import get_profile
from kvreplay.replay.records import EngineInputs, StepRecord, preemption_records, totals
from kvreplay.replay.scheduler import SchedulerConfig
from kvreplay.replay.workload import RequestSpec, Workload
from tools.oracle.log_lines import TimedLines, kv_cache_lines, stamp

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
EPOCH = 1778148000.0  # 2026-05-07 10:00:00, read as UTC like the parser does


@dataclass(slots=True)
class SynthRun:
    """A simulated serving run: per-step records on a wall clock plus the totals."""

    records: list[StepRecord]
    step_start: list[float]
    step_end: list[float]
    arrival_time: dict[str, float]
    truth: dict[str, Any] = field(default_factory=dict)


def make_workload(
    n: int = 200,
    *,
    seed: int = 0,
    rate: float = 20.0,
    prompt: tuple[int, int] = (200, 1200),
    output: tuple[int, int] = (50, 400),
    num_gpu_blocks: int = 1000,
    block_size: int = 16,
    max_num_seqs: int = 64,
    max_num_batched_tokens: int = 2048,
    max_model_len: int = 4096,
    enable_prefix_caching: bool = False,
    enable_chunked_prefill: bool = True,
) -> tuple[Workload, list[float]]:
    """A random workload and its Poisson arrival times (seconds from the start)."""
    rng = random.Random(seed)
    cfg = SchedulerConfig(
        num_gpu_blocks=num_gpu_blocks, block_size=block_size, max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len,
        enable_chunked_prefill=enable_chunked_prefill,
        enable_prefix_caching=enable_prefix_caching,
    )
    specs, times = [], []
    t = 0.0
    for i in range(n):
        t += rng.expovariate(rate)
        p = rng.randint(*prompt)
        o = rng.randint(*output)
        toks = [10 + (i * 7919 + j * 104729) % 30000 for j in range(p)]
        specs.append(RequestSpec(f"r{i}", 0, toks, o))
        times.append(t)
    wl = Workload("synthetic", f"{n} requests, seed {seed}", cfg, specs, max_steps=10**9)
    return wl, times


def run_on_clock(
    workload: Workload,
    arrivals: list[float],
    *,
    profile: str = "0.33",
    step_time: StepTimeModel | None = None,
) -> SynthRun:
    """Run the scheduler model; a request enters at the first step starting at or after its
    arrival; each step takes `step_time.dt(tokens, requests)` seconds."""
    model = step_time or StepTimeModel(0.008, 3e-5, 0.0)
    specs = workload.requests
    engine = Engine(workload, get_profile(profile), inputs=EngineInputs([-1] * len(specs)))
    order = sorted(range(len(specs)), key=lambda i: (arrivals[i], i))
    k = 0
    clock = 0.0
    records: list[StepRecord] = []
    starts: list[float] = []
    ends: list[float] = []
    arrival_time: dict[str, float] = {}
    while not engine.done and (k < len(order) or engine.has_work()):
        if not engine.has_work() and k < len(order):
            clock = max(clock, arrivals[order[k]])
        while k < len(order) and arrivals[order[k]] <= clock:
            i = order[k]
            engine.submit(i)
            arrival_time[specs[i].id] = arrivals[i]
            k += 1
        rec = engine.step()
        starts.append(clock)
        clock += model.dt_record(rec)
        ends.append(clock)
        records.append(rec)
    run = SynthRun(records, starts, ends, arrival_time)
    run.truth = truth_of(records, workload)
    run.truth["step_time_model"] = model.describe()
    return run


def truth_of(records: list[StepRecord], workload: Workload) -> dict[str, Any]:
    """The answers an audit should find: the run's own totals (kvreplay.replay.records)."""
    t = totals(records, preemption_records(records))
    return {"preemptions": t.preemptions, "self_preemptions": t.self_preemptions,
            "requests_preempted": t.requests_preempted,
            "computed_tokens_lost": t.computed_tokens_lost,
            "recomputed_tokens": t.tokens_recomputed, "processed_tokens": t.processed_tokens,
            "recompute_ratio": t.recompute_ratio, "requests": len(workload.requests)}


# ---------------------------------------------------------------- rendering
def render_log(
    workload: Workload,
    arrivals: list[float],
    *,
    profile: str = "0.33",
    step_time: StepTimeModel | None = None,
    interval_s: float = 10.0,
    version: str = "0.33.0",
    stats_preemptions: bool = False,
    request_bodies: bool = True,
    start: float = EPOCH + 60.0,
    run: SynthRun | None = None,
) -> tuple[str, SynthRun]:
    """The log text of a simulated run, and the run (with `.truth`).

    `stats_preemptions` prints the stats line's `Preemptions: N` field (vLLM 0.11.1-0.32
    print it; 0.33 never does)."""
    if run is None:
        run = run_on_clock(workload, arrivals, profile=profile, step_time=step_time)
    cfg = workload.config
    api = "(APIServer pid=2801) INFO"
    core = "(EngineCore pid=2978) INFO"
    lines = TimedLines()
    add = lines.emit

    t0 = start - 55.0
    nd = {
        "model_tag": MODEL, "model": MODEL, "max_model_len": cfg.max_model_len,
        "num_gpu_blocks_override": cfg.num_gpu_blocks,
        "enable_prefix_caching": cfg.enable_prefix_caching,
        "max_num_batched_tokens": cfg.max_num_batched_tokens,
        "max_num_seqs": cfg.max_num_seqs, "async_scheduling": cfg.async_scheduling,
        "enable_log_requests": True,
    }
    if not cfg.enable_chunked_prefill:
        nd["enable_chunked_prefill"] = False
    add(t0, f"{api} {stamp(t0)} [startup.py:38]  ▄▄ ▄█ █     █     █ ▀▄▀ █  version {version}")
    add(t0, f"{api} {stamp(t0)} [startup.py:38]   █▄█▀ █     █     █     █  model   {MODEL}")
    add(t0, f"{api} {stamp(t0)} [startup.py:96] non-default args: {nd!r}")
    add(t0 + 7, f"{core} {stamp(t0 + 7)} [core.py:139] Initializing a V1 LLM engine (v{version}) "
        f"with config: model='{MODEL}', speculative_config=None, tokenizer='{MODEL}', "
        f"max_seq_len={cfg.max_model_len}, tensor_parallel_size=1, pipeline_parallel_size=1, "
        f"data_parallel_size=1, kv_cache_dtype=auto, seed=0, served_model_name={MODEL}, "
        f"enable_prefix_caching={cfg.enable_prefix_caching}, "
        f"enable_chunked_prefill={cfg.enable_chunked_prefill}, pooler_config=None")
    for line in kv_cache_lines(core, t0 + 25, cfg):
        add(t0 + 25, line)
    add(t0 + 33, f"{api} {stamp(t0 + 33)} [entry.py:139] Starting vLLM server on http://0.0.0.0:8000")

    specs = {s.id: s for s in workload.requests}
    for i, spec in enumerate(workload.requests):
        t = start + arrivals[i]
        st = stamp(t)
        if request_bodies:
            body = {"model": MODEL, "prompt": spec.prompt_token_ids, "max_tokens": spec.max_tokens,
                    "stream": False, "temperature": 0.0, "ignore_eos": True}
            add(t, f"{api} {st} [request_logger.py:84] Request {i:032x} JSON body: "
                f"{json.dumps(body, separators=(',', ':'))}")
        add(t, f"{api} {st} [request_logger.py:66] Received request cmpl-{spec.id}-0: params: "
            "SamplingParams(n=1, presence_penalty=0.0, frequency_penalty=0.0, "
            "repetition_penalty=1.0, temperature=0.0, top_p=1.0, top_k=0, min_p=0.0, seed=None, "
            "stop=[], stop_token_ids=[], ignore_eos=True, "
            f"max_tokens={spec.max_tokens}, min_tokens=0, logprobs=None), lora_request: None.")
        add(t, f"{api} {st} [async_llm.py:587] Added request cmpl-{spec.id}-0-{i:08x}.")

    port = 40000
    for rec, end in zip(run.records, run.step_end):
        for rid in rec.finished:
            port += 1
            add(start + end, f'INFO:     127.0.0.1:{port} - "POST /v1/completions HTTP/1.1" 200 OK')

    # stats lines: a snapshot of the last step that began before the tick, and the tokens
    # of the steps that ended in the interval; idle twice in a row -> DEBUG (not shown).
    last_end = run.step_end[-1] if run.step_end else 0.0
    tick = interval_s
    si = 0
    n_steps = len(run.records)
    prev_idle = False
    while tick <= last_end + 2 * interval_s:
        prompt = gen = pre = 0
        while si < n_steps and run.step_end[si] <= tick:
            rec = run.records[si]
            prompt += rec.prefill_tokens
            gen += rec.generated_tokens
            pre += len(rec.preemptions)
            si += 1
        snap = run.records[si - 1] if si else None
        running = snap.num_running if snap else 0
        waiting = snap.num_waiting if snap else 0
        usage = 100.0 * snap.kv_usage if snap else 0.0
        idle = prompt == 0 and gen == 0
        if not (idle and prev_idle):
            parts = [f"Avg prompt throughput: {prompt / interval_s:.1f} tokens/s",
                     f"Avg generation throughput: {gen / interval_s:.1f} tokens/s",
                     f"Running: {running} reqs", f"Waiting: {waiting} reqs"]
            if stats_preemptions and pre:
                parts.append(f"Preemptions: {pre}")
            parts.append(f"GPU KV cache usage: {usage:.1f}%")
            if cfg.enable_prefix_caching:
                parts.append("Prefix cache hit rate: 0.0%")
            t = start + tick
            add(t, f"{api} {stamp(t)} [loggers.py:335] Engine 000: " + ", ".join(parts))
        prev_idle = idle
        tick += interval_s
    del specs
    return "".join(text + "\n" for _, text in lines.in_order()), run
