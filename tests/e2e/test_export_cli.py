"""`kvreplay export` from the command line: both formats from one replay, the step range,
and every user mistake as one line and exit 2."""

from __future__ import annotations

import builtins
from pathlib import Path

import pytest
from helpers.trace_read import read_trace

from kvreplay.cli import main
from kvreplay.samples import sample_path

DATA = Path(__file__).parents[1] / "data"
LOG = DATA / "logcases/b_fcfs_heavy/server.iter.reqbody.log"


def test_both_formats_from_one_run(tmp_path: Path, capsys) -> None:
    pf, js = tmp_path / "b.pftrace", tmp_path / "b.json"
    assert main(["export", "--perfetto", str(pf), "--chrome", str(js), str(LOG)]) == 0
    err = capsys.readouterr().err
    assert f"{pf}: {pf.stat().st_size:,} bytes" in err and "ui.perfetto.dev" in err
    assert "chrome://tracing" in err
    a, b = read_trace(pf), read_trace(js)
    # the same trace in both: slices, instants and counter samples
    key = lambda s: (s["name"], s["start"], s["end"], s["depth"])  # noqa: E731
    assert sorted(map(key, a.slices)) == sorted(map(key, b.slices))
    assert sorted((i["name"], i["ts"]) for i in a.instants) == sorted(
        (i["name"], i["ts"]) for i in b.instants)
    assert a.counters["KV free blocks"] == b.counters["KV free blocks"]
    # b_fcfs_heavy has 5 preemptions (logcases README)
    assert sum(1 for i in a.instants if i["name"] == "preemption" and i["track"] == 1) == 5
    # a second run, from the log again: byte-identical files
    pf2, js2 = tmp_path / "c.pftrace", tmp_path / "c.json"
    assert main(["export", "--perfetto", str(pf2), "--chrome", str(js2), str(LOG)]) == 0
    assert pf2.read_bytes() == pf.read_bytes() and js2.read_bytes() == js.read_bytes()


def test_a_workload_and_a_step_range(tmp_path: Path) -> None:
    out = tmp_path / "w.json"
    wl = sample_path("fcfs_heavy.workload.json")
    assert main(["export", "--chrome", str(out), "--steps", "100:199", str(wl)]) == 0
    got = read_trace(out)
    steps = sorted(s["args"]["step"] for s in got.slices if s["track"] == 1)
    assert steps == list(range(100, 200))


@pytest.mark.parametrize("argv, msg", [
    (["export", str(LOG)], "say where to write"),
    (["export", "--chrome", "{tmp}/x.json", "--steps", "9:3", str(LOG)], "steps 9-3"),
    (["export", "--chrome", "{tmp}/x.json", "--steps", "a:b", str(LOG)], "give LO:HI"),
    (["export", "--chrome", "{tmp}/x.json", "{tmp}/missing.log"], "missing.log"),
    (["export", "--chrome", "{tmp}/no/such/dir/x.json", str(LOG)], "cannot write"),
])
def test_user_mistakes(argv: list[str], msg: str, tmp_path: Path, capsys) -> None:
    assert main([a.replace("{tmp}", str(tmp_path)) for a in argv]) == 2
    err = capsys.readouterr().err
    assert msg in err and "Traceback" not in err and err.count("\n") == 1


def test_without_the_perfetto_package(tmp_path: Path, monkeypatch, capsys) -> None:
    real = builtins.__import__

    def no_perfetto(name, *args, **kwargs):
        if name.split(".")[0] == "perfetto":
            raise ImportError(f"No module named {name!r}")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_perfetto)
    out = tmp_path / "x.pftrace"
    assert main(["export", "--perfetto", str(out), str(LOG)]) == 2
    err = capsys.readouterr().err
    assert "pip install 'kvreplay[perfetto]'" in err and "--chrome" in err
    assert not out.exists()
    # the JSON trace needs nothing more
    assert main(["export", "--chrome", str(tmp_path / "x.json"), str(LOG)]) == 0
