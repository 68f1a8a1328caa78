"""Golden tests on the real excerpts (tests/data/corpus, copied verbatim from
../shared/corpus/real) and the shipped samples.

Expected counts were checked by hand: `grep -c` for 'Avg prompt throughput',
'Received request' and 'is preempted by' per file, then each hit read to see whether the
excerpt cut it (TRUNC-END / mangled lines in SOURCES.md): a cut line is a typed event marked
`truncated` with the fields before the cut (issue 18; tests/unit/parsers/test_parse_mangled.py). Columns: (stats, received, preemption, unparsed, physical lines).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from kvreplay.events import encode_jsonl
from kvreplay.parsers import detect_version, merge_config, parse_files

CORPUS = Path(__file__).parents[1] / "data" / "corpus"
SAMPLES = Path(__file__).parents[2] / "src" / "kvreplay" / "samples"

EXPECTED = {
    # file: (stats, received, preemption, unparsed, lines)
    "01-v03-metrics-single-line.log": (1, 0, 0, 0, 1),
    "03-v03-stuck-engine-completions.log": (1, 1, 0, 0, 6),  # Received line cut mid-params: typed, truncated
    "05-v050-tqdm-interleaved-swap-preemption.log": (3, 0, 1, 0, 4),  # 3 stats, last cut (truncated); glued after tqdm bars
    "07-v060-received-request-chat-escaped-prompt.log": (0, 1, 0, 0, 1),  # Received cut: truncated
    "09-v063-swap-preemption-chat-ids.log": (2, 0, 1, 0, 3),  # preemption cut inside total_num_cumulative_pr...: truncated, no count
    "11-v064-received-request-chatcmpl-health.log": (0, 1, 0, 0, 4),
    "13-v065-init-engine-config-specdecode.log": (0, 0, 0, 0, 2),  # one config record wrapped over 2 lines
    "15-v07x-v1-startup-gpu-blocks.log": (0, 0, 0, 1, 10),  # the shell command line
    "17-v080-v0engine-startup-404-received.log": (0, 1, 0, 0, 13),  # Received cut: truncated
    "19-v083-dp-engine-init-config.log": (0, 0, 0, 1, 3),  # wrapped config (2 lines) + cut "(EngineCore_7 pid=..) I"
    "21-v09x-v1-startup-kv-capacity.log": (0, 0, 0, 2, 14),  # 2 continuation lines of a raw Python warning
    "23-v011-enginecore-dp0-kv-capacity.log": (0, 0, 0, 0, 3),
    "25-v011-enginedead-mangled-brackets.log": (0, 0, 0, 0, 10),  # 2 tracebacks (6 + 4 lines)
    "27-v014-dp8-waiting-skew.log": (3, 0, 0, 0, 3),  # Engine 002 line cut: truncated
    "29-v016-queue-drain-full-isl.log": (6, 0, 0, 0, 6),  # last one cut: truncated
    "31-v02x-docker-rfc3339-timestamps.log": (5, 0, 0, 0, 5),  # last one cut: truncated
    "33-v02x-specdecode-uvicorn-interleaved.log": (2, 0, 0, 1, 7),  # last access line cut
    "35-v024-idle-gaps-trailing-spaces.log": (6, 0, 0, 0, 6),  # last one cut after "Running: 1 reqs,"
    "37-v07x-preemption-foreign-formatter.log": (0, 0, 1, 0, 3),  # foreign formatter, no envelope
    "39-v02x-mm-cache-hit-specdecode.log": (2, 0, 0, 0, 3),
}


def _parse(path: Path, engine: str = "fast"):
    return list(parse_files([str(path)], year=2025, engine=engine))


def test_every_corpus_file_is_covered():
    assert sorted(p.name for p in CORPUS.glob("*.log")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_corpus_golden_counts(name):
    path = CORPUS / name
    evs = _parse(path)
    kinds = Counter(e.__struct_config__.tag for e in evs)
    stats, received, preempt, unparsed, lines = EXPECTED[name]
    assert (kinds["stats"], kinds["request_received"], kinds["preemption"], kinds["unparsed"]) == (stats, received, preempt, unparsed)
    # every physical line is accounted for exactly once
    physical = path.read_bytes().count(b"\n") + (0 if path.read_bytes().endswith(b"\n") else 1)
    assert sum(e.lines for e in evs) == physical == lines
    covered = sorted(ln for e in evs for ln in range(e.line, e.line + e.lines))
    assert covered == list(range(1, lines + 1))


@pytest.mark.parametrize("path", sorted(CORPUS.glob("*.log")) + sorted(SAMPLES.glob("*.log")), ids=lambda p: p.name)
def test_lark_engine_gives_identical_events(path):
    assert encode_jsonl(_parse(path, "lark")) == encode_jsonl(_parse(path, "fast"))


def test_corpus_details():
    evs = _parse(CORPUS / "05-v050-tqdm-interleaved-swap-preemption.log")
    assert evs[0].note.startswith("record glued") and evs[0].swapped == 100 and evs[0].cpu_kv_usage == 70.4
    assert (evs[1].request_id, evs[1].mode, evs[1].cumulative) == ("165", "SWAP", 151)
    (cfg,) = [e for e in _parse(CORPUS / "19-v083-dp-engine-init-config.log") if e.__struct_config__.tag == "engine_config"]
    assert (cfg.lines, cfg.engine, cfg.vllm_version, cfg.enable_chunked_prefill, cfg.enable_prefix_caching) == (2, 1, "0.8.3", True, True)
    tb = _parse(CORPUS / "25-v011-enginedead-mangled-brackets.log")
    assert [(e.lines, e.category) for e in tb] == [(6, "engine_dead"), (4, None)]
    st = [e for e in _parse(CORPUS / "27-v014-dp8-waiting-skew.log") if e.__struct_config__.tag == "stats"]
    assert [(e.engine, e.waiting, e.gpu_kv_usage, e.mm_cache_hit_rate, e.truncated) for e in st] == [
        (0, 117, 100.0, 0.0, False), (1, 108, 98.6, 0.0, False), (2, None, None, None, True)]
    assert st[2].prompt_throughput == 0.0  # "Engine 002: Avg prompt throughput: 0.0 tok": what is there
    (pre,) = [e for e in _parse(CORPUS / "09-v063-swap-preemption-chat-ids.log") if e.__struct_config__.tag == "preemption"]
    assert (pre.request_id, pre.mode, pre.cumulative, pre.truncated) == ("chat-7e630abf1a8b4c8a88775b1e98a54cf2", "SWAP", None, True)
    (rr,) = [e for e in _parse(CORPUS / "03-v03-stuck-engine-completions.log") if e.__struct_config__.tag == "request_received"]
    # cut after "length_penalty=1.0, early": the complete key=value items before the cut
    assert (rr.request_id, rr.n, rr.best_of, rr.temperature, rr.max_tokens, rr.truncated) == (
        "cmpl-a523b4f84b1b491d9f61ddc4558f532b-0", 1, 1, 0.0, None, True)
    kv = _parse(CORPUS / "21-v09x-v1-startup-kv-capacity.log")
    assert merge_config(kv).kv_cache_tokens == 251920 and merge_config(kv).num_gpu_blocks == 15745
    assert merge_config(kv).block_size == 16
    d = detect_version(_parse(CORPUS / "29-v016-queue-drain-full-isl.log"))
    assert (d.vllm_version, d.how, d.engine_version) == ("0.16.0", "fingerprint loggers.py:259", "V1")
    dock = list(parse_files([str(CORPUS / "31-v02x-docker-rfc3339-timestamps.log")]))  # no --year
    assert dock[0].time == 1778572899.0  # 2026-05-12 08:01:39: year from the docker time stamp, not --year


def test_embedded_sample():
    evs = list(parse_files([str(SAMPLES / "vllm033_fcfs_heavy.reqbody.log")], year=2026))
    kinds = Counter(e.__struct_config__.tag for e in evs)
    # grep -c: 12 'Received request', 12 'Added request', 12 'JSON body', 6 'Avg prompt throughput', 12 'POST /v1/completions'
    assert (kinds["request_received"], kinds["request_added"], kinds["request_body"], kinds["stats"], kinds["http_access"]) == (12, 12, 12, 6, 12)
    assert kinds["unparsed"] == 0
    cfg = merge_config(evs)
    assert (cfg.vllm_version, cfg.num_gpu_blocks, cfg.kv_cache_tokens, cfg.block_size, cfg.max_num_seqs, cfg.max_num_batched_tokens,
            cfg.max_model_len, cfg.enable_prefix_caching, cfg.async_scheduling) == ("0.33.0", 64, 1024, 16, 16, 2048, 1008, False, False)
    r = next(e for e in evs if e.__struct_config__.tag == "request_received")
    assert (r.request_id, r.max_tokens, r.ignore_eos, r.n, r.temperature) == ("cmpl-bench-78064ebc-0-0", 150, True, 1, 0.0)
    b = next(e for e in evs if e.__struct_config__.tag == "request_body")
    assert b.prompt_len == 200 and b.prompt_token_ids[:2] == [10000, 10001] and b.max_tokens == 150
    assert detect_version(evs).how == "stated"


def test_synthetic_samples():
    v0 = list(parse_files([str(SAMPLES / "synthetic_v063_preemptions_newyear.log")], year=2025))
    pre = [e for e in v0 if e.__struct_config__.tag == "preemption"]
    assert [(e.cumulative, e.mode) for e in pre] == [(1, "RECOMPUTE"), (51, "RECOMPUTE")]
    # 12-31 23:59:59 (2025) -> 01-01 00:00:03 (2026): monotonic across the new year
    times = [e.time for e in v0 if e.time is not None]
    assert times == sorted(times) and times[-1] - times[0] < 60
    cfg = merge_config(v0)
    assert (cfg.block_size, cfg.swap_space, cfg.scheduling_policy, cfg.num_gpu_blocks, cfg.max_num_seqs) == (16, 4.0, "fcfs", 1200, 8)
    dp = list(parse_files([str(SAMPLES / "synthetic_v022_dp2_iterations.log")], year=2025))
    it = [e for e in dp if e.__struct_config__.tag == "iteration"]
    assert [(e.engine, e.step, e.context_tokens) for e in it] == [(0, 1, 812), (1, 1, 0), (0, 2, 0)]
    js = list(parse_files([str(SAMPLES / "synthetic_v032_json_format.log")]))
    assert js[0].time == 1778148005.101 and js[-1].category == "engine_dead" and js[2].priority == 3
