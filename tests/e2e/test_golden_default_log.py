"""The golden-log plugin on a default log (no request lines; issue 30): a golden of its
answer's intervals ([default_log], one [windows] line per stats interval) instead of a
golden of a refusal; it round-trips, and a changed interval shows as a mismatch."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from kvreplay.pytest_plugin import golden as g

pytest_plugins = ["pytester"]

B_LOG = Path(__file__).parents[1] / "data" / "logcases" / "b_fcfs_heavy" / "server.log"
_INNER = tuple(a for p in ("textual-snapshot", "cacheprovider", "benchmark", "hypothesispytest",
                           "syrupy") for a in ("-p", f"no:{p}"))


def _default_text() -> str:
    assert B_LOG.is_file()
    return "".join(x for x in B_LOG.read_text().splitlines(True)
                   if "Received request" not in x and "request_logger" not in x)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> g.Golden:
    log = tmp_path_factory.mktemp("dl") / "b.default.log"
    log.write_text(_default_text())
    return g.build(log, year=2026)


def test_the_golden_holds_the_intervals(built: g.Golden) -> None:
    doc = built.doc
    assert "error" not in doc["replay"] and "preemptions" not in doc
    d = doc["default_log"]
    assert d["requests"] == 12  # b's 12 requests, from the stats and access lines
    assert d["certainty"] == "interval" and d["victims"] == "none named"
    assert d["preemptions_low"] <= 5 <= d["preemptions_high"]  # b's truth: 5
    assert d["preemptions_low"] <= d["preemptions_median"] <= d["preemptions_high"]
    assert 0.0 < d["recompute_ratio_low"] <= d["recompute_ratio_high"] <= 1.0
    wins = doc["windows"]
    assert len(wins) == 6  # b's six stats lines
    assert [w["end"] for w in wins[:3]] == ["10:01:00", "10:01:01", "10:01:02"]  # hand-read
    text = g.render(built)
    assert "[default_log]" in text and "\nstart=10:00:59 end=10:01:00 median=" in text
    assert g.parse(text) == doc  # round trip
    changed = copy.deepcopy(doc)
    changed["windows"][1]["high"] += 1
    mm = g.compare(doc, changed)
    assert mm is not None and any("windows #2" in s and "high" in s for s in mm.summary)
    assert g.normalize_fields("windows.high,default_log") == ["windows.high", "default_log"]
    with pytest.raises(g.GoldenUsageError):
        g.normalize_fields("windows.victim")


def test_update_then_pass(pytester: pytest.Pytester, built: g.Golden) -> None:
    (pytester.path / "quiet.log").write_text(_default_text())
    pytester.makepyfile(test_quiet="""
import pytest

@pytest.mark.kvreplay(year=2026)
def test_quiet(kvreplay_golden):
    kvreplay_golden.check("quiet.log")
""")
    pytester.runpytest(*_INNER, "--kvreplay-update").assert_outcomes(passed=1)
    text = (pytester.path / "golden" / "test_quiet.golden").read_text()
    assert "\n[default_log]\n" in text and "\n[windows]\n" in text and "\n[preemptions]\n" not in text
    assert "# NOTE: a default log (no request lines)" in text
    pytester.runpytest(*_INNER).assert_outcomes(passed=1)
