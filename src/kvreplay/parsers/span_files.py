"""Exported OpenTelemetry request spans: vLLM's `llm_request` spans (`--otlp-traces-endpoint`)
as `RequestSpan`s.

Two formats, told apart by content (`spans_format`):

* OTLP/JSON as the OpenTelemetry Collector's file exporter writes it: one
  `ExportTraceServiceRequest` per line (`resourceSpans -> scopeSpans -> spans`), read with
  the `opentelemetry-proto` message classes and protobuf's JSON parser (the `otlp` extra);
* Jaeger's JSON export (`{"data": [{"spans": [{"operationName", "startTime" (us),
  "duration" (us), "tags": [{"key", "type", "value"}]}]}]}`), plain JSON; one document, or
  one per line.

A line that is not a span batch is reported (file:line) and skipped; a file with no
`llm_request` span at all is a `UserError`.
"""

from __future__ import annotations

import base64
import json
import math
import os
from typing import Any

from kvreplay.errors import UserError
from kvreplay.events import RequestSpan

SPAN_NAME = "llm_request"  # vLLM's SpanAttributes / do_tracing span name
_ATTR = {  # span attribute -> RequestSpan field (vLLM's SpanAttributes names)
    "gen_ai.request.id": "request_id",
    "gen_ai.usage.prompt_tokens": "prompt_tokens",
    "gen_ai.usage.completion_tokens": "completion_tokens",
    "gen_ai.request.max_tokens": "max_tokens",
    "gen_ai.request.n": "n",
    "gen_ai.latency.time_in_queue": "time_in_queue",
    "gen_ai.latency.time_to_first_token": "time_to_first_token",
    "gen_ai.latency.time_in_model_prefill": "time_in_model_prefill",
    "gen_ai.latency.time_in_model_decode": "time_in_model_decode",
    "gen_ai.latency.time_in_model_inference": "time_in_model_inference",
    "gen_ai.latency.e2e": "e2e",
}
_INTS = {"prompt_tokens", "completion_tokens", "max_tokens", "n"}


def spans_format(path: str) -> str | None:
    """"otlp" or "jaeger" when the file's first JSON object looks like one, else None."""
    import stat

    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO or device: not sniffed (it would block)
            return None
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return None
    head = head.lstrip()
    if not head.startswith(b"{"):
        return None
    if b'"resourceSpans"' in head[:64]:
        return "otlp"
    if head.startswith(b'{"data"') or (b'"data"' in head[:200] and b'"spans"' in head):
        return "jaeger"
    return None


def read_spans(path: str) -> tuple[list[RequestSpan], list[str]]:
    """The `llm_request` spans of a file, in file order, and the problems found (one
    "file:line: why" each; those lines are skipped)."""
    fmt = spans_format(path)
    if fmt is None:
        raise UserError(f"{path}: not an OTLP/JSON or Jaeger JSON span file")
    try:
        with open(path, "rt", encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read: {exc}") from None
    spans, problems = (_read_otlp if fmt == "otlp" else _read_jaeger)(path, text)
    if not spans:
        why = f" ({problems[0]})" if problems else ""
        raise UserError(f"{path}: no {SPAN_NAME} span with a gen_ai.request.id{why}")
    return spans, problems


def _span(path: str, line: int, start: float, end: float | None,
          attrs: dict[str, Any]) -> RequestSpan | None:
    vals: dict[str, Any] = {}
    for key, field in _ATTR.items():
        v = attrs.get(key)
        if v is None:
            continue
        try:
            vals[field] = str(v) if field == "request_id" else (
                int(v) if field in _INTS else float(v))
        except (TypeError, ValueError, OverflowError):
            continue
        x = vals[field]
        if (isinstance(x, float) and not math.isfinite(x)) or (isinstance(x, int) and not -(1 << 63) <= x < 1 << 63):
            del vals[field]  # (nan, inf, past int64: says nothing)
    if not vals.get("request_id") or not math.isfinite(start) or (end is not None and not math.isfinite(end)):
        return None
    return RequestSpan(file=path, line=line, start=start, end=end, **vals)


# ------------------------------------------------------------------ OTLP/JSON


def _otlp_classes():
    try:
        from google.protobuf import json_format
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest)
    except ImportError:
        raise UserError("reading OTLP/JSON spans needs the opentelemetry-proto package: "
                        "pip install 'kvreplay[otlp]'") from None
    return json_format, ExportTraceServiceRequest


def _hex_ids_to_base64(d: Any) -> None:
    """The Collector writes trace and span ids as hex; protobuf's JSON mapping of `bytes`
    is base64. Rewrite them so the ids parse as the bytes they are."""
    for rs in d.get("resourceSpans") or ():
        for ss in rs.get("scopeSpans") or ():
            for sp in ss.get("spans") or ():
                for k in ("traceId", "spanId", "parentSpanId"):
                    v = sp.get(k)
                    if isinstance(v, str) and v and len(v) % 2 == 0:
                        try:
                            sp[k] = base64.b64encode(bytes.fromhex(v)).decode()
                        except ValueError:
                            pass  # not hex: left as the file has it (base64)


def _any_value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return None if kind is None else getattr(v, kind)


def _read_otlp(path: str, text: str) -> tuple[list[RequestSpan], list[str]]:
    json_format, Request = _otlp_classes()
    spans: list[RequestSpan] = []
    problems: list[str] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            if not isinstance(d, dict):
                raise ValueError("not a JSON object")
            _hex_ids_to_base64(d)
            msg = json_format.ParseDict(d, Request(), ignore_unknown_fields=True)
        except (ValueError, json_format.ParseError, AttributeError, TypeError, RecursionError) as exc:
            problems.append(f"{path}:{n}: not an OTLP ExportTraceServiceRequest ({exc})"[:300])
            continue
        for rs in msg.resource_spans:
            for ss in rs.scope_spans:
                for sp in ss.spans:
                    if sp.name != SPAN_NAME:
                        continue
                    attrs = {a.key: _any_value(a.value) for a in sp.attributes}
                    s = _span(path, n, sp.start_time_unix_nano / 1e9,
                              sp.end_time_unix_nano / 1e9 if sp.end_time_unix_nano else None,
                              attrs)
                    if s is None:
                        problems.append(f"{path}:{n}: an {SPAN_NAME} span without "
                                        "gen_ai.request.id")
                    else:
                        spans.append(s)
    return spans, problems


# ------------------------------------------------------------------ Jaeger JSON


def _read_jaeger(path: str, text: str) -> tuple[list[RequestSpan], list[str]]:
    docs: list[tuple[int, Any]] = []
    problems: list[str] = []
    try:
        docs.append((1, json.loads(text)))
    except (ValueError, RecursionError):
        for n, line in enumerate(text.splitlines(), 1):  # one document per line
            if not line.strip():
                continue
            try:
                docs.append((n, json.loads(line)))
            except (ValueError, RecursionError) as exc:  # (nested past Python's recursion limit)
                problems.append(f"{path}:{n}: not Jaeger JSON ({exc})")
    spans: list[RequestSpan] = []
    for n, doc in docs:
        data = doc.get("data") if isinstance(doc, dict) else None
        if not isinstance(data, list):
            problems.append(f"{path}:{n}: no Jaeger 'data' list")
            continue
        for trace in data:
            for sp in (trace.get("spans") or ()) if isinstance(trace, dict) else ():
                if not isinstance(sp, dict) or sp.get("operationName") != SPAN_NAME:
                    continue
                try:
                    start = float(sp["startTime"]) / 1e6
                    dur = sp.get("duration")
                    end = start + float(dur) / 1e6 if dur is not None else None
                    attrs = {t["key"]: t.get("value") for t in sp.get("tags") or ()}
                except (KeyError, TypeError, ValueError) as exc:
                    problems.append(f"{path}:{n}: a Jaeger span without {exc}")
                    continue
                s = _span(path, n, start, end, attrs)
                if s is None:
                    problems.append(f"{path}:{n}: an {SPAN_NAME} span without gen_ai.request.id")
                else:
                    spans.append(s)
    return spans, problems
