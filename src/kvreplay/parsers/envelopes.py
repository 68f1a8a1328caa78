"""A log record's envelope (vLLM's `LEVEL MM-DD HH:MM:SS [file.py:N]` prefix, with any
wrapper time stamp, `(Name pid=N)` process prefix, the Rust front end's and the Lark
grammar's forms) -> its fields, as one tuple:

    (wrapper_time, level, date, hms, source, process, pid, engine, end)

`end` is where the message starts. The regex route (`_envelope`, memoised) and the Lark
route (`_lark_env`) give the same tuples (tests/unit/parsers/test_parse_fast.py).
"""

from __future__ import annotations

import re

from kvreplay.parsers import matchers, newlines

_ENV_MATCH = matchers.ENVELOPE.match
_ENGINE_NUM = re.compile(r"EngineCore(?:_DP|_)(\d+)$")


_PROC_CACHE: dict[str, tuple[str | None, int | None, int | None]] = {}


def _small_int(s: str) -> int | None:
    """An id or count as logged; None past 18 digits (no pid or engine index is that long, and
    int() of thousands of digits is slow and then refused)."""
    return int(s) if len(s) <= 18 else None


def _procs(text: str) -> tuple[str | None, int | None, int | None]:
    r = _PROC_CACHE.get(text)
    if r is None:
        m = matchers.PROC.search(text)
        if m is None:
            r = (None, None, None)
        else:
            name = m.group(1)
            em = _ENGINE_NUM.match(name)
            r = (name, _small_int(m.group(2)), _small_int(em.group(1)) if em else None)
        if len(_PROC_CACHE) < 10000:
            _PROC_CACHE[text] = r
    return r


_ENV_CACHE: dict[str, tuple] = {}


def _envelope(s: str) -> tuple | None:
    """ENVELOPE.match(s) as `(wrapper_datetime or wrapper_time, level, date, hms, source,
    process, pid, engine, end)`, or None.

    Memoised on the line's text up to its first "] " (the envelope of a bracketed-source
    record ends there): a regex match depends only on the text it reads, and an envelope
    that ends at the first "] " reads nothing past it (no envelope group can span "] "
    except `ip=...`, which is never memoised). A miss tries `_ENV_COMMON` first: when it
    matches, ENVELOPE matches the same text with the same groups (it is ENVELOPE with one
    space per separator, at most one `(name pid=N)` and no wrapper, each taken the way
    ENVELOPE's greedy/lazy order takes it)."""
    k = s.find("] ")
    if k > 0:
        key = s[: k + 2]
        r = _ENV_CACHE.get(key)
        if r is not None:
            return r
    m = _ENV_COMMON(s)
    if m is not None:
        procs, level, date, hms, source = m.groups()
        process, pid, engine = _procs(procs) if procs else (None, None, None)
        end = m.end()
        r = (None, level, date, hms, source, process, pid, engine, end)
    else:
        r = _envelope_plain(s)
        if r is None:
            return None
        end = r[8]
    if k > 0 and end == k + 2 and ", ip=" not in key:
        if len(_ENV_CACHE) >= 4096:
            _ENV_CACHE.clear()
        _ENV_CACHE[key] = r
    return r


_ENV_COMMON = re.compile(
    r"(\([A-Za-z][\w-]* pid=\d+\) )?(DEBUG|INFO|WARNING|ERROR|CRITICAL) (\d\d-\d\d) (\d\d:\d\d:\d\d) \[([^\s\[\]:]+\.py:\d+)\] "
).match


def _envelope_plain(s: str) -> tuple | None:
    """`_envelope` by ENVELOPE alone (the general route)."""
    if ".py:" not in s:  # the source "[file.py:N]" is required
        return None
    m = _ENV_MATCH(s)
    if m is None:
        return None
    wt, _comp, wdt, procs, level, date, hms, source = m.groups()
    process, pid, engine = _procs(procs) if procs else (None, None, None)
    return (wt or wdt, level, date, hms, source, process, pid, engine, m.end())


def _rust_env(s: str) -> tuple | None:
    """The envelope of a Rust front end record (`[log_stats.rs:273]`), as `_envelope` gives it."""
    m = newlines.RUST_ENVELOPE(s)
    if m is None:
        return None
    process, pid, level, date, hms, source = m.groups()
    level = {"WARN": "WARNING", "TRACE": "DEBUG"}.get(level, level)
    return (None, level, date, hms, source, process, None if pid is None else int(pid), None, m.end())


def _lark_env(s: str) -> tuple | None:
    env = _lark_envelope(s)
    if env is None:
        return None
    (wt, _comp, wdt, procs, level, date, hms, source), end = env
    process, pid, engine = _procs(procs) if procs else (None, None, None)
    return (wt or wdt, level, date, hms, source, process, pid, engine, end)


def _lark_envelope(s: str):
    """The Lark twin of ENVELOPE.match: ((groups...), end offset) or None."""
    from kvreplay.parsers.grammar import lark_envelope_fields

    if not s or s[0] not in "([0123456789DIWECabcdefghijklmnopqrstuvwxyzABFGHJKLMNOPQRSTUVXYZ_-.":
        return None
    fields = lark_envelope_fields(s)
    if fields is None:
        return None
    d: dict[str, str] = {}
    procs = []
    for k, v in fields:
        if k == "process":
            procs.append(v)
        elif k == "pid":
            procs[-1] = f"({procs[-1]} pid={v}) "
        else:
            d[k] = v
    msg = d.get("message", "")
    end = len(s) - len(msg)
    return (d.get("wrapper_time"), d.get("compose"), d.get("wrapper_datetime"), "".join(procs) or None,
            d["level"], d["date"], d["time"], d["source"]), end
