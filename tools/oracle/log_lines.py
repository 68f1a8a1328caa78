"""What the fixture log renderers share (render_log.py, render_v0_log.py, synth_log.py):
vLLM's logger time stamp, the lines gathered out of order and written in time order, and
the two KV-cache lines a V1 engine core prints at start-up (0.33's formats,
spec: vllm-log-formats.md)."""

from __future__ import annotations

import time as _time
from typing import Any


def stamp(t: float) -> str:
    """`MM-DD HH:MM:SS` of epoch seconds `t` read as UTC (the parser reads it back as UTC)."""
    return _time.strftime("%m-%d %H:%M:%S", _time.gmtime(t))


class TimedLines:
    """Lines emitted in any order with their times. `in_order()` gives them by time; lines
    with the same time keep the order they were emitted in."""

    def __init__(self) -> None:
        self._rows: list[tuple[float, int, str]] = []  # (time, emission order, line)

    def emit(self, t: float, line: str) -> None:
        self._rows.append((t, len(self._rows), line))

    def in_order(self) -> list[tuple[float, str]]:
        return [(t, line) for t, _, line in sorted(self._rows, key=lambda x: (x[0], x[1]))]


def kv_cache_lines(core_info: str, t: float, cfg: Any) -> list[str]:
    """The engine core's `num_gpu_blocks_override` and `GPU KV cache size` lines at `t`
    (`core_info`: the line's prefix up to the level, e.g. "(EngineCore pid=1) INFO")."""
    tokens = cfg.num_gpu_blocks * cfg.block_size
    return [f"{core_info} {stamp(t)} [kv_cache_planning.py:1525] Overriding "
            f"num_gpu_blocks=28002 with num_gpu_blocks_override={cfg.num_gpu_blocks}",
            f"{core_info} {stamp(t)} [kv_cache_utils.py:1147] GPU KV cache size: "
            f"{tokens:,} tokens, Maximum concurrency for {cfg.max_model_len:,} tokens per "
            f"request: {tokens / cfg.max_model_len:.2f}x"]
