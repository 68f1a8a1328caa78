"""Event builders: `(kind, fields)` from a matcher or the grammar -> a typed event.

A builder raises ValueError (or returns None) when the fields are not usable; the caller then
emits an Unparsed event. Builders never see the envelope: `base` carries file/line/time/...
The configuration builders are in build_config.py, the step-trace ones in build_trace.py and
the shared field-value readers in build_values.py; `BUILDERS` maps every kind.
"""

from __future__ import annotations

import ast
import re
from typing import Any, Callable

import msgspec

from kvreplay import events as ev
from kvreplay.parsers.build_config import (  # noqa: F401
    b_chunked, b_init, b_namespace, b_non_default, config_from_mapping, config_line, split_kwargs,
)
from kvreplay.parsers.build_trace import b_trace_config, b_trace_request, b_trace_step
from kvreplay.parsers.build_values import Fields, _bool, _float, _ids, _ids_decode, _int, _pystr, shared_ints  # noqa: F401


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
    dropped: list[str] = []
    for k, v in f:
        if v[-1:] in ("n", "f"):  # nan / inf: a figure that says nothing, kept as not logged
            dropped.append(f"{k}={v}")
            if k == "kv_usage" and "gpu_kv_usage" not in kw:
                kw["gpu_kv_usage"] = None
        elif k in ints:
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
            if "gpu_kv_usage" in kw:  # (present as None when the first was nan)
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
    elif era == "v1" and "waiting" not in kw and "engine" not in dict(f) and "aggregated_engines" not in kw:
        # a line cut before the counts that tell the eras apart: V1 prints it from loggers.py
        src = base.get("source") or ""
        if not (src.startswith("loggers.py") or "/loggers.py" in src):
            era = "v0"
    if dropped:
        note = f"non-finite values not kept: {', '.join(dropped)}"
        base = {**base, "note": note if not base.get("note") else f"{base['note']}; {note}"}
    return ev.Stats(era=era, **base, **kw)


def b_prefix_v0(f: Fields, base: dict) -> ev.Event:
    d = dict(f)
    return ev.PrefixCacheStats(gpu_hit_rate=float(d["gpu_hit_rate"]), cpu_hit_rate=float(d["cpu_hit_rate"]), **base)


def b_preemption(f: Fields, base: dict) -> ev.Event:
    d = dict(f)
    c = d.get("cumulative")  # (None: the line was cut before it)
    return ev.Preemption(request_id=d["request_id"], mode=d.get("mode"), cumulative=None if c is None else int(c), **base)


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
    p = parse_params(d["params"]) if "params" in d else {"__call__": None}  # (a line cut before them)
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
    ids = shared_ints(p) if isinstance(p, list) else None
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
    if ids is not None:
        ids = shared_ints(ids)
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
