"""Event builders: `(kind, fields)` from a matcher or the grammar -> a typed event.

A builder raises ValueError (or returns None) when the fields are not usable; the caller then
emits an Unparsed event. Builders never see the envelope: `base` carries file/line/time/...
"""

from __future__ import annotations

import ast
import re
from typing import Any, Callable

import msgspec

from kvreplay import events as ev

Fields = list[tuple[str, str]]


def _int(s: str) -> int:
    return int(s.replace(",", ""))


def _float(s: str) -> float:
    return float(s)


def _bool(s: str | None) -> bool | None:
    if s == "True" or s == "true":
        return True
    if s == "False" or s == "false":
        return False
    return None


_ids_decode = msgspec.json.Decoder(list[int]).decode


def _ids(text: str | None) -> list[int] | None:
    """`[1, 2, 3]` -> ints; None for `None`; a list cut by --max-log-len keeps its ints."""
    if text is None or text == "None" or not text.startswith("["):
        return None
    if text[-1] == "]":  # a well-formed JSON list of ints means the same here, decoded in C
        try:
            return _ids_decode(text)
        except msgspec.DecodeError:
            pass
    inner = text[1:-1].strip()
    if not inner:
        return []
    out = []
    for p in inner.split(","):
        p = p.strip()
        if p.lstrip("-").isdigit():
            out.append(int(p))
    return out


def _pystr(text: str | None) -> str | None:
    if text is None or text == "None":
        return None
    q = text[:1]
    if (q == "'" or q == '"') and "\\" not in text and text.find(q, 1) == len(text) - 1:
        return text[1:-1]  # what literal_eval gives (or its fallback) without escapes inside
    try:
        v = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text[1:-1]
    return v if isinstance(v, str) else str(v)


# ------------------------------------------------------------------ SamplingParams repr

_SCALAR = re.compile(r"(?:\(|, )(\w+)=([^,()\[\]{}'\"]*)(?=[,)])")
_STOP = re.compile(r"(?:\(|, )stop=(\[(?:'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|[^\]'\"])*\]|None)")
_STOP_IDS = re.compile(r"(?:\(|, )stop_token_ids=(\[[-\d, ]*\]|None)")


def parse_params(text: str) -> dict[str, Any]:
    """The fields of a `SamplingParams(...)` repr that the replay needs (fast path).

    Scalars come from one regex pass; `stop` strings are read with ast.literal_eval, and if
    that fails the whole repr goes through the Lark pyrepr grammar.
    """
    out: dict[str, Any] = {"__call__": text[: text.find("(")]}
    for k, v in _SCALAR.findall(text):
        out.setdefault(k, v)
    m = _STOP.search(text)
    if m:
        s = m.group(1)
        if s == "[]":
            out["stop"] = []
        elif s != "None":
            try:
                out["stop"] = [str(x) for x in ast.literal_eval(s)]
            except (ValueError, SyntaxError):
                out["stop"] = _lark_params(text).get("stop")
    m = _STOP_IDS.search(text)
    if m:
        out["stop_token_ids"] = _ids(m.group(1))
    return out


def _lark_params(text: str) -> dict[str, Any]:
    from lark.exceptions import LarkError

    from kvreplay.parsers.grammar import parse_pyrepr

    try:
        v = parse_pyrepr(text)
    except LarkError:
        return {}
    return v if isinstance(v, dict) else {}


def _opt_int(d: dict[str, Any], k: str) -> int | None:
    v = d.get(k)
    if v is None or v == "None":
        return None
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def _opt_float(d: dict[str, Any], k: str) -> float | None:
    v = d.get(k)
    if v is None or v == "None":
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


# ------------------------------------------------------------------ builders


def b_stats(f: Fields, base: dict) -> ev.Event:
    kw: dict[str, Any] = {}
    era = "v1"
    ints = {"running", "waiting", "swapped", "deferred", "preemptions", "corrupted", "kv_fetch_waiting", "kv_fetch_in_progress", "kv_fetch_completed"}
    for k, v in f:
        if k in ints:
            kw[k] = int(v)
        elif k == "pending":
            kw["waiting"] = int(v)
            era = "v0"
        elif k == "swapped":
            kw[k] = int(v)
        elif k == "kv_device":
            if "kv_device" in kw:
                dev2 = v
            else:
                kw["kv_device"] = v
                dev2 = None
        elif k == "kv_usage":
            if "gpu_kv_usage" in kw:
                kw["cpu_kv_usage"] = float(v)  # v0: the second usage is the CPU swap space
            else:
                kw["gpu_kv_usage"] = float(v)
        elif k == "engine":
            base = {**base, "engine": int(v)}
        elif k == "aggregated":
            kw["aggregated_engines"] = int(v)
        else:
            kw[k] = float(v)
    if "swapped" in kw:
        era = "v0"
    return ev.Stats(era=era, **base, **kw)


def b_prefix_v0(f: Fields, base: dict) -> ev.Event:
    d = dict(f)
    return ev.PrefixCacheStats(gpu_hit_rate=float(d["gpu_hit_rate"]), cpu_hit_rate=float(d["cpu_hit_rate"]), **base)


def b_preemption(f: Fields, base: dict) -> ev.Event:
    d = dict(f)
    return ev.Preemption(request_id=d["request_id"], mode=d["mode"], cumulative=int(d["cumulative"]), **base)


def b_iteration(f: Fields, base: dict) -> ev.Event:
    d = dict(f)
    if "engine" in d:
        base = {**base, "engine": int(d["engine"])}
    return ev.Iteration(
        step=int(d["step"]),
        context_requests=int(d["context_requests"]),
        context_tokens=int(d["context_tokens"]),
        generation_requests=int(d["generation_requests"]),
        generation_tokens=int(d["generation_tokens"]),
        elapsed_ms=float(d["elapsed_ms"]),
        dummy="dummy" in d,
        kv_device=d.get("kv_device"),
        kv_usage=float(d["kv_usage"]) if "kv_usage" in d else None,
        encoder_inputs=int(d["encoder_inputs"]) if "encoder_inputs" in d else None,
        encoder_output_embeddings=int(d["encoder_output_embeddings"]) if "encoder_output_embeddings" in d else None,
        **base,
    )


def b_received(f: Fields, base: dict) -> ev.Event:
    d = dict(f)
    p = parse_params(d["params"])
    ids = _ids(d.get("prompt_token_ids"))
    lora = d.get("lora")
    stop = p.get("stop")
    return ev.RequestReceived(
        request_id=d["id"],
        prompt=_pystr(d.get("prompt")),
        prompt_token_ids=ids,
        prompt_len=len(ids) if ids is not None else None,
        n=_opt_int(p, "n"),
        best_of=_opt_int(p, "best_of"),
        max_tokens=_opt_int(p, "max_tokens"),
        min_tokens=_opt_int(p, "min_tokens"),
        ignore_eos=_bool(p.get("ignore_eos")),
        temperature=_opt_float(p, "temperature"),
        stop=stop if isinstance(stop, list) else None,
        stop_token_ids=p.get("stop_token_ids"),
        priority=_opt_int(p, "priority"),
        lora=None if lora in (None, "None") else lora,
        params=p["__call__"] or None,
        **base,
    )


def b_details(f: Fields, base: dict) -> ev.Event:
    d = dict(f)
    ids = _ids(d.get("prompt_token_ids"))
    return ev.RequestDetails(
        request_id=d["details_id"], prompt=_pystr(d.get("prompt")), prompt_token_ids=ids,
        prompt_len=len(ids) if ids is not None else None, **base,
    )


_body_decoder = msgspec.json.Decoder()


class _Body(msgspec.Struct):
    """The common request-body shape, validated in C (fast path for `b_body`)."""

    model: str | None = None
    prompt: list[int] | str | None = None
    messages: list[msgspec.Raw] | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    min_tokens: int | None = None
    ignore_eos: bool | None = None
    priority: int | None = None
    n: int | None = None
    stream: bool | None = None
    temperature: float | None = None


_typed_body_decoder = msgspec.json.Decoder(_Body)


def b_body(f: Fields, base: dict) -> ev.Event:
    d = dict(f)
    try:
        t = _typed_body_decoder.decode(d["body"])
    except msgspec.ValidationError:
        return _b_body_generic(d, base)
    p = t.prompt
    ids = p if isinstance(p, list) else None
    return ev.RequestBody(
        request_id=d["body_id"], model=t.model, prompt_token_ids=ids, prompt_len=len(ids) if ids is not None else None,
        prompt_text_len=len(p) if isinstance(p, str) else None, num_messages=len(t.messages) if t.messages is not None else None,
        max_tokens=t.max_tokens if t.max_tokens is not None else t.max_completion_tokens, min_tokens=t.min_tokens,
        ignore_eos=t.ignore_eos, priority=t.priority, n=t.n, stream=t.stream, temperature=t.temperature, **base,
    )


def _b_body_generic(d: dict, base: dict) -> ev.Event:
    body = _body_decoder.decode(d["body"])
    if not isinstance(body, dict):
        raise ValueError("JSON body is not an object")
    prompt = body.get("prompt")
    ids = None
    text_len = None
    if isinstance(prompt, list) and all(type(x) is int for x in prompt):
        ids = prompt
    elif isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list):
        ids = [x for x in prompt[0] if type(x) is int]
    elif isinstance(prompt, str):
        text_len = len(prompt)
    if ids is None and isinstance(body.get("prompt_token_ids"), list):
        ids = [x for x in body["prompt_token_ids"] if type(x) is int]
    msgs = body.get("messages")
    max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))

    def typed(v: Any, t: type) -> Any:
        return v if isinstance(v, t) and not (t is int and isinstance(v, bool)) else None

    return ev.RequestBody(
        request_id=d["body_id"],
        model=typed(body.get("model"), str),
        prompt_token_ids=ids,
        prompt_len=len(ids) if ids is not None else None,
        prompt_text_len=text_len,
        num_messages=len(msgs) if isinstance(msgs, list) else None,
        max_tokens=typed(max_tokens, int),
        min_tokens=typed(body.get("min_tokens"), int),
        ignore_eos=typed(body.get("ignore_eos"), bool),
        priority=typed(body.get("priority"), int),
        n=typed(body.get("n"), int),
        stream=typed(body.get("stream"), bool),
        temperature=float(body["temperature"]) if isinstance(body.get("temperature"), (int, float)) and not isinstance(body.get("temperature"), bool) else None,
        **base,
    )


def b_added(f: Fields, base: dict) -> ev.Event:
    return ev.RequestAdded(request_id=f[0][1], **base)


def b_finished(f: Fields, base: dict) -> ev.Event:
    return ev.RequestFinished(request_id=f[0][1], **base)


def b_aborted(f: Fields, base: dict) -> ev.Event:
    ids = [x.strip() for x in f[0][1].split(",") if x.strip()]
    return ev.RequestAborted(request_ids=ids, **base)


def b_status(f: Fields, base: dict) -> ev.Event:
    d = dict(f)
    if "aborted" in d:
        return ev.RequestAborted(request_ids=[d["status_id"]], **base)
    return ev.RequestFailed(request_id=d["status_id"], reason=d.get("reason"), **base)


def b_generated(f: Fields, base: dict) -> ev.Event:
    d = dict(f)
    ids = _ids(d.get("output_token_ids"))
    st = d.get("streaming")
    return ev.GeneratedResponse(
        request_id=d["gen_id"],
        streaming=st[len("(streaming "):-1] if st else None,
        output=_pystr(d.get("output")),
        output_token_ids=ids,
        num_output_tokens=len(ids) if ids is not None else None,
        finish_reason=None if d.get("finish_reason") in (None, "None") else d["finish_reason"],
        **base,
    )


def b_kv(f: Fields, base: dict) -> ev.Event:
    kw: dict[str, Any] = {}
    for k, v in f:
        if k == "tokens":
            kw["kv_cache_tokens"] = _int(v)
        elif k == "device":
            kw["device"] = v
        elif k in ("max_concurrency", "available_kv_gib"):
            kw[k] = float(v)
        elif k == "engine":
            base = {**base, "engine": int(v)}
        else:
            kw[k] = _int(v)
    return ev.KvCapacity(**base, **kw)


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
            elif name in _FLOAT_FIELDS:
                v = float(v)
            elif name in _BOOL_FIELDS:
                if not isinstance(v, bool):
                    continue
            else:
                v = str(v)
        except (TypeError, ValueError):
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


def b_spec(f: Fields, base: dict) -> ev.Event:
    kw: dict[str, Any] = {}
    for k, v in f:
        if k in ("accepted", "drafted", "emitted"):
            kw[k] = int(v)
        elif k == "per_position":
            kw[k] = [float(x) for x in v.split(",")]
        else:
            kw[k] = float(v)
    return ev.SpecDecode(**kw, **base)


# ------------------------------------------------------------------ kvreplay step trace

_TRACE_CONFIG_KEYS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "v": ("vllm_version", str),
    "sched": ("scheduler", str),
    "blocks": ("num_gpu_blocks", int),
    "bs": ("block_size", int),
    "hbs": ("hash_block_size", int),
    "seqs": ("max_num_seqs", int),
    "tokens": ("max_num_batched_tokens", int),
    "len": ("max_model_len", int),
    "chunked": ("enable_chunked_prefill", lambda v: v == "1"),
    "prefix": ("enable_prefix_caching", lambda v: v == "1"),
    "policy": ("policy", str),
    "lpt": ("long_prefill_token_threshold", int),
    "isl": ("scheduler_reserve_full_isl", lambda v: v == "1"),
    "wm": ("watermark", float),
    "async": ("async_scheduling", lambda v: v == "1"),
    "interval": ("prefill_schedule_interval", int),
    "spec": ("num_spec_tokens", int),
}


def b_trace_config(f: Fields, base: dict) -> ev.Event:
    kw: dict[str, Any] = {}
    extra: dict[str, str] = {}
    for part in dict(f)["trace_config"].split():
        k, _, v = part.partition("=")
        spec = _TRACE_CONFIG_KEYS.get(k)
        if spec is None:
            extra[k] = v
        else:
            kw[spec[0]] = spec[1](v)
    return ev.TraceConfig(extra=extra or None, **kw, **base)


def b_trace_request(f: Fields, base: dict) -> ev.Event:
    d = dict(f)
    bh = d.get("block_hashes")
    return ev.RequestTrace(
        request_id=d["req_id"], handle=int(d["handle"]), at_step=int(d["at"]),
        prompt_len=int(d["prompt_len"]), max_tokens=int(d["max_tokens"]),
        priority=int(d["priority"]), block_hashes=bh.split(",") if bh else None, **base,
    )


def _pairs(text: str | None, default: int | None = None) -> list[tuple[int, int]] | None:
    if text is None:
        return None
    if text == "-":
        return []
    out = []
    for item in text.split(","):
        h, _, n = item.partition(":")
        out.append((int(h), int(n) if n else default))
    return out


def b_trace_step(f: Fields, base: dict) -> ev.Event:
    d = dict(f)
    step = int(d["step"])
    sched = _pairs(d.get("sched"), 1)
    u = d.get("updated")
    if u is None:
        updated = step if sched is not None else None
    elif u in ("-", "?"):
        updated = None
    else:
        updated = int(u)
    pre = None
    if "preempted" in d:
        pre = []
        for item in d["preempted"].split(","):
            v, t, lost = item.split("/")
            pre.append((int(v), None if t == "-" else int(t), int(lost)))
    bh = None
    if "hashes" in d:
        bh = []
        for item in d["hashes"].split(","):
            h, _, hs = item.partition(":")
            bh.append((int(h), hs.split(".")))
    return ev.StepTrace(
        step=step, aborted_before=_pairs(d.get("aborted_before")), scheduled=sched,
        new=_pairs(d.get("new")), resumed=_pairs(d.get("resumed")), preempted=pre,
        aborted_mid=_pairs(d.get("aborted_mid")), updated_batch=updated,
        finished=_pairs(d.get("finished")), block_hashes=bh,
        kv_events=int(d["kv_events"]) if "kv_events" in d else None, free_blocks=int(d["free"]),
        kv_usage=float(d["kv_usage"]), running=int(d["running"]), waiting=int(d["waiting"]),
        **base,
    )


BUILDERS: dict[str, Callable[[Fields, dict], ev.Event]] = {
    "trace_config": b_trace_config,
    "trace_request": b_trace_request,
    "trace_step": b_trace_step,
    "stats": b_stats,
    "prefix_cache_v0": b_prefix_v0,
    "preemption": b_preemption,
    "iteration": b_iteration,
    "received": b_received,
    "details": b_details,
    "body": b_body,
    "added": b_added,
    "aborted": b_aborted,
    "finished": b_finished,
    "request_status": b_status,
    "generated": b_generated,
    "kv_size": b_kv,
    "kv_blocks": b_kv,
    "kv_concurrency": b_kv,
    "kv_cache_config": b_kv,
    "kv_override": b_kv,
    "kv_memory": b_kv,
    "init": b_init,
    "chunked": b_chunked,
    "non_default_args": b_non_default,
    "namespace": b_namespace,
    "spec_v1": b_spec,
    "spec_v0": b_spec,
}

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


# ------------------------------------------------------------------ errors that matter

# (category, regex) - searched in WARNING/ERROR/CRITICAL messages and traceback last lines.
ERRORS: list[tuple[str, re.Pattern]] = [
    ("max_seq_len_exceeds_kv_cache", re.compile(r"The model's max seq len \((?P<tokens>\d+)\) is larger than the maximum number of tokens that can be stored in KV cache \((?P<limit>\d+)\)")),
    ("max_seq_len_exceeds_kv_cache", re.compile(r"To serve at least one request with the models's max seq len \((?P<tokens>\d+)\)")),
    ("kv_cache_too_small", re.compile(r"No available memory for the cache blocks|Insufficient memory for KV cache|KV cache is needed, which is larger than the available KV cache memory")),
    ("prompt_too_long", re.compile(r"Input prompt \((?P<tokens>\d+) tokens\) is too long and exceeds limit of (?P<limit>\d+)")),
    ("prompt_exceeds_capacity", re.compile(r"Input prompt \((?P<tokens>\d+) tokens\)(?: \+ lookahead slots \(\d+\))? is too long and exceeds the capacity of block_manager")),
    ("not_enough_kv_blocks", re.compile(r"Failing the request (?P<request_id>\S+) because there's not enough kv cache blocks")),
    ("context_length", re.compile(r"maximum context length is (?P<limit>\d+) tokens\. However, you requested (?P<tokens>\d+) tokens")),
    ("swap_space", re.compile(r"(?i)swap space|Too large swap space")),
    ("oom", re.compile(r"OutOfMemoryError|CUDA out of memory|CUDA error: out of memory")),
    ("engine_dead", re.compile(r"EngineDeadError|AsyncEngineDeadError|Background loop has errored|Background loop is not running|MQLLMEngine is already dead|Engine loop is not running|AsyncLLM output_handler failed|Engine iteration timed out|Task finished unexpectedly")),
    ("engine_start_failed", re.compile(r"EngineCore failed to start|Engine core initialization failed")),
]


def classify_error(msg: str) -> tuple[str, re.Match] | None:
    for cat, rx in ERRORS:
        m = rx.search(msg)
        if m:
            return cat, m
    return None


def error_event(msg: str, base: dict) -> ev.Event | None:
    hit = classify_error(msg)
    if hit is None:
        return None
    cat, m = hit
    g = m.groupdict()
    return ev.Error(
        category=cat, message=msg,
        request_id=g.get("request_id"),
        tokens=int(g["tokens"]) if g.get("tokens") else None,
        limit=int(g["limit"]) if g.get("limit") else None,
        **base,
    )
