#!/usr/bin/env python3
"""Convert an OTLP/JSON span file (the Collector's file exporter: one
ExportTraceServiceRequest per line) to Jaeger's JSON export (what the Jaeger UI's
"Download JSON" / the query API `/api/traces` return), with Jaeger's documented field
names: {"data": [{"traceID", "spans": [{"traceID", "spanID", "operationName",
"references", "startTime" (us), "duration" (us), "tags": [{"key", "type", "value"}],
"logs", "processID", "warnings"}], "processes": {"p1": {"serviceName", "tags"}},
"warnings"}]}. Dev tool: makes test material from spans vLLM wrote; never hand-write spans.

    python -m tools.oracle.otlp_to_jaeger spans.otlp.jsonl > spans.jaeger.json
"""
from __future__ import annotations

import json
import sys


def _tag(attr: dict) -> dict:
    v = attr["value"]
    if "stringValue" in v:
        return {"key": attr["key"], "type": "string", "value": v["stringValue"]}
    if "intValue" in v:
        return {"key": attr["key"], "type": "int64", "value": int(v["intValue"])}
    if "doubleValue" in v:
        return {"key": attr["key"], "type": "float64", "value": float(v["doubleValue"])}
    if "boolValue" in v:
        return {"key": attr["key"], "type": "bool", "value": bool(v["boolValue"])}
    return {"key": attr["key"], "type": "string", "value": json.dumps(v)}


def convert(lines) -> dict:
    traces: dict[str, dict] = {}
    for line in lines:
        if not line.strip():
            continue
        req = json.loads(line)
        for rs in req.get("resourceSpans", []):
            res = {a["key"]: a["value"].get("stringValue") for a in
                   rs.get("resource", {}).get("attributes", [])}
            process = {"serviceName": res.get("service.name") or "unknown",
                       "tags": [_tag(a) for a in rs.get("resource", {}).get("attributes", [])
                                if a["key"] != "service.name"]}
            for ss in rs.get("scopeSpans", []):
                for sp in ss.get("spans", []):
                    start_ns = int(sp["startTimeUnixNano"])
                    end_ns = int(sp.get("endTimeUnixNano", start_ns))
                    tid = sp["traceId"]
                    t = traces.setdefault(tid, {"traceID": tid, "spans": [],
                                                "processes": {"p1": process},
                                                "warnings": None})
                    t["spans"].append({
                        "traceID": tid, "spanID": sp["spanId"],
                        "operationName": sp["name"],
                        "references": ([{"refType": "CHILD_OF", "traceID": tid,
                                         "spanID": sp["parentSpanId"]}]
                                       if sp.get("parentSpanId") else []),
                        "startTime": start_ns // 1000, "duration": (end_ns - start_ns) // 1000,
                        "tags": [_tag(a) for a in sp.get("attributes", [])],
                        "logs": [], "processID": "p1", "warnings": None})
    return {"data": list(traces.values()), "total": 0, "limit": 0, "offset": 0,
            "errors": None}


def main() -> int:
    with open(sys.argv[1], encoding="utf-8") as f:
        json.dump(convert(f), sys.stdout, separators=(",", ":"))
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
