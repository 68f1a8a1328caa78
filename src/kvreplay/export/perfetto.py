"""The trace as Perfetto's protobuf trace (`.pftrace`), built with the official `perfetto`
package (`TraceProtoBuilder`, the optional extra `kvreplay[perfetto]`).

One trusted packet sequence: first a TrackDescriptor per track (the engine's group, and
under it the engine's own track, the counters and one per request, in that order), then
the TrackEvents in the order `Trace.events()` gives (slice begin/end, instants, counters;
flows as flow ids on the trigger's instant and terminating flow ids on the victim's).
Timestamps are ns: the replay's wall clock for a log (epoch), the step-time model's from
0 otherwise.
"""

from __future__ import annotations

from typing import Any

from kvreplay.errors import UserError
from kvreplay.export.model import GROUP, Trace

SEQUENCE = 1
MISSING = ("the Perfetto trace needs the perfetto package: pip install 'kvreplay[perfetto]' "
           "(or write the JSON trace with --chrome OUT.json, which needs nothing more)")


def protos() -> Any:
    """The perfetto package's builder and protobuf classes, or a UserError saying how to
    get them."""
    try:
        from perfetto.protos.perfetto.trace import perfetto_trace_pb2
        from perfetto.trace_builder.proto_builder import TraceProtoBuilder
    except ImportError:
        raise UserError(MISSING) from None
    return TraceProtoBuilder, perfetto_trace_pb2


def _annotate(ev: Any, args: dict[str, Any]) -> None:
    for k, v in args.items():
        if v is None:
            continue
        a = ev.debug_annotations.add()
        a.name = k
        if isinstance(v, bool):
            a.bool_value = v
        elif isinstance(v, int):
            a.int_value = v
        elif isinstance(v, float):
            a.double_value = v
        else:
            a.string_value = str(v)


def build_proto(trace: Trace) -> bytes:
    builder_cls, pb = protos()
    TE = pb.TrackEvent
    builder = builder_cls()
    first = True
    for rank, t in enumerate(trace.tracks):
        p = builder.add_packet()
        p.trusted_packet_sequence_id = SEQUENCE
        if first:
            p.sequence_flags = pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
            first = False
        d = p.track_descriptor
        d.uuid = t.uid
        d.name = t.name
        if t.parent is not None:
            d.parent_uuid = t.parent
            d.sibling_order_rank = rank
        if t.uid == GROUP:
            d.child_ordering = pb.TrackDescriptor.EXPLICIT
        if t.kind == "counter":
            d.counter.unit_name = t.unit
    floats = {t.uid for t in trace.tracks if t.kind == "counter" and t.value_type == "float"}
    for kind, ts, obj in trace.events():
        p = builder.add_packet()
        p.trusted_packet_sequence_id = SEQUENCE
        p.timestamp = ts
        ev = p.track_event
        if kind == "begin":
            ev.type = TE.TYPE_SLICE_BEGIN
            ev.track_uuid = obj.track
            ev.name = obj.name
            _annotate(ev, obj.args)
        elif kind == "end":
            ev.type = TE.TYPE_SLICE_END
            ev.track_uuid = obj.track
        elif kind == "counter":
            track, v = obj
            ev.type = TE.TYPE_COUNTER
            ev.track_uuid = track
            if track in floats:
                ev.double_counter_value = float(v)
            else:
                ev.counter_value = int(v)
        else:
            ev.type = TE.TYPE_INSTANT
            ev.track_uuid = obj.track
            ev.name = obj.name
            _annotate(ev, obj.args)
            if obj.flow_out is not None:
                ev.flow_ids.append(obj.flow_out)
            if obj.flow_in is not None:
                ev.terminating_flow_ids.append(obj.flow_in)
    return builder.serialize()
