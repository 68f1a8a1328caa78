"""`kvreplay watch`: what it prints for a finished log is what `kvreplay replay` says of
the same lines, however the lines arrived; the follower's cases (rotation, truncation,
stdin, a restart banner); Ctrl-C and bad input as every command ends them."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvreplay.cli.watch import row_text
from kvreplay.live.session import IntervalRow, PreemptionRow, Session
from kvreplay.samples import DEFAULT_LOG, DEFAULT_LOG_YEAR, sample_path
from kvreplay.sources import open_replay
from tools.oracle.bursty_log import render_bursty

DATA = Path(__file__).parent.parent / "data"
CASES = DATA / "logcases"
B_EXACT = CASES / "b_fcfs_heavy" / "server.iter.reqbody.log"


def _watch(lines: list[str], chunk: int, label: str, **kw) -> list:
    """A session fed `chunk` lines at a time and replayed after each (the most replays any
    pace could make), then ended: every row it printed, in order."""
    s = Session(label, **kw)
    rows: list = []
    for i in range(0, len(lines), chunk):
        rows += s.feed(lines[i:i + chunk])
        rows += s.update()
    return rows + s.finish(end=True)


def _net(rows: list) -> list[tuple]:
    """The rows standing at the end: each given row minus the ones withdrawn later."""
    out: list[tuple] = []
    for r in rows:
        if isinstance(r, PreemptionRow):
            k = (r.run, r.step, r.victim, r.trigger, r.tokens_lost, r.confidence, r.rule)
        elif isinstance(r, IntervalRow):
            k = (r.run, r.start, r.end, r.median, r.low, r.high)
        else:
            continue
        if r.event == "withdrawn":
            out.remove(k)
        else:
            out.append(k)
    return sorted(out)


def _offline(path: Path, year: int | None = None) -> tuple[list[tuple], list[tuple]]:
    """(preemption rows, interval rows) of `kvreplay replay` on the file."""
    rep = open_replay([str(path)], year=year)
    rule = lambda p: (p.victim_rule or "").split(":")[0] + (  # noqa: E731  (the report's)
        " self" if p.self_preemption and p.victim_rule != "self" else "")
    pre = sorted((1, p.step, p.victim, p.trigger, p.computed_tokens_lost, p.confidence, rule(p))
                 for p in rep.preemptions)
    unc = rep.uncertainty.to_json() if rep.uncertainty is not None else None
    wins = sorted((1, w["start"], w["end"], w["median"], w["low"], w["high"])
                  for w in (unc["windows"] if unc else []) if w["high"] > 0)
    return pre, wins


def _lines(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8", errors="replace", newline="\n") as f:
        return f.readlines()


FAST = ["b_fcfs_heavy/server.iter.reqbody.log", "f_prefix_caching/server.iter.reqbody.log"]
SLOW = ["b_fcfs_heavy/server.iter.log", "f_prefix_caching/server.iter.log",
        "p1_poisson_fcfs_200/server.iter.reqbody.log", "p1_poisson_fcfs_200/server.iter.log",
        "b_fcfs_heavy/server.log", "f_prefix_caching/server.log",
        "b_fcfs_heavy/server.reqbody.log", "p1_poisson_fcfs_200/server.log"]


# p1 without its request bodies: each replay of a prefix runs an ensemble (a minute): 3 pieces
PIECES = {"p1_poisson_fcfs_200/server.iter.log": 3, "p1_poisson_fcfs_200/server.log": 3}


@pytest.mark.parametrize("name", FAST + [pytest.param(n, marks=pytest.mark.slow) for n in SLOW])
def test_printed_rows_equal_the_offline_replay(name):
    """Replayed after every 40 lines (a tenth of the log for a long one; each prefix a log
    cut there), the rows standing at the end are the offline replay's: its preemptions, or
    (stats lines only) its intervals."""
    path = CASES / name
    assert path.is_file()
    lines = _lines(path)
    chunk = max(40, len(lines) // PIECES.get(name, 10))
    rows = _watch(lines, chunk, str(path), mtime=os.path.getmtime(path))
    pre, wins = _offline(path)
    assert [r.event for r in rows].count("mode") == 1 and rows[0].event == "mode"
    if "stats lines only" in rows[0].text:
        assert _net(rows) == wins and wins
        assert not any(isinstance(r, PreemptionRow) for r in rows)
    else:
        assert _net(rows) == pre and pre


def test_exact_prompts_give_truths_preemptions_without_withdrawal():
    """b with its request bodies: every row the truth has (victim, step, tokens lost),
    each printed once, none withdrawn, in step order."""
    truth = json.loads((CASES / "b_fcfs_heavy" / "truth.json").read_text())
    rows = [r for r in _watch(_lines(B_EXACT), 25, str(B_EXACT)) if isinstance(r, PreemptionRow)]
    assert [(r.step, r.victim, r.tokens_lost) for r in rows] == [
        (p["step"], p["victim_log_id"], p["num_computed_tokens_before"]) for p in truth["preemptions"]]
    assert all(r.event == "preemption" and r.confidence == "exact-by-log" for r in rows)


def test_a_row_comes_within_a_line_of_its_step():
    """Fed one line at a time (settle 1): a preemption at step s is not printed when the
    Iteration line of step s has arrived, and is when that of step s + 1 has."""
    truth = [41, 137, 191, 338, 386]  # truth.json's steps
    s = Session(str(B_EXACT))
    printed: dict[int, int] = {}
    for line in _lines(B_EXACT):
        s.feed([line])
        if "Iteration(" in line:
            n = int(line.split("Iteration(")[1].split(")")[0])
            if n in truth or n - 1 in truth:  # (replays only there: each costs the prefix)
                for r in s.update():
                    if isinstance(r, PreemptionRow):
                        printed[r.step] = n
    assert printed == {step: step + 1 for step in truth}


@pytest.mark.slow
def test_step_trace_log_rows_equal_the_offline_replay(tmp_path):
    path = CASES / "p1_poisson_fcfs_200" / "server.trace.log.gz"
    assert path.is_file()
    plain = tmp_path / "server.trace.log"
    plain.write_text("".join(_lines(path)))
    rows = _watch(_lines(path), 200, str(plain))
    assert "step-trace" in rows[0].text
    assert _net(rows) == _offline(plain)[0]


@pytest.mark.slow
def test_embedded_sample_rows_equal_the_offline_replay():
    path = sample_path(DEFAULT_LOG)
    rows = _watch(_lines(path), 30, str(path), year=DEFAULT_LOG_YEAR)
    pre, wins = _offline(path, DEFAULT_LOG_YEAR)
    assert _net(rows) == (wins if "stats lines only" in rows[0].text else pre)


def test_a_restart_banner_starts_a_new_run():
    """Two server runs in one log: the first's rows, one restart line, the second's rows
    with their steps from 0 again."""
    lines = _lines(B_EXACT)
    rows = _watch(lines + lines, 50, "two-runs.log")
    restarts = [r for r in rows if r.event == "restart"]
    assert len(restarts) == 1 and "vLLM restarted" in restarts[0].text
    pre = [(r.run, r.step) for r in rows if isinstance(r, PreemptionRow)]
    steps = [41, 137, 191, 338, 386]
    assert pre == [(1, s) for s in steps] + [(2, s) for s in steps]
    assert rows.index(restarts[0]) == 1 + len(steps)  # mode, run 1's rows, restart, ...


def _cli(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "kvreplay", "watch", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, **kw)


def _rows_of(out: str) -> list[str]:
    return [s for s in out.splitlines() if s.lstrip().startswith("step")]


def test_stdin_fed_in_pieces_gives_every_row_and_jsonl_parses():
    lines = _lines(B_EXACT)
    p = _cli("-", "--format", "jsonl", stdin=subprocess.PIPE)
    for i in range(0, len(lines), 100):
        p.stdin.write("".join(lines[i:i + 100]))  # type: ignore[union-attr]
        p.stdin.flush()  # type: ignore[union-attr]
        time.sleep(0.05)
    p.stdin.close()  # type: ignore[union-attr]
    p.stdin = None  # (communicate would flush it)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    objs = [json.loads(s) for s in out.splitlines()]
    assert objs[0]["event"] == "mode"
    assert [(o["step"], o["victim"]) for o in objs if o["event"] == "preemption"] == [
        (41, "cmpl-bench-78064ebc-3-0"), (137, "cmpl-bench-78064ebc-2-0"),
        (191, "cmpl-bench-78064ebc-6-0"), (338, "cmpl-bench-78064ebc-9-0"),
        (386, "cmpl-bench-78064ebc-10-0")]


def _follow(tmp_path: Path, act) -> tuple[str, str]:
    """`watch LOG --exit-idle` on a file `act(path, lines)` writes while it is followed."""
    lines = _lines(B_EXACT)
    log = tmp_path / "server.log"
    log.write_text("".join(lines[:300]))
    p = _cli(str(log), "--exit-idle", "1.5")
    first = p.stdout.readline()  # type: ignore[union-attr]  # it has read the first lines
    assert first.startswith("# run 1:")
    act(log, lines)
    # (read through the same buffered stream: communicate() would skip what readline read ahead)
    out = first + p.stdout.read()  # type: ignore[union-attr]
    err = p.stderr.read()  # type: ignore[union-attr]  # (a few lines: no pipe fills)
    p.wait(timeout=120)
    assert p.returncode == 0, err
    return out, err


def test_a_rotated_log_is_followed_into_the_new_file(tmp_path):
    def rotate(log: Path, lines: list[str]) -> None:
        with log.open("a") as f:
            f.write("".join(lines[300:500]))
        time.sleep(0.3)
        log.rename(tmp_path / "server.log.1")  # logrotate's create mode: a new inode
        log.write_text("".join(lines[500:]))

    out, err = _follow(tmp_path, rotate)
    assert "replaced (rotated)" in err
    assert len(_rows_of(out)) == 5


def test_a_truncated_log_is_read_again_from_its_start(tmp_path):
    def truncate(log: Path, lines: list[str]) -> None:
        with log.open("a") as f:
            f.write("".join(lines[300:500]))
        time.sleep(0.3)
        log.write_text("".join(lines[500:]))  # copytruncate: same inode, shorter

    out, err = _follow(tmp_path, truncate)
    assert "truncated" in err
    assert len(_rows_of(out)) == 5


def test_ctrl_c_ends_with_one_line_and_exit_130(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("".join(_lines(B_EXACT)))
    p = _cli(str(log))
    time.sleep(2.0)
    os.killpg(p.pid, signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130
    assert err.splitlines() == ["kvreplay watch: interrupted"]


@pytest.mark.parametrize("make, words", [
    (lambda d: d / "missing.log", "no such file"),
    (lambda d: d, "is a directory"),
    (lambda d: _write(d / "x.log", "hello\nworld\n"), "not a vLLM log"),
    (lambda d: _write(d / "x.log.gz", "a\n"), "compressed"),
])
def test_bad_input_one_line_exit_2(tmp_path, make, words):
    p = _cli(str(make(tmp_path)), "--exit-idle", "0.2")
    out, err = p.communicate(timeout=60)
    assert p.returncode == 2 and out == ""
    assert len(err.splitlines()) == 1 and words in err and err.startswith("kvreplay watch: error:")


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_table_row_words():
    """A row in the report's words: step, wall time, victim, trigger, rule, lost, confidence."""
    r = PreemptionRow(run=1, step=41, time=1778148060.25, victim="v", trigger="t", rule="fcfs self",
                      self_preemption=True, tokens_lost=240, confidence="exact-by-log")
    assert row_text(r) == ("  step    41  10:01:00.250  victim v  trigger t  rule fcfs self  "
                           "lost 240  exact-by-log")


def _bursty_log(tmp_path: Path, bursts: int) -> Path:
    """tools.oracle.bursty_log: bursts of 8 requests with preemptions, idle between them."""
    path = tmp_path / "bursty.log"
    path.write_text("\n".join(render_bursty(bursts)) + "\n")
    return path


def test_quiet_points_bound_the_window_and_keep_the_offline_rows(tmp_path):
    """Between bursts the engine is idle: the window restarts there (the lines kept are the
    startup lines and the last burst's), and the steps, put back by the offsets, are the
    offline replay's."""
    path = _bursty_log(tmp_path, 4)
    lines = _lines(path)
    s = Session(str(path))
    rows: list = []
    for i in range(0, len(lines), 60):
        rows += s.feed(lines[i:i + 60])
        rows += s.update()
    rows += s.finish(end=True)
    pre, _ = _offline(path)
    assert _net(rows) == pre and len(pre) > 4
    assert s.cuts >= 2 and len(s.lines) < len(lines) / 2
    assert not any(r.event == "withdrawn" for r in rows)


@pytest.mark.parametrize("bursts, chunk", [
    (40, 500),  # main's cut gave rows a step early after a quiet step followed by one that
    # scheduled nothing (no Iteration line)
    pytest.param(220, 2000, marks=pytest.mark.slow),  # ... and, at burst 217, a burst whose
    # request lines came before the Iteration line of the step that ended the last one
])
def test_a_long_bursty_run_cut_at_every_quiet_point_keeps_the_offline_rows(tmp_path, bursts, chunk):
    """A long run of bursts (tools.oracle.bursty_log, seed 1): every window cut puts the
    steps back where the whole run has them; the rows standing are the offline replay's,
    none withdrawn, and the window holds a few bursts' lines, not the run's."""
    path = _bursty_log(tmp_path, bursts)
    lines = _lines(path)
    s = Session(str(path))
    rows: list = []
    longest = 0
    for i in range(0, len(lines), chunk):
        rows += s.feed(lines[i:i + chunk])
        rows += s.update()
        longest = max(longest, len(s.lines))
    rows += s.finish(end=True)
    pre, _ = _offline(path)
    assert _net(rows) == pre and len(pre) > 2 * bursts
    assert not any(r.event == "withdrawn" for r in rows)
    assert s.cuts >= min(bursts, len(lines) // chunk) // 2  # (a cut a replay at most)
    assert longest < chunk + 6 * len(lines) / bursts


class _Batches:
    """A follower that gives `lines` in batches of `size`, then the end of the input."""

    def __init__(self, lines: list[str], size: int) -> None:
        self.batches = [lines[i:i + size] for i in range(0, len(lines), size)]
        self.partial = b""

    def read(self, timeout: float):
        from kvreplay.live.follow import Batch

        if not self.batches:
            return Batch([], [], eof=True)
        return Batch(self.batches.pop(0), [])


def test_the_shared_follow_loop_ends_the_input_with_the_offline_rows():
    """live.driver.follow (watch's and tui --follow's loop): every batch read, the last tick
    marked the end with the session's final rows; the rows standing are the offline
    replay's. An input with no line is refused as an empty log."""
    from kvreplay.errors import UserError
    from kvreplay.live.driver import follow

    lines = _lines(B_EXACT)
    ticks = list(follow(_Batches(lines, 120), Session(str(B_EXACT)), "b", poll_s=0))
    assert sum(t.lines for t in ticks) == len(lines)
    assert [t.end for t in ticks].count(True) == 1 and ticks[-1].end
    assert _net([r for t in ticks for r in t.rows]) == _offline(B_EXACT)[0]
    with pytest.raises(UserError, match="empty log"):
        list(follow(_Batches([], 1), Session("e"), "e", poll_s=0))
