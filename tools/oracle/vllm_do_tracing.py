#!/usr/bin/env python3
"""Run INSIDE the vLLM 0.33.0 venv (with the OpenTelemetry SDK and OTLP exporter on
PYTHONPATH): vLLM's own `OutputProcessor(tracing_enabled=True)` fed a simulated run's engine
outputs, its `llm_request` spans caught by an in-memory exporter and written as the
OpenTelemetry Collector's file exporter writes OTLP/JSON (one `ExportTraceServiceRequest`
a line, hex ids). Nothing here writes a span attribute: `do_tracing` does.

    python -m tools.oracle.vllm_do_tracing RUN.json OUT.otlp.jsonl [RUN2.json OUT2.otlp.jsonl ...]

(several runs in one process: vLLM's import costs seconds, each run's spans apart)

RUN.json (tools/research/render_poisson_spans.py writes it): {"requests": [{"id", "internal_id",
"prompt_len", "max_tokens", "arrival"}], "steps": [{"start", "end", "queued", "scheduled",
"preempted", "sampled", "finished"}]}: wall-clock seconds; the engine's monotonic clock is
the wall clock minus a constant, and the frontend sees a step's output `ipc_s` after it.
"""
from __future__ import annotations

import base64
import json
import sys

MONO_BASE = 1.7e9  # monotonic = wall - MONO_BASE (one machine: one constant)
BATCH = 32  # spans per exported line (as a BatchSpanProcessor hands them over)


def main() -> int:
    args = sys.argv[1:]
    if not args or len(args) % 2:
        print("usage: vllm_do_tracing.py RUN.json OUT.otlp.jsonl [RUN2.json OUT2.otlp.jsonl ...]",
              file=sys.stderr)
        return 2
    from google.protobuf.json_format import MessageToDict
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from vllm.sampling_params import RequestOutputKind, SamplingParams
    from vllm.v1.engine import (EngineCoreEvent, EngineCoreEventType, EngineCoreOutput,
                                EngineCoreRequest, FinishReason)
    from vllm.v1.engine.output_processor import OutputProcessor
    from vllm.v1.metrics.stats import IterationStats

    mem = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create(
        {"vllm.instrumenting_module_name": "vllm.llm_engine", "vllm.process_id": "2801"}))
    provider.add_span_processor(SimpleSpanProcessor(mem))
    trace.set_tracer_provider(provider)

    # the SDK ends a span "now": on the simulated clock, the frontend's receipt of the step
    import opentelemetry.sdk.trace as sdk_trace

    now = [0.0]
    sdk_trace.time_ns = lambda: int(now[0] * 1e9)  # type: ignore[attr-defined]

    for src, out in zip(args[::2], args[1::2]):
        mem.clear()
        _one(json.load(open(src)), out, now, mem, OutputProcessor, RequestOutputKind,
             SamplingParams, EngineCoreEvent, EngineCoreEventType, EngineCoreOutput,
             EngineCoreRequest, FinishReason, IterationStats, MessageToDict, encode_spans)
    return 0


def _one(run, out, now, mem, OutputProcessor, RequestOutputKind, SamplingParams,
         EngineCoreEvent, EngineCoreEventType, EngineCoreOutput, EngineCoreRequest,
         FinishReason, IterationStats, MessageToDict, encode_spans) -> None:
    op = OutputProcessor(None, log_stats=True, tracing_enabled=True)
    ipc = run.get("ipc_s", 0.0003)
    reqs = {r["id"]: r for r in run["requests"]}
    for r in run["requests"]:
        sp = SamplingParams(n=1, temperature=0.0, top_p=1.0, max_tokens=r["max_tokens"],
                            ignore_eos=True, detokenize=False,
                            output_kind=RequestOutputKind.DELTA)
        req = EngineCoreRequest(
            request_id=r["internal_id"], prompt_token_ids=[1] * r["prompt_len"],
            mm_features=None, sampling_params=sp, pooling_params=None,
            arrival_time=r["arrival"], lora_request=None, cache_salt=None,
            data_parallel_rank=None, external_req_id=r["id"])
        op.add_request(req, None)
    pending: dict[str, list] = {}  # events not yet carried by an output (request id)
    for st in run["steps"]:
        t0 = st["start"] - MONO_BASE
        for rid in st["queued"]:
            pending.setdefault(rid, []).append(
                EngineCoreEvent(EngineCoreEventType.QUEUED, t0))
        for rid in st["preempted"]:
            pending.setdefault(rid, []).append(
                EngineCoreEvent(EngineCoreEventType.PREEMPTED, t0))
        for rid in st["scheduled"]:
            pending.setdefault(rid, []).append(
                EngineCoreEvent(EngineCoreEventType.SCHEDULED, t0))
        outs = []
        fin = set(st["finished"])
        for rid in st["sampled"]:
            outs.append(EngineCoreOutput(
                request_id=reqs[rid]["internal_id"], new_token_ids=[7],
                finish_reason=FinishReason.LENGTH if rid in fin else None,
                events=pending.pop(rid, None) or None))
        if not outs:
            continue
        it = IterationStats()
        it.iteration_timestamp = now[0] = st["end"] + ipc  # the frontend's clock on receipt
        op.process_outputs(outs, engine_core_timestamp=st["end"] - MONO_BASE,
                           iteration_stats=it)
    spans = list(mem.get_finished_spans())
    with open(out, "w", encoding="utf-8") as f:
        for i in range(0, len(spans), BATCH):
            d = MessageToDict(encode_spans(spans[i:i + BATCH]))
            for rs in d.get("resourceSpans", []):
                for ss in rs.get("scopeSpans", []):
                    for s in ss.get("spans", []):
                        for key in ("traceId", "spanId", "parentSpanId"):
                            if key in s:  # OTLP/JSON: ids as hex, not base64
                                s[key] = base64.b64decode(s[key]).hex()
            f.write(json.dumps(d, separators=(",", ":")) + "\n")
    print(f"{len(spans)} spans -> {out}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
