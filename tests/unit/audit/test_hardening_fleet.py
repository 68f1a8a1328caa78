"""The fleet under hostile inputs: no input stops the run, hangs it, doubles a row, or
touches another run's work."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

from kvreplay.audit import expand_paths
from kvreplay.audit.fleet import Options, run
from kvreplay.audit.fleet import dataset as ds
from kvreplay.audit.fleet.executors import LocalExecutor
from kvreplay.audit.fleet.task import Skipped, log_id

SAMPLE = Path(__file__).parents[3] / "src" / "kvreplay" / "samples" / "vllm033_fcfs_heavy.log"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
OPTS = Options(replay=False, year=2026)


def _rows(out: Path) -> pl.DataFrame:
    return ds.scan_dataset(str(out)).collect()


def test_fifo_device_and_outside_link_are_skipped_with_a_reason(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "good.log").write_bytes(SAMPLE.read_bytes())
    os.mkfifo(logs / "pipe.log")
    os.symlink("/dev/zero", logs / "zero.log")
    (tmp_path / "secret.log").write_text("not for the fleet\n")
    os.symlink(tmp_path / "secret.log", logs / "outside.log")
    os.symlink(logs / "good.log", logs / "inside.log")  # a link inside the folder: the same input as good.log
    paths = expand_paths([str(logs)])
    skipped = {os.path.basename(p): p.reason for p in paths if isinstance(p, Skipped)}
    assert set(skipped) == {"outside.log", "pipe.log", "zero.log"}
    assert "outside" in skipped["outside.log"] and "FIFO" in skipped["pipe.log"] and "device" in skipped["zero.log"]
    assert [os.path.basename(p) for p in paths if not isinstance(p, Skipped)] == ["good.log"]
    # the whole CLI run ends (a FIFO used to block it for ever) with one row per input
    out = tmp_path / "ds"
    r = subprocess.run([sys.executable, "-m", "kvreplay", "audit", str(logs), "-o", f"{out}/", "--no-replay", "--year", "2026"],
                       capture_output=True, text=True, timeout=120)
    assert "Traceback" not in r.stderr, r.stderr
    rows = _rows(out)
    assert rows.height == 4
    ev = dict(zip([os.path.basename(x) for x in rows["log"]], rows["status_evidence"]))
    assert "FIFO" in ev["pipe.log"] and "device" in ev["zero.log"] and "outside" in ev["outside.log"]


def test_explicit_fifo_is_an_error_row_not_a_hang(tmp_path):
    os.mkfifo(tmp_path / "p.log")
    ex = LocalExecutor(1)
    try:
        fr = run([str(tmp_path / "p.log")], ex, options=OPTS)
    finally:
        ex.close()
    assert fr.failed == 1 and "FIFO" in fr.results[0].error


def test_path_spellings_are_one_input(tmp_path, monkeypatch):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "a.log").write_bytes(SAMPLE.read_bytes())
    monkeypatch.chdir(tmp_path)
    assert log_id("logs/a.log") == log_id(str(logs / "a.log")) == log_id("./logs/../logs/a.log")
    assert expand_paths(["logs", str(logs), "logs/a.log"]) == ["logs/a.log"]


def test_long_model_name_is_a_safe_folder_name(tmp_path):
    name = "org/" + "m" * 300 + "/\u00e9"
    log = tmp_path / "long.log"
    log.write_text(SAMPLE.read_text().replace(MODEL, name))
    out = tmp_path / "ds"
    for _ in range(2):  # the rerun finds it (no abort, no second file)
        ex = LocalExecutor(1)
        try:
            run([str(log)], ex, options=OPTS, out_dir=str(out))
        finally:
            ex.close()
    (f,) = ds.files(str(out))
    assert all(len(part.encode()) <= 255 for part in Path(f).relative_to(out).parts)
    rows = _rows(out)
    assert rows.height == 1 and rows["model"][0] == name and rows["error"][0] is None
    # distinct long names stay distinct folders
    assert ds._enc("x" * 300) != ds._enc("x" * 299 + "y")
    assert ds._enc("..") != ".." and ds._enc("a/b") == "a%2Fb"


def test_value_the_schema_cannot_hold_is_that_logs_error_row(tmp_path):
    from kvreplay.audit.fleet.run import FleetRun, _take
    from kvreplay.audit.fleet.task import Result
    from kvreplay.audit.record import empty_record

    rec = empty_record("big.log")
    rec["max_model_len"] = 1 << 70
    fr = FleetRun(inputs=2)
    _take(fr, Result(0, "0" * 24, [rec]), "big.log", str(tmp_path), {})
    good = empty_record("ok.log")
    _take(fr, Result(1, "1" * 24, [good]), "ok.log", str(tmp_path), {})
    rows = _rows(tmp_path).sort("log")
    assert rows["log"].to_list() == ["big.log", "ok.log"]
    assert "cannot be stored" in rows["status_evidence"][0] and rows["error"][1] is None
    assert (fr.audited, fr.failed) == (1, 1)


def test_concurrent_runs_keep_each_others_temporaries(tmp_path):
    log = "0" * 24
    d = tmp_path / "day=unknown" / "deployment=x"
    d.mkdir(parents=True)
    host = ds._host()
    mine = d / f".part-{log}-{'a' * 24}.parquet.{os.getpid()}.{host}.tmp"  # a live writer on this host
    other_host = d / f".part-{log}-{'b' * 24}.parquet.1.{'f' * 8 if host != 'f' * 8 else 'e' * 8}.tmp"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    gone = d / f".part-{log}-{'c' * 24}.parquet.{dead.pid}.{host}.tmp"
    old = d / f".part-{log}-{'d' * 24}.parquet.{os.getpid()}.{'f' * 8 if host != 'f' * 8 else 'e' * 8}.tmp"  # another host's, a day old
    for p in (mine, other_host, gone, old):
        p.write_bytes(b"x")
    os.utime(old, (time.time() - 2 * ds.STALE_TMP_S, time.time() - 2 * ds.STALE_TMP_S))
    ds.scan(str(tmp_path))
    assert mine.exists() and other_host.exists()
    assert not gone.exists() and not old.exists()


def test_one_row_per_log_and_engine(tmp_path):
    text = SAMPLE.read_text()
    lines = text.splitlines()
    k = 0
    for i, s in enumerate(lines):  # every other stats line without its "Engine 000: "
        if "Engine 000: " in s:
            if k % 2:
                lines[i] = s.replace("Engine 000: ", "")
            k += 1
    assert k >= 4
    log = tmp_path / "mixed.log"
    log.write_text("\n".join(lines) + "\n")
    from kvreplay.audit.record import audit_records

    recs = audit_records(str(log), replay=False, year=2026)
    assert len(recs) == 1
    ref = audit_records(str(SAMPLE), replay=False, year=2026)
    assert recs[0]["kv_usage_p95"] == ref[0]["kv_usage_p95"]


def test_workers_die_with_their_parent(tmp_path):
    code = (
        "import os, sys, time\n"
        "from kvreplay.audit.fleet.executors import LocalExecutor\n"
        "ex = LocalExecutor(2)\n"
        "fs = [ex.submit(time.sleep, 60) for _ in range(2)]\n"
        "time.sleep(1.5)\n"
        "print(' '.join(str(p) for p in ex.pool._processes), flush=True)\n"
        "time.sleep(60)\n"
    )
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(x) for x in p.stdout.readline().split()]
        assert len(pids) == 2 and all(os.path.exists(f"/proc/{q}") for q in pids)
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    deadline = time.time() + 10
    while time.time() < deadline and any(_alive(q) for q in pids):
        time.sleep(0.2)
    assert not any(_alive(q) for q in pids)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False
