"""parsers.compact.EventList: a log's events with stats lines packed give back the same
events (every field, in order, by index), and a packed stats line costs a fraction of
its Struct."""

from __future__ import annotations

import math
import pickle
from pathlib import Path

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from helpers.examples import many
from kvreplay import events as ev
from kvreplay.parsers import detect_version, merge_config, parse_files
from kvreplay.parsers.compact import EventList
from kvreplay.sources import read_log

ROOT = Path(__file__).resolve().parents[3]
SAMPLE = ROOT / "src" / "kvreplay" / "samples" / "vllm033_fcfs_heavy.log"
V0 = ROOT / "src" / "kvreplay" / "samples" / "synthetic_v063_preemptions_newyear.log"


def _bytes(events) -> list[bytes]:
    # msgpack keeps nan (JSON would make it null) and float vs int
    return [msgspec.msgpack.encode(e) for e in events]


def test_real_logs_round_trip():
    for p in (SAMPLE, V0):
        parsed = list(parse_files([str(p)], year=2026))
        packed = EventList(parsed)
        assert packed.packed == sum(isinstance(e, ev.Stats) for e in parsed) > 0
        assert len(packed) == len(parsed)
        assert _bytes(packed) == _bytes(parsed)
        assert [type(e) for e in packed] == [type(e) for e in parsed]
        n = len(parsed)
        for i in range(-n, n):
            assert packed[i] == parsed[i]
        assert packed[3:40:3] == parsed[3:40:3]
        again = pickle.loads(pickle.dumps(packed))  # (a process pool's argument)
        assert isinstance(again, EventList) and _bytes(again) == _bytes(parsed)
        # every other event is the parsed object itself
        assert all(a is b for a, b in zip(packed, parsed) if not isinstance(b, ev.Stats))


NUM = st.one_of(st.none(), st.integers(-(2 ** 63), 2 ** 63 - 1))
FLT = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True))
TXT = st.one_of(st.none(), st.text(max_size=20))


@many()
@given(st.lists(st.builds(
    ev.Stats, file=st.text(max_size=30), line=st.integers(0, 2 ** 63 - 1), era=st.sampled_from(["v0", "v1", "x"]),
    time=FLT, time_text=TXT, level=TXT, process=TXT, pid=NUM, engine=NUM, source=TXT, note=TXT,
    wrapper_time=FLT, truncated=st.booleans(), repeat=NUM, prompt_throughput=FLT, running=NUM, waiting=NUM,
    preemptions=NUM, kv_device=TXT, gpu_kv_usage=FLT, prefix_cache_hit_rate=FLT, max_iteration_ms=FLT,
    avg_time_per_token_ms=FLT), max_size=8))
def test_any_stats_event_round_trips(stats):
    mixed = []
    for k, s in enumerate(stats):
        mixed += [s, ev.Noise(file="f", line=k, what="blank")] if k % 2 else [s]
    packed = EventList(mixed)
    assert _bytes(packed) == _bytes(mixed)
    for a, b in zip(packed, mixed):
        for f in ev.Stats.__struct_fields__ if isinstance(b, ev.Stats) else ():
            x, y = getattr(a, f), getattr(b, f)
            assert type(x) is type(y) and (x == y or (isinstance(x, float) and math.isnan(x) and math.isnan(y)))


def test_a_packed_stats_line_is_small():
    line = next(s for s in SAMPLE.read_text().splitlines() if "Avg prompt throughput" in s)
    one = list(parse_files([str(SAMPLE)], year=2026))
    stats = [e for e in one if isinstance(e, ev.Stats)][0]
    packed = EventList(msgspec.structs.replace(stats, line=100_000 + k) for k in range(5000))
    # the Struct alone is 16 + 8 per field (36 fields): ~300 bytes; a row is its values'
    # MessagePack with the strings numbered
    per_row = len(packed._buf) / packed.packed
    assert len(ev.Stats.__struct_fields__) * 8 > 250 and per_row < 80, (per_row, line[:80])


def test_read_log_holds_the_events_packed_and_detects_as_before():
    log = read_log([str(SAMPLE)], year=2026)
    parsed = list(parse_files([str(SAMPLE)], year=2026))
    assert isinstance(log.events, EventList) and log.events.packed > 0
    assert _bytes(log.events) == _bytes(parsed)
    assert log.dialect == detect_version(parsed)
    assert log.config == merge_config(parsed)
