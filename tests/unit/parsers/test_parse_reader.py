"""Reader and CLI behaviour: gz, stdin, CRLF, invalid UTF-8, long lines, wraps, years,
several files merged in time order, determinism, exit codes."""

from __future__ import annotations

import gzip
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvreplay.cli import main
from kvreplay.errors import UserError
from kvreplay.events import decode_jsonl, encode_jsonl
from kvreplay.parsers import parse_files, parse_lines, pipeline

STATS = "(APIServer pid=1) INFO {d} [loggers.py:335] Engine 000: Avg prompt throughput: 1.0 tokens/s, Avg generation throughput: 2.0 tokens/s, Running: {r} reqs, Waiting: 0 reqs, GPU KV cache usage: 5.0%"
SAMPLES = Path(__file__).parents[3] / "src" / "kvreplay" / "samples"


def _write(tmp_path: Path, name: str, data: bytes) -> str:
    p = tmp_path / name
    p.write_bytes(data)
    return str(p)


def test_crlf_gz_and_invalid_utf8(tmp_path):
    raw = (STATS.format(d="05-07 10:00:05", r=3) + "\r\n").encode() + b"INFO 05-07 10:00:06 [x.py:1] caf\xff\xfe\r\n"
    plain = _write(tmp_path, "a.log", raw)
    gz = _write(tmp_path, "a.log.gz", gzip.compress(raw))
    a = list(parse_files([plain], year=2026))
    b = list(parse_files([gz], year=2026))
    assert [e.running for e in a[:1]] == [3] and len(a) == 2
    assert a[1].note == "invalid UTF-8 replaced" and a[1].message.startswith("caf")
    assert encode_jsonl(a).replace(plain.encode(), b"F") == encode_jsonl(b).replace(gz.encode(), b"F")


def test_long_line_truncated_with_note():
    stream = io.StringIO("x" * 100 + "\nINFO 01-01 00:00:00 a.py:1] ok\n", newline="\n")
    got = list(pipeline.physical_lines(stream, limit=40))
    assert got[0] == ("x" * 40, "line truncated to 40 characters (60 dropped)")
    assert got[1][0].endswith("ok") and len(got) == 2


def test_no_trailing_newline_and_blank_lines_are_counted():
    evs = list(parse_lines("\n\nINFO 01-01 00:00:00 a.py:1] x", year=2026))
    assert [e.line for e in evs] == [1, 2, 3] and [e.__struct_config__.tag for e in evs] == ["noise", "noise", "log"]


def test_wrapped_line_rejoined():
    head = "INFO 01-22 09:01:39 llm_engine.py:249] Initializing an LLM engine (v0.6.5) with config: model='m', x=Foo(a=1,"
    evs = list(parse_lines([head, "b=2), max_seq_len=1000, enable_prefix_caching=True"], year=2025))
    assert len(evs) == 1 and evs[0].lines == 2 and evs[0].enable_prefix_caching is True and evs[0].max_model_len == 1000


def test_year_rollover_and_mtime(tmp_path):
    p = _write(tmp_path, "y.log", "\n".join(STATS.format(d=d, r=1) for d in ("12-31 23:59:59", "01-01 00:00:09")).encode())
    ts = 1767225600 + 86400 * 30  # 2026-01-31: the file was last written in January 2026
    os.utime(p, (ts, ts))
    a, b = parse_files([p])
    assert b.time - a.time == 10.0
    assert a.time == 1767225599.0  # 2025-12-31 23:59:59: the year came from the mtime
    c, d = parse_files([p], year=2030)
    assert c.time > a.time and d.time - c.time == 10.0


def test_invalid_date_gives_no_time():
    (e,) = parse_lines(["INFO 02-30 10:00:00 a.py:1] x"], year=2025)
    assert e.time is None and e.time_text == "02-30 10:00:00"


def test_several_files_merged_in_time_order(tmp_path):
    a = _write(tmp_path, "api.log", "\n".join(STATS.format(d=f"05-07 10:00:{s:02d}", r=s) for s in (1, 5, 9)).encode())
    b = _write(tmp_path, "core.log", "\n".join(STATS.format(d=f"05-07 10:00:{s:02d}", r=s) for s in (2, 3, 10)).encode())
    evs = list(parse_files([a, b], year=2026))
    assert [e.running for e in evs] == [1, 2, 3, 5, 9, 10]
    assert [e.file for e in evs] == [a, b, b, a, a, b]


def test_missing_file_is_a_user_error(tmp_path, capsys):
    with pytest.raises(UserError):
        parse_files([str(tmp_path / "nope.log")])
    assert main(["parse", str(tmp_path / "nope.log")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nope.log" in err


def test_cli_default_summary_strict_and_jsonl(tmp_path, capsys):
    assert main(["parse"]) == 0
    out = capsys.readouterr().out
    assert "vLLM version: 0.33.0" in out and "request_received     12" in out and "unparsed lines: 0" in out
    bad = _write(tmp_path, "bad.log", b"hello\nINFO 01-01 00:00:00 a.py:1] x\n")
    assert main(["parse", "--strict", "--format", "summary", bad]) == 1
    assert main(["parse", bad, "--year", "2025"]) == 0
    evs = decode_jsonl(capsys.readouterr().out.split("unparsed lines")[-1].split("\n", 2)[-1].encode())
    assert [e.__struct_config__.tag for e in evs] == ["unparsed", "log"]
    out_path = tmp_path / "ev.jsonl"
    assert main(["parse", str(SAMPLES / "vllm033_fcfs_heavy.log"), "-o", str(out_path), "--year", "2026", "--format", "table"]) == 0
    table = capsys.readouterr().out
    assert table.count("\n") == 107 and "stats" in table
    assert len(decode_jsonl(out_path.read_bytes())) == 107


def test_stdin_and_determinism(tmp_path):
    data = (SAMPLES / "vllm033_fcfs_heavy.reqbody.log").read_bytes()
    cmd = [sys.executable, "-m", "kvreplay", "parse", "-", "--year", "2026"]
    r1 = subprocess.run(cmd, input=data, capture_output=True, check=True)
    r2 = subprocess.run(cmd, input=data, capture_output=True, check=True)
    assert r1.stdout == r2.stdout and r1.stdout.count(b"\n") == 119
    assert b'"file":"<stdin>"' in r1.stdout
