"""Hypothesis example counts by the cost of one example, scaled by the active profile
(tests/conftest.py: `ci` by default, `thorough` on demand). A test says how costly its
examples are, never how many to run:

    @settings(few())     # one example replays a log or runs a workload: profile / 5
    @given(...)          # (no settings) the profile's count
    @settings(many())    # one example parses a line or two: profile x 4
"""

from __future__ import annotations

from hypothesis import settings


def few() -> settings:
    return settings(max_examples=max(5, settings.default.max_examples // 5))


def many() -> settings:
    return settings(max_examples=settings.default.max_examples * 4)
