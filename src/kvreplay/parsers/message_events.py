"""One log message (its envelope removed) -> one typed event: the dispatcher to the message
matchers and builders (or their Lark twins), the Rust front end's and PR #42827's lines, a
traceback grouped with its body. Every count is checked to fit int64 (else the line is
unparsed, with the reason)."""

from __future__ import annotations

import re
from typing import Any

from kvreplay import events as ev
from kvreplay.parsers import build, matchers, newlines
from kvreplay.parsers.envelopes import _small_int

_DISPATCH = matchers.dispatch
_MATCHERS = matchers.MATCHERS
_BUILDERS = build.BUILDERS
_TB_LEVELS = frozenset({"ERROR", "CRITICAL", "WARNING"})
_EXC_LINE = re.compile(r"[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning|Failure)\b(?::|$)")

_REPEATED = re.compile(r" *\[repeated (\d+)x across cluster\]$")


_I64 = 1 << 63
_astuple = __import__("msgspec").structs.astuple


def _check_ints(e: ev.Event) -> None:
    """ValueError for a count or size past int64 (no server logs one; typed columns downstream
    cannot hold it): the line is then unparsed, with the reason."""
    for v in _astuple(e):
        if v.__class__ is int and (v >= _I64 or v < -_I64):
            f = e.__struct_fields__[_astuple(e).index(v)]
            raise ValueError(f"{f} out of range ({str(v)[:24]}...)")


def message_event(msg: str, base: dict[str, Any], level: str | None, lark: bool = False) -> ev.Event:
    """One log message (envelope already removed) -> one event."""
    if msg.endswith("across cluster]"):  # Ray's de-duplication suffix
        m = _REPEATED.search(msg)
        if m is not None:
            e = message_event(msg[: m.start()], base, level, lark)
            e.repeat = _small_int(m.group(1))
            return e
    if msg.startswith(newlines.RUST_STATS_HEAD):  # the Rust front end's stats line
        return newlines.rust_stats(msg, base)
    if msg.startswith(newlines.PREEMPT_HEAD):  # vLLM PR #42827's per-victim warning
        return newlines.preemption_warning(msg, base)
    d = _DISPATCH(msg)
    if d is not None:
        kind, text = d
        if lark:
            from kvreplay.parsers.grammar import lark_message_fields

            fields = lark_message_fields(kind, text)
        else:
            fields = _MATCHERS[kind](text)
            if fields is not None and kind == "generated":
                fields = [(matchers.RENAME.get(k, k), v) for k, v in fields]
        truncated = False
        if fields is None:  # cut short? the grammar says which fields came before the cut
            from kvreplay.parsers.grammar import cut_fields

            fields = cut_fields(kind, text)
            if not fields:
                return ev.Unparsed(reason=f"malformed {kind} line (cut or unknown variant)", text=msg, **base)
            if kind == "generated":
                fields = [(matchers.RENAME.get(k, k), v) for k, v in fields]
            truncated = True
        try:
            e = _BUILDERS[kind](fields, base)
            _check_ints(e)
        except Exception as exc:  # a builder rejecting odd values must not stop the parse
            if truncated:
                return ev.Unparsed(reason=f"{kind} line cut before its required fields", text=msg, **base)
            return ev.Unparsed(reason=f"bad {kind} line: {type(exc).__name__}: {str(exc)[:80]}", text=msg, **base)
        if truncated:
            e.truncated = True
        return e
    try:
        e = build.config_line(msg, base)
        if e is not None:
            _check_ints(e)
            return e
        if level in _TB_LEVELS or level is None:
            e = build.error_event(msg, base)
            if e is not None:
                _check_ints(e)
                return e
    except Exception as exc:  # odd values in a config or error line must not stop the parse
        return ev.Unparsed(reason=f"bad line: {type(exc).__name__}: {str(exc)[:80]}", text=msg, **base)
    return ev.Log(message=msg, **base)


def _traceback_event(head: str, body: list[str], base: dict[str, Any]) -> ev.Event:
    exc_type = exc_msg = None
    for s in reversed(body):
        t = s.strip()
        if _EXC_LINE.match(t):
            exc_type, _, exc_msg = t.partition(":")
            exc_msg = exc_msg.strip() or None
            break
    probe = "\n".join([head] + body[-3:])
    hit = build.classify_error(probe)
    return ev.Traceback(head=head, exc_type=exc_type, exc_message=exc_msg, category=hit[0] if hit else None, **base)


def _tb_continuation(msg: str) -> bool:
    c = msg[:1]
    return (
        c == " " or c == "\t" or c == "^" or msg.startswith(("Traceback (", "During handling", "The above exception", "File \""))
        or _EXC_LINE.match(msg) is not None
    )
