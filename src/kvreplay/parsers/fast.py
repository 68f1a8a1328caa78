"""Fused fast paths for the most frequent message shapes: text -> event in one step.

The general route for a message is `matchers.dispatch` -> `matchers.MATCHERS[kind]` (the regex
twin of a `messages.lark` start symbol) -> `build.BUILDERS[kind]`. For the few shapes that
make up nearly every line of a serving log (v1/v0 stats, `Added request`, `Received
request ... params: SamplingParams(...), lora_request: None.`, `Request ... JSON body:`,
...) the functions here produce the *same event* directly: one anchored regex (or a few
`str` tests) with positional groups, and the event built with explicit keyword arguments
instead of field lists and `**base` dicts.

A fast path returns None whenever it is not certain to agree with the general route (other
variant, cut line, odd value, any exception); the caller then takes the general route. So a
fast path may only *narrow* what it accepts, never widen it. tests/unit/parsers/test_parse_fast.py
checks fast == general on every grammar sample, the corpus and mutated lines.

Signature of every handler: (msg, file, line, time, time_text, level, process, pid, engine,
source, note) -> Event | None; `msg` is the message after the envelope, right-stripped.
"""

from __future__ import annotations

import re
import sys
from typing import Any, Callable

import msgspec

from kvreplay import events as ev
from kvreplay.parsers import build, matchers
from kvreplay.parsers.build_values import shared_ints

_F = r"(-?\d+(?:\.\d+)?|nan|inf)"
_N = r"(\d{1,18})"  # a count: at most 18 digits (longer ones take the general route, which refuses past int64)
_FIN = r"(-?\d+(?:\.\d+)?)"  # finite only: a stats line with nan/inf takes the general route (build.b_stats)
_DEV = r"([A-Z][A-Za-z0-9]*(?: \+ [a-z]+)?)"

# --------------------------------------------------------------------------- stats
# The common complete shapes of the periodic stats line. When one of these matches the whole
# message, `match_stats` + `b_stats` give exactly these fields: the head regex takes the
# optional parts greedily in the same order, every part is consumed by the part regex, and a
# final "." is outside the parts in both.
_STATS_V1 = re.compile(
    rf"(?:Engine {_N}: )?Avg prompt throughput: {_FIN} tokens/s, Avg generation throughput: {_FIN} tokens/s, "
    rf"Running: {_N} reqs, Waiting: {_N} reqs, {_DEV} KV cache usage: {_FIN}%"
    rf"(?:, Prefix cache hit rate: {_FIN}%)?(?:, MM cache hit rate: {_FIN}%)?\.?"
).fullmatch
_STATS_V0 = re.compile(
    rf"Avg prompt throughput: {_FIN} tokens/s, Avg generation throughput: {_FIN} tokens/s, "
    rf"Running: {_N} reqs, Swapped: {_N} reqs, Pending: {_N} reqs, {_DEV} KV cache usage: {_FIN}%, "
    rf"{_DEV} KV cache usage: {_FIN}%\.?"
).fullmatch


# The per-step line (--enable-logging-iteration-details), its common complete shape: no
# "(dummy)", no encoder part (those take the general route). A log written with the flag is
# one such line per engine step (10-50x the lines of a plain log), so this is the hottest
# path: `_ITERATION_ENGINE` is the shape vLLM 0.14+ writes (engine prefix and KV usage, the
# same groups `_ITERATION` gives them), tried first; numbers come from small caches; the
# event is a copy of a private template with the fields of the line set.
_ITERATION = re.compile(
    r"(?:Engine (\d{1,18}): )?Iteration\((\d{1,18})\): (\d{1,18}) context requests, (\d{1,18}) context tokens, "
    rf"{_N} generation requests, {_N} generation tokens, iteration elapsed time: {_F} ms"
    rf"(?:, {_DEV} KV cache usage: {_F}%)?"
).fullmatch
# (Three ASCII digits after "Engine " as the dispatcher requires, ASCII digits only, the printed "%.2f" form tried first: it only narrows `_ITERATION`,
# and each number is delimited by literals no alternative can contain, so the groups agree.)
_F_DEC = r"(\d+\.\d+|-?\d+(?:\.\d+)?|nan|inf)"
_ITERATION_ENGINE = re.compile(
    r"Engine (\d{3}): Iteration\((\d{1,18})\): (\d{1,18}) context requests, (\d{1,18}) context tokens, "
    rf"{_N} generation requests, {_N} generation tokens, iteration elapsed time: {_F_DEC} ms, "
    rf"{_DEV} KV cache usage: {_F_DEC}%", re.ASCII
).fullmatch


class _Ints(dict):
    """str -> int for the decimal texts a regex group `\\d+` captured: the canonical texts of
    0..16383 are looked up, every other text goes through int() (same value: int("007") is 7)."""

    __slots__ = ()

    def __missing__(self, k: str) -> int:
        return int(k)


class _Floats(dict):
    """str -> float, memoised (bounded): KV usages and step times repeat."""

    __slots__ = ()

    def __missing__(self, k: str) -> float:
        v = float(k)
        if len(self) < 8192:
            self[k] = v
        return v


_INT = _Ints((str(i), i) for i in range(1 << 14))
_FLOAT = _Floats()
# The template an Iteration event is copied from, with the fields its line shares with the
# line before (file, time, level, process, pid, engine, source, note: `_iter_ctx`); it is
# never handed out, so never mutated after it is made.
_iter_ctx: tuple | None = None
_replace = msgspec.structs.replace
_iter_tpl: Any = None


def _engine(msg: str, file: str, line: int, t: Any, tt: Any, level: Any, process: Any, pid: Any, engine: Any, source: Any, note: Any) -> ev.Event | None:
    """`Engine N: ...` and `Iteration(N): ...`: the Iteration line (the hottest), else a stats line."""
    global _iter_ctx, _iter_tpl
    m = _ITERATION_ENGINE(msg)
    if m is None:
        if msg.startswith("Iteration(", 12) or msg.startswith("Iteration("):
            m = _ITERATION(msg)
            if m is None:
                return None
        else:
            return _stats(msg, file, line, t, tt, level, process, pid, engine, source, note)
    eng, step, cr, ct, gr, gt, ms, dev, usage = m.groups()
    i = _INT
    ctx = (file, t, tt, level, process, pid, engine, source, note)
    if ctx != _iter_ctx:
        _iter_tpl = ev.Iteration(step=0, context_requests=0, context_tokens=0, generation_requests=0, generation_tokens=0,
                                 elapsed_ms=0.0, file=file, line=0, time=t, time_text=tt, level=level, process=process,
                                 pid=pid, engine=engine, source=source, note=note)
        _iter_ctx = ctx
    if eng is not None and dev is not None:  # the shape vLLM 0.14+ writes
        return _replace(_iter_tpl, step=i[step], context_requests=i[cr], context_tokens=i[ct], generation_requests=i[gr],
                        generation_tokens=i[gt], elapsed_ms=_FLOAT[ms], kv_device=dev, kv_usage=_FLOAT[usage], line=line,
                        engine=i[eng])
    e = _replace(_iter_tpl, step=i[step], context_requests=i[cr], context_tokens=i[ct], generation_requests=i[gr],
                 generation_tokens=i[gt], elapsed_ms=_FLOAT[ms], line=line)
    if dev is not None:
        e.kv_device = dev
        e.kv_usage = _FLOAT[usage]
    if eng is not None:
        e.engine = i[eng]
    return e


def _stats(msg: str, file: str, line: int, t: Any, tt: Any, level: Any, process: Any, pid: Any, engine: Any, source: Any, note: Any) -> ev.Event | None:
    m = _STATS_V1(msg)
    if m is not None:
        eng, pt, gt, run, wait, dev, usage, phr, mmhr = m.groups()
        f = _FLOAT  # (one float object per distinct text: a long log's stats lines repeat them)
        return ev.Stats(
            era="v1", file=file, line=line, time=t, time_text=tt, level=level, process=process, pid=pid,
            engine=engine if eng is None else int(eng), source=source, note=note,
            prompt_throughput=f[pt], generation_throughput=f[gt], running=int(run), waiting=int(wait),
            kv_device=sys.intern(dev), gpu_kv_usage=f[usage],
            prefix_cache_hit_rate=None if phr is None else f[phr], mm_cache_hit_rate=None if mmhr is None else f[mmhr],
        )
    m = _STATS_V0(msg)
    if m is not None:
        pt, gt, run, swapped, pend, dev, usage, _dev2, cpu = m.groups()
        return ev.Stats(
            era="v0", file=file, line=line, time=t, time_text=tt, level=level, process=process, pid=pid,
            engine=engine, source=source, note=note,
            prompt_throughput=_FLOAT[pt], generation_throughput=_FLOAT[gt], running=int(run), swapped=int(swapped),
            waiting=int(pend), kv_device=sys.intern(dev), gpu_kv_usage=_FLOAT[usage], cpu_kv_usage=_FLOAT[cpu],
        )
    return None


# --------------------------------------------------------------------------- requests

_ADDED = re.compile(r"Added request (\S+)\.").fullmatch


def _added(msg: str, file: str, line: int, t: Any, tt: Any, level: Any, process: Any, pid: Any, engine: Any, source: Any, note: Any) -> ev.Event | None:
    m = _ADDED(msg)
    if m is None:
        return None
    return ev.RequestAdded(request_id=m.group(1), file=file, line=line, time=t, time_text=tt, level=level, process=process,
                           pid=pid, engine=engine, source=source, note=note)


_FINISHED = re.compile(r"Finished request (\S+)\.").fullmatch


def _finished(msg: str, file: str, line: int, t: Any, tt: Any, level: Any, process: Any, pid: Any, engine: Any, source: Any, note: Any) -> ev.Event | None:
    m = _FINISHED(msg)
    if m is None:
        return None
    return ev.RequestFinished(request_id=m.group(1), file=file, line=line, time=t, time_text=tt, level=level, process=process,
                              pid=pid, engine=engine, source=source, note=note)


# `Received request ID: params: CALL(...), lora_request: None.` (0.8+ V1 without prompt text).
# In the `received` matcher the params group `\w+\(.*?\)` ends at the first ")" after which the
# rest of the line matches; the rest must start with ", prompt_token_ids: ", ", prompt_embeds
# shape: " or ", lora_request: ". When none of these occurs except the final ", lora_request: ",
# the params group is everything up to that final one.
_RECV_HEAD = re.compile(r"Received request ([^\s:]+): params: \w+\(").match
_LORA_NONE = "), lora_request: None."

# The first `(k=v` / `, k=v` scalar of a SamplingParams repr for the keys a request needs:
# `build._SCALAR` restricted to those keys (a match of the restricted pattern is a match of
# `_SCALAR` with the same key at the same place, and `_SCALAR` matches never overlap one).
_PARAM_KEYS = ("n", "best_of", "max_tokens", "min_tokens", "ignore_eos", "temperature", "priority", "stop_token_ids")
_KEYS_RX = "|".join(sorted(_PARAM_KEYS, key=len, reverse=True))
_SCALARS = re.compile(r"""(?:\(|, )(""" + _KEYS_RX + r""")=([^,()\[\]{}'"]*)(?=[,)])""").findall
# the same, split by the separator: ", k=v" (a literal prefix: 3x faster) and "(k=v" at one "("
_SCALARS_COMMA = re.compile(r""", (""" + _KEYS_RX + r""")=([^,()\[\]{}'"]*)(?=[,)])""").findall
_SCALAR_PAREN = re.compile(r"""\((""" + _KEYS_RX + r""")=([^,()\[\]{}'"]*)(?=[,)])""").match
_STOP_SEARCH = build._STOP.search
_STOP_IDS_SEARCH = build._STOP_IDS.search


def _int_or_none(v: str | None) -> int | None:
    if v is None or v == "None":
        return None
    try:
        return int(v)
    except ValueError:
        return None


def _float_or_none(v: str | None) -> float | None:
    if v is None or v == "None":
        return None
    try:
        return float(v)
    except ValueError:
        return None


def request_params(text: str) -> dict[str, Any]:
    """What `b_received` reads from `build.parse_params(text)`, computed directly:
    n, best_of, max_tokens, min_tokens, ignore_eos, temperature, priority (raw text),
    stop, stop_token_ids and __call__."""
    d: dict[str, Any] = {}
    paren = text.find("(")
    if paren >= 0 and text.find("(", paren + 1) < 0:  # no nested call: "(k=v" can only start there
        m = _SCALAR_PAREN(text, paren)
        if m is not None:
            d[m.group(1)] = m.group(2)
        scalars = _SCALARS_COMMA(text)
    else:
        scalars = _SCALARS(text)
    for k, v in scalars:
        if k not in d:
            d[k] = v
    # `stop=[...]` / `stop_token_ids=[...]`: the first place where the list pattern matches; it
    # contains the first "stop=" of the text, so the search can start just before that.
    i = text.find("stop=")
    if i >= 0:
        m = _STOP_SEARCH(text, max(i - 2, 0))
        if m:
            s = m.group(1)
            if s == "[]":
                d["stop"] = []
            elif s != "None":
                d["stop"] = build.parse_params(text).get("stop")  # quoted strings: the general code
    i = text.find("stop_token_ids=")
    if i >= 0:
        m = _STOP_IDS_SEARCH(text, max(i - 2, 0))
        if m:
            d["stop_token_ids"] = build._ids(m.group(1))
    return d


_PARAMS_CACHE: dict[str, tuple] = {}
_SHAPED: dict[str, tuple] = {}  # params texts checked for the one-shape fast path of `_received`


def _received_params(params: str) -> tuple:
    """(n, best_of, max_tokens, min_tokens, ignore_eos, temperature, stop, stop_token_ids,
    priority, call) of a SamplingParams repr, memoised: a server log repeats the same few
    reprs (clients send the same settings). Lists are copied by the caller."""
    r = _PARAMS_CACHE.get(params)
    if r is None:
        p = request_params(params)
        stop = p.get("stop")
        r = (_int_or_none(p.get("n")), _int_or_none(p.get("best_of")), _int_or_none(p.get("max_tokens")),
             _int_or_none(p.get("min_tokens")), build._bool(p.get("ignore_eos")), _float_or_none(p.get("temperature")),
             stop if isinstance(stop, list) else None, p.get("stop_token_ids"), _int_or_none(p.get("priority")),
             params[: params.find("(")] or None)
        if len(_PARAMS_CACHE) >= 1024:
            _PARAMS_CACHE.clear()
        _PARAMS_CACHE[params] = r
    return r


def _received(msg: str, file: str, line: int, t: Any, tt: Any, level: Any, process: Any, pid: Any, engine: Any, source: Any, note: Any) -> ev.Event | None:
    m = _RECV_HEAD(msg) if msg.endswith(_LORA_NONE) else None
    if m is None:
        return _received_any(msg, file, line, t, tt, level, process, pid, engine, source, note)
    params = msg[m.end(1) + 10 : -21]
    r = _SHAPED.get(params)
    if r is None:
        # The head ("Received request ID: params: CALL(") and the tail cannot hold these
        # strings, so they are looked for in the params text only (and once per text).
        if "\n" in params or ", lora_request: " in params or ", prompt_token_ids: " in params or ", prompt_embeds shape: " in params:
            return _received_any(msg, file, line, t, tt, level, process, pid, engine, source, note)
        r = _received_params(params)
        if len(_SHAPED) >= 1024:
            _SHAPED.clear()
        _SHAPED[params] = r
    n, best_of, max_tokens, min_tokens, ignore_eos, temperature, stop, stop_ids, priority, call = r
    return ev.RequestReceived(
        request_id=m.group(1), prompt=None, prompt_token_ids=None, prompt_len=None,
        n=n, best_of=best_of, max_tokens=max_tokens, min_tokens=min_tokens, ignore_eos=ignore_eos, temperature=temperature,
        stop=None if stop is None else stop.copy(), stop_token_ids=stop_ids.copy() if type(stop_ids) is list else stop_ids,
        priority=priority, lora=None, params=call,
        file=file, line=line, time=t, time_text=tt, level=level, process=process, pid=pid, engine=engine, source=source, note=note,
    )


_RECEIVED_FULL = matchers.MATCHERS["received"].rx.fullmatch  # type: ignore[attr-defined]


def _received_any(msg: str, file: str, line: int, t: Any, tt: Any, level: Any, process: Any, pid: Any, engine: Any, source: Any, note: Any) -> ev.Event | None:
    """Every other `received` variant: the matcher's regex, then `b_received` with memoised params."""
    if not msg.startswith("Received request "):
        return None
    m = _RECEIVED_FULL(msg, 17)
    if m is None:
        return None
    rid, prompt, params, ids_text, lora = m.groups()
    n, best_of, max_tokens, min_tokens, ignore_eos, temperature, stop, stop_ids, priority, call = _received_params(params)
    ids = build._ids(ids_text)
    return ev.RequestReceived(
        request_id=rid, prompt=build._pystr(prompt), prompt_token_ids=ids, prompt_len=len(ids) if ids is not None else None,
        n=n, best_of=best_of, max_tokens=max_tokens, min_tokens=min_tokens, ignore_eos=ignore_eos, temperature=temperature,
        stop=None if stop is None else stop.copy(), stop_token_ids=stop_ids.copy() if type(stop_ids) is list else stop_ids,
        priority=priority, lora=None if lora is None or lora == "None" else lora, params=call,
        file=file, line=line, time=t, time_text=tt, level=level, process=process, pid=pid, engine=engine, source=source, note=note,
    )


# `Request ID JSON body: {...}`: the `body` matcher is `(\S+) JSON body: (\{.*\})` on the text
# after "Request "; `\S+` ends at the first white space, which must start " JSON body: ".
_BODY_HEAD = re.compile(r"Request (\S+) JSON body: \{").match
_body_decode = build._typed_body_decoder.decode


def _request(msg: str, file: str, line: int, t: Any, tt: Any, level: Any, process: Any, pid: Any, engine: Any, source: Any, note: Any) -> ev.Event | None:
    m = _BODY_HEAD(msg)
    if m is None or msg[-1] != "}" or "\n" in msg:
        return None
    try:
        b = _body_decode(msg[m.end() - 1:])
    except msgspec.ValidationError:
        return None
    p = b.prompt
    ids = shared_ints(p) if isinstance(p, list) else None
    return ev.RequestBody(
        request_id=m.group(1), model=b.model, prompt_token_ids=ids, prompt_len=len(ids) if ids is not None else None,
        prompt_text_len=len(p) if isinstance(p, str) else None, num_messages=len(b.messages) if b.messages is not None else None,
        max_tokens=b.max_tokens if b.max_tokens is not None else b.max_completion_tokens, min_tokens=b.min_tokens,
        ignore_eos=b.ignore_eos, priority=b.priority, n=b.n, stream=b.stream, temperature=b.temperature,
        file=file, line=line, time=t, time_text=tt, level=level, process=process, pid=pid, engine=engine, source=source, note=note,
    )


# `Sequence group X is preempted by PreemptionMode.M mode because ...=N` (V0 WARNING): the
# `preemption` matcher's own regex, its groups by position.
_PREEMPTION = matchers.MATCHERS["preemption"].rx.fullmatch  # type: ignore[attr-defined]


def _preemption(msg: str, file: str, line: int, t: Any, tt: Any, level: Any, process: Any, pid: Any, engine: Any, source: Any, note: Any) -> ev.Event | None:
    m = _PREEMPTION(msg)  # starts with "Sequence group ", as the dispatcher requires
    if m is None:
        return None
    rid, mode, cumulative = m.groups()
    return ev.Preemption(request_id=rid, mode=mode, cumulative=int(cumulative),
                         file=file, line=line, time=t, time_text=tt, level=level, process=process, pid=pid, engine=engine, source=source, note=note)


# --------------------------------------------------------------------------- dispatch

# first three characters of the message -> handler. Each handler checks its own leading
# words ("Engine N: ", "Avg ", "Added request ", ...), the same ones `matchers._FIRST` selects.
FAST: dict[str, Callable[..., ev.Event | None]] = {
    "Eng": _engine,
    "Avg": _stats,
    "Add": _added,
    "Fin": _finished,
    "Rec": _received,
    "Req": _request,
    "Seq": _preemption,
    "Ite": _engine,
}
_FAST_GET = FAST.get


def fast_message(msg: str, file: str, line: int, t: Any, tt: Any, level: Any, process: Any, pid: Any, engine: Any, source: Any, note: Any) -> ev.Event | None:
    """The event for `msg` when a fast path is sure of it, else None (take the general route)."""
    h = _FAST_GET(msg[:3])
    if h is None:
        return None
    try:
        return h(msg, file, line, t, tt, level, process, pid, engine, source, note)
    except Exception:  # any doubt: the general route decides (and reports)
        return None
