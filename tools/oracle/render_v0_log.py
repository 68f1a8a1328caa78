"""Render a V0-engine run as the log a vLLM 0.6.6 OpenAI server would have written.

The V0 counterpart of `render_log.py` (round-trip tests: V0 workload -> simulate -> log ->
replay -> same preemptions, same warnings; and samples). Lines follow the 0.6.x formats of
vllm-log-formats.md: `vLLM API server version`, `args: Namespace(...)`, `Initializing an
LLM engine (v...) with config: ...`, `# GPU blocks: N, # CPU blocks: M`, per request
`Received request X: prompt: None, params: SamplingParams(...), prompt_token_ids: [...]`
and `Added request X.`, `Finished request X.` (in-process engine,
`--disable-frontend-multiprocessing`) and the uvicorn access line, the every-50th
`Sequence group X is preempted by PreemptionMode.Y mode ... total_num_cumulative_preemption=K`
warning, and the `metrics.py` stats line printed at the end of the first step more than 5 s
after the previous one (0.6.5+: not printed when this and the previous interval had no
tokens at all, it goes to DEBUG).
"""

from __future__ import annotations

from typing import Any, Callable

from kvreplay.replay.v0.v0_engine import parse_workload
from tools.oracle.log_lines import TimedLines, stamp as _ts

STATS_INTERVAL_S = 5.0  # vllm/engine/metrics.py _LOCAL_LOGGING_INTERVAL_SEC

WARNING_TEXT = ("is preempted by PreemptionMode.{mode} mode because there is not enough KV "
                "cache space. This can affect the end-to-end performance. Increase "
                "gpu_memory_utilization or tensor_parallel_size to provide more KV cache "
                "memory. total_num_cumulative_preemption={k}")


def step_tokens(rec: dict[str, Any]) -> tuple[int, int]:
    """(prompt tokens, generation tokens) the V0 stat logger counts for one step:
    prompt = token chunks of the prefill groups; generation = the rest of the batch plus
    one per prefill that completed (it sampled its first token)."""
    sched = rec.get("scheduled") or []
    npf = rec.get("num_prefill_groups", 0)
    prompt = sum(n for _, n in sched[:npf])
    sampled = set(rec.get("sampled", ()))
    done_prefills = sum(1 for rid, _ in sched[:npf] if rid in sampled)
    gen = rec.get("num_batched_tokens", 0) - prompt + done_prefills
    return prompt, gen


def render_v0_log(
    workload: dict[str, Any],
    records: list[dict[str, Any]],
    *,
    step_time_s: float | Callable[[dict[str, Any]], float],
    start: float = 1736071200.25,
    engine_start: float | None = None,
    version: str = "0.6.6.post1",
    model: str = "meta-llama/Llama-3.1-8B-Instruct",
    ignore_eos: bool = True,
    finished_lines: bool = True,
    swap_space_gib: float = 4,
) -> list[str]:
    """Lines of a 0.6.x V0 log for `records` (a V0 `run_workload` trace). Step k starts at
    start + the durations of steps 0..k-1 (`step_time_s`: seconds, or a function of the
    step's record). Idle records take a step's time and print nothing. Arrivals are logged
    just before the step that adds them; the stat logger's clock starts at `engine_start`
    (default: 30 s before `start`)."""
    cfg, reqs, _ = parse_workload(workload)
    out = TimedLines()
    emit = out.emit

    boot = start - 60.0
    ns = (f"Namespace(host=None, port=8000, model='{model}', tokenizer=None, "
          f"max_model_len={cfg['max_model_len']}, block_size={cfg['block_size']}, "
          f"enable_prefix_caching={cfg['enable_prefix_caching']}, swap_space={swap_space_gib}, "
          f"gpu_memory_utilization=0.9, num_gpu_blocks_override={cfg['num_gpu_blocks']}, "
          f"max_num_batched_tokens={cfg['max_num_batched_tokens']}, "
          f"max_num_seqs={cfg['max_num_seqs']}, "
          f"enable_chunked_prefill={cfg['enable_chunked_prefill']}, "
          f"preemption_mode={cfg['preemption_mode']!r}, scheduling_policy='{cfg['policy']}', "
          f"disable_log_stats=False, disable_log_requests=False, "
          f"disable_frontend_multiprocessing={finished_lines})")
    emit(boot, f"INFO {_ts(boot)} api_server.py:651] vLLM API server version {version}")
    emit(boot, f"INFO {_ts(boot)} api_server.py:652] args: {ns}")
    emit(boot + 1, f"INFO {_ts(boot + 1)} llm_engine.py:234] Initializing an LLM engine "
         f"(v{version}) with config: model='{model}', speculative_config=None, "
         f"tokenizer='{model}', max_seq_len={cfg['max_model_len']}, tensor_parallel_size=1, "
         f"pipeline_parallel_size=1, num_scheduler_steps=1, "
         f"enable_prefix_caching={cfg['enable_prefix_caching']}, "
         f"chunked_prefill_enabled={cfg['enable_chunked_prefill']}, use_async_output_proc=True, "
         f"use_cached_outputs={not finished_lines}, ")
    ng, nc = cfg["num_gpu_blocks"], cfg["num_cpu_blocks"]
    emit(boot + 20, f"INFO {_ts(boot + 20)} gpu_executor.py:76] # GPU blocks: {ng}, "
         f"# CPU blocks: {nc}")
    conc = ng * cfg["block_size"] / cfg["max_model_len"]
    emit(boot + 20, f"INFO {_ts(boot + 20)} gpu_executor.py:80] Maximum concurrency for "
         f"{cfg['max_model_len']} tokens per request: {conc:.2f}x")

    by_id = {r["id"]: r for r in reqs}
    parent: dict[str, str] = {}
    children_left: dict[str, int] = {}
    for r in reqs:
        n = int(r.get("n", 1))
        children_left[r["id"]] = n
        if n == 1:
            parent[r["id"]] = r["id"]
        else:
            for i in range(n):
                parent[f"{r['id']}_parallel_sample_{i}"] = r["id"]
    port = {r["id"]: 41000 + i for i, r in enumerate(reqs)}
    dt_of = step_time_s if callable(step_time_s) else (lambda rec: float(step_time_s))

    t = start
    last_log = start - 30.0 if engine_start is None else engine_start
    prompt_acc = gen_acc = 0
    prev_zero = False
    announced: set[str] = set()
    for rec in records:
        dt = dt_of(rec)
        lead = min(0.0005, dt / 4)
        for rid in rec.get("arrivals", ()):
            pid = parent.get(rid, rid)
            if pid in announced:
                continue
            announced.add(pid)
            r = by_id[pid]
            ta = t - lead
            params = (f"SamplingParams(n={int(r.get('n', 1))}, presence_penalty=0.0, "
                      "frequency_penalty=0.0, repetition_penalty=1.0, temperature=0.0, top_p=1.0, "
                      "top_k=-1, min_p=0.0, seed=None, stop=[], stop_token_ids=[], bad_words=[], "
                      f"include_stop_str_in_output=False, ignore_eos={ignore_eos}, "
                      f"max_tokens={r['max_tokens']}, min_tokens=0, logprobs=None, "
                      "prompt_logprobs=None, skip_special_tokens=True, "
                      "spaces_between_special_tokens=True, truncate_prompt_tokens=None, "
                      "guided_decoding=None)")
            ids = ", ".join(str(x) for x in r["prompt_token_ids"])
            emit(ta, f"INFO {_ts(ta)} logger.py:37] Received request {pid}: prompt: None, "
                     f"params: {params}, prompt_token_ids: [{ids}], lora_request: None, "
                     "prompt_adapter_request: None.")
            emit(ta, f"INFO {_ts(ta)} async_llm_engine.py:209] Added request {pid}.")
        if rec.get("idle"):
            t += dt
            continue
        tp = t + min(0.0002, dt / 8)
        for p in rec.get("preemptions", ()):
            if p.get("warning_logged"):
                mode = "SWAP" if p.get("mode") == "swap" else "RECOMPUTE"
                emit(tp, f"WARNING {_ts(tp)} scheduler.py:1555] Sequence group {p['req']} "
                         + WARNING_TEXT.format(mode=mode, k=p["cumulative_before"] + 1))
        if "terminal_error" in rec:
            err = rec["terminal_error"]
            emit(tp, f"ERROR {_ts(tp)} async_llm_engine.py:66] Engine background task failed")
            emit(tp, f"{err['type']}: {err['message']}")
            break
        end = t + dt
        p_tok, g_tok = step_tokens(rec)
        prompt_acc += p_tok
        gen_acc += g_tok
        tf = end + min(0.0001, dt / 8)
        for rid in rec.get("finished", ()):
            pid = parent.get(rid, rid)
            children_left[pid] -= 1
            if children_left[pid] == 0:
                if finished_lines:
                    emit(tf, f"INFO {_ts(tf)} async_llm_engine.py:179] Finished request {pid}.")
                emit(tf, f'INFO:     127.0.0.1:{port[pid]} - "POST /v1/completions HTTP/1.1" 200 OK')
        if end - last_log > STATS_INTERVAL_S:
            elapsed = end - last_log
            zero = prompt_acc == 0 and gen_acc == 0
            if not (zero and prev_zero):
                ts = end + min(0.0003, dt / 4)
                emit(ts, f"INFO {_ts(ts)} metrics.py:467] Avg prompt throughput: "
                         f"{prompt_acc / elapsed:.1f} tokens/s, Avg generation throughput: "
                         f"{gen_acc / elapsed:.1f} tokens/s, Running: {len(rec['running'])} reqs, "
                         f"Swapped: {len(rec['swapped'])} reqs, Pending: {len(rec['waiting'])} "
                         f"reqs, GPU KV cache usage: {100 * rec['gpu_cache_usage']:.1f}%, "
                         f"CPU KV cache usage: {100 * rec['cpu_cache_usage']:.1f}%.")
            prev_zero = zero
            last_log = end
            prompt_acc = gen_acc = 0
        t = end
    return [line for _, line in out.in_order()]
