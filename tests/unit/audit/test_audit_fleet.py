"""`kvreplay audit --executor local|dask -o DIR/`: the fleet dataset (kvreplay.audit.fleet).

The fleet is 48 logs rendered from the oracle bank (tests/data/oracle/0.33, the cases with
the fewest steps: simulated, written as vLLM 0.33 logs on three days) plus a truncated
.log.gz and an empty file. One LocalCluster of 2 workers serves the Dask tests.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import time
from pathlib import Path

import polars as pl
import pytest
from hypothesis import given, settings, strategies as st
from helpers.examples import few

from kvreplay.audit.fleet import Options, make_executor, run, summarize
from kvreplay.audit.fleet import dataset as ds
from kvreplay.audit.fleet.executors import DaskExecutor, LocalExecutor
from kvreplay.audit.fleet.summarize import log_knee
from kvreplay.audit.fleet.task import input_key
from kvreplay.cli import main
from kvreplay.errors import UserError

ORACLE = Path(__file__).parents[2] / "data" / "oracle"
THIN = "tests/data/corpus/29-v016-queue-drain-full-isl.log"  # stats lines only
OPTS = Options(year=2026)  # the logs' year, not their files' mtime
DAY = 86400.0


def _render(out: Path, n: int = 48) -> list[str]:
    from kvreplay.replay import parse_workload, simulate
    from tools.oracle.render_log import render_log

    index = [e for e in json.loads((ORACLE / "index.json").read_text())
             if e["release"] == "0.33" and e["completed"] and e["status"] == "ok"]
    index.sort(key=lambda e: (e["num_steps"], e["case"]))
    for i, e in enumerate(index[:n]):
        wl = parse_workload(json.loads((ORACLE / e["path"] / "workload.json").read_text()))
        records, _ = simulate(wl)
        lines = render_log(wl, records, step_time_s=0.02, stats_interval_s=1.0,
                           start=1778148060.0 + (i % 3) * DAY)
        (out / f"{e['case']}.log").write_text("\n".join(lines) + "\n")
    good = sorted(out.glob("*.log"))
    (out / "corrupt.log.gz").write_bytes(gzip.compress(good[0].read_bytes())[:400])
    (out / "empty.log").write_text("")
    return sorted(str(p) for p in out.iterdir())


@pytest.fixture(scope="module")
def fleet(tmp_path_factory) -> list[str]:
    return _render(tmp_path_factory.mktemp("fleet"))


@pytest.fixture(scope="module")
def local_ds(fleet, tmp_path_factory) -> str:
    """The fleet audited by the local executor (2 processes): the reference dataset."""
    out = str(tmp_path_factory.mktemp("local") / "ds")
    ex = LocalExecutor(2)
    try:
        fr = run(fleet, ex, options=OPTS, out_dir=out)
    finally:
        ex.close()
    assert (fr.audited, fr.failed, fr.skipped) == (48, 2, 0)
    return out


@pytest.fixture(scope="module")
def client():
    import logging

    import distributed

    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       dashboard_address=None, silence_logs=logging.ERROR)
    c = distributed.Client(cluster)
    yield c
    c.close()
    cluster.close()


def _good(fleet: list[str]) -> list[str]:
    return [p for p in fleet if not p.endswith(("empty.log", "corrupt.log.gz"))]


def _rows(root: str) -> pl.DataFrame:
    return ds.scan_dataset(root).collect().sort(["log", "engine"], nulls_last=True)


def _tree(root: str) -> dict[str, bytes]:
    return {os.path.relpath(p, root): Path(p).read_bytes() for p in ds.files(root)}


# ---------------------------------------------------------------- the dataset
@pytest.mark.slow
def test_dataset_one_file_per_log_partitioned_by_day_and_deployment(fleet, local_ds):
    files = ds.files(local_ds)
    assert len(files) == len(fleet) == 50
    df = _rows(local_ds)
    assert df["log"].n_unique() == 50 and df.height == 50  # no DP log: one row each
    good = df.filter(pl.col("error").is_null())
    # rendered on three days (start + 0, 1, 2 days); all serve the renderer's model
    assert sorted(good["day"].unique()) == ["2026-05-07", "2026-05-08", "2026-05-09"]
    assert good["deployment"].unique().to_list() == ["meta-llama/Llama-3.1-8B-Instruct"]
    assert all("deployment=meta-llama%2FLlama-3.1-8B-Instruct" in f for f in files
               if "/part-" in f)
    assert (good["log_start"].str.slice(0, 10) == good["day"]).all()
    # the key is the bytes (and options): the file's name carries it
    for f in files[:5]:
        row = pl.read_parquet(f).row(0, named=True)
        assert row["input_key"] == input_key(row["log"], OPTS)
        assert os.path.basename(f).endswith(f"-{row['input_key']}.parquet")


def test_corrupt_and_empty_files_are_error_rows(local_ds):
    err = _rows(local_ds).filter(pl.col("error").is_not_null())
    by = {os.path.basename(r["log"]): r for r in err.to_dicts()}
    assert sorted(by) == ["corrupt.log.gz", "empty.log"]
    assert "unreadable at line" in by["corrupt.log.gz"]["error"]
    assert "end-of-stream marker" in by["corrupt.log.gz"]["error"]
    assert by["empty.log"]["error"].endswith("empty log")
    for r in by.values():
        assert r["error_kind"] == "input" and r["status"] == "not established"
        assert r["day"] == "unknown" and r["deployment"] == "file:" + os.path.basename(r["log"])
        assert r["replay"] == "skipped" and r["recompute_ratio"] is None
    assert sum("/error-" in f for f in ds.files(local_ds)) == 2


def test_rows_are_the_audit_of_each_log(fleet, local_ds):
    """A dataset row is audit_records' record of its log (plus its key)."""
    from kvreplay.audit.record import audit_records

    df = _rows(local_ds)
    for path in (_good(fleet)[3], _good(fleet)[40]):
        want = audit_records(path, year=2026)[0]
        got = df.filter(pl.col("log") == path).drop("input_key", "day", "deployment").row(0, named=True)
        assert got == json.loads(json.dumps(want))  # (tuples -> lists, as Parquet has them)


# ---------------------------------------------------------------- Dask
def test_dask_gives_the_local_rows_and_a_rerun_writes_nothing(fleet, local_ds, client, tmp_path):
    out = str(tmp_path / "ds")
    ex = DaskExecutor(client=client)
    fr = run(fleet, ex, options=OPTS, out_dir=out)
    assert (fr.audited, fr.failed, fr.skipped) == (48, 2, 0)
    assert fr.executor == "dask LocalCluster, 2 workers"
    assert len(fr.peak_rss_kb) == 2 and all(v > 0 for v in fr.peak_rss_kb.values())
    assert _rows(out).equals(_rows(local_ds))
    assert _tree(out) == _tree(local_ds)  # byte-identical files, same names
    stamps = {p: os.stat(p).st_mtime_ns for p in ds.files(out)}
    again = run(fleet, ex, options=OPTS, out_dir=out)
    assert (again.audited, again.failed, again.skipped, again.written) == (0, 0, 50, [])
    assert {p: os.stat(p).st_mtime_ns for p in ds.files(out)} == stamps


@pytest.mark.slow
def test_a_worker_killed_mid_run_loses_and_doubles_nothing(fleet, local_ds, client, tmp_path):
    """SIGKILL a worker while it audits a log: the scheduler re-runs its tasks elsewhere
    (its nanny starts a new worker); every log still gets exactly one file."""
    out = str(tmp_path / "ds")
    killed: list[tuple[str, int, tuple]] = []

    def kill_one(res, fr):
        if killed or fr.audited + fr.failed < 5:
            return
        busy = {a: ks for a, ks in client.processing().items() if ks}
        if busy:
            addr = sorted(busy)[0]
            pid = client.run(os.getpid, workers=[addr])[addr]
            os.kill(pid, signal.SIGKILL)
            killed.append((addr, pid, tuple(busy[addr])))

    fr = run(fleet, DaskExecutor(client=client), options=OPTS, out_dir=out, on_result=kill_one)
    assert killed and killed[0][2], "no worker was killed while busy"
    assert (fr.audited, fr.failed) == (48, 2)
    assert _rows(out).equals(_rows(local_ds))
    assert _tree(out) == _tree(local_ds)
    assert killed[0][1] not in client.run(os.getpid).values()  # it really died


def test_a_local_worker_killed_mid_run_loses_and_doubles_nothing(fleet, local_ds, tmp_path):
    """The stdlib pool breaks when one of its processes dies: the executor starts another
    and resubmits what had not finished."""
    logs = _good(fleet)[:12]
    out = str(tmp_path / "ds")
    ex = LocalExecutor(2)
    killed = []

    def kill_one(res, fr):
        if not killed and fr.audited == 2 and ex.pool is not None:
            pid = sorted(ex.pool._processes)[0]
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    try:
        fr = run(logs, ex, options=OPTS, out_dir=out, on_result=kill_one)
    finally:
        ex.close()
    assert killed and ex.generation == 2
    assert (fr.audited, fr.failed) == (12, 0)
    ref = _rows(local_ds).filter(pl.col("log").is_in(logs))
    assert _rows(out).equals(ref)


def test_dask_scheduler_address_and_missing_dask(monkeypatch, client, capsys):
    monkeypatch.setattr(DaskExecutor, "connect_timeout", "1s")
    ex = make_executor(f"dask:{client.scheduler.address}")
    try:
        assert ex.describe().startswith(f"dask {client.scheduler.address}, ")
        fr = run([THIN], ex, options=Options(replay=False))
        assert fr.results[0].records[0]["waiting_max"] == 90
    finally:
        ex.close()
    assert main(["audit", THIN, "--executor", "dask:tcp://127.0.0.1:1"]) == 2
    assert "cannot reach the scheduler" in capsys.readouterr().err
    monkeypatch.setitem(__import__("sys").modules, "distributed", None)  # not installed
    with pytest.raises(UserError, match=r"pip install 'kvreplay\[fleet\]'"):
        make_executor("dask")
    assert main(["audit", THIN, "--executor", "dask"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs dask.distributed" in err[0]


# ---------------------------------------------------------------- reruns, interruptions
def _copy(fleet: list[str], d: Path, names: int = 3) -> list[str]:
    d.mkdir()
    out = []
    for p in _good(fleet)[:names] + [p for p in fleet if p.endswith("empty.log")]:
        q = d / os.path.basename(p)
        q.write_bytes(Path(p).read_bytes())
        out.append(str(q))
    return out


def test_changed_log_replaces_its_row_force_and_retry_errors(fleet, tmp_path):
    logs = _copy(fleet, tmp_path / "logs")
    out = str(tmp_path / "ds")
    ex = LocalExecutor(1)
    assert run(logs, ex, options=OPTS, out_dir=out).written.__len__() == 4
    # the log grew: a new key, its old file replaced (one row per log, never two)
    before = {os.path.basename(f) for f in ds.files(out)}
    with open(logs[0], "a") as f:
        f.write(Path(logs[0]).read_text().splitlines()[-1] + "\n")
    fr = run(logs, ex, options=OPTS, out_dir=out)
    assert (fr.audited, fr.skipped) == (1, 3)
    after = {os.path.basename(f) for f in ds.files(out)}
    assert len(after) == 4 and len(after - before) == 1
    assert _rows(out)["input_key"].to_list().count(input_key(logs[0], OPTS)) == 1
    # a copy under another name is another log
    copy = str(tmp_path / "logs" / "copy.log")
    Path(copy).write_bytes(Path(logs[1]).read_bytes())
    fr = run(logs + [copy], ex, options=OPTS, out_dir=out)
    assert (fr.audited, fr.skipped) == (1, 4) and len(ds.files(out)) == 5
    # --retry-errors: only the error row again; --force: all
    fr = run(logs, ex, options=OPTS, out_dir=out, retry_errors=True)
    assert (fr.audited, fr.failed, fr.skipped) == (0, 1, 3)
    fr = run(logs, ex, options=OPTS, out_dir=out, force=True)
    assert (fr.audited, fr.failed, fr.skipped) == (3, 1, 0) and len(ds.files(out)) == 5
    # other options are another key: the row is replaced, not added
    fr = run(logs, ex, options=Options(year=2026, replay=False), out_dir=out)
    assert fr.skipped == 0 and len(ds.files(out)) == 5
    assert _rows(out).filter(pl.col("log") == logs[0])["replay"].to_list() == ["skipped"]


def test_ctrl_c_leaves_whole_files_and_a_rerun_completes(fleet, tmp_path):
    logs = _copy(fleet, tmp_path / "logs", names=5)
    out = str(tmp_path / "ds")
    ex = LocalExecutor(1)

    def interrupt(res, fr):
        if fr.audited + fr.failed == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(logs, ex, options=OPTS, out_dir=out, on_result=interrupt)
    assert len(ds.files(out)) == 2 and _rows(out).height == 2
    fr = run(logs, ex, options=OPTS, out_dir=out)
    assert (fr.skipped, fr.audited + fr.failed) == (2, 4)
    assert sorted(_rows(out)["log"]) == sorted(logs)


def test_a_writer_killed_mid_file_leaves_no_partial_file(fleet, tmp_path, monkeypatch):
    logs = _copy(fleet, tmp_path / "logs", names=2)
    out = str(tmp_path / "ds")
    real = pl.DataFrame.write_parquet
    calls = []

    def dies_half_way(self, path, *a, **k):
        calls.append(path)
        if len(calls) == 2:
            Path(path).write_bytes(b"PAR1 half a file")
            raise KeyboardInterrupt  # (as a kill would leave it: the bytes, no rename)
        return real(self, path, *a, **k)

    monkeypatch.setattr(pl.DataFrame, "write_parquet", dies_half_way)
    with pytest.raises(KeyboardInterrupt):
        run(logs, LocalExecutor(1), options=OPTS, out_dir=out)
    assert len(ds.files(out)) == 1
    assert not [n for _, _, ns in os.walk(out) for n in ns if n.endswith(".tmp")]
    pl.read_parquet(ds.files(out)[0])  # whole


def test_scan_repairs_an_interrupted_run(tmp_path, fleet):
    logs = _copy(fleet, tmp_path / "logs", names=1)
    out = str(tmp_path / "ds")
    run(logs, LocalExecutor(1), options=OPTS, out_dir=out)
    part = next(f for f in ds.files(out) if "/part-" in f)
    d = os.path.dirname(part)
    stale = os.path.join(d, "." + os.path.basename(part) + ".123.tmp")
    Path(stale).write_bytes(b"junk")
    lid = os.path.basename(part).split("-")[1]
    older = os.path.join(d, f"part-{lid}-{'0' * 24}.parquet")  # the log's previous file
    Path(older).write_bytes(Path(part).read_bytes())
    os.utime(older, ns=(1, 1))
    have = ds.scan(out)
    assert not os.path.exists(stale) and not os.path.exists(older)
    assert have[lid].path == part


@settings(few())
@given(st.lists(st.tuples(st.sets(st.integers(0, 4), min_size=1), st.integers(0, 5),
                          st.booleans()), min_size=1, max_size=4))
def test_any_sequence_of_runs_ends_as_one_full_run(tmp_path_factory, runs):
    """Invariant: whatever subsets are audited, interrupted, or grow between runs, a last
    full run leaves exactly the dataset a single run of the final files writes."""
    root = tmp_path_factory.mktemp("prop")
    logs = []
    for i in range(5):
        p = root / f"s{i}.log"
        p.write_bytes(Path(THIN).read_bytes() if i != 4 else b"")
        logs.append(str(p))
    out, ref = str(root / "ds"), str(root / "ref")
    opts = Options(year=2026, replay=False)
    ex = LocalExecutor(1)
    for subset, stop_after, grow in runs:
        chosen = [logs[i] for i in sorted(subset)]

        def stop(res, fr, n=stop_after):
            if fr.audited + fr.failed == n:
                raise KeyboardInterrupt

        try:
            run(chosen, ex, options=opts, out_dir=out, on_result=stop)
        except KeyboardInterrupt:
            pass
        if grow:
            with open(chosen[0], "a") as f:
                f.write("INFO 05-07 10:00:00 [loggers.py:1] noise\n")
    run(logs, ex, options=opts, out_dir=out)
    run(logs, ex, options=opts, out_dir=ref)
    assert _tree(out).keys() == _tree(ref).keys()
    assert _rows(out).equals(_rows(ref))


# ---------------------------------------------------------------- --summarize, the CLI
def test_summarize_tables(local_ds, capsys):
    s = summarize(local_ds)
    df = _rows(local_ds)
    good = df.filter(pl.col("error").is_null())
    assert (s["records"], s["inputs"], s["errors"]) == (50, 50, 2)
    assert s["days"] == ["2026-05-07", "2026-05-09"] and s["deployments"] == 1
    counts = {r["status"]: r["records"] for r in s["status"]}
    assert counts == {k: good.filter(pl.col("status") == k).height for k in counts}
    assert sum(counts.values()) == 48
    top = s["worst_recompute"][0]
    assert top["recompute_ratio"] == good["recompute_ratio"].max()
    ratios = [r["recompute_ratio"] for r in s["worst_recompute"]]
    assert ratios == sorted(ratios, reverse=True) and len(ratios) == 10
    tokens = sorted((x["recomputed_tokens"] for st_ in good["storms"].to_list() for x in st_),
                    reverse=True)
    assert [x["recomputed_tokens"] for x in s["worst_storms"]] == tokens[:10]
    assert {os.path.basename(r["log"]) for r in s["failed"]} == {"corrupt.log.gz", "empty.log"}
    assert main(["audit", "--summarize", local_ds]) == 0
    text = capsys.readouterr().out
    assert text.startswith("kvreplay fleet: 50 inputs, 50 records, 1 deployments, "
                           "2026-05-07 to 2026-05-09, 2 error rows")
    for head in ("worst recompute ratios", "worst preemption storms",
                 "deployments whose knee is below max_num_seqs", "could not be audited (2)"):
        assert head in text


def test_knee_below_max_num_seqs():
    # 90% of the 201 tok/s peak is 180.9: reached at 16 running
    tbc = [{"running": r, "gen_tput": g, "samples": 3}
           for r, g in ((8, 100.0), (16, 190.0), (24, 200.0), (32, 201.0))]
    assert log_knee({"max_num_seqs": 64, "tput_by_concurrency": tbc}) == 16
    assert log_knee({"max_num_seqs": 16, "tput_by_concurrency": tbc}) is None
    # still climbing at the most the log ran: no knee to speak of
    climbing = [dict(b, gen_tput=float(b["running"])) for b in tbc]
    assert log_knee({"max_num_seqs": 64, "tput_by_concurrency": climbing}) is None
    assert log_knee({"max_num_seqs": 64, "tput_by_concurrency": tbc[:1]}) is None


def test_cli_dataset_rerun_and_fail_on(fleet, tmp_path, capsys):
    logs = _copy(fleet, tmp_path / "logs", names=2)
    out = str(tmp_path / "ds") + "/"
    # an input that could not be audited: an error row, and exit 2 (a gate never passes)
    assert main(["audit", *logs, "-o", out, "--year", "2026", "-j", "1"]) == 2
    err = capsys.readouterr().err
    assert "empty.log: empty log" in err
    assert "3 logs (local, 1 process): 2 done, 1 failed, 0 skipped" in err
    assert "1 of 3 inputs could not be audited" in err
    assert main(["audit", str(tmp_path / "logs" / "*.log"), "-o", out, "--year", "2026",
                 "--fail-on", "requests > 0"]) == 1
    err = capsys.readouterr().err
    assert "0 done, 0 failed, 3 skipped" in err and err.count("--fail-on") == 2
    assert main(["audit", *logs, "-o", out, "--format", "json"]) == 2
    assert "a folder is the Parquet dataset" in capsys.readouterr().err
    assert main(["audit", *logs, "--force"]) == 2
    assert main(["audit", "--summarize", str(tmp_path / "nothing")]) == 2
    assert "no such folder" in capsys.readouterr().err
    assert main(["audit", THIN, "--executor", "ray"]) == 2
    assert "use local, dask, or dask:ADDRESS" in capsys.readouterr().err
    assert main(["audit"]) == 2
    assert main(["audit", str(tmp_path / "none" / "*.log")]) == 2
    assert "no file matches" in capsys.readouterr().err


@pytest.mark.slow
def test_progress_counts(fleet, tmp_path):
    from kvreplay import progress

    seen: list[str] = []

    class Sink:
        def start(self, name, total):
            seen.append(f"start {name} {total}")
            return 1

        def advance(self, h, n):
            pass

        def finish(self, h):
            pass

        def status(self, h, text):
            seen.append(text)

    logs = _copy(fleet, tmp_path / "logs", names=2)
    old = progress.set_sink(Sink())
    try:
        run(logs, LocalExecutor(1), options=OPTS, out_dir=str(tmp_path / "ds"))
        run(logs, LocalExecutor(1), options=OPTS, out_dir=str(tmp_path / "ds"))
    finally:
        progress.set_sink(old)
    assert seen[0] == "start audit 3 logs (local, 1 process) 3"
    counts = [x.rsplit(", ", 1) for x in seen if not x.startswith("start ")]
    assert [c for c, _ in counts] == [
        "1 done, 0 failed, 0 skipped", "2 done, 0 failed, 0 skipped",
        "2 done, 1 failed, 0 skipped",  # (empty.log is the last)
        "0 done, 0 failed, 3 skipped"]
    assert all(rate.endswith(" logs/s") for _, rate in counts)
