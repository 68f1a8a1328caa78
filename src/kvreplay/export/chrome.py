"""The trace as Chrome's JSON trace-event format (chrome://tracing, Perfetto UI, and any
other viewer of that format); needs nothing beyond kvreplay's own dependencies.

One process (pid 1) is the engine's group; thread 1 is the engine's own track, each request
a thread of its own (tid = its track uid, named by `thread_name` metadata). Slices are
complete events ("X"), instants "i" (thread scope), counters "C" (one series, `value`),
flows "s" (at the trigger) and "f" (at the victim, bound to the enclosing slice). `ts` and
`dur` are whole microseconds: the same instants as the protobuf trace.
"""

from __future__ import annotations

from typing import Any

import msgspec

from kvreplay.export.model import GROUP, Trace

PID = 1


def chrome_events(trace: Trace) -> list[dict[str, Any]]:
    names = {t.uid: t.name for t in trace.tracks}
    out: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": PID, "args": {"name": names[GROUP]}}]
    rank = 0
    for t in trace.tracks:
        if t.kind in ("group", "counter"):
            continue
        out.append({"ph": "M", "name": "thread_name", "pid": PID, "tid": t.uid,
                    "args": {"name": t.name}})
        out.append({"ph": "M", "name": "thread_sort_index", "pid": PID, "tid": t.uid,
                    "args": {"sort_index": rank}})
        rank += 1
    for kind, ts, obj in trace.events():
        us = ts // 1000
        if kind == "begin":
            out.append({"ph": "X", "name": obj.name, "cat": "kvreplay", "pid": PID,
                        "tid": obj.track, "ts": us, "dur": (obj.end - obj.start) // 1000,
                        "args": obj.args})
        elif kind == "counter":
            track, v = obj
            out.append({"ph": "C", "name": names[track], "pid": PID, "ts": us,
                        "args": {"value": v}})
        elif kind == "instant":
            out.append({"ph": "i", "s": "t", "name": obj.name, "cat": "kvreplay", "pid": PID,
                        "tid": obj.track, "ts": us, "args": obj.args})
            if obj.flow_out is not None:
                out.append({"ph": "s", "name": "preemption", "cat": "kvreplay", "pid": PID,
                            "tid": obj.track, "ts": us, "id": obj.flow_out})
            if obj.flow_in is not None:
                out.append({"ph": "f", "bp": "e", "name": "preemption", "cat": "kvreplay",
                            "pid": PID, "tid": obj.track, "ts": us, "id": obj.flow_in})
    return out


def chrome_json(trace: Trace) -> bytes:
    """The whole file: the events, and the replay's provenance as `otherData`."""
    return msgspec.json.encode({"traceEvents": chrome_events(trace), "displayTimeUnit": "ms",
                                "otherData": trace.meta})
