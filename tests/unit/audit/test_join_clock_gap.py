"""Scrapes whose clock cannot be the log's (audit/join.match_span, issue 31): not joined,
and the one line says how far apart the two spans are; a whole number of quarter hours is
still taken as the log's time zone and joined."""

from __future__ import annotations

from types import SimpleNamespace

from kvreplay.audit.join import match_span


def _scrapes(*times: float) -> list:
    return [SimpleNamespace(time=t, values={"0": {"running": 1.0}}, model="m") for t in times]


def test_scrapes_an_hour_and_five_minutes_later_are_not_joined() -> None:
    shift, how = match_span("m", (1000.0, 1100.0), _scrapes(5000.0, 5015.0, 5100.0), "0")
    assert shift is None
    # 5000 - 1100 = 3900 s = 65 min after the log ends
    assert how.startswith("not joined: the scrapes' time span does not overlap the log's")
    assert "they start 65 min after it ends" in how and "host clock" in how


def test_scrapes_ending_before_the_log_say_so() -> None:
    shift, how = match_span("m", (10_000.0, 10_100.0), _scrapes(9_000.0, 9_050.0), "0")
    assert shift is None and "they end 950 s before the log starts" not in how
    assert "they end 16 min before the log starts" in how  # 10000 - 9050 = 950 s


def test_a_time_zone_away_is_joined() -> None:
    shift, how = match_span("m", (1000.0, 1100.0), _scrapes(1000.0 - 7200, 1100.0 - 7200), "0")
    assert shift == 7200.0 and "+2.00 h" in how
