"""The report's two probabilities are named for what each is about (issue 31): a request's
p (preempted at least once, at any step) and a row's p (that victim at that step), so
"5 requests with p >= 0.8" beside "5 of 5 rows are leads" is no contradiction."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvreplay.cli.replay_report import probability_line

LOGCASES = Path(__file__).resolve().parents[2] / "data" / "logcases"


def _u(ps: list[float]) -> dict:
    return {"requests": [{"id": f"r{i}", "p_preempted": p} for i, p in enumerate(ps)]}


def test_requests_and_rows_are_named_apart() -> None:
    # five requests surely preempted, but no row pins when: every row is a lead
    rows = [SimpleNamespace(probability=p) for p in (0.34, 0.33, 0.43, 0.35, 0.33)]
    line = probability_line(_u([1.0, 1.0, 0.9, 0.85, 0.8, 0.2]), rows)
    assert "requests preempted at least once (at any step): 5 requests with p >= 0.8" in line
    assert "5 with p >= 0.5, 6 with p > 0" in line
    assert "table rows (that victim within 5 steps of that step): 5 of 5 rows are leads (p < 0.5)" in line


def test_one_lead_and_rows_without_probability() -> None:
    rows = [SimpleNamespace(probability=0.49), SimpleNamespace(probability=0.5),
            SimpleNamespace(probability=None)]
    line = probability_line(_u([0.5, 0.49]), rows)
    assert "1 request with p >= 0.8" not in line and "0 requests with p >= 0.8" in line
    assert "1 with p >= 0.5, 2 with p > 0" in line
    assert "1 of 2 rows is a lead (p < 0.5)" in line


def test_no_rows_says_nothing_about_rows() -> None:
    line = probability_line(_u([0.9]), [])
    assert "1 request with p >= 0.8" in line and "rows" not in line


@pytest.mark.slow
def test_the_report_counts_what_its_table_shows() -> None:
    """On b's stats-line log (no Iteration lines): the leads the headline and the requests
    line count are the table's rows marked lead; the requests are the JSON's."""
    log = LOGCASES / "b_fcfs_heavy" / "server.log"
    assert log.is_file()
    out = subprocess.run([sys.executable, "-m", "kvreplay", "replay", str(log)],
                         capture_output=True, text=True, check=True).stdout
    table = [ln for ln in out.splitlines() if re.match(r"^\s+\d+\s+\d\d:\d\d:\d\d\.\d{3}\s", ln)]
    leads = sum(1 for ln in table if ln.endswith("  lead"))
    assert table and leads == 4  # hand-read: 4 of b's 5 stats-line rows are leads
    head = next(ln for ln in out.splitlines() if "HEADLINE" in ln)
    assert f"{leads} of {len(table)} rows are leads (p < 0.5 that the row's victim" in head
    req = next(ln for ln in out.splitlines() if "requests preempted at least once" in ln)
    assert f"{leads} of {len(table)} rows are leads" in req
    assert "3 requests with p >= 0.8" in req
