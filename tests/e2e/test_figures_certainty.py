"""Every view gives a figure with its certainty, as the report does: the audit tables and
`--summarize` an interval where the record has one, a `~` on figures from estimated prompt
lengths, the TUI status bar the report's interval; counts said in words."""

from __future__ import annotations

from types import SimpleNamespace

from kvreplay.replay.result import CountEstimate
from kvreplay.audit.report import audit_text, fleet_columns, fmt, shown_row
from kvreplay.tui.panel_text import preemption_count
from kvreplay.words import count


def test_audit_rows_show_the_interval_and_mark_estimates() -> None:
    r = {"log": "a.log", "engine": None, "status": "not established", "status_evidence": "-",
         "preemptions_replayed": 51,
         "preemptions_replayed_low": 23, "preemptions_replayed_high": 69,
         "recompute_ratio": 0.123, "recompute_source": "replay (prompt lengths estimated)"}
    s = shown_row(r)
    assert s["preemptions_replayed"] == "23-69" and s["recompute_ratio"] == "~12.3%"
    exact = dict(r, preemptions_replayed_low=5, preemptions_replayed_high=5,
                 recompute_source="replay")
    assert shown_row(exact)["preemptions_replayed"] == 51
    assert shown_row(exact)["recompute_ratio"] == 0.123
    text = audit_text([r])
    assert "23-69" in text and "~12.3%" in text and " eng " not in text.splitlines()[2]


def test_eng_column_only_for_data_parallel_logs() -> None:
    assert ("engine", "eng") not in fleet_columns([{"engine": None}])
    assert ("engine", "eng") in fleet_columns([{"engine": None}, {"engine": 1}])


def test_knee_is_the_settings_integer() -> None:
    assert fmt(29.0, "knee_median") == "29" and fmt(2.0, "knee_min") == "2"
    assert fmt(29.5, "knee_median") == "29.5"


def test_tui_status_gives_the_reports_interval() -> None:
    unc = SimpleNamespace(preemptions={"low": 23, "high": 69, "median": 38})
    assert preemption_count(SimpleNamespace(uncertainty=unc, estimate=None), 51) == \
        "23-69 preemptions (90%; this replay 51)"
    rough = CountEstimate(preemptions_low=25, preemptions_high=55, preemptions_median=38,
                          variants={}, why="", make_it_exact="")
    assert preemption_count(SimpleNamespace(uncertainty=None, estimate=rough), 38) == \
        "25-55 preemptions (rough range; this replay 38)"
    pinned = SimpleNamespace(preemptions={"low": 5, "high": 5})
    assert preemption_count(SimpleNamespace(uncertainty=pinned, estimate=None), 5) == "5 preemptions"
    assert preemption_count(SimpleNamespace(uncertainty=None, estimate=None), 1) == "1 preemption"


def test_counts_in_words() -> None:
    assert count(1, "self-preemption") == "1 self-preemption"
    assert count(2, "self-preemption") == "2 self-preemptions"
    assert count(12000, "request") == "12,000 requests"
