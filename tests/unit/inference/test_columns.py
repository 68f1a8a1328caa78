"""inference.columns: records held as columns give back equal records (every value of the
same type, -0.0 and nan included), appended one at a time or in blocks, by index, in
order and after pickling; the facts' stats lines and the default-log evidence read the
same through a Table as through a list; and a stats line held so costs a fraction of its
object."""

from __future__ import annotations

import math
import pickle
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from helpers.examples import many
from kvreplay import events as ev
from kvreplay.inference import evidence_metrics as EM
from kvreplay.inference.columns import Column, Table
from kvreplay.inference.facts import StatsPoint
from kvreplay.parsers import parse_files
from kvreplay.sources import read_log

ROOT = Path(__file__).resolve().parents[3]
SAMPLE = ROOT / "src" / "kvreplay" / "samples" / "vllm033_fcfs_heavy.log"
V0 = ROOT / "src" / "kvreplay" / "samples" / "synthetic_v063_preemptions_newyear.log"

VALUE = st.one_of(st.none(), st.booleans(), st.integers(-(2 ** 70), 2 ** 70),
                  st.sampled_from([0, 1, 2 ** 31, -(2 ** 31) - 1, 2 ** 63, 300]),
                  st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, -0.0, 1.5]),
                  st.sampled_from(["a", "b"]))


def _same(a, b) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    return a == b


@many()
@given(st.lists(st.one_of(VALUE, st.lists(VALUE, min_size=1, max_size=5)), max_size=12))
def test_a_column_gives_back_every_value(parts):
    col, want = Column(), []
    for p in parts:  # a value appended, or a block extended
        if isinstance(p, list):
            col.extend(p)
            want += p
        else:
            col.append(p)
            want.append(p)
    assert len(col) == len(want)
    assert all(_same(a, b) for a, b in zip(col, want))
    assert all(_same(col[i], want[i]) for i in range(-len(want), len(want)))
    again = pickle.loads(pickle.dumps(col))
    assert all(_same(a, b) for a, b in zip(again, want))


def test_a_column_is_small_while_its_values_fit():
    assert Column(["server.log"] * 1000).nbytes == 0  # one value: nothing per row
    assert Column([None] * 1000).nbytes == 0
    assert Column(range(1000)).nbytes == 4000  # 32-bit ints
    assert Column([2 ** 40 + k for k in range(1000)]).nbytes == 8000
    assert Column([0.5 * k for k in range(1000)]).nbytes == 8000
    assert Column([None, *range(999)]).nbytes == 5000  # (and a byte of None mask a row)
    assert "list" in repr(Column([1, 1.0]))  # an int and a float: kept as given


def _points(path: Path) -> list[StatsPoint]:
    """The stats points built here from the parsed events, as collect defines them (the
    first engine's lines with a time; usage in percent -> fraction)."""
    out, seq, engine = [], 0, None
    for e in parse_files([str(path)], year=2026):
        if isinstance(e, (ev.RequestReceived, ev.HttpAccess)):
            seq += isinstance(e, ev.RequestReceived) or (e.method == "POST" and e.status == 200 and any(
                p in e.path for p in ("/completions", "/generate", "/responses", "/chat")))
        if not isinstance(e, ev.Stats) or e.time is None:
            continue
        engine = (e.engine or 0) if engine is None else engine
        if (e.engine or 0) != engine:
            continue
        seq += 1
        out.append(StatsPoint(
            index=len(out), time=e.time, file=e.file, line=e.line, running=e.running,
            waiting=e.waiting, kv_usage=None if e.gpu_kv_usage is None else e.gpu_kv_usage / 100.0,
            prompt_throughput=e.prompt_throughput, generation_throughput=e.generation_throughput,
            preemptions=e.preemptions, prefix_cache_hit_rate=e.prefix_cache_hit_rate,
            swapped=e.swapped, cpu_kv_usage=None if e.cpu_kv_usage is None else e.cpu_kv_usage / 100.0,
            seq=seq))
    return out


def test_facts_stats_read_back_as_the_points_of_the_log():
    for path in (SAMPLE, V0):
        stats = read_log([str(path)], year=2026).facts.stats
        want = _points(path)
        assert isinstance(stats, Table) and len(stats) == len(want) > 0
        fields = [f for f in StatsPoint.__slots__ if f not in ("arrivals_before", "completions_before")]
        for got, exp in zip(stats, want):
            assert all(_same(getattr(got, f), getattr(exp, f)) for f in fields), (got, exp)
        assert stats[-1] == list(stats)[-1] and stats[0:3] == list(stats)[0:3]
        assert pickle.loads(pickle.dumps(stats)) == stats


def test_a_stats_line_costs_a_fraction_of_its_object():
    t = Table(StatsPoint)
    for k in range(20_000):
        t.add(index=k, time=1.7e9 + 10.0 * k, file="server.log", line=100_000 + k, running=k % 200,
              waiting=k % 7, kv_usage=(k % 1000) / 1000, prompt_throughput=float(k % 300),
              generation_throughput=float(k % 900), preemptions=0, prefix_cache_hit_rate=0.25,
              arrivals_before=k // 3, completions_before=k // 4, seq=k)
    # the object is 16 + 8 per field (17) with its GC header, its own ints and floats more
    assert t.nbytes / len(t) <= 72
    assert t[12_345].line == 112_345 and t[12_345].time == 1.7e9 + 123_450.0


def test_evidence_reads_the_same_from_a_table_and_a_list():
    facts = read_log([str(SAMPLE)], year=2026).facts
    stats = list(facts.stats)
    ev_t = EM.from_stats(iter(stats), [s.completions_before for s in stats], len(facts.completions), 10.0)
    assert isinstance(ev_t.windows, Table)
    ev_l = EM.MetricsEvidence(list(ev_t.windows), [], ev_t.interval_s, ev_t.late_finishes, ev_t.late_arrivals)
    assert ev_l.windows == ev_t.windows and len(ev_l.windows) == len(stats)
    for k in ("t1", "running", "prompt_tokens", "arrivals"):
        assert list(ev_t.column(k)) == [getattr(w, k) for w in ev_l.windows]
    assert ev_t.requests == ev_l.requests and ev_t.totals() == ev_l.totals()
    assert EM.step_time(ev_t) == EM.step_time(ev_l) and EM.busy_intervals(ev_t) == EM.busy_intervals(ev_l)
