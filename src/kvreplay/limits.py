"""Sanity limits on what one input may ask of kvreplay (memory and time stay bounded).

Each limit has a default that no real vLLM server reaches and an environment variable that
raises it; a value above a limit is a `UserError` that names both. The parsers' own bounds
(line length, JSON nesting, number size) are not settings: past them a line is unparsed.
"""

from __future__ import annotations

import os

from kvreplay.errors import UserError

# name -> (environment variable, default, what it bounds)
LIMITS: dict[str, tuple[str, int, str]] = {
    # one KVCacheBlock object (~150 bytes) per block: 4M blocks ~ 0.6 GB; an H200 serving a
    # 1B model at block size 16 has ~1M
    "blocks": ("KVREPLAY_MAX_BLOCKS", 1 << 22, "KV cache blocks (num_gpu_blocks, num_gpu_blocks_override)"),
    # sequences one request fans out to (SamplingParams n / best_of)
    "n": ("KVREPLAY_MAX_N", 1024, "sequences per request (n)"),
    # tokens of one sequence (max_model_len / max_seq_len, prompt plus max_tokens)
    "tokens": ("KVREPLAY_MAX_MODEL_LEN", 1 << 26, "tokens per sequence (max_model_len)"),
    # bytes a compressed log may expand to
    "decompressed": ("KVREPLAY_MAX_DECOMPRESSED", 4 << 30, "bytes a .gz input expands to"),
}

INT64_MAX = (1 << 63) - 1


def limit(name: str) -> int:
    """The limit's value: its environment variable if set to a positive integer, else the default."""
    var, default, _what = LIMITS[name]
    raw = os.environ.get(var)
    if raw:
        try:
            v = int(raw)
        except ValueError:
            raise UserError(f"{var}={raw!r}: must be a positive integer") from None
        if v < 1:
            raise UserError(f"{var}={raw!r}: must be a positive integer")
        return v
    return default


def check(name: str, value: int, what: str) -> int:
    """`value` if within the limit, else a UserError naming the limit and how to raise it."""
    lim = limit(name)
    if value > lim:
        var = LIMITS[name][0]
        raise UserError(f"{what} = {value} is above kvreplay's limit of {lim} {LIMITS[name][2]}; "
                        f"set {var} to raise it")
    return value
