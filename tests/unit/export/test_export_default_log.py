"""A default log (no request lines) exports as a trace of what its answer gives (issue 30,
export/default_log.py): the stats lines' counters as logged, the preemptions per stats
interval as 90% intervals, no steps or requests; `--steps` is refused."""

from __future__ import annotations

import json
from pathlib import Path

from kvreplay.cli import main

B_LOG = Path(__file__).parents[2] / "data" / "logcases" / "b_fcfs_heavy" / "server.log"
T0 = 1778148060  # 05-07 10:01:00 UTC in 2026, b's first stats line


def default_log(tmp_path: Path) -> Path:
    """b's log as vLLM's defaults write it: no request lines (startup, stats, access)."""
    assert B_LOG.is_file()
    keep = [x for x in B_LOG.read_text().splitlines(True) if "Received request" not in x
            and "request_logger" not in x]
    out = tmp_path / "b.default.log"
    out.write_text("".join(keep))
    return out


def _series(events: list[dict], name: str) -> list[tuple[int, float]]:
    return [(e["ts"] // 1_000_000, e["args"]["value"]) for e in events
            if e["ph"] == "C" and e["name"] == name]


def test_the_counters_as_logged_and_the_intervals(tmp_path: Path, capsys) -> None:
    log = default_log(tmp_path)
    out = tmp_path / "b.json"
    assert main(["export", str(log), "--chrome", str(out), "--year", "2026"]) == 0
    err = capsys.readouterr().err
    assert "a default log (no request lines)" in err and "Traceback" not in err
    doc = json.loads(out.read_text())
    ev = doc["traceEvents"]
    # hand-read from b's stats lines (10:01:00, :01, :02): Running 3, 3, 3; Waiting 9, 6, 2;
    # GPU KV cache usage 90.5%, 92.1%, 82.5%; prompt throughput 800, 600, 800 tokens/s
    assert _series(ev, "waiting (logged)")[:3] == [(T0, 9), (T0 + 1, 6), (T0 + 2, 2)]
    assert _series(ev, "running (logged)")[0] == (T0, 3)
    assert _series(ev, "KV usage (logged)")[:3] == [(T0, 0.905), (T0 + 1, 0.921), (T0 + 2, 0.825)]
    # each line's tokens over the second before it, placed at that second's start
    assert _series(ev, "prompt tokens per interval (logged)")[:3] == \
        [(T0 - 1, 800), (T0, 600), (T0 + 1, 800)]
    # no step, no request: only the engine's track of stats intervals
    assert not any(e["ph"] == "i" for e in ev)
    threads = [e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"]
    assert threads == ["engine: stats intervals (no steps or requests logged)"]
    slices = [e for e in ev if e["ph"] == "X"]
    assert len(slices) == 6  # b's six stats lines
    for s in slices:
        a = s["args"]
        assert a["certainty"] == "interval"
        assert 0 <= a["preemptions_low"] <= a["preemptions_median"] <= a["preemptions_high"]
    meta = doc["otherData"]
    assert meta["headline"].startswith("default log (no request lines): ")
    assert meta["certainty"]["running (logged)"] == "exact-by-log"
    assert meta["certainty"]["preemptions per interval: median"] == "interval"
    iv = meta["answer"]["preemptions"]
    assert iv["low"] <= 5 <= iv["high"]  # b's truth: 5 preemptions


def test_steps_of_a_default_log_are_refused(tmp_path: Path, capsys) -> None:
    log = default_log(tmp_path)
    out = tmp_path / "b.json"
    assert main(["export", str(log), "--chrome", str(out), "--steps", "0:10"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has no steps" in err
    assert not out.exists()


def test_perfetto_of_a_default_log(tmp_path: Path) -> None:
    log = default_log(tmp_path)
    out = tmp_path / "b.pftrace"
    assert main(["export", str(log), "--perfetto", str(out)]) == 0
    assert out.stat().st_size > 0
