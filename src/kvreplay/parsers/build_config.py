"""Configuration builders: engine arguments and startup lines -> EngineConfig events.

`config_from_mapping` types the known keys of an args/config mapping; the builders read the
init line, the chunked-prefill notice, the non-default args, the argparse Namespace, and
(`config_line`) the banner, version and max-model-len lines that are not grammar kinds.
"""

from __future__ import annotations

import ast
import re
from typing import Any

from kvreplay import events as ev
from kvreplay.limits import INT64_MAX
from kvreplay.parsers.build_values import Fields, _pystr


# ---- configuration

_CONFIG_KEYS = {
    # log key -> EngineConfig field
    "model": "model",
    "max_seq_len": "max_model_len",
    "max_model_len": "max_model_len",
    "block_size": "block_size",
    "num_gpu_blocks_override": "num_gpu_blocks_override",
    "max_num_seqs": "max_num_seqs",
    "max_num_batched_tokens": "max_num_batched_tokens",
    "enable_chunked_prefill": "enable_chunked_prefill",
    "chunked_prefill_enabled": "enable_chunked_prefill",
    "enable_prefix_caching": "enable_prefix_caching",
    "scheduling_policy": "scheduling_policy",
    "scheduler_policy": "scheduling_policy",
    "gpu_memory_utilization": "gpu_memory_utilization",
    "async_scheduling": "async_scheduling",
    "data_parallel_size": "data_parallel_size",
    "data_parallel_rank": "data_parallel_rank",
    "tensor_parallel_size": "tensor_parallel_size",
    "pipeline_parallel_size": "pipeline_parallel_size",
    "swap_space": "swap_space",
    "preemption_mode": "preemption_mode",
    "num_scheduler_steps": "num_scheduler_steps",
    "kv_cache_dtype": "kv_cache_dtype",
    "long_prefill_token_threshold": "long_prefill_token_threshold",
    "max_num_partial_prefills": "max_num_partial_prefills",
    "watermark": "watermark",
    "scheduler_reserve_full_isl": "scheduler_reserve_full_isl",
}
_INT_FIELDS = {"block_size", "num_gpu_blocks_override", "max_num_seqs", "max_num_batched_tokens", "data_parallel_size", "data_parallel_rank",
               "tensor_parallel_size", "pipeline_parallel_size", "num_scheduler_steps", "max_model_len", "long_prefill_token_threshold",
               "max_num_partial_prefills"}
_FLOAT_FIELDS = {"gpu_memory_utilization", "swap_space", "watermark"}
_BOOL_FIELDS = {"enable_chunked_prefill", "enable_prefix_caching", "async_scheduling",
                "scheduler_reserve_full_isl"}


def config_from_mapping(values: dict[str, Any]) -> dict[str, Any]:
    """Known keys of an args/config mapping -> EngineConfig keyword arguments (typed)."""
    kw: dict[str, Any] = {}
    for key, raw in values.items():
        name = _CONFIG_KEYS.get(key)
        if name is None:
            continue
        v = raw
        if isinstance(v, str):
            v = _scalar(v)
        if v is None:
            continue
        try:
            if name in _INT_FIELDS:
                if isinstance(v, bool):
                    continue
                v = int(v)
                if not -INT64_MAX <= v <= INT64_MAX:  # no server runs with it; a typed column cannot hold it
                    continue
            elif name in _FLOAT_FIELDS:
                v = float(v)
                if v != v or v in (float("inf"), float("-inf")):
                    continue
            elif name in _BOOL_FIELDS:
                if not isinstance(v, bool):
                    continue
            else:
                v = str(v)
        except (TypeError, ValueError, OverflowError):
            continue
        kw[name] = v
    if "speculative_config" in values and values["speculative_config"] not in (None, "None"):
        kw["speculative"] = str(values["speculative_config"])[:200]
    return kw


def _scalar(s: str) -> Any:
    s = s.strip()
    if s in ("None", ""):
        return None
    if s in ("True", "False"):
        return s == "True"
    if s[:1] in "'\"":
        return _pystr(s)
    try:
        return int(s)
    except ValueError:
        pass
    try:
        return float(s)
    except ValueError:
        return s


def split_kwargs(text: str) -> dict[str, str]:
    """Bracket/quote-aware `k=v, k=v` scanner; tolerant of truncation (keeps what it saw).

    Returns raw value text per key (top level only).
    """
    out: dict[str, str] = {}
    i, n = 0, len(text)
    while i < n:
        while i < n and text[i] in " ,":
            i += 1
        j = text.find("=", i)
        if j < 0:
            break
        key = text[i:j].strip()
        k = j + 1
        depth = 0
        quote = ""
        start = k
        while k < n:
            c = text[k]
            if quote:
                if c == "\\":
                    k += 2
                    continue
                if c == quote:
                    quote = ""
            elif c in "'\"":
                quote = c
            elif c in "([{<":
                depth += 1
            elif c in ")]}>":
                if depth == 0:
                    break
                depth -= 1
            elif c == "," and depth == 0:
                break
            k += 1
        if key.isidentifier():
            out[key] = text[start:k].strip()
        i = k + 1
    return out


def b_init(f: Fields, base: dict) -> ev.Event:
    d = dict(f)
    cfg = d["config"]
    values = split_kwargs(cfg)
    kw = config_from_mapping(values)
    ver = d.get("vllm_version")
    return ev.EngineConfig(origin="init", vllm_version=ver[1:] if ver else None, engine_version=d.get("engine_version") or ("V0" if ver else None), **kw, **base)


def b_chunked(f: Fields, base: dict) -> ev.Event:
    d = dict(f)
    mnbt = d.get("max_num_batched_tokens")
    return ev.EngineConfig(origin="chunked_prefill", enable_chunked_prefill=True, max_num_batched_tokens=int(mnbt) if mnbt else None, **base)


def b_non_default(f: Fields, base: dict) -> ev.Event:
    text = dict(f)["args"]
    try:
        values = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        from kvreplay.parsers.grammar import parse_pyrepr

        values = parse_pyrepr(text)  # LarkError -> Unparsed by the caller
    if not isinstance(values, dict):
        raise ValueError("non-default args is not a dict")
    return ev.EngineConfig(origin="non_default_args", **config_from_mapping(values), **base)


def b_namespace(f: Fields, base: dict) -> ev.Event:
    text = dict(f)["namespace"]
    values: dict[str, Any]
    try:
        from kvreplay.parsers.grammar import parse_pyrepr

        values = parse_pyrepr(text)
    except Exception:  # Lark could not parse it: fall back to the scanner
        values = split_kwargs(text[len("Namespace("):])
    return ev.EngineConfig(origin="args", **config_from_mapping(values), **base)


# ------------------------------------------------------------------ other startup facts

_VERSION_LINE = re.compile(r"vLLM API server version (\S+)")
_BANNER_VERSION = re.compile(r"version (\d+\.\d+\S*)\s*$")
_BANNER_MODEL = re.compile(r"model +(\S+)\s*$")
_MAX_LEN = re.compile(r"Using max model len (\d+)")


def config_line(msg: str, base: dict) -> ev.Event | None:
    """Startup lines that are config facts but not grammar kinds (banner, version, max len)."""
    if msg.startswith("vLLM API server version "):
        m = _VERSION_LINE.match(msg)
        if m:
            return ev.EngineConfig(origin="version", vllm_version=m.group(1), **base)
    elif msg.startswith("Using max model len "):
        m = _MAX_LEN.match(msg)
        if m:
            return ev.EngineConfig(origin="max_model_len", max_model_len=int(m.group(1)), **base)
    elif "\u2588" in msg or "\u2580" in msg or "\u2584" in msg:  # the 0.11+ ASCII-art banner
        m = _BANNER_VERSION.search(msg)
        if m:
            return ev.EngineConfig(origin="banner", vllm_version=m.group(1), **base)
        m = _BANNER_MODEL.search(msg)
        if m:
            return ev.EngineConfig(origin="banner", model=m.group(1), **base)
        return ev.Noise(what="banner", **base)
    return None
