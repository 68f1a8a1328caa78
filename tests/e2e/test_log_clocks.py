"""Log files on different clocks (kvreplay.cli.clocks, issue 31): the same log given twice
(as is, or shifted by another host's clock) is refused with one line and exit 2; two files
logging stats over the same stretch are refused; rotated parts of one log whose clocks are
a few seconds apart are merged with one warning line."""

from __future__ import annotations

import datetime
import re
from pathlib import Path

import pytest

from kvreplay.cli import main

LOGCASES = Path(__file__).parents[1] / "data" / "logcases"
B_LOG = LOGCASES / "b_fcfs_heavy" / "server.log"  # 12 requests, 10:01:00-10:01:03
P1_LOG = LOGCASES / "p1_poisson_fcfs_200" / "server.log"
STAMP = re.compile(r"(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)")


def _shift(lines: list[str], seconds: int) -> list[str]:
    def one(line: str) -> str:
        m = STAMP.search(line)
        if not m:
            return line
        t = datetime.datetime(2026, *map(int, m.groups())) + datetime.timedelta(seconds=seconds)
        return line[:m.start()] + t.strftime("%m-%d %H:%M:%S") + line[m.end():]
    return [one(x) for x in lines]


def _run(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(["replay", "--samples", "0", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _split_p1(tmp_path: Path, shift: int) -> tuple[Path, Path]:
    """p1's log cut after its stats line of 10:01:08; the second part shifted by `shift` s."""
    assert P1_LOG.is_file()
    lines = P1_LOG.read_text().splitlines(True)
    cut = next(i for i, x in enumerate(lines) if "throughput" in x and "10:01:08" in x) + 1
    a, b = tmp_path / "part1.log", tmp_path / "part2.log"
    a.write_text("".join(lines[:cut]))
    b.write_text("".join(_shift(lines[cut:], shift)))
    return a, b


def test_the_same_log_twice_is_refused(tmp_path: Path, capsys) -> None:
    assert B_LOG.is_file()
    copy = tmp_path / "copy.log"
    copy.write_text(B_LOG.read_text())
    rc, out, err = _run(capsys, str(B_LOG), str(copy))
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "copy.log logs the same 12 requests" in err and "at the same times" in err


def test_the_same_log_on_another_clock_is_refused_with_its_shift(tmp_path: Path, capsys) -> None:
    assert B_LOG.is_file()
    later = tmp_path / "later.log"
    later.write_text("".join(_shift(B_LOG.read_text().splitlines(True), 3600)))
    rc, out, err = _run(capsys, str(B_LOG), str(later))
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert "later.log logs the same 12 requests" in err and "+3600.0 s later" in err


def test_two_stats_logs_over_the_same_minute_are_refused(capsys) -> None:
    # b's and p1's runs: each logs from 10:00:05, b's until 10:01:05, p1's until 10:01:30
    assert B_LOG.is_file() and P1_LOG.is_file()
    rc, out, err = _run(capsys, str(B_LOG), str(P1_LOG))
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert "server.log starts 60 s before" in err and "two servers, or one file's clock" in err


@pytest.mark.slow
def test_parts_a_few_seconds_apart_are_merged_with_a_warning(tmp_path: Path, capsys) -> None:
    a, b = _split_p1(tmp_path, -4)
    rc, out, err = _run(capsys, str(a), str(b))
    assert rc == 0 and "preemptions" in out
    warn = [x for x in err.splitlines() if "warning" in x]
    assert warn == [f"kvreplay: warning: {b} starts 4.0 s before {a} ends: parts "
                    "of one log on clocks up to 4.0 s apart? merged by time as logged"]


@pytest.mark.slow
def test_parts_in_order_merge_without_a_word(tmp_path: Path, capsys) -> None:
    a, b = _split_p1(tmp_path, 0)
    rc, out, err = _run(capsys, str(a), str(b))
    assert rc == 0 and "warning" not in err
