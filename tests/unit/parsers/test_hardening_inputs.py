"""Hostile inputs: each a one-line reproducer of a hang, a blow-up or a traceback, now either
an unparsed line (with file and line) or one UserError (exit 2) naming what to do."""

from __future__ import annotations

import gzip
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvreplay.errors import UserError
from kvreplay.parsers import parse_files, parse_lines

SAMPLES = Path(__file__).parents[3] / "src" / "kvreplay" / "samples"
ENV = "(APIServer pid=2801) INFO 05-07 10:01:00 [request_logger.py:66] "
STATS = "Engine 000: Avg prompt throughput: 800.0 tokens/s, Avg generation throughput: 332.0 tokens/s, Running: 3 reqs, Waiting: 9 reqs, GPU KV cache usage: 90.5%"


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _cli(*args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    import os

    e = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "kvreplay", *args], capture_output=True, text=True, timeout=120, env=e, cwd=cwd)


def _no_traceback(p: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in p.stderr, p.stderr[-2000:]
    assert p.returncode in (0, 2), (p.returncode, p.stderr[-500:])


# 1. the progress-bar test backtracked cubically: 7 KB took 106 s
def test_progress_bar_pattern_is_linear():
    line = "1%|" * 20000  # 60 KB
    t0 = _cpu()
    evs = list(parse_lines([line], year=2026))
    assert _cpu() - t0 < 2.0
    assert sum(e.lines for e in evs) == 1
    # the test itself still tells a bar from a line
    bar = "Processed prompts:  45%|████▌     | 9/20 [00:01<00:01,  7.20it/s]"
    assert [e.what for e in parse_lines([bar], year=2026)] == ["progress"]
    assert [type(e).__name__ for e in parse_lines(["45%| nothing else | here"], year=2026)] == ["Unparsed"]


# 2. a cut request line of any length: bounded CPU (its recovery parses at most CUT_MAX)
def test_cut_request_line_is_bounded(tmp_path):
    p = tmp_path / "cut.log"
    p.write_text(ENV + "Received request cmpl-x: params: SamplingParams(n=1, stop=[" + '"a", ' * 600_000)
    t0 = _cpu()
    evs = list(parse_files([str(p)], year=2026))
    assert _cpu() - t0 < 8.0
    assert len(evs) == 1 and evs[0].line == 1 and evs[0].file == str(p)


def test_unterminated_prompt_is_linear():
    """The grammar's string terminal backtracked with a stack per character: a cut 400 KB
    prompt took 330 MB and grew quadratically (now unrolled and possessive)."""
    from kvreplay.parsers import grammar

    grammar.messages_parser()
    t0 = _cpu()
    r0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    evs = list(parse_lines([ENV + "Received request cmpl-x: prompt: '" + "a" * 1_000_000], year=2026))
    assert _cpu() - t0 < 2.0
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - r0 < 150 * 1024  # KiB
    assert len(evs) == 1


# 3. one flipped byte in a .gz: a read error on a line (audit: one UserError), not zlib.error
def test_corrupt_gzip_is_a_read_error(tmp_path):
    data = bytearray(gzip.compress((SAMPLES / "vllm033_fcfs_heavy.log").read_bytes()))
    data[len(data) // 2] ^= 0xFF
    p = tmp_path / "flip.log.gz"
    p.write_bytes(bytes(data))
    evs = list(parse_files([str(p)], year=2026))
    assert evs[-1].note and evs[-1].note.startswith("read error")
    r = _cli("audit", str(p))
    _no_traceback(r)
    assert "unreadable" in r.stdout + r.stderr


def test_decompressed_size_limit(tmp_path, monkeypatch):
    p = tmp_path / "bomb.log.gz"
    p.write_bytes(gzip.compress(b"\n" * 2_000_000))
    monkeypatch.setenv("KVREPLAY_MAX_DECOMPRESSED", "100000")
    evs = list(parse_files([str(p)], year=2026))
    assert "KVREPLAY_MAX_DECOMPRESSED" in (evs[-1].note or "")
    assert sum(e.lines for e in evs) < 200_000


def test_corrupt_kv_events_gzip(tmp_path):
    from kvreplay.parsers.kv_event_files import read_kv_events

    data = bytearray(gzip.compress(b'{"seq": 1, "ts": 0, "events": []}\n' * 5000))
    data[len(data) // 2] ^= 0xFF
    p = tmp_path / "kv.jsonl.gz"
    p.write_bytes(bytes(data))
    with pytest.raises(UserError):
        read_kv_events(str(p))


# 4. year 0 in a container stamp; a new year past 9999; --year out of range
def test_dates_out_of_range():
    evs = list(parse_lines(["0000-05-07T10:01:00.000000000Z " + ENV + STATS], year=2026))
    assert type(evs[0]).__name__ == "Stats" and evs[0].wrapper_time is None
    roll = ["INFO 12-31 23:59:59 [loggers.py:1] Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 1.0%",
            "INFO 01-01 00:00:01 [loggers.py:1] Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 1.0%"]
    evs = list(parse_lines(roll, year=9999))
    assert evs[0].time is not None and evs[1].time is None and evs[1].time_text == "01-01 00:00:01"
    with pytest.raises(UserError, match="--year"):
        list(parse_lines(roll, year=0))


# 5. a 5,000-digit pid
def test_huge_integers():
    evs = list(parse_lines(["(APIServer pid=" + "9" * 5000 + ") INFO 05-07 10:01:00 [loggers.py:335] " + STATS[12:]], year=2026))
    assert len(evs) == 1 and evs[0].pid is None
    evs = list(parse_lines([ENV + "Engine 000: Avg prompt throughput: 1.0 tokens/s, Avg generation throughput: 1.0 tokens/s, Running: "
                            + "9" * 5000 + " reqs, Waiting: 0 reqs, GPU KV cache usage: 1.0%"], year=2026))
    assert len(evs) == 1 and type(evs[0]).__name__ == "Unparsed" and evs[0].line == 1
    # past int64 (a typed column downstream cannot hold it): unparsed, on both routes
    line = ENV + STATS.replace("Running: 3", "Running: 99999999999999999999")
    for engine in ("fast", "lark"):
        (e,) = parse_lines([line], year=2026, engine=engine)
        assert type(e).__name__ == "Unparsed" and "out of range" in e.reason


def test_audit_of_a_count_past_int64(tmp_path):
    src = (SAMPLES / "vllm033_fcfs_heavy.log").read_text()
    p = tmp_path / "big.log"
    p.write_text(src.replace("Running: 3 reqs, Waiting: 9 reqs", "Running: 99999999999999999999 reqs, Waiting: 9 reqs", 1))
    r = _cli("audit", str(p), "--no-replay", "--year", "2026")
    _no_traceback(r)
    assert r.returncode == 0


# 6. JSON-format lines: a time of 1e309 / a fraction that overflows, deep nesting
def test_json_lines_with_odd_numbers(tmp_path):
    rec = {"asctime": "2026-05-07 10:00:05,1e999", "levelname": "INFO", "message": STATS}
    lines = [json.dumps(rec), '{"asctime": 1e309, "message": "x"}', "{" + '"a":[' * 50_000 + "1" + "]" * 50_000 + "}",
             '{"message": "' + STATS + '", "process": ' + "9" * 5000 + "}"]
    evs = list(parse_lines(lines, year=2026))
    assert [e.line for e in evs] == [1, 2, 3, 4]
    assert evs[0].time is None or evs[0].time < 1e11
    p = tmp_path / "j.log"
    p.write_text("\n".join(lines) + "\n")
    r = _cli("parse", "--format", "summary", str(p))
    _no_traceback(r)
    assert r.returncode == 0


# 7. workload and Jaeger files nested 100k deep
def test_deep_nesting(tmp_path):
    from kvreplay.parsers.span_files import read_spans
    from kvreplay.replay.workload import load_workload

    w = tmp_path / "deep.workload.json"
    w.write_text('{"config": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(UserError, match="nested"):
        load_workload(w)
    j = tmp_path / "deep.jaeger.json"
    j.write_text('{"data": [{"spans": ' + "[" * 100_000 + "]" * 100_000 + "}]}")
    with pytest.raises(UserError):
        read_spans(str(j))
    r = _cli("simulate", str(w))
    _no_traceback(r)
    assert r.returncode == 2


# 8. nan / inf throughput in a stats line: kept as not logged, with a note
@pytest.mark.parametrize("v", ["nan", "inf"])
def test_non_finite_stats(v):
    line = ENV + STATS.replace("800.0", v)
    for engine in ("fast", "lark"):
        (e,) = parse_lines([line], year=2026, engine=engine)
        assert type(e).__name__ == "Stats" and e.prompt_throughput is None and e.generation_throughput == 332.0
        assert e.running == 3 and f"prompt_throughput={v}" in e.note


def test_replay_with_nan_throughput(tmp_path):
    src = (SAMPLES / "vllm033_fcfs_heavy.log").read_text()
    p = tmp_path / "nan.log"
    p.write_text(src.replace("Avg prompt throughput: 800.0", "Avg prompt throughput: nan", 1).replace(
        "Avg generation throughput: 332.0", "Avg generation throughput: inf"))
    r = _cli("replay", str(p), "--year", "2026")
    _no_traceback(r)
    assert r.returncode == 0


# 9, 10. sanity limits: a config past them is a UserError naming the limit and its variable
def test_config_values_past_int64_are_not_kept():
    from kvreplay.parsers.build_config import config_from_mapping

    kw = config_from_mapping({"max_seq_len": "99999999999999999999", "block_size": "16", "gpu_memory_utilization": "1e999",
                              "max_num_seqs": 1e309})
    assert kw == {"block_size": 16}


def test_block_limit(monkeypatch):
    from kvreplay.replay.workload import parse_workload

    wl = json.loads((SAMPLES / "fcfs_heavy.workload.json").read_text())
    wl["config"]["num_gpu_blocks"] = 10_000_000_000
    from kvreplay.replay.engine import simulate

    t0 = _cpu()
    with pytest.raises(UserError, match="KVREPLAY_MAX_BLOCKS"):
        simulate(parse_workload(wl, check_capacity=False))
    assert _cpu() - t0 < 1.0
    monkeypatch.setenv("KVREPLAY_MAX_BLOCKS", "10")
    wl["config"]["num_gpu_blocks"] = 64
    with pytest.raises(UserError, match="limit of 10 "):
        simulate(parse_workload(wl, check_capacity=False))


def test_override_in_log_hits_the_limit(tmp_path):
    src = (SAMPLES / "vllm033_fcfs_heavy.log").read_text()
    p = tmp_path / "ovr.log"
    p.write_text(src.replace("'num_gpu_blocks_override': 64", "'num_gpu_blocks_override': 10000000000")
                 .replace("num_gpu_blocks_override=64", "num_gpu_blocks_override=10000000000"))
    r = _cli("replay", str(p), "--year", "2026")
    assert r.returncode == 2 and "KVREPLAY_MAX_BLOCKS" in r.stderr and "Traceback" not in r.stderr


def test_n_limit():
    from kvreplay.limits import check

    with pytest.raises(UserError, match="KVREPLAY_MAX_N"):
        check("n", 2147483648, "SamplingParams n")
    assert check("n", 8, "n") == 8


def test_bad_limit_variable(monkeypatch):
    from kvreplay.limits import limit

    monkeypatch.setenv("KVREPLAY_MAX_N", "lots")
    with pytest.raises(UserError, match="KVREPLAY_MAX_N"):
        limit("n")


# 11. --fail-on accepts only its documented grammar
@pytest.mark.parametrize("text", ["[1] < 2", "[0]*99999999999 == 1", "recompute_ratio in (1, 2) < 3", "status in [(1, 2)]",
                                  "(1, 2) in (1, 2)", "a\x00", "recompute_ratio ** 2 > 1"])
def test_fail_on_rejects_outside_grammar(text):
    from kvreplay.audit.expr import ExprError, compile_fail_on

    t0 = time.process_time()
    with pytest.raises(ExprError):
        compile_fail_on(text)
    assert time.process_time() - t0 < 1.0


def test_fail_on_documented_forms_still_work():
    from kvreplay.audit.expr import compile_fail_on

    rec = {"recompute_ratio": 0.1, "status": "KV-block bound", "kv_time_ge95": 0.0, "preemptions_replayed": 11, "prefix_caching": False}
    for text in ["recompute_ratio > 0.05", "status == 'KV-block bound' or kv_time_ge95 >= 0.2",
                 "preemptions_replayed > 10 and not prefix_caching", "status in ('KV-block bound', 'single-sequence-length bound')",
                 "status not in ['x'] and -recompute_ratio < 0"]:
        assert compile_fail_on(text).evaluate(rec) is True


# the Dask executor's own cluster: nothing another local user can connect to
def test_dask_local_cluster_listens_nowhere():
    import psutil

    from kvreplay.audit.fleet.executors import DaskExecutor

    me = psutil.Process()

    def listening() -> set:
        return {c.laddr for c in me.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN}

    before = listening()
    ex = DaskExecutor(None, 2)
    try:
        assert listening() == before  # no comm port, no HTTP server (Dask opens 8787 on 0.0.0.0 otherwise)
        assert ex.describe() == "dask in-process LocalCluster, 2 workers"
        assert ex.result(ex.submit(pow, 2, 10, key="p")) == 1024
        assert listening() == before
    finally:
        ex.close()


def test_fast_paths_still_take_the_common_lines():
    """The counts' digit bound (18) must not push every stats / Iteration line off the fast path."""
    from kvreplay.parsers.fast import fast_message

    args = ("f", 1, None, None, "INFO", None, None, None, "loggers.py:1", None)
    for msg in [STATS, STATS[12:], "Engine 000: Iteration(7): 1 context requests, 200 context tokens, 3 generation requests, 3 generation tokens, "
                "iteration elapsed time: 23.45 ms, GPU KV cache usage: 12.5%",
                "Iteration(7): 1 context requests, 200 context tokens, 3 generation requests, 3 generation tokens, iteration elapsed time: 23.45 ms"]:
        assert fast_message(msg, *args) is not None, msg
    assert fast_message(STATS.replace("Running: 3", "Running: " + "9" * 19), *args) is None


# found by tools/fuzz_inputs.py (long run): each a traceback or seconds of CPU before
def test_fuzz_finds():
    from kvreplay.parsers import grammar

    grammar.messages_parser()
    lines = [
        "(EngineCore pid=1) INFO 05-07 10:00:05 [config.py:1] Using max model len " + "9" * 4995,  # config_line int()
        '{"message": "Running: 1 reqs", "processName": "EngineCore_DP' + "9" * 5000 + '", "filename": "a.py", "lineno": 1}',
        "ERROR 05-07 10:00:05 [serving.py:1] This model's maximum context length is " + "9" * 5000
        + " tokens. However, you requested " + "9" * 5000 + " tokens",
    ]
    evs = list(parse_lines(lines, year=2026))
    assert [e.line for e in evs] == [1, 2, 3]
    assert type(evs[0]).__name__ == "Unparsed"
    # cut-line recovery tried every cut of the text after the parse stopped: quadratic
    t0 = _cpu()
    it = ("Engine 000: Iteration(17): 0 context requests, 0 context tokens, 9 generation requests, 9 generation tokens, "
          "iteration elapsed time: 6.83 ms, GPU KV cach" + "Engine 000: " * 90_000 + "e usage: 98.4%")
    evs = list(parse_lines([ENV + it], year=2026))
    assert _cpu() - t0 < 2.0 and len(evs) == 1


# a gzip bomb: refused by its expansion ratio after GZIP_RATIO_FREE bytes (a read error on
# a line, one line and exit 2 in every command), not read until memory runs out
def test_gzip_bomb_is_refused_by_its_ratio(tmp_path, monkeypatch, capsys):
    import kvreplay.limits
    from kvreplay.cli import main

    monkeypatch.setattr(kvreplay.limits, "GZIP_RATIO_FREE", 1 << 20)
    monkeypatch.setenv("KVREPLAY_PROGRESS", "0")
    monkeypatch.setenv("KVREPLAY_MAX_GZIP_RATIO", "50")  # (the default's 200: a real bomb's 1000x)
    line = "(APIServer pid=2801) INFO 05-07 10:01:00 [loggers.py:335] " + STATS + "\n"
    p = tmp_path / "bomb.log.gz"
    p.write_bytes(gzip.compress(line.encode() * 40_000, mtime=0))  # 8 MB -> 40 kB: ~220x
    evs = list(parse_files([str(p)], year=2026))
    assert "KVREPLAY_MAX_GZIP_RATIO" in (evs[-1].note or "")
    assert len(evs) < 10_000  # stopped after ~1 MB of its 8 MB (read 16 kB at a time)
    for argv in (["parse", str(p)], ["replay", str(p)], ["audit", str(p)]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "gzip bomb" in err[0] and "KVREPLAY_MAX_GZIP_RATIO" in err[0], err
    monkeypatch.setenv("KVREPLAY_MAX_GZIP_RATIO", "1000")  # raised above its ratio: read through
    assert sum(e.lines for e in parse_files([str(p)], year=2026)) == 40_000


def test_gzip_bomb_workload_is_refused(tmp_path, monkeypatch, capsys):
    import kvreplay.limits
    from kvreplay.cli import main

    monkeypatch.setattr(kvreplay.limits, "GZIP_RATIO_FREE", 1 << 20)
    p = tmp_path / "w.json.gz"
    p.write_bytes(gzip.compress(b" " * (8 << 20), mtime=0))  # ~1000x
    assert main(["simulate", str(p)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "gzip bomb" in err[0], err
    with pytest.raises(OSError, match="end-of-stream"):
        kvreplay.limits.gunzip(gzip.compress(b"x" * 1000)[:-12])


# a run that would take an absurd number of steps stops at the `steps` limit with one line
def test_step_limit_stops_a_replay(monkeypatch, capsys):
    from kvreplay.cli import main

    monkeypatch.setenv("KVREPLAY_PROGRESS", "0")
    log = str(SAMPLES / "vllm033_fcfs_heavy.log")  # its replay runs ~100 steps
    assert main(["replay", log, "--samples", "1"]) == 0
    capsys.readouterr()
    monkeypatch.setenv("KVREPLAY_MAX_STEPS", "30")
    for argv in (["replay", log], ["whatif", log, "--max-num-seqs", "2"]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "limit of 30 scheduler steps" in err[0] and "KVREPLAY_MAX_STEPS" in err[0], err


def test_step_limit_stops_a_request_too_long_for_the_pool(tmp_path, monkeypatch, capsys):
    """One request whose max_tokens runs it for ~10^6 decode steps: stopped at the limit."""
    from kvreplay.cli import main

    monkeypatch.setenv("KVREPLAY_MAX_STEPS", "2000")
    w = {"config": {"num_gpu_blocks": 70000, "block_size": 16, "max_num_seqs": 4,
                    "max_num_batched_tokens": 2048, "max_model_len": 1 << 21, "max_steps": 10**9},
         "requests": [{"id": "r0", "arrival_step": 0, "prompt_token_ids": [1] * 32,
                       "max_tokens": 1_000_000}]}
    p = tmp_path / "w.json"
    p.write_text(json.dumps(w))
    assert main(["simulate", str(p), "--format", "summary"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "limit of 2000 scheduler steps" in err[0], err


def test_kv_events_gzip_bomb_is_bounded(tmp_path, monkeypatch):
    """A KV-events .gz that expands without a newline: the sniff reads a bounded head and
    the reader stops at the ratio limit (one UserError), neither reads it through."""
    import kvreplay.limits
    from kvreplay.parsers.kv_event_files import is_kv_events_file, read_kv_events

    monkeypatch.setattr(kvreplay.limits, "GZIP_RATIO_FREE", 1 << 20)
    p = tmp_path / "kv.jsonl.gz"
    p.write_bytes(gzip.compress(b'{"seq": 1, "events": [' + b"0, " * (3 << 20), mtime=0))
    assert is_kv_events_file(str(p)) is False
    with pytest.raises(UserError, match="gzip bomb"):
        read_kv_events(str(p))


def test_a_cut_line_nested_deeper_than_the_recursion_limit():
    # found by the fuzz harness (seed 101, input 119,128): a non-default args line cut inside
    # 5,000 nested brackets; the cut-line recovery's tree walk raised RecursionError
    from kvreplay import events as ev
    from kvreplay.parsers import grammar

    line = ("(APIServer pid=2801) INFO 05-07 10:00:05 [startup.py:96] non-default args: {'model_tag': "
            + "[" * 5000 + "]" * 4000)
    t0 = _cpu()
    evs = list(parse_lines([line], year=2026))
    assert _cpu() - t0 < 5.0
    assert sum(e.lines for e in evs) == 1 and len(evs) == 1
    assert isinstance(evs[0], (ev.EngineConfig, ev.Unparsed))
    # the walk gives a deep tree's fields in source order, as the recursive walk did
    from lark import Token, Tree

    deep = Tree("f_inner", [Token("F_X", "x")])
    for _ in range(5000):
        deep = Tree("wrap", [deep])
    tree = Tree("_", [Token("F_A", "a"), deep, Tree("wrap", [Token("F_B", "b")])])
    text = "a" + " " * 10
    deep_f = deep
    while deep_f.data != "f_inner":
        deep_f = deep_f.children[0]
    deep_f.meta.start_pos, deep_f.meta.end_pos = 1, 3
    assert grammar.tree_fields(tree, text) == [("a", "a"), ("inner", text[1:3]), ("b", "b")]


def test_a_broken_workload_json_with_a_huge_integer_is_one_line(tmp_path):
    # found by the fuzz harness (seed 202, input 1,848): JSON that msgspec refuses, whose
    # fallback decode (for the message) met a 5,000-digit integer first: ValueError traceback
    p = tmp_path / "w.workload.json"
    p.write_text('{"config": {"num_gpu_blocks": ' + "9" * 5000 + '}, "requests": [,]}')
    r = _cli("replay", str(p), "--samples", "0")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-500:]
    assert len(r.stderr.strip().splitlines()) == 1 and "not JSON" in r.stderr


@pytest.mark.parametrize("version", ["v" + "9" * 5000, "0.\u00b2.1"])
def test_a_release_number_no_int_can_read_is_no_release(version):
    # found by the fuzz harness (seed 205, input 314: export of a log whose banner names
    # release v999...9, 5,000 digits): int() refused it with a traceback; "²" is a digit
    # to str.isdigit but not to int()
    from kvreplay.replay.profile import parse_version

    assert parse_version(version) is None
    assert parse_version("v0.33.0") == (0, 33, 0) and parse_version("0.6.6.post1") == (0, 6, 6)


def test_export_of_a_log_naming_a_5000_digit_release_is_one_line(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("(EngineCore_0 pid=1) INFO 04-17 23:05:00 [core.py:61] Initializing a V1 LLM "
                   "engine (v" + "9" * 5000 + ") with config: model='m'\n"
                   "INFO 04-17 23:05:01 [loggers.py:123] Engine 000: Avg prompt throughput: "
                   "0.0 tokens/s, Avg generation throughput: 0.0 tokens/s, Running: 0 reqs, "
                   "Waiting: 0 reqs, GPU KV cache usage: 0.0%, Prefix cache hit rate: 0.0%\n")
    r = _cli("export", str(log), "--year", "2026", "--perfetto", str(tmp_path / "o.pftrace"))
    _no_traceback(r)
