"""Request spans: an idle engine's step grid (span_clock.idle_period) and prefix caching
without prompt bodies (span_prefix.py): the spans are used, the run is not pinned, so the
report carries the uncertainty object and calls no row sure."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from kvreplay.inference.span_clock import SpanMarks, idle_period
from kvreplay.sources import open_replay

F = Path(__file__).parents[1] / "data" / "logcases" / "f_prefix_caching"


def _marks(gaps: list[float], busy: float = 0.3) -> SpanMarks:
    """One request per busy stretch: it enters, is scheduled at once, its first token
    after 20 ms, its last `busy` s after it entered; the next enters `gap` after that."""
    m = SpanMarks([], [], [], [], [])
    t = 1000.0
    for g in [0.0, *gaps]:
        t += g
        m.entry.append(t)
        m.scheduled.append(t)
        m.first_token.append(t + 0.02)
        m.last_token.append(t + busy)
        m.has_span.append(True)
        t += busy
    return m


def test_idle_grid_found_from_run_dry_gaps():
    rng = random.Random(3)
    # gaps a whole number of 10 ms idle steps, each end stamped to the microsecond
    gaps = [round(rng.randrange(20, 400) * 0.01, 6) for _ in range(6)]
    d = idle_period(_marks(gaps))
    assert d is not None and abs(d - 0.01) < 1e-6


def test_no_idle_grid_without_one():
    rng = random.Random(4)
    # an engine that waits idle (vLLM's engine core): gaps of any length
    assert idle_period(_marks([rng.uniform(0.2, 4.0) for _ in range(8)])) is None
    # too few run-dry gaps to tell a grid from chance (0.02 and 0.01 both fit two)
    assert idle_period(_marks([0.2, 2.02])) is None
    # a request that enters while another still runs is no run-dry gap
    m = _marks([0.2, 2.02, 0.37])
    assert idle_period(m) is not None
    m.entry[2] = m.last_token[1] - 0.1
    assert idle_period(m) is None


@pytest.fixture(scope="module")
def f_plain():
    return open_replay([str(F / "server.otlp.log"), str(F / "spans.otlp.jsonl")])


def test_prefix_caching_without_prompts_uses_the_spans(f_plain):
    rep = f_plain
    assert rep.summary()["spans"]["arrivals"] == "spans"
    assert any("prefix caching on, prompts not logged" in n for n in rep.notes)


def test_prefix_caching_without_prompts_is_not_called_sure(f_plain):
    rep = f_plain
    truth = json.loads((F / "truth.json").read_text())
    unc = rep.uncertainty
    assert unc is not None and unc.samples > 0
    c = unc.preemptions
    assert c["low"] <= len(truth["preemptions"]) <= c["high"]  # 10 (truth.json)
    assert rep.preemptions
    for q in rep.preemptions:
        assert q.confidence not in ("exact", "exact-by-log", "consistent")
        assert q.probability is not None
    # the rows it calls likely are true preemptions (victim within 5 steps)
    true = [(p["step"], p["victim_log_id"]) for p in truth["preemptions"]]
    for q in rep.preemptions:
        if q.probability >= 0.8:
            assert any(v == q.victim and abs(s - q.step) <= 5 for s, v in true)
