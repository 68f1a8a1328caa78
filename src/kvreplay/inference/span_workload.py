"""A workload from request spans alone (no request lines): each `llm_request` span is a
request (its id, prompt and output lengths, arrival), the engine config comes from the
log's startup lines or `--config`. The spans' engine stamps then place the arrivals as
beside a log (span_clock.py); there are no stats lines to check the replay against, only
the spans themselves (spans.check_spans).
"""

from __future__ import annotations

import math
import re
from typing import Any

from kvreplay import events as ev
from kvreplay.errors import UserError
from kvreplay.inference.facts import LogFacts, LogRequest


def facts_from_spans(spans: list[ev.RequestSpan], config: ev.EngineConfig | None,
                     files: list[str], vllm_version: str | None) -> LogFacts:
    """`LogFacts` whose requests are the spans, in arrival order; a `UserError` when a span
    lacks what a request needs or the config lacks what the replay needs."""
    if config is None or config.num_gpu_blocks is None and config.kv_cache_tokens is None:
        raise UserError("request spans alone need the engine config: give the server log's "
                        "startup lines (the log itself) or --config CONFIG.json")
    reqs: list[LogRequest] = []
    # arrival order; spans arriving at the same instant (to the ns) in their ids' natural
    # order (clients number their requests: "...-9-0" before "...-10-0")
    for i, s in enumerate(sorted(spans, key=lambda s: (s.start, _natural(s.request_id)))):
        if s.prompt_tokens is None or s.completion_tokens is None:
            raise UserError(f"{s.file}:{s.line}: span {s.request_id} has no "
                            "gen_ai.usage.prompt_tokens / completion_tokens")
        reqs.append(LogRequest(
            index=i, log_id=s.request_id, time=float(math.floor(s.start)), file=s.file,
            line=s.line, max_tokens=s.max_tokens or s.completion_tokens, ignore_eos=True,
            n=s.n or 1, prompt_len=s.prompt_tokens, output_len=s.completion_tokens,
            seq=i, precise_time=s.start, span=s))
    ids = [r.log_id for r in reqs]
    if len(set(ids)) != len(ids):
        raise UserError("request spans alone: a request id repeats (spans of more than one "
                        "server?); give the log to join them by its lines")
    facts = LogFacts(
        config=config, vllm_version=vllm_version or config.vllm_version, engine_version="V1",
        requests=reqs, stats=[], completions=[], v0_preemptions=[], iterations=[],
        interval_s=None, first_time=reqs[0].time if reqs else None,
        last_time=reqs[-1].time if reqs else None, num_cpu_blocks=None, finished=[],
        num_events=len(spans), num_unparsed=0, files=list(files), precise_times=True,
        span_placement=True,
        notes=(f"workload from {len(reqs)} request spans alone (no request lines): "
               "the spans are the only check on the replay",))
    return facts


def _natural(text: str) -> list[Any]:
    return [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", text)]


def config_from_json(path: str) -> ev.EngineConfig:
    """`--config`: a JSON object of engine settings by vLLM's names (those of
    events.EngineConfig: num_gpu_blocks, block_size, max_num_seqs, max_num_batched_tokens,
    max_model_len, enable_prefix_caching, ...), or a conformance workload (its "config")."""
    import json

    import msgspec

    try:
        with open(path, encoding="utf-8") as f:
            data: Any = json.load(f)
    except (OSError, ValueError, RecursionError) as exc:
        raise UserError(f"--config {path}: {exc}") from None
    if isinstance(data, dict) and isinstance(data.get("config"), dict):
        # a workload's config is the whole engine config: what it leaves out is the
        # workload format's default (replay.scheduler.SchedulerConfig), not vLLM's
        from dataclasses import fields as dc_fields

        from kvreplay.replay.scheduler import SchedulerConfig

        defaults = {f.name: f.default for f in dc_fields(SchedulerConfig)
                    if isinstance(f.default, (int, float, str, bool))}
        data = {**defaults, **data["config"]}
    if not isinstance(data, dict):
        raise UserError(f"--config {path}: not a JSON object")
    known = set(ev.EngineConfig.__struct_fields__)
    if "policy" in data and "scheduling_policy" not in data:
        data = {**data, "scheduling_policy": data["policy"]}
    fields = {k: v for k, v in data.items() if k in known and k != "origin"}
    try:
        return msgspec.convert({"file": path, "line": 1, "origin": "json_config", **fields},
                               ev.EngineConfig)
    except msgspec.ValidationError as exc:
        raise UserError(f"--config {path}: {exc}") from None
