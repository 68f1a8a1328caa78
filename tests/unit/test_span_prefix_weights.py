"""span_prefix.span_weights: a member's weight is the stats lines' times the spans'
likelihood exp(-(its early admissions - the fewest) / SPAN_T); span_prefix.ROW_MAP: a row's
raw share maps to how often such rows were right on the calibration renders. Expected
values are worked by hand from the constants, not read back from the code under test."""

from __future__ import annotations

import math

import pytest

from kvreplay.inference import span_prefix
from kvreplay.inference.uncertainty import calibrated


def test_members_that_disagree_with_the_spans_weigh_less(monkeypatch):
    monkeypatch.setattr(span_prefix, "SPAN_T", 10.0)
    w = span_prefix.span_weights([1.0, 0.5, 1.0], [3, 3, 23])
    # fewest early admissions 3: the first two keep their stats weight, the third,
    # 20 more requests admitted before the spans say, loses e^-2
    assert w[0] == pytest.approx(1.0)
    assert w[1] == pytest.approx(0.5)
    assert w[2] == pytest.approx(math.exp(-2.0))
    # equal counts: the stats lines' weights alone
    assert span_prefix.span_weights([0.2, 0.7], [8, 8]) == pytest.approx([0.2, 0.7])


def test_span_weights_off_leaves_the_stats_weights(monkeypatch):
    monkeypatch.setattr(span_prefix, "SPAN_T", 0.0)
    assert span_prefix.span_weights([0.3, 0.9], [90, 10]) == [0.3, 0.9]


def test_no_row_share_reads_as_likely():
    # every member preempting the row's victim at its step still says 14%: on the
    # calibration renders no share band named the true victim more often than 5 of 36
    assert calibrated(1.0, span_prefix.ROW_MAP) == pytest.approx(0.14)
    assert calibrated(0.05, span_prefix.ROW_MAP) == pytest.approx(0.03)
    assert calibrated(0.2, span_prefix.ROW_MAP) == pytest.approx(0.055)  # halfway 0.03-0.08
    assert calibrated(0.0, span_prefix.ROW_MAP) == 0.0
    assert all(y < 0.8 for _, y in span_prefix.ROW_MAP)
