"""Builders of kvreplay's own step trace (the `kvtrace` lines the vLLM plugin writes):
trace config, per-request and per-step records."""

from __future__ import annotations

from typing import Any, Callable

from kvreplay import events as ev
from kvreplay.parsers.build_values import Fields

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
