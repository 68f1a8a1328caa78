"""KV-cache events: the recorder's decoding, the cache state it implies, and the
block-level check of an exact replay. The live path (real vLLM 0.33.0 publishing over ZMQ,
`record-kv-events` subscribing) is in test_kv_events_vllm below; it needs the vLLM venv."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

import msgspec
import pytest

from kvreplay.inference.step_trace import CacheState, apply_all, replay_step_trace
from kvreplay.cli.record_kv_events import decode_batch
from kvreplay.parsers.kv_event_files import is_kv_events_file, read_kv_events
from kvreplay.parsers import parse_files

from helpers.vllm_venv import DRIVER, need_vllm, vllm_env

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent


def _payload(events, ts=1.5, rank=None):
    # vLLM's KVEventBatch is array_like: [ts, events, rank]; events are tagged maps.
    return msgspec.msgpack.encode([ts, events, rank])


def test_decode_batch_keeps_hashes_drops_token_ids():
    h = bytes(range(32))
    p = _payload([
        {"type": "BlockStored", "block_hashes": [h, 7], "parent_block_hash": None,
         "token_ids": list(range(32)), "block_size": 16, "lora_id": None, "medium": "GPU"},
        {"type": "BlockRemoved", "block_hashes": [2**64 - 1], "medium": "GPU"},
        {"type": "AllBlocksCleared"},
    ])
    b = decode_batch(3, p)
    assert b["seq"] == 3 and b["ts"] == 1.5
    st, rm, cl = b["events"]
    assert st["block_hashes"] == [h[-8:].hex(), "0000000000000007"]
    assert st["num_tokens"] == 32 and "token_ids" not in st
    assert rm["block_hashes"] == ["ffffffffffffffff"]  # vLLM's int hashes are 64-bit
    assert cl == {"type": "AllBlocksCleared"}
    assert "0, 1, 2" not in json.dumps(b)


def test_cache_state():
    recs = [
        {"seq": 0, "events": [{"type": "BlockStored", "block_hashes": ["a", "b"]}]},
        {"seq": 1, "events": [{"type": "BlockRemoved", "block_hashes": ["a"]},
                              {"type": "BlockStored", "block_hashes": ["c"], "medium": "CPU"}]},
    ]
    assert apply_all(recs).cached == {"b"}
    s = CacheState()
    s.apply(recs[0])
    s.apply({"seq": 2, "events": [{"type": "AllBlocksCleared"}]})
    assert s.num_cached == 0 and s.batches == 2


def test_read_and_sniff(tmp_path):
    p = tmp_path / "ev.jsonl"
    p.write_text('{"seq":1,"events":[]}\n{"seq":0,"events":[]}\n')
    assert is_kv_events_file(str(p))
    assert [r["seq"] for r in read_kv_events(str(p))] == [0, 1]
    q = tmp_path / "x.log"
    q.write_text("INFO 01-01 00:00:00 [a.py:1] hi\n")
    assert not is_kv_events_file(str(q))


# ------------------------------------------------------------------ real vLLM 0.33.0


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def vllm_kv_runs(tmp_path_factory):
    """f_prefix_caching (sync) and the same workload under async scheduling, through vLLM
    with the plugin and --kv-events-config (ZMQ on 127.0.0.1), each recorded by
    `python -m kvreplay.cli.record_kv_events` (record-kv-events) running in the vLLM venv."""
    py = need_vllm()
    out = tmp_path_factory.mktemp("kv_events")
    base = json.loads((TESTS / "data/conformance/cases/f_prefix_caching/workload.json").read_text())
    variants = {"sync": base, "async": {**base, "config": {**base["config"], "async_scheduling": True}}}
    jobs, recorders, names = [], [], []
    env = vllm_env()
    env["PYTHONPATH"] = str(REPO / "src")
    for name, wl in variants.items():
        d = out / name
        d.mkdir()
        (d / "workload.json").write_text(json.dumps(wl))
        pub, rep = _port(), _port()
        ep, rep_ep = f"tcp://127.0.0.1:{pub}", f"tcp://127.0.0.1:{rep}"
        recorders.append(subprocess.Popen(
            [str(py), "-m", "kvreplay.cli.record_kv_events", ep, "-o", str(d / "kv_events.jsonl"),
             "--replay-endpoint", rep_ep, "--idle-timeout", "4", "--duration", "240"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        jobs.append({"workload": str(d / "workload.json"), "log": str(d / "vllm.log"),
                     "trace": str(d / "trace.jsonl"), "summary": str(d / "summary.json"),
                     "meta": str(d / "meta.json"), "plugin": True,
                     "kv_events": {"endpoint": f"tcp://127.0.0.1:{pub}", "replay_endpoint": f"tcp://127.0.0.1:{rep}"}})
        names.append(name)
    (out / "jobs.json").write_text(json.dumps(jobs))
    try:
        proc = subprocess.run([str(py), str(DRIVER), str(out / "jobs.json")], capture_output=True,
                              text=True, env=vllm_env(), timeout=600)
        recs = [json.loads(line[6:]) for line in proc.stdout.splitlines() if line.startswith("@@JOB ")]
        assert [r["status"] for r in recs] == ["ok"] * len(jobs), (recs, proc.stderr[-3000:])
        for r in recorders:
            r.wait(timeout=300)
    finally:
        for r in recorders:
            if r.poll() is None:
                r.kill()
                r.wait()
    return {n: out / n for n in names}


@pytest.mark.needs_vllm
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_kv_events_from_vllm_match_the_replay_block_pool(vllm_kv_runs, mode):
    d = vllm_kv_runs[mode]
    recs = read_kv_events(str(d / "kv_events.jsonl"))
    assert recs and [r["seq"] for r in recs] == list(range(len(recs)))  # nothing lost
    assert any(e["type"] == "BlockRemoved" for r in recs for e in r["events"])
    evs = list(parse_files([str(d / "vllm.log")], year=2026))
    res = replay_step_trace(evs, kv_events=recs).step_check
    assert res.first_divergence is None, res.first_divergence
    steps = [e for e in evs if type(e).__name__ == "StepTrace"]
    assert res.steps_checked == len(steps)
    # checked after every step that published (every step with an update)
    assert res.kv_events_checked == sum(1 for e in steps if e.updated_batch is not None) > 0


@pytest.mark.needs_vllm
def test_altered_kv_event_is_a_block_level_divergence(vllm_kv_runs):
    d = vllm_kv_runs["sync"]
    recs = read_kv_events(str(d / "kv_events.jsonl"))
    i = next(k for k, r in enumerate(recs) if any(e["type"] == "BlockRemoved" for e in r["events"]))
    bad = json.loads(json.dumps(recs))
    bad[i]["events"] = [e for e in bad[i]["events"] if e["type"] != "BlockRemoved"]
    evs = list(parse_files([str(d / "vllm.log")], year=2026))
    res = replay_step_trace(evs, kv_events=bad).step_check
    div = res.first_divergence
    assert div is not None and div.field == "kv_cached_blocks"
    steps = [e for e in evs if type(e).__name__ == "StepTrace"]
    want = next(st for st in steps if st.kv_events is not None and st.kv_events > recs[i]["seq"])
    assert (div.step, div.line) == (want.step, want.line)
    assert div.logged["only_in_vllm"]


@pytest.mark.needs_vllm
def test_cli_replays_a_step_trace_log_with_its_kv_events(vllm_kv_runs, tmp_path):
    """`kvreplay replay vllm.log kv_events.jsonl`: every step and the block state checked."""
    import subprocess
    import sys

    d = vllm_kv_runs["sync"]
    proc = subprocess.run(
        [sys.executable, "-m", "kvreplay", "replay", str(d / "vllm.log"), str(d / "kv_events.jsonl"),
         "--year", "2026"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "every step agrees with the log" in proc.stdout
    assert "KV-cache block state checked against vLLM's events after" in proc.stdout
    lone = subprocess.run([sys.executable, "-m", "kvreplay", "replay", str(d / "kv_events.jsonl")],
                          capture_output=True, text=True, timeout=120)
    assert lone.returncode == 2 and "give the log too" in lone.stderr
