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
    # scheduler steps one run (a replay, an ensemble member, a simulation) may take: a step
    # costs ~0.1-0.2 ms, so 10M is ~20-30 min; a busy day at 20 ms a step is ~4.3M. Past
    # it a run stops with one line instead of running for hours (a request with a huge
    # max_tokens on a tiny pool, a stats line far in the future)
    "steps": ("KVREPLAY_MAX_STEPS", 10_000_000, "scheduler steps per run"),
    # bytes a compressed log may expand to
    "decompressed": ("KVREPLAY_MAX_DECOMPRESSED", 4 << 30, "bytes a .gz input expands to"),
    # bytes out per compressed byte, checked past GZIP_RATIO_FREE bytes out: a vLLM log
    # compresses ~3x (prompt lines) to ~83x (200k idle stats lines 10 s apart, gzip -9);
    # a bomb of one line repeated is ~220x, of one byte ~1000x (deflate's ceiling): either
    # is refused after 64 MB, before its lines fill memory
    "gzip_ratio": ("KVREPLAY_MAX_GZIP_RATIO", 200, "decompressed bytes per compressed byte of a .gz input"),
}

GZIP_RATIO_FREE = 64 << 20  # decompressed bytes read before the ratio is checked

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


def gunzip(data: bytes) -> bytes:
    """`data` (gzip, one or more members) decompressed, at most the `decompressed` limit of
    bytes: an OSError with one line when it is corrupt, cut short or expands past the
    limit (a gzip bomb is refused after `limit` bytes, not read until memory runs out)."""
    import zlib

    lim = min(limit("decompressed"), max(GZIP_RATIO_FREE, limit("gzip_ratio") * len(data)))
    out: list[bytes] = []
    size = 0
    rest = data
    while rest:
        d = zlib.decompressobj(wbits=31)  # one gzip member (header and CRC checked)
        try:
            chunk = d.decompress(rest, lim - size + 1)
        except zlib.error as exc:
            raise OSError(f"corrupt gzip data ({exc})") from None
        size += len(chunk)
        if size > lim:
            raise OSError(too_large(size, len(data)))
        if not d.eof:
            raise OSError("compressed file ended before the end-of-stream marker was reached")
        out.append(chunk)
        rest = d.unused_data.lstrip(b"\x00")  # gzip's trailing zero padding
    return b"".join(out)


def too_large(out: int, read: int) -> str:
    """The message for a .gz input that expanded to `out` bytes from `read` compressed
    bytes, past one of the two limits (`decompressed`, `gzip_ratio`)."""
    cap = limit("decompressed")
    if out > cap:
        return (f"decompressed size above kvreplay's limit of {cap} bytes "
                f"({LIMITS['decompressed'][2]}); set {LIMITS['decompressed'][0]} to raise it")
    ratio = limit("gzip_ratio")
    return (f"expands more than {ratio}x ({out} bytes from {read} compressed): a gzip bomb, not "
            f"a log; set {LIMITS['gzip_ratio'][0]} to raise kvreplay's limit of {ratio} "
            f"{LIMITS['gzip_ratio'][2]}")


def too_many_steps(cap: int) -> UserError:
    """The error of a run that reached the `steps` limit without finishing."""
    return UserError(f"the run reached kvreplay's limit of {cap} {LIMITS['steps'][2]} without "
                     f"finishing (a request far too long for the pool, or times far apart?); "
                     f"set {LIMITS['steps'][0]} to raise it")
