"""Read an exported trace back from its file, independently of kvreplay's exporter: a
`.pftrace` decoded with the perfetto package's own protobuf classes (no trace processor:
it downloads a binary at first use), a Chrome JSON trace with `json`. Both come out in one
shape, so the same checks run on both; `check_trace` holds those checks."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Read:
    tracks: dict[int, str] = field(default_factory=dict)  # uid (tid) -> name
    parents: dict[int, int | None] = field(default_factory=dict)
    counters: dict[str, list[tuple[int, Any]]] = field(default_factory=dict)  # name -> samples
    slices: list[dict] = field(default_factory=list)  # track, name, start, end, depth, args
    instants: list[dict] = field(default_factory=list)  # track, name, ts, args, flow_out/in
    event_tracks: set[int] = field(default_factory=set)  # every track an event names
    engine: int = 1

    def by_track(self) -> dict[int, list[dict]]:
        out: dict[int, list[dict]] = defaultdict(list)
        for s in self.slices:
            out[s["track"]].append(s)
        return out


def _arg_value(a: Any) -> Any:
    kind = a.WhichOneof("value")
    return getattr(a, kind) if kind else None


def read_perfetto(path: Path) -> Read:
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TrackEvent

    trace = Trace()
    trace.ParseFromString(Path(path).read_bytes())
    out = Read()
    counter_names: dict[int, str] = {}
    stacks: dict[int, list[dict]] = defaultdict(list)
    last_ts = -1
    for p in trace.packet:
        assert p.trusted_packet_sequence_id == 1
        if p.HasField("track_descriptor"):
            d = p.track_descriptor
            out.tracks[d.uuid] = d.name
            out.parents[d.uuid] = d.parent_uuid if d.HasField("parent_uuid") else None
            if d.HasField("counter"):
                counter_names[d.uuid] = d.name
                out.counters[d.name] = []
            continue
        ev = p.track_event
        ts = p.timestamp
        assert ts >= last_ts, "track events out of time order"
        last_ts = ts
        out.event_tracks.add(ev.track_uuid)
        args = {a.name: _arg_value(a) for a in ev.debug_annotations}
        if ev.type == TrackEvent.TYPE_SLICE_BEGIN:
            s = {"track": ev.track_uuid, "name": ev.name, "start": ts, "end": None,
                 "depth": len(stacks[ev.track_uuid]), "args": args}
            stacks[ev.track_uuid].append(s)
            out.slices.append(s)
        elif ev.type == TrackEvent.TYPE_SLICE_END:
            stacks[ev.track_uuid].pop()["end"] = ts
        elif ev.type == TrackEvent.TYPE_INSTANT:
            out.instants.append({"track": ev.track_uuid, "name": ev.name, "ts": ts,
                                 "args": args, "flow_out": list(ev.flow_ids),
                                 "flow_in": list(ev.terminating_flow_ids)})
        elif ev.type == TrackEvent.TYPE_COUNTER:
            v = ev.double_counter_value if ev.HasField("double_counter_value") else ev.counter_value
            out.counters[counter_names[ev.track_uuid]].append((ts, v))
        else:
            raise AssertionError(f"unexpected event type {ev.type}")
    assert all(not s for s in stacks.values()), "a slice was never ended"
    return out


def read_chrome(path: Path | bytes) -> Read:
    data = json.loads(path if isinstance(path, bytes) else Path(path).read_bytes())
    out = Read()
    ev = data["traceEvents"]
    for e in ev:
        if e["ph"] == "M" and e["name"] == "thread_name":
            out.tracks[e["tid"]] = e["args"]["name"]
    flows_out: dict[tuple, list] = defaultdict(list)
    flows_in: dict[tuple, list] = defaultdict(list)
    for e in ev:
        ph = e["ph"]
        if ph == "M":
            continue
        ts = e["ts"] * 1000  # whole microseconds -> ns, as the protobuf trace
        if ph == "X":
            out.event_tracks.add(e["tid"])
            out.slices.append({"track": e["tid"], "name": e["name"], "start": ts,
                               "end": ts + e["dur"] * 1000, "depth": None, "args": e["args"]})
        elif ph == "i":
            out.event_tracks.add(e["tid"])
            out.instants.append({"track": e["tid"], "name": e["name"], "ts": ts,
                                 "args": e["args"], "flow_out": [], "flow_in": []})
        elif ph == "C":
            out.counters.setdefault(e["name"], []).append((ts, e["args"]["value"]))
        elif ph == "s":
            flows_out[(e["tid"], ts)].append(e["id"])
        elif ph == "f":
            assert e["bp"] == "e"
            flows_in[(e["tid"], ts)].append(e["id"])
        else:
            raise AssertionError(f"unexpected phase {ph}")
    for i in out.instants:  # a flow event sits with the instant it was written after
        k = (i["track"], i["ts"])
        if i["name"] == "allocation failed" and flows_out.get(k):
            i["flow_out"] = [flows_out[k].pop(0)]
        if i["name"] == "preemption" and i["track"] != out.engine and flows_in.get(k):
            i["flow_in"] = [flows_in[k].pop(0)]
    assert not any(flows_out.values()) and not any(flows_in.values()), "a flow without its instant"
    # depth by nesting on each track (a JSON complete event carries none)
    for track, sl in out.by_track().items():
        stack: list[dict] = []
        for s in sorted(sl, key=lambda s: (s["start"], -s["end"])):
            while stack and stack[-1]["end"] <= s["start"]:
                stack.pop()
            assert not stack or s["end"] <= stack[-1]["end"], "slices overlap on a track"
            s["depth"] = len(stack)
            stack.append(s)
    return out


def read_trace(path: Path) -> Read:
    return read_perfetto(path) if str(path).endswith(".pftrace") else read_chrome(path)


def value_at(samples: list[tuple[int, Any]], t: int) -> Any:
    """A counter's value at time t: its last sample at or before t."""
    v = None
    for ts, x in samples:
        if ts > t:
            break
        v = x
    return v
