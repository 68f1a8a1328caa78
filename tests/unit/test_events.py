"""The event model: one tagged union, JSON Lines round trip, stable bytes."""

from __future__ import annotations

import msgspec
import pytest

from kvreplay import events as ev


def _example(t: type) -> object:
    """An instance of event type `t` with every required field filled."""
    req = {
        "origin": "init", "request_id": "r1", "request_ids": ["a", "b"], "era": "v1", "step": 3, "context_requests": 1,
        "context_tokens": 2, "generation_requests": 3, "generation_tokens": 4, "elapsed_ms": 1.5, "method": "POST",
        "path": "/v1/completions", "status": 200, "category": "oom", "message": "m", "head": "h", "what": "blank",
        "reason": "r", "text": "t",
    }
    fields = {f: req[f] for f in t.__struct_fields__ if f in req}
    return t(file="x.log", line=7, time=1.5, process="APIServer", pid=3, engine=0, **fields)


def test_one_tagged_union_with_unique_kinds():
    kinds = [t.__struct_config__.tag for t in ev.EVENT_TYPES]
    assert len(kinds) == len(set(kinds))
    assert {"stats", "preemption", "request_received", "unparsed", "engine_config", "kv_capacity", "iteration"} <= set(kinds)
    for t in ev.EVENT_TYPES:
        assert {"file", "line", "time", "time_text", "process", "pid", "engine"} <= set(t.__struct_fields__)


@pytest.mark.parametrize("t", ev.EVENT_TYPES, ids=lambda t: t.__struct_config__.tag)
def test_jsonl_round_trip(t):
    e = _example(t)
    data = ev.encode_jsonl([e, e])
    assert data.count(b"\n") == 2
    assert data.startswith(b'{"kind":"%s"' % t.__struct_config__.tag.encode())
    back = ev.decode_jsonl(data)
    assert back == [e, e]
    assert ev.encode_jsonl(back) == data  # byte-identical


def test_streaming_encoder_matches_batch():
    es = [_example(t) for t in ev.EVENT_TYPES] * 5
    assert b"".join(ev.iter_encode_jsonl(es, batch=3)) == ev.encode_jsonl(es)


def test_none_fields_are_omitted_and_kind_is_required():
    e = ev.RequestAdded(file="f", line=1, request_id="x")
    assert msgspec.json.decode(ev.encode_jsonl([e])) == {"kind": "request_added", "file": "f", "line": 1, "request_id": "x"}
    with pytest.raises(msgspec.ValidationError):
        ev.decode_jsonl(b'{"file":"f","line":1}\n')
    with pytest.raises(msgspec.ValidationError):
        ev.decode_jsonl(b'{"kind":"nope","file":"f","line":1}\n')
