"""Workloads in the conformance format (tests/data/conformance/README.md).

A workload is a scheduler config plus requests that arrive at given engine steps. Every
problem is reported as a `UserError` naming the key or request, never a traceback.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import msgspec

from kvreplay.errors import UserError
from kvreplay.replay.scheduler import SchedulerConfig

# Keys of the workload "config" object beyond SchedulerConfig's, with their defaults.
RUN_DEFAULTS: dict[str, Any] = {"max_steps": 5000, "fake_token_mode": "index", "fixed_token": 42}
_CONFIG_TYPES = {f.name: f.type for f in fields(SchedulerConfig)}


@dataclass(frozen=True, slots=True)
class RequestSpec:
    id: str
    arrival_step: int
    prompt_token_ids: list[int]
    max_tokens: int
    priority: int = 0


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    description: str
    config: SchedulerConfig
    requests: list[RequestSpec]
    max_steps: int = 5000
    fake_token_mode: str = "index"
    fixed_token: int = 42

    def fake_token(self, num_output_tokens: int) -> int:
        """The token the fake model samples as a request's output number k (from 0)."""
        if self.fake_token_mode == "fixed":
            return self.fixed_token
        return FAKE_TOKEN_FIRST + num_output_tokens % FAKE_TOKEN_PERIOD

    def fake_outputs(self, n: int) -> list[int]:
        """A request's first n output tokens: [fake_token(k) for k in range(n)], fast."""
        if self.fake_token_mode == "fixed":
            return [self.fixed_token] * n
        if n <= FAKE_TOKEN_PERIOD:
            return _PERIOD[:n]
        return (_PERIOD * (n // FAKE_TOKEN_PERIOD + 1))[:n]


# "index" mode: output number k samples FAKE_TOKEN_FIRST + k % FAKE_TOKEN_PERIOD
FAKE_TOKEN_FIRST = 1000
FAKE_TOKEN_PERIOD = 30000
_PERIOD = list(range(FAKE_TOKEN_FIRST, FAKE_TOKEN_FIRST + FAKE_TOKEN_PERIOD))


def load_workload(path: str | Path) -> dict[str, Any]:
    """Read a workload file as JSON ("-" is stdin; gzip is decompressed). Anything else
    (a directory, binary data, a log, JSON without 'requests') is a UserError naming it."""
    import sys

    from kvreplay.limits import gunzip

    what = "a workload JSON (kvreplay simulate's input; a vLLM log is read by kvreplay replay)"
    try:
        if str(path) == "-":
            raw = sys.stdin.buffer.read()
        else:
            raw = Path(path).read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gunzip(raw)  # (bounded: OSError when corrupt, cut or too large)
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a directory, not {what}") from None
    except (OSError, EOFError) as exc:
        raise UserError(f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{path}: binary data, not {what}") from None
    try:
        data = msgspec.json.decode(text)  # same values as json.loads, 3-4x faster
    except msgspec.DecodeError:
        data = None
    except RecursionError:
        raise UserError(f"{path}: not a workload: JSON nested deeper than the decoder's limit") from None
    try:
        if data is None:
            data = json.loads(text)  # (for its message: line and column)
    except json.JSONDecodeError as exc:
        head = "empty file" if not text.strip() else \
            f"not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
        raise UserError(f"{path}: {head}; expected {what}") from None
    except RecursionError:
        raise UserError(f"{path}: not a workload: JSON nested deeper than the decoder's limit") from None
    except ValueError as exc:  # an integer past Python's digit limit, before the syntax error
        raise UserError(f"{path}: not JSON ({str(exc).split(';')[0]}); expected {what}") from None
    if not isinstance(data, dict) or "requests" not in data:
        keys = ", ".join(sorted(data)[:5]) if isinstance(data, dict) else type(data).__name__
        raise UserError(f"{path}: JSON that is not a workload (a workload has 'config' and "
                        f"'requests'; this has: {keys or 'nothing'})")
    return data


_INT = {int}


def _int(value: Any, what: str, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise UserError(f"{what} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise UserError(f"{what} must be >= {minimum}, got {value}")
    return value


def parse_workload(data: dict[str, Any], *, check_capacity: bool = True) -> Workload:
    """Validate a V1 workload dict and build a `Workload`.

    With `check_capacity`, a request that needs more KV blocks than the pool has is an
    error (vLLM would preempt it forever); without, it is replayed as vLLM would run it.
    """
    unknown_top = set(data) - {"name", "description", "config", "requests", "engine"}
    if unknown_top:
        raise UserError(f"unknown workload keys: {', '.join(sorted(unknown_top))}")
    engine = data.get("engine", "v1")
    if engine != "v1":
        raise UserError(f"engine {engine!r} is not the V1 engine")
    cfg_in = data.get("config", {})
    if not isinstance(cfg_in, dict):
        raise UserError("'config' must be an object")
    unknown = set(cfg_in) - set(_CONFIG_TYPES) - set(RUN_DEFAULTS)
    if unknown:
        raise UserError(f"unknown config keys: {', '.join(sorted(unknown))}")
    cfg: dict[str, Any] = {}
    for key, value in cfg_in.items():
        if key in RUN_DEFAULTS:
            continue
        kind = _CONFIG_TYPES[key]
        if value is None and key == "max_model_len":
            continue
        if kind == "bool":
            if not isinstance(value, bool):
                raise UserError(f"config {key} must be true or false, got {value!r}")
        elif kind == "int":
            value = _int(value, f"config {key}", 0)
        elif kind == "float":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
                raise UserError(f"config {key} must be a number in [0, 1), got {value!r}")
            value = float(value)
        elif kind == "str":
            if key == "policy" and value not in ("fcfs", "priority"):
                raise UserError(f"config policy must be 'fcfs' or 'priority', got {value!r}")
        cfg[key] = value
    chunked = cfg.get("enable_chunked_prefill", True)
    if "max_model_len" not in cfg:
        cfg["max_model_len"] = 2048 if chunked else min(2048, cfg.get("max_num_batched_tokens", 2048))
    config = SchedulerConfig(**cfg)
    for key in ("num_gpu_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens", "max_model_len"):
        if getattr(config, key) < 1:
            raise UserError(f"config {key} must be >= 1")
    if config.num_gpu_blocks < 2:
        raise UserError("config num_gpu_blocks must be >= 2 (block 0 is vLLM's reserved null block)")
    if not config.enable_chunked_prefill and config.max_num_batched_tokens < config.max_model_len:
        raise UserError(
            "with chunked prefill off, max_num_batched_tokens "
            f"({config.max_num_batched_tokens}) must be >= max_model_len ({config.max_model_len}), "
            "as vLLM's SchedulerConfig requires"
        )
    run = {k: cfg_in.get(k, v) for k, v in RUN_DEFAULTS.items()}
    max_steps = _int(run["max_steps"], "config max_steps", 1)
    if run["fake_token_mode"] not in ("index", "fixed"):
        raise UserError(f"config fake_token_mode must be 'index' or 'fixed', got {run['fake_token_mode']!r}")
    fixed_token = _int(run["fixed_token"], "config fixed_token")

    reqs_in = data.get("requests")
    if not isinstance(reqs_in, list):
        raise UserError("'requests' must be a list")
    usable = config.num_gpu_blocks - 1
    requests: list[RequestSpec] = []
    seen: set[str] = set()
    for i, r in enumerate(reqs_in):
        if not isinstance(r, dict):
            raise UserError(f"request #{i} must be an object")
        rid = r.get("id")
        if rid is None:
            raise UserError(f"request #{i} has no id")
        rid = str(rid)
        if rid in seen:
            raise UserError(f"duplicate request id {rid!r}")
        seen.add(rid)
        bad = set(r) - {"id", "arrival_step", "prompt_token_ids", "max_tokens", "priority", "n"}
        if bad:
            raise UserError(f"request {rid}: unknown keys {', '.join(sorted(bad))}")
        if r.get("n", 1) != 1:
            raise UserError(f"request {rid}: n > 1 is split by the engine; use the V0 engine format")
        for key in ("arrival_step", "prompt_token_ids", "max_tokens"):
            if key not in r:
                raise UserError(f"request {rid} lacks {key}")
        arrival = _int(r["arrival_step"], f"request {rid} arrival_step", 0)
        max_tokens = _int(r["max_tokens"], f"request {rid} max_tokens", 1)
        priority = _int(r.get("priority", 0), f"request {rid} priority")
        prompt = r["prompt_token_ids"]
        if not isinstance(prompt, list) or not prompt:
            raise UserError(f"request {rid}: prompt_token_ids must be a non-empty list of integers")
        if not set(map(type, prompt)) <= _INT:  # (bool is not int here)
            raise UserError(f"request {rid}: prompt_token_ids must be integers")
        if len(prompt) > config.max_model_len:
            raise UserError(
                f"request {rid}: prompt of {len(prompt)} tokens is longer than max_model_len "
                f"{config.max_model_len}"
            )
        # The last step computes position min(prompt + max_tokens, max_model_len) - 1.
        last_len = min(len(prompt) + max_tokens, config.max_model_len) - 1
        blocks = -(-max(last_len, len(prompt)) // config.block_size)
        if check_capacity and blocks > usable:
            raise UserError(
                f"request {rid} needs {blocks} KV blocks of {config.block_size} tokens, but the pool "
                f"has only {usable} usable blocks (num_gpu_blocks {config.num_gpu_blocks} - 1): "
                "it could never finish"
            )
        requests.append(RequestSpec(rid, arrival, list(prompt), max_tokens, priority))
    return Workload(
        name=str(data.get("name", "")),
        description=str(data.get("description", "")),
        config=config,
        requests=requests,
        max_steps=max_steps,
        fake_token_mode=run["fake_token_mode"],
        fixed_token=fixed_token,
    )
