"""One rule for bad input across every command (kvreplay.cli, sources.check_vllm_log):
one line naming what is wrong, exit 2, nothing written to the output path; stdin and
gzipped stdin read as files are; `audit` never passes a gate on input it could not read;
inputs of different servers refused; Ctrl-C ends with one line and exit 130."""

from __future__ import annotations

import gzip
import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvreplay.cli import main

DATA = Path(__file__).parents[1] / "data"
SAMPLES = Path(__file__).parents[2] / "src" / "kvreplay" / "samples"
SAMPLE_LOG = SAMPLES / "vllm033_fcfs_heavy.reqbody.log"
NGINX = ('192.168.1.10 - - [02/Dec/2026:09:00:01 +0000] "GET / HTTP/1.1" 200 612 "-" "curl/8"\n'
         '192.168.1.11 - - [02/Dec/2026:09:00:02 +0000] "POST /v1/completions HTTP/1.1" 200 9\n')
DPKG = ("2026-12-01 10:11:12 startup archives unpack\n"
        "2026-12-01 10:11:13 install libfoo:amd64 <none> 1.2-3\n")

_GZ = gzip.compress((SAMPLES / "vllm033_fcfs_heavy.log").read_bytes(), mtime=0)
_FLIP = bytearray(_GZ)
_FLIP[len(_FLIP) // 2] ^= 0xFF  # one flipped byte: zlib stops on it

# kind -> (file name, bytes or None for a folder / a missing file, what the line says)
KINDS = {
    "nginx": ("access.log", NGINX.encode(), "not a vLLM log"),
    "dpkg": ("dpkg.log", DPKG.encode(), "not a vLLM log"),
    "empty": ("empty.log", b"", "empty"),
    "binary": ("blob.log", bytes(range(256)) * 8, "binary data"),
    "json": ("other.json", b'{"hello": [1, 2, 3]}', "not"),
    "gzip-nginx": ("access.log.gz", gzip.compress(NGINX.encode(), mtime=0), "not a vLLM log"),
    "gzip-flip": ("flip.log.gz", bytes(_FLIP), "Error -3 while decompressing data"),
    "gzip-cut": ("cut.log.gz", _GZ[: len(_GZ) // 2], "end-of-stream marker"),
    "folder": ("adir", None, "directory"),
    "missing": ("missing.log", None, "no such file"),
}


def _make(tmp_path: Path, kind: str) -> Path:
    name, data, _ = KINDS[kind]
    p = tmp_path / name
    if kind == "folder":
        p.mkdir()
        (p / "notes.md").write_text("no logs here\n")
    elif data is not None:
        p.write_bytes(data)
    return p


def _argv(cmd: str, path: str, out: Path) -> list[str]:
    return {
        "replay": ["replay", path, "-o", str(out)],
        "export": ["export", path, "--chrome", str(out)],
        "whatif": ["whatif", path, "--max-num-seqs", "4", "-o", str(out)],
        "simulate": ["simulate", path, "-o", str(out)],
        "parse": ["parse", path, "-o", str(out)],
        "audit": ["audit", path, "-o", str(out)],
        "audit-gate": ["audit", path, "--fail-on", "recompute_ratio > 0.05"],
        "tui": ["tui", path],
        "watch": ["watch", path, "--exit-idle", "0.1"],
    }[cmd]


COMMANDS = ["replay", "export", "whatif", "simulate", "parse", "audit", "audit-gate", "tui",
            "watch"]


def _one_line_exit_2(capsys, argv: list[str], out: Path, want: str | None = None) -> str:
    rc = main(argv)
    err = capsys.readouterr().err
    lines = [s for s in err.splitlines() if s.strip()]
    assert rc == 2, err
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"kvreplay {argv[0]}: error: "), err
    if want is not None:
        assert want in lines[0], err
    assert not out.exists() and not out.with_suffix(".html").exists()
    assert not list(out.parent.glob(out.name + ".part"))
    return lines[0]


@pytest.mark.parametrize("cmd", COMMANDS)
@pytest.mark.parametrize("kind", list(KINDS))
def test_bad_input_one_line_exit_2_nothing_written(tmp_path, capsys, monkeypatch, cmd, kind):
    monkeypatch.setenv("KVREPLAY_PROGRESS", "0")
    path = _make(tmp_path, kind)
    out = tmp_path / "out.txt"
    want = KINDS[kind][2]
    if cmd == "simulate" and kind in ("nginx", "dpkg", "gzip-nginx"):
        want = "not JSON"  # simulate reads workloads: it says so, and where logs go
    if cmd.startswith("audit") and kind == "folder":
        want = "no .log / .prom files in this folder"  # audit reads folders of logs
    if cmd == "watch" and kind.startswith("gzip"):
        want = "compressed file does not grow"  # watch follows a growing file
    line = _one_line_exit_2(capsys, _argv(cmd, str(path), out), out, want)
    assert "--enable-log-requests" not in line  # not a vLLM log is not a log without requests


def _stdin(monkeypatch, data: bytes) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))


@pytest.mark.parametrize("cmd", ["replay", "export", "whatif", "simulate", "parse", "audit",
                                 "audit-gate"])
@pytest.mark.parametrize("kind", ["nginx", "gzip-nginx", "empty", "binary", "gzip-flip", "gzip-cut"])
def test_bad_stdin_is_bad_input_named_dash(tmp_path, capsys, monkeypatch, cmd, kind):
    monkeypatch.setenv("KVREPLAY_PROGRESS", "0")
    _stdin(monkeypatch, KINDS[kind][1])
    out = tmp_path / "out.txt"
    line = _one_line_exit_2(capsys, _argv(cmd, "-", out), out)
    assert ": -: " in line and "kvreplay-stdin" not in line, line


def _kinds_summary(text: str) -> str:
    return text[text.index("events by kind"):]


def test_stdin_and_gzipped_stdin_read_as_the_file(capsys, monkeypatch):
    monkeypatch.setenv("KVREPLAY_PROGRESS", "0")
    assert main(["parse", str(SAMPLE_LOG), "--format", "summary", "--year", "2026"]) == 0
    want = _kinds_summary(capsys.readouterr().out)
    for data in (SAMPLE_LOG.read_bytes(), gzip.compress(SAMPLE_LOG.read_bytes(), mtime=0)):
        _stdin(monkeypatch, data)
        assert main(["parse", "-", "--format", "summary", "--year", "2026"]) == 0
        assert _kinds_summary(capsys.readouterr().out) == want


def test_replay_of_stdin_without_request_lines_says_what_to_turn_on(capsys, monkeypatch):
    """`kubectl logs ... | kvreplay replay -` on a server without request logging: the
    default-log answer (intervals, no victims) whose headline names the vLLM flag, not a
    traceback (the stats-only log is read again from the spooled stdin)."""
    monkeypatch.setenv("KVREPLAY_PROGRESS", "0")
    text = "".join(s for s in SAMPLE_LOG.read_text().splitlines(keepends=True)
                   if "Received request" not in s)
    _stdin(monkeypatch, text.encode())
    rc = main(["replay", "-", "--samples", "4"])
    out, err = capsys.readouterr()
    assert rc == 0 and "Traceback" not in err, err
    assert "--enable-log-requests" in out


def test_audit_gate_fails_on_unreadable_input_and_keeps_the_rest(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("KVREPLAY_PROGRESS", "0")
    bad = _make(tmp_path, "nginx")
    good = SAMPLES / "vllm033_fcfs_heavy.log"
    out = tmp_path / "audit.json"
    rc = main(["audit", str(good), str(bad), "--format", "json", "-o", str(out),
               "--no-replay", "--fail-on", "kv_usage_p95 > 2"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert f"{bad}: not a vLLM log" in err and "1 of 2 inputs could not be audited" in err
    import json

    rows = json.loads(out.read_text())
    rows = rows if isinstance(rows, list) else rows["records"]
    assert {r["log"]: bool(r.get("error")) for r in rows} == {str(good): False, str(bad): True}
    # all readable: --fail-on decides, as before
    assert main(["audit", str(good), "--no-replay", "--fail-on", "kv_usage_p95 >= 0"]) == 1
    assert main(["audit", str(good), "--no-replay", "--fail-on", "kv_usage_p95 > 2"]) == 0


def test_fleet_folder_walks_per_host_subfolders(tmp_path):
    from kvreplay.audit import expand_paths

    for host in ("h1", "h2"):
        (tmp_path / host).mkdir()
        (tmp_path / host / "server.log").write_text("x\n")
    (tmp_path / "h2" / "scrapes").mkdir()
    (tmp_path / "h2" / "scrapes" / "a.prom").write_text("")
    (tmp_path / ".hidden").mkdir()
    (tmp_path / ".hidden" / "x.log").write_text("")
    assert expand_paths([str(tmp_path)]) == [
        str(tmp_path / "h1" / "server.log"), str(tmp_path / "h2" / "server.log"),
        str(tmp_path / "h2" / "scrapes")]


def test_logs_of_two_servers_are_refused(capsys, monkeypatch):
    monkeypatch.setenv("KVREPLAY_PROGRESS", "0")
    v0 = DATA / "v0_logs" / "v066_recompute_basic_1s.log"
    rc = main(["replay", str(SAMPLE_LOG), str(v0)])
    err = capsys.readouterr().err
    assert rc == 2 and "different servers" in err and "0.6.6" in err and "0.33" in err
    # the same run logged twice (with and without request bodies): the same requests at
    # the same times (cli/clocks.py)
    rc = main(["replay", str(SAMPLE_LOG), str(SAMPLES / "vllm033_fcfs_heavy.log")])
    err = capsys.readouterr().err
    assert rc == 2 and "logs the same 12 requests" in err and "at the same times" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("argv,want", [
    (["replay", "--profile", "9.99"], "known: 0.33"),
    (["simulate", "--profile", "0.40"], "no rules for vLLM newer than 0.33"),
    (["replay", "--samples", "1000000000"], "--samples 1000000000: give 0"),
    (["replay", "--samples", "-1"], "--samples -1"),
])
def test_options_out_of_range_are_refused(capsys, argv, want):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert want in err and len(err.strip().splitlines()) == 1


def test_progress_lines_on_a_stderr_that_is_not_a_terminal():
    from kvreplay.cli.progress_bar import LineSink

    now = [0.0]
    out = io.StringIO()
    sink = LineSink("kvreplay replay", clock=lambda: now[0], out=out)
    quick = sink.start("parse a.log", None)
    now[0] = 1.0
    sink.finish(quick)  # under LINE_AFTER_S: nothing
    h = sink.start("uncertainty ensemble, round 1", 32)
    for _ in range(32):
        now[0] += 0.5
        sink.advance(h, 1)
    sink.finish(h)
    lines = out.getvalue().splitlines()
    assert lines[-1] == "kvreplay replay: uncertainty ensemble, round 1: 32/32 done 16 s"
    assert len(lines) == 4  # at 6, 11, 16 s... at most one line every 5 s, and the end
    assert all(s.startswith("kvreplay replay: uncertainty ensemble") for s in lines)


def test_ctrl_c_during_the_ensemble_one_line_exit_130():
    """SIGINT to the process group (a terminal's Ctrl-C) while the ensemble's forked pool
    runs: one line, exit 130, no worker traceback."""
    log = DATA / "logcases" / "p1_poisson_fcfs_200" / "server.log"
    env = dict(os.environ, KVREPLAY_PROGRESS="1")
    # 512 members: the ensemble runs long enough to be interrupted in it on any machine
    p = subprocess.Popen([sys.executable, "-m", "kvreplay", "replay", str(log), "--samples", "512"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         start_new_session=True, env=env)
    seen = []
    t0 = time.monotonic()
    for line in p.stderr:  # type: ignore[union-attr]
        seen.append(line)
        if "uncertainty ensemble" in line or time.monotonic() - t0 > 120:
            break  # the ensemble's pool is running
    os.killpg(p.pid, signal.SIGINT)
    rest = p.stderr.read()  # type: ignore[union-attr]
    rc = p.wait(timeout=60)
    assert rc == 130, "".join(seen) + rest
    assert "Traceback" not in rest and "KeyboardInterrupt" not in rest
    assert rest.strip().splitlines()[-1] == "kvreplay replay: interrupted"


def test_stdin_output_is_deterministic_and_names_it_dash(capsys, monkeypatch):
    """Same stdin, same bytes out; the private file stdin is spooled to is never named."""
    monkeypatch.setenv("KVREPLAY_PROGRESS", "0")
    outs = []
    for _ in range(2):
        _stdin(monkeypatch, gzip.compress(SAMPLE_LOG.read_bytes(), mtime=0))
        assert main(["replay", "-", "--format", "json", "--samples", "0", "--year", "2026"]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1] and "kvreplay-stdin" not in outs[0]
    import json

    assert json.loads(outs[0])["inputs"]["files"] == ["-"]
