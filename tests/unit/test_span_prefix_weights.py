"""span_prefix.span_weights: a member's weight is the stats lines' times the spans'
likelihood exp(-(its early admissions - the fewest) / SPAN_T); span_prefix.voters: the
replay shown does not vote on its own rows. Expected
values are worked by hand from the constants, not read back from the code under test."""

from __future__ import annotations

import math

import pytest

from kvreplay.inference import span_prefix


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


def test_the_replay_shown_does_not_vote_for_its_own_rows():
    assert span_prefix.voters([0.2, 0.9, 0.4], 1) == [0.2, 0.0, 0.4]
    assert span_prefix.voters([0.0, 1.0], 1) == [0.0, 1.0]  # no one else: all of them
