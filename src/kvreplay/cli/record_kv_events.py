"""`kvreplay record-kv-events ENDPOINT -o FILE`: record vLLM's KV-cache events.

vLLM started with

    --kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq",
                         "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"}'

publishes, after each engine step that changed the prefix cache, one msgpack batch
[ts, events, dp_rank] on a ZMQ PUB socket as the frames (topic, seq: 8 bytes big-endian,
payload); events are BlockStored / BlockRemoved / AllBlocksCleared. This subscribes, and
with --replay-endpoint first asks vLLM's ROUTER for every batch it still buffers (so
nothing published before the subscription is lost), then writes one JSON object per batch:

    {"seq": 0, "ts": 1764450000.12, "rank": null, "events": [
        {"type": "BlockStored", "block_hashes": ["3f2a9c1b7e4d5a60"], "parent": null,
         "num_tokens": 16, "block_size": 16, "medium": "GPU"},
        {"type": "BlockRemoved", "block_hashes": ["0c1d..."], "medium": "GPU"},
        {"type": "AllBlocksCleared"}]}

Block hashes are 16 hex digits, the same names the step trace uses. Token ids are never
written (BlockStored carries them; only their count is kept).

Such a file is replay input (kvreplay.parsers.kv_event_files reads it; the step-trace replay,
kvreplay.inference.step_trace, checks after every step that the set of blocks vLLM
announced as cached equals the set of cached blocks in kvreplay's block pool).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Iterable

END_SEQ = (-1).to_bytes(8, "big", signed=True)


def _hx(h: Any) -> str | None:
    if h is None:
        return None
    if isinstance(h, (bytes, bytearray)):
        return bytes(h[-8:]).hex()
    if isinstance(h, int):
        return format(h & 0xFFFFFFFFFFFFFFFF, "016x")
    return str(h)


def _event(e: Any) -> dict[str, Any]:
    """One decoded msgpack event (a map tagged by "type", or an array tagged first)."""
    if isinstance(e, (list, tuple)):  # array_like encoders: [tag, field...]
        tag = e[0]
        if tag == "BlockStored":
            keys = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium")
        elif tag == "BlockRemoved":
            keys = ("block_hashes", "medium")
        else:
            keys = ()
        e = {"type": tag, **dict(zip(keys, e[1:]))}
    t = e.get("type")
    out: dict[str, Any] = {"type": t}
    if t in ("BlockStored", "BlockRemoved"):
        out["block_hashes"] = [_hx(h) for h in e.get("block_hashes") or ()]
    if t == "BlockStored":
        out["parent"] = _hx(e.get("parent_block_hash"))
        out["num_tokens"] = len(e.get("token_ids") or ())
        out["block_size"] = e.get("block_size")
    if e.get("medium") is not None:
        out["medium"] = e["medium"]
    if e.get("group_idx"):
        out["group"] = e["group_idx"]
    return out


def decode_batch(seq: int, payload: bytes) -> dict[str, Any]:
    import msgspec

    raw = msgspec.msgpack.decode(payload)
    if isinstance(raw, dict):  # a map-encoded batch
        ts, evs, rank = raw.get("ts"), raw.get("events", []), raw.get("data_parallel_rank")
    else:
        ts, evs = raw[0], raw[1]
        rank = raw[2] if len(raw) > 2 else None
    return {"seq": seq, "ts": ts, "rank": rank, "events": [_event(e) for e in evs]}


def record(
    endpoint: str,
    out,
    *,
    replay_endpoint: str | None = None,
    topic: str = "",
    duration: float | None = None,
    idle_timeout: float | None = None,
    max_batches: int | None = None,
    ready=None,
    catch_up: float = 0.5,
) -> int:
    """Subscribe and write batches to the text stream `out` (one JSON line each, in seq
    order, each seq once). Returns the number of batches written. Stops after `duration`
    seconds, after `idle_timeout` seconds without a batch (once one arrived), after
    `max_batches`, or on KeyboardInterrupt. `ready()` is called once subscribed. With a
    replay endpoint, vLLM's replay buffer is asked every `catch_up` seconds for batches
    after the last one seen, so batches dropped while joining are recovered."""
    try:
        import zmq
    except ImportError:  # pragma: no cover - depends on the install
        from kvreplay.errors import UserError

        raise UserError("record-kv-events needs pyzmq: pip install 'kvreplay[vllm-plugin]'") from None
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
    sub.setsockopt(zmq.RCVHWM, 0)
    sub.setsockopt(zmq.RECONNECT_IVL, 10)  # join vLLM's PUB quickly once it binds
    sub.connect(endpoint)
    poller = zmq.Poller()
    poller.register(sub, zmq.POLLIN)
    dealer = None
    if replay_endpoint:
        dealer = ctx.socket(zmq.DEALER)
        dealer.connect(replay_endpoint)
        dealer.send_multipart((b"", (0).to_bytes(8, "big")))
        poller.register(dealer, zmq.POLLIN)
    if ready is not None:
        ready()
    written = 0
    next_seq = 0
    pending: dict[int, bytes] = {}
    replaying = dealer is not None
    start = time.monotonic()
    last = None
    asked = start  # when the replay buffer was last asked

    def emit() -> None:
        nonlocal next_seq, written
        # In order; while vLLM's replay is still coming, wait for the gap to fill.
        while pending:
            lo = min(pending)
            if lo > next_seq and replaying:
                return
            payload = pending.pop(lo)
            if lo < next_seq:
                continue
            out.write(json.dumps(decode_batch(lo, payload), separators=(",", ":")) + "\n")
            written += 1
            next_seq = lo + 1

    try:
        while True:
            now = time.monotonic()
            if duration is not None and now - start >= duration:
                break
            if idle_timeout is not None and last is not None and now - last >= idle_timeout:
                break
            if max_batches is not None and written >= max_batches:
                break
            if dealer is not None and not replaying and now - asked >= catch_up:
                # A PUB socket drops what it sends while a subscriber is still joining, and
                # nothing tells us: ask vLLM's replay buffer for anything after what we have.
                dealer.send_multipart((b"", next_seq.to_bytes(8, "big")))
                replaying, asked = True, now
            for sock, _ in poller.poll(100):
                if sock is sub:
                    _topic, seq_b, payload = sub.recv_multipart()
                    seq = int.from_bytes(seq_b, "big")
                    if seq >= next_seq:
                        pending[seq] = payload
                        gap = seq > next_seq and not any(k < seq for k in pending if k >= next_seq and k != seq)
                        if gap and dealer is not None and not replaying:
                            # Missed the start (a PUB socket drops what it sent before we
                            # subscribed): ask vLLM's replay buffer for the gap.
                            dealer.send_multipart((b"", next_seq.to_bytes(8, "big")))
                            replaying, asked = True, time.monotonic()
                    last = time.monotonic()
                else:
                    frames = dealer.recv_multipart()
                    _empty, _topic, seq_b, payload = frames[-4:] if len(frames) >= 4 else (b"", b"", END_SEQ, b"")
                    if seq_b == END_SEQ:
                        replaying = False
                    else:
                        seq = int.from_bytes(seq_b, "big")
                        if seq >= next_seq:
                            pending[seq] = payload
                        last = time.monotonic()
            emit()
            out.flush()
    except KeyboardInterrupt:
        pass
    finally:
        replaying = False
        emit()
        out.flush()
        sub.close(linger=0)
        if dealer is not None:
            dealer.close(linger=0)
    return written


# ------------------------------------------------------------------ CLI


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("endpoint", help="vLLM's KV-events PUB endpoint, e.g. tcp://127.0.0.1:5557")
    p.add_argument("-o", "--output", required=True, help="file to write (JSON Lines; '-' = stdout)")
    p.add_argument("--replay-endpoint", help="vLLM's replay_endpoint (ROUTER): fetch what was published before we subscribed")
    p.add_argument("--topic", default="", help="topic filter (vLLM's kv-events-config topic)")
    p.add_argument("--duration", type=float, help="stop after this many seconds")
    p.add_argument("--idle-timeout", type=float, help="stop after this many seconds without a batch")
    p.add_argument("--max-batches", type=int, help="stop after this many batches")


def run(args: argparse.Namespace) -> int:
    out = sys.stdout if args.output == "-" else open(args.output, "w", encoding="utf-8")

    def ready() -> None:
        print(f"record-kv-events: subscribed to {args.endpoint}", file=sys.stderr, flush=True)

    try:
        n = record(
            args.endpoint, out, replay_endpoint=args.replay_endpoint, topic=args.topic,
            duration=args.duration, idle_timeout=args.idle_timeout, max_batches=args.max_batches,
            ready=ready,
        )
    finally:
        if out is not sys.stdout:
            out.close()
    print(f"record-kv-events: {n} batches written to {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":  # `python -m kvreplay.cli.record_kv_events ENDPOINT -o FILE` (no CLI imports)
    _p = argparse.ArgumentParser(prog="kvreplay record-kv-events")
    add_arguments(_p)
    raise SystemExit(run(_p.parse_args()))
