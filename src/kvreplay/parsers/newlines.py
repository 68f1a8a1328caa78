"""Line kinds outside the Python front end's stats line: vLLM's Rust front end
(`VLLM_USE_RUST_FRONTEND=1`) and lines proposed in open vLLM PRs, typed when they appear.

Rust front end (its `log_stats.rs`, read in vLLM's public source): one line per interval,
aggregated over the engines (no `Engine N:` prefix), with its own words:

    (RustFrontend pid=3226278) INFO 09-17 15:57:17 [log_stats.rs:273] Avg prompt tput: 672.5
    toks/s, Avg generation tput: 1931.6 toks/s, Reqs Running: 57, Waiting: 0[, Deferred: N reqs]
    [, Preemptions: N], GPU KV cache used: 1.8%, Prefix cache hit rate: 0.0%
    [, External prefix cache hit rate: X%]

`Preemptions` is the interval's counter increase, printed only when > 0 (older builds never
print it, so its absence is not read as 0). There is no Iteration line.

PR #42827 (open): a WARNING per victim from `Scheduler._preempt_request`,
`Preempting request <id>: <N> computed tokens lost (recompute on resume), kv_cache_...`
(the PR's example; its tail, KV usage before -> after and the request's preemption count,
is read by keyword, whatever its punctuation).
"""

from __future__ import annotations

import re
from typing import Any

from kvreplay import events as ev

_F = r"(-?\d+(?:\.\d+)?|nan|inf)"

# (level, date, hms, source, process, pid) of a Rust front end record; the same shape as the
# Python formatter's, with a `.rs` source.
RUST_ENVELOPE = re.compile(
    r"(?:\(([A-Za-z][\w-]*) pid=(\d+)\) +)?(DEBUG|INFO|WARNING|ERROR|CRITICAL|WARN|TRACE) +"
    r"(\d\d-\d\d) +(\d\d:\d\d:\d\d) +\[([^\s\[\]:]+\.rs:\d+)\](?: |$)"
).match

RUST_STATS_HEAD = "Avg prompt tput: "
# the parts in the order log_stats.rs writes them; each consumed with its ", " separator
_PARTS: list[tuple[str, re.Pattern]] = [
    ("prompt_throughput", re.compile(rf"Avg prompt tput: {_F} toks/s")),
    ("generation_throughput", re.compile(rf"Avg generation tput: {_F} toks/s")),
    ("running", re.compile(r"Reqs Running: (\d+)")),
    ("waiting", re.compile(r"Waiting: (\d+)")),
    ("deferred", re.compile(r"Deferred: (\d+) reqs")),
    ("preemptions", re.compile(r"Preemptions: (\d+)")),
    ("gpu_kv_usage", re.compile(rf"GPU KV cache used: {_F}%")),
    ("prefix_cache_hit_rate", re.compile(rf"Prefix cache hit rate: {_F}%")),
    ("external_prefix_cache_hit_rate", re.compile(rf"External prefix cache hit rate: {_F}%")),
]
_OPTIONAL = {"deferred", "preemptions", "external_prefix_cache_hit_rate"}
_INTS = {"running", "waiting", "deferred", "preemptions"}


def rust_stats(msg: str, base: dict[str, Any]) -> ev.Event:
    """A Rust front end stats message -> Stats (era v1, kv_device GPU). A line cut short
    keeps the fields before the cut (`truncated`); anything else is Unparsed."""
    text = msg.rstrip().removesuffix(".")
    kw: dict[str, Any] = {}
    pos, i, cut = 0, 0, False
    while pos < len(text):
        if pos:
            if not text.startswith(", ", pos):
                if ", ".startswith(text[pos:]):
                    cut = True
                    break
                return ev.Unparsed(reason="malformed Rust front end stats line", text=msg, **base)
            pos += 2
        for j in range(i, len(_PARTS)):
            name, rx = _PARTS[j]
            m = rx.match(text, pos)
            if m is not None:
                v = m.group(1)
                kw[name] = int(v) if name in _INTS else float(v)
                pos, i = m.end(), j + 1
                break
            if name not in _OPTIONAL:
                # the rest is a prefix of this required part (or of an optional one): a cut
                rest = text[pos:]
                if any(_prefix_of(rest, p) for _, p in _PARTS[i:j + 1]):
                    cut = True
                    pos = len(text)
                    break
                return ev.Unparsed(reason="malformed Rust front end stats line", text=msg, **base)
        else:
            return ev.Unparsed(reason="malformed Rust front end stats line", text=msg, **base)
        if cut:
            break
    if "prompt_throughput" not in kw:
        return ev.Unparsed(reason="Rust front end stats line cut before its fields", text=msg, **base)
    e = ev.Stats(era="v1", kv_device="GPU" if "gpu_kv_usage" in kw else None, **base, **kw)
    if cut or "gpu_kv_usage" not in kw:
        e.truncated = True
    return e


def _prefix_of(rest: str, rx: re.Pattern) -> bool:
    """Is `rest` a proper beginning of a text `rx` matches (a line cut inside this part)?"""
    words = rx.pattern.split("(")[0]  # the literal words before the first number
    if words.startswith(rest) or rest.startswith(words):
        return rx.fullmatch(rest) is None
    return False


PREEMPT_HEAD = "Preempting request "
_PREEMPT = re.compile(r"Preempting request (\S+?):? (?:(\d+) computed tokens? lost)?")
_KV = re.compile(r"kv_cache(?:_usage)?\W*?(\d+(?:\.\d+)?)\s*(%?)\s*(?:->|→|to)\s*(\d+(?:\.\d+)?)\s*(%?)")
_NPRE = re.compile(r"num_preemptions\W*?(\d+)")


def preemption_warning(msg: str, base: dict[str, Any]) -> ev.Event:
    """PR #42827's per-victim WARNING -> PreemptionWarning (the victim named by vLLM)."""
    m = _PREEMPT.match(msg)
    if m is None:
        return ev.Unparsed(reason="malformed preemption warning", text=msg, **base)
    rid = m.group(1)
    lost = None if m.group(2) is None else int(m.group(2))
    rest = msg[m.end():]
    kv = _KV.search(rest)
    npre = _NPRE.search(rest)
    e = ev.PreemptionWarning(request_id=rid, computed_tokens_lost=lost,
                             kv_usage_before=None if kv is None else _pct(kv.group(1), kv.group(2)),
                             kv_usage_after=None if kv is None else _pct(kv.group(3), kv.group(4)),
                             num_preemptions=None if npre is None else int(npre.group(1)), **base)
    if lost is None or "recompute on resume" not in msg:
        e.truncated = True  # cut before its fields, or an unknown variant: the id stands
    return e


def _pct(v: str, sign: str) -> float:
    """A usage in percent: as printed with "%", else a fraction (vLLM's kv_cache_usage)."""
    return float(v) if sign else float(v) * 100.0
