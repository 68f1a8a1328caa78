"""kvreplay.parsers: vLLM log text -> typed events (kvreplay.events).

Public API:
    parse_files(paths, *, year=None, vllm_version=None, engine="fast") -> Iterator[Event]
    parse_lines(lines, *, file="<lines>", year=None, engine="fast") -> Iterator[Event]
    merge_config(events) -> EngineConfig          # every config fact, later lines win
    detect_version(events, given=None) -> Dialect  # vllm_version, how, engine_version

`engine="lark"` parses envelope and messages with the Lark grammars (parsers/*.lark) instead
of the regex matchers derived from them: same events, ~50x slower; used to cross-check.
Every physical line ends up in exactly one event (`Event.lines` counts them).
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Iterable, Iterator

if TYPE_CHECKING:
    from kvreplay.events import EngineConfig, Event
    from kvreplay.parsers.version import Dialect

__all__ = ["parse_files", "parse_lines", "merge_config", "detect_version"]


def parse_files(paths: Iterable[str], *, year: int | None = None, vllm_version: str | None = None, engine: str = "fast") -> Iterator["Event"]:
    """Parse log files (`-` = stdin, `.gz` ok); several files are merged in time order.

    Raises kvreplay.errors.UserError for a missing or unreadable file (before any output).
    `vllm_version` is accepted for symmetry with the CLI; the parser reads every release's
    formats, the version only labels the result (see detect_version).
    """
    from kvreplay.parsers import pipeline

    paths = list(paths)
    lark = _engine(engine)
    for p in paths:  # fail fast, before streaming anything
        if p != "-":
            pipeline.open_text(p)[0].close()
    iters = [pipeline.parse_path(p, year=year, lark=lark) for p in paths]
    if len(iters) == 1:
        return iter(iters[0])
    return pipeline.merge_by_time(iters)


def parse_lines(lines: Iterable[str] | str, *, file: str = "<lines>", year: int | None = None, engine: str = "fast") -> Iterator["Event"]:
    """Parse in-memory text (a string or an iterable of lines, with or without newlines)."""
    from kvreplay.parsers import pipeline

    if isinstance(lines, str):
        text = lines
    else:
        text = "".join(s if s.endswith("\n") else s + "\n" for s in lines)
    clock = pipeline.Clock(year=year) if year is not None else pipeline.Clock()
    return pipeline.parse_stream(io.StringIO(text, newline="\n"), file, clock, _engine(engine))


def merge_config(events: Iterable["Event"]) -> "EngineConfig":
    """One EngineConfig from every EngineConfig / KvCapacity event (later facts win; the
    block size is derived as kv_cache_tokens / num_gpu_blocks when both are known)."""
    import msgspec

    from kvreplay.events import LINE_FIELDS, EngineConfig, KvCapacity

    merged: dict = {}
    kv: dict = {}
    first = None
    for e in events:
        if isinstance(e, EngineConfig):
            first = first or e
            for k in EngineConfig.__struct_fields__:
                if k == "origin" or k in LINE_FIELDS:
                    continue
                v = getattr(e, k)
                if v is not None:
                    merged[k] = v
        elif isinstance(e, KvCapacity):
            if e.kv_cache_tokens is not None:
                kv["kv_cache_tokens"] = e.kv_cache_tokens
            if e.num_gpu_blocks is not None:
                kv["num_gpu_blocks"] = e.num_gpu_blocks
            if e.num_gpu_blocks_override is not None:
                kv["num_gpu_blocks"] = e.num_gpu_blocks_override
            if e.concurrency_tokens is not None and "max_model_len" not in merged:
                kv["max_model_len"] = e.concurrency_tokens
    for k, v in kv.items():
        merged.setdefault(k, v) if k == "max_model_len" else merged.__setitem__(k, v)
    if merged.get("block_size") is None and merged.get("kv_cache_tokens") and merged.get("num_gpu_blocks"):
        q, r = divmod(merged["kv_cache_tokens"], merged["num_gpu_blocks"])
        if r == 0 and q in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024):
            merged["block_size"] = q
    loc = {"file": first.file, "line": first.line} if first else {"file": "", "line": 0}
    return msgspec.structs.replace(EngineConfig(origin="merged", **loc), **merged)


def detect_version(events: Iterable["Event"], given: str | None = None) -> "Dialect":
    from kvreplay.parsers.version import detect

    return detect(events, given)


def _engine(engine: str) -> bool:
    if engine not in ("fast", "lark"):
        raise ValueError(f"engine must be 'fast' or 'lark', not {engine!r}")
    return engine == "lark"
