"""Stage 2, config: the scheduler configuration the log describes (spec A13; Part B for V0).

Consumes: `LogFacts` (startup lines: `non-default args`, the engine config line, the
chunked-prefill line, the KV cache size) and the `LogFormat` (its release's defaults).
Produces: the engine's config (V1 `SchedulerConfig` or `V0Config`), where each knob came
from ("log", "default", "derived"), and a note for every default assumed. A log that
lacks what no default can stand for (the KV cache size, max_model_len, request lines) is
refused with a `ReplayError` naming the lines to keep.
"""

from __future__ import annotations

from typing import Any

from kvreplay.errors import ReplayError
from kvreplay.inference.facts import LogFacts
from kvreplay.inference.formats import LogFormat
from kvreplay.replay.scheduler import SchedulerConfig
from kvreplay.replay.v0.steps import V0Config


class _Picker:
    """A value from the log if it gives one, else the release's default (noted)."""

    def __init__(self, fmt: LogFormat, note_defaults: bool) -> None:
        self.fmt = fmt
        self.src: dict[str, str] = {}
        self.notes: list[str] = []
        self.note_defaults = note_defaults

    def __call__(self, name: str, logged: Any, default: Any = None) -> Any:
        if logged is not None:
            self.src[name] = "log"
            return logged
        self.src[name] = "default"
        value = self.fmt.defaults.get(name) if default is None else default
        if self.note_defaults:
            self.notes.append(f"{name} not in the log: vLLM 0.6's default {value!r} assumed")
        return value


def check_replayable(facts: LogFacts, fmt: LogFormat) -> None:
    """Raise `ReplayError` naming what the log lacks for a replay."""
    c = facts.config
    if fmt.engine == "V1":
        if len(facts.engines) > 1:
            raise ReplayError(
                f"this is a data-parallel log ({len(facts.engines)} engines write stats "
                "lines): its request lines do not say which engine served each request, so "
                "the workload cannot be split per engine, and replaying every request on one "
                "engine would overload it. Replay the step trace of kvreplay's vLLM plugin "
                "instead (it traces each engine process on its own), or the log of a "
                "single-engine server (one rank under external load balancing writes one)")
        if not facts.requests:
            raise ReplayError(
                "the log has no request lines, so there is no workload to replay: start vLLM "
                "with --enable-log-requests (and VLLM_REQUEST_BODY_LOG_LEVEL=INFO for prompts)")
        return
    missing = []
    if c is None or c.num_gpu_blocks is None:
        missing.append("the KV cache size (the startup line `# GPU blocks: N, # CPU blocks: M`)")
    if c is None or c.max_model_len is None:
        missing.append("max_model_len (the startup line `Initializing an LLM engine (v...) with "
                       "config: ... max_seq_len=N` or `args: Namespace(... max_model_len=N)`)")
    if not facts.requests:
        missing.append("request lines (`Received request X: ... prompt_token_ids: [...]`, logged "
                       "by default by V0 servers unless --disable-log-requests)")
    if missing:
        have = []
        if facts.stats:
            have.append(f"{len(facts.stats)} stats line(s)")
        if facts.v0_preemptions:
            ks = ", ".join(str(p.cumulative) for p in facts.v0_preemptions if p.cumulative)
            have.append(f"{len(facts.v0_preemptions)} preemption warning(s)"
                        + (f" (total_num_cumulative_preemption={ks})" if ks else ""))
        if facts.requests:
            have.append(f"{len(facts.requests)} request line(s)")
        text = "cannot replay this V0-engine log: it lacks " + "; ".join(missing)
        if have:
            text += " (it has only " + ", ".join(have) + ")"
        raise ReplayError(text)


def engine_config(facts: LogFacts, fmt: LogFormat, watermark_rule: bool = True):
    """(config, knob -> source, notes) for the engine that replays the log."""
    if fmt.engine == "V0":
        return _v0_config(facts, fmt)
    return _v1_config(facts, fmt, watermark_rule)


def _v1_config(facts: LogFacts, fmt: LogFormat, watermark_rule: bool):
    c = facts.config
    pick = _Picker(fmt, note_defaults=False)
    notes = pick.notes
    src = pick.src
    block_size = pick("block_size", c.block_size if c else None)
    num_blocks = c.num_gpu_blocks if c else None
    if num_blocks is not None:
        src["num_gpu_blocks"] = "log"
    elif c is not None and c.kv_cache_tokens:
        num_blocks = c.kv_cache_tokens // block_size
        src["num_gpu_blocks"] = "derived"
        notes.append(
            f"num_gpu_blocks = KV cache size {c.kv_cache_tokens} tokens / block size {block_size}")
    else:
        raise ReplayError(
            "the log does not give the KV cache size: keep the startup lines (GPU KV cache "
            "size / # GPU blocks / num_gpu_blocks_override) in the log you replay")
    max_model_len = c.max_model_len if c else None
    if max_model_len is None:
        raise ReplayError("the log does not give max_model_len: keep the startup lines")
    src["max_model_len"] = "log"
    chunked = pick("enable_chunked_prefill", c.enable_chunked_prefill if c else None)
    caching = pick("enable_prefix_caching", c.enable_prefix_caching if c else None)
    max_seqs = pick("max_num_seqs", c.max_num_seqs if c else None, _default_max_num_seqs(facts, fmt))
    budget = pick("max_num_batched_tokens", c.max_num_batched_tokens if c else None)
    policy = pick("policy", c.scheduling_policy if c else None)
    threshold = pick("long_prefill_token_threshold", c.long_prefill_token_threshold if c else None)
    watermark = pick("watermark", c.watermark if c else None) if watermark_rule else 0.0
    full_isl = pick("scheduler_reserve_full_isl",
                    getattr(c, "scheduler_reserve_full_isl", None) if c else None)
    async_sched = pick("async_scheduling", c.async_scheduling if c else None,
                       fmt.async_scheduling_default)
    for k, v in src.items():
        if v == "default":
            if k == "max_num_seqs" and max_seqs != fmt.defaults["max_num_seqs"]:
                notes.append(
                    f"max_num_seqs not in the log: {max_seqs} assumed, vLLM's default on a GPU "
                    "of 70 GiB or more (not an A100): the default token budget the log shows "
                    f"({budget}) comes from that branch of vLLM's defaults")
                continue
            notes.append(f"{k} not in the log: vLLM's default assumed")
    cfg = SchedulerConfig(
        num_gpu_blocks=int(num_blocks),
        block_size=int(block_size),
        max_num_seqs=int(max_seqs),
        max_num_batched_tokens=int(budget),
        max_model_len=int(max_model_len),
        enable_chunked_prefill=bool(chunked),
        enable_prefix_caching=bool(caching),
        policy=str(policy).lower(),
        long_prefill_token_threshold=int(threshold),
        scheduler_reserve_full_isl=bool(full_isl),
        watermark=float(watermark),
        async_scheduling=bool(async_sched),
    )
    return cfg, src, notes


def _default_max_num_seqs(facts: LogFacts, fmt: LogFormat) -> int:
    """vLLM 0.9+ picks its defaults for max_num_seqs and max_num_batched_tokens together,
    by GPU: the log shows the token budget in use (the chunked-prefill line); when the user
    did not set it (`non-default args` does not name it), it tells which branch."""
    c = facts.config
    budget = c.max_num_batched_tokens if c else None
    if (budget == 8192 and fmt.batch_defaults_by_gpu and facts.non_default is not None
            and "max_num_batched_tokens" not in facts.non_default):
        return 1024
    return fmt.defaults["max_num_seqs"]


def _v0_config(facts: LogFacts, fmt: LogFormat):
    c = facts.config
    pick = _Picker(fmt, note_defaults=True)
    src, notes = pick.src, pick.notes
    block_size = pick("block_size", c.block_size if c else None)
    ngpu = c.num_gpu_blocks if c else None
    src["num_gpu_blocks"] = "log"
    max_model_len = c.max_model_len if c else None
    src["max_model_len"] = "log"
    chunked = pick("enable_chunked_prefill", c.enable_chunked_prefill if c else None)
    caching = pick("enable_prefix_caching", c.enable_prefix_caching if c else None)
    max_seqs = pick("max_num_seqs", c.max_num_seqs if c else None)
    if c is not None and c.max_num_batched_tokens is not None:
        budget = c.max_num_batched_tokens
        src["max_num_batched_tokens"] = "log"
    else:
        # SchedulerConfig (0.6.x): 512 with chunked prefill, else max(max_model_len, 2048)
        budget = 512 if chunked else max(int(max_model_len or 0), 2048)
        src["max_num_batched_tokens"] = "default"
        notes.append(f"max_num_batched_tokens not in the log: vLLM 0.6's default {budget} assumed")
    policy = str(pick("policy", c.scheduling_policy if c else None)).lower()
    mode = c.preemption_mode if c else None
    src["preemption_mode"] = "log" if mode is not None else "default"
    mode = None if mode in (None, "None") else str(mode).lower()
    ncpu = facts.num_cpu_blocks
    if ncpu is None:
        ncpu = 0
        src["num_cpu_blocks"] = "default"
        notes.append("# CPU blocks not in the log: no swap space assumed")
    else:
        src["num_cpu_blocks"] = "log"
    if chunked and caching and budget % int(block_size):
        raise ReplayError("chunked prefill with prefix caching needs max_num_batched_tokens a "
                          f"multiple of block_size ({budget} vs {block_size}): check the log's args")
    if not chunked and budget < (max_model_len or 0):
        raise ReplayError(f"max_num_batched_tokens ({budget}) < max_model_len ({max_model_len}) "
                          "with chunked prefill off: vLLM refuses this; the log's config is "
                          "incomplete (pass the real values)")
    cfg = V0Config(
        num_gpu_blocks=int(ngpu), num_cpu_blocks=int(ncpu), block_size=int(block_size),
        max_num_seqs=int(max_seqs), max_num_batched_tokens=int(budget),
        max_model_len=int(max_model_len), enable_chunked_prefill=bool(chunked),
        enable_prefix_caching=bool(caching),
        policy=policy if policy in ("fcfs", "priority") else "fcfs",
        preemption_mode=mode if mode in ("swap", "recompute") else None)
    return cfg, src, notes
