"""The fuzz harness's quick profile (tools/research/fuzz_inputs.py; the long run is in its docstring):
mutated real lines parse without a traceback, account for every physical line, and stay
fast; mutated whole logs through replay / audit / export end with exit 0 or 2."""

from __future__ import annotations

import io
import json
import random
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.examples import many
from kvreplay.parsers import pipeline
from tools.research import fuzz_inputs

ROOT = Path(__file__).resolve().parents[3]
LINES = fuzz_inputs.seed_lines()
FUZZ = settings(many(), deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


@FUZZ
@given(st.randoms(use_true_random=False))
def test_mutated_documents_parse(rnd):
    rng = random.Random(rnd.getrandbits(64))
    data = fuzz_inputs.make_doc(rng, LINES)
    t0 = _cpu()
    stream = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", errors="replace", newline="\n")
    evs = list(pipeline.parse_stream(stream, "fuzz", pipeline.Clock(year=2026)))
    assert _cpu() - t0 < 5.0
    assert sum(e.lines for e in evs) == data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


def _harness(tmp_path, *args: str) -> dict:
    """The harness in a fresh interpreter: it forks a child per batch or run, and forking
    this process (threads of earlier tests: Dask, progress heartbeats) can deadlock."""
    out = tmp_path / "report.json"
    r = subprocess.run([sys.executable, "-m", "tools.research.fuzz_inputs", *args, "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(out.read_text())


def test_quick_parse_profile(tmp_path):
    rep = _harness(tmp_path, "parse", "--n", "400", "--seed", "7", "--batch", "200", "--max-cpu", "5",
                   "--keep", str(tmp_path / "keep"))
    assert rep["inputs"] == 400 and rep["failures"] == 0 and rep["slow"] == 0, rep["examples"][:3]
    assert 0 < rep["max_rss_kb_batch"] < 2 << 20 and rep["max_cpu_s_input"] < 5
    assert not (tmp_path / "keep").exists()


def test_an_input_over_its_cpu_limit_is_a_failure_with_a_reproducer(tmp_path):
    # a limit no input can meet: every input is stopped by its timer, reported, and saved
    out = tmp_path / "report.json"
    r = subprocess.run([sys.executable, "-m", "tools.research.fuzz_inputs", "parse", "--n", "30", "--seed", "7",
                        "--batch", "10", "--max-cpu", "0.000001", "--keep", str(tmp_path / "keep"), "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    rep = json.loads(out.read_text())
    assert r.returncode == 1 and rep["failures"] == rep["slow"] == 30, rep
    kept = sorted((tmp_path / "keep").glob("parse-s7-*.log"))
    assert len(kept) == 30
    assert (tmp_path / "keep" / (kept[0].name + ".why.txt")).read_text().startswith("over ")


def test_quick_commands_profile(tmp_path):
    # in batches through main() in a forked child, and a share as `python -m kvreplay`
    rep = _harness(tmp_path, "commands", "--n", "8", "--seed", "3", "--batch", "4", "--subprocess", "0.3",
                   "--max-rss-mb", "2048", "--keep", str(tmp_path / "keep"))
    assert rep["inputs"] == 8 and rep["failures"] == 0, rep["examples"][:3]
    assert rep["in_process"] > 0 and rep["subprocess"] > 0 and rep["in_process"] + rep["subprocess"] == 8
    assert rep["max_rss_kb_batch"] < 2 << 20 and rep["max_rss_kb_subprocess"] < 2 << 20
    assert sum(rep["exit_codes"].values()) == 8 and set(rep["exit_codes"]) <= {"0", "1", "2"}
