"""The follower: every complete line once, in order, through appends, partial lines,
rotation (a new inode at the path) and truncation, as `tail -F` reads a file."""

from __future__ import annotations

import os

import pytest

from kvreplay.errors import UserError
from kvreplay.live.follow import FileFollower, StdinFollower


def _all(f: FileFollower) -> tuple[list[str], list[str]]:
    lines, notices = [], []
    for _ in range(4):  # a read gives what is new; a few more find nothing
        b = f.read(0.0)
        lines += b.lines
        notices += b.notices
    return lines, notices


def test_appended_lines_once_and_a_partial_line_waits(tmp_path):
    p = tmp_path / "a.log"
    p.write_text("one\ntw")
    f = FileFollower(str(p))
    assert _all(f) == (["one\n"], [])
    with p.open("a") as w:
        w.write("o\nthree\n")
    assert _all(f) == (["two\n", "three\n"], [])
    f.close()


def test_rotation_reads_the_new_file_from_its_start(tmp_path):
    p = tmp_path / "a.log"
    p.write_text("1\n2\n")
    f = FileFollower(str(p))
    assert _all(f)[0] == ["1\n", "2\n"]
    with p.open("a") as w:
        w.write("3\n")
    p.rename(tmp_path / "a.log.1")
    p.write_text("4\n")
    lines, notices = _all(f)
    # the old file's last line first (still open), then the new file's
    assert lines == ["3\n", "4\n"] and len(notices) == 1 and "rotated" in notices[0]


def test_truncation_reads_again_from_the_start(tmp_path):
    p = tmp_path / "a.log"
    p.write_text("a long first line\nsecond\n")
    f = FileFollower(str(p))
    _all(f)
    with p.open("w") as w:  # same inode, shorter
        w.write("x\n")
    lines, notices = _all(f)
    assert lines == ["x\n"] and "truncated" in notices[0]


def test_a_file_gone_waits_for_the_next(tmp_path):
    p = tmp_path / "a.log"
    p.write_text("1\n")
    f = FileFollower(str(p))
    _all(f)
    p.rename(tmp_path / "old")
    assert _all(f) == ([], [])  # gone: nothing, no error
    p.write_text("2\n")
    assert _all(f)[0] == ["2\n"]


def test_refusals(tmp_path):
    with pytest.raises(UserError, match="no such file"):
        FileFollower(str(tmp_path / "nope.log"))
    with pytest.raises(UserError, match="directory"):
        FileFollower(str(tmp_path))
    (tmp_path / "x.gz").write_bytes(b"")
    with pytest.raises(UserError, match="compressed"):
        FileFollower(str(tmp_path / "x.gz"))


def test_stdin_lines_then_eof_with_a_last_line_without_newline():
    r, w = os.pipe()
    f = StdinFollower(r)
    os.write(w, "a\nb".encode())
    assert f.read(1.0).lines == ["a\n"]
    os.close(w)
    b = f.read(1.0)
    assert b.lines == ["b"] and b.eof
    assert f.read(0.0).eof
    os.close(r)
