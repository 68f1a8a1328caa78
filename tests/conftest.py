"""Shared test setup: Hypothesis profiles, the data folder, and assertion rewriting in the
helpers package.

Hypothesis profiles (example counts live here and in helpers/examples.py, never in a test):
- `ci` (default): a fixed, derandomized set of examples, so CI is quick and repeatable;
- `thorough`: ten times the examples, freshly drawn each run, for a search before a release
  or after a change to the model: `pytest --hypothesis-profile=thorough` or
  `KVREPLAY_HYPOTHESIS_PROFILE=thorough pytest`.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

pytest.register_assert_rewrite("helpers")

# An example may replay a whole log: no per-example deadline, and a slow or fixture-using
# test is not an error. Counts per example cost: helpers/examples.py (few / many).
_COMMON = dict(deadline=None, print_blob=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
settings.register_profile("ci", max_examples=50, derandomize=True, **_COMMON)
settings.register_profile("thorough", max_examples=500, derandomize=False, **_COMMON)  # (under CI=true Hypothesis defaults to derandomize)
settings.load_profile(os.environ.get("KVREPLAY_HYPOTHESIS_PROFILE", "ci"))

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="session")
def data_dir() -> Path:
    return DATA


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that drives vLLM's own scheduler is slow too (vLLM's import alone takes ~6 s):
    `-m "not slow"` is the quick run."""
    for item in items:
        if item.get_closest_marker("needs_vllm") and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)
