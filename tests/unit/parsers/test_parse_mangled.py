"""Real log lines as users paste them (issue 18): cut short, quoted in prose, behind another
formatter or a Ray tag, with Ray's `[repeated Nx across cluster]`, at DEBUG, V0's `Finished
request`. tests/data/corpus_mangled/ holds our own mangled variants of real line shapes;
each expectation below was read off the line by hand.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from helpers.examples import many

from kvreplay import events as ev
from kvreplay.events import encode_jsonl
from kvreplay.parsers import grammar, parse_files, parse_lines, pipeline

MANGLED = Path(__file__).parents[2] / "data" / "corpus_mangled"


def _events(name: str, engine: str = "fast") -> list:
    return list(parse_files([str(MANGLED / name)], year=2025, engine=engine))


def _kind(e) -> str:
    return e.__struct_config__.tag


def test_quoted_in_prose():
    a, b, c = _events("m01-quoted-in-prose.log")
    assert (_kind(a), a.era, a.running, a.waiting, a.cpu_kv_usage, a.truncated) == ("stats", "v0", 2, 0, 0.0, False)
    assert (_kind(b), b.request_id, b.mode, b.cumulative) == ("preemption", "7", "RECOMPUTE", 1)
    # quoted with typographic quotes and cut inside the last number: "Prefix cache hit rate: 0"
    assert (_kind(c), c.engine, c.waiting, c.gpu_kv_usage, c.prefix_cache_hit_rate, c.truncated) == ("stats", 0, 5, 97.0, None, True)


def test_foreign_formatter_in_front():
    r, a, s, f = _events("m02-framework-logger.log")
    assert (_kind(r), r.request_id, r.prompt, r.max_tokens, r.prompt_len, r.level) == ("request_received", "chat-5d9f", "hello", 256, 3, "INFO")
    assert r.time_text == "2024-10-27 14:02:11.482" and r.time == pytest.approx(1730037731.482)
    assert (_kind(a), a.request_id, a.time_text) == ("request_added", "chat-5d9f", "2024-10-27 14:02:11,483")
    assert (_kind(s), s.era, s.running, s.gpu_kv_usage) == ("stats", "v0", 1, 0.5)
    assert (_kind(f), f.request_id) == ("request_finished", "chat-5d9f")
    assert all(e.note == "vLLM message after a foreign prefix" for e in (r, a, s, f))


def test_ray_tags_and_repeated_suffix():
    p, s, f = _events("m03-ray-repeated.log")
    assert (_kind(p), p.process, p.pid, p.request_id, p.cumulative, p.repeat) == ("preemption", "RayWorkerWrapper", 5423, "12", 1, 2)
    assert (_kind(s), s.running, s.waiting, s.repeat) == ("stats", 4, 2, 3)
    assert (_kind(f), f.request_id, f.repeat) == ("request_finished", "cmpl-77", 5)


def test_cut_short():
    s0, s1, p, r, it, kv = _events("m04-cut-short.log")
    assert (_kind(s0), s0.era, s0.prompt_throughput, s0.generation_throughput, s0.truncated) == ("stats", "v0", 0.0, None, True)
    assert (s1.running, s1.waiting, s1.gpu_kv_usage, s1.prefix_cache_hit_rate, s1.truncated) == (1, 0, 3.0, None, True)
    assert (_kind(p), p.request_id, p.mode, p.cumulative, p.truncated) == ("preemption", "cmpl-9", "RECOMPUTE", None, True)
    # cut inside SamplingParams: the complete key=value items before the cut
    assert (_kind(r), r.request_id, r.n, r.temperature, r.max_tokens, r.min_tokens, r.truncated) == (
        "request_received", "cmpl-9", 1, 0.0, 128, None, True)
    # an Iteration line cut before its step time: every field of the event is required
    assert (_kind(it), it.reason) == ("unparsed", "iteration line cut before its required fields")
    assert (_kind(kv), kv.kv_cache_tokens, kv.concurrency_tokens, kv.truncated) == ("kv_capacity", 251920, None, True)


def test_debug_stats_and_v05_finished():
    d1, d0, f1, f2, err = _events("m05-debug-and-v05.log")
    assert (_kind(d1), d1.level, d1.era, d1.source) == ("stats", "DEBUG", "v1", "v1/metrics/loggers.py:123")
    assert (_kind(d0), d0.level, d0.era, d0.truncated) == ("stats", "DEBUG", "v0", False)
    assert [(_kind(e), e.request_id) for e in (f1, f2)] == [("request_finished", "cmpl-7f3a2b9c0d"), ("request_finished", "0")]
    # "Engine background task failed" starts with "Engine" but is no stats line
    assert (_kind(err), err.message) == ("log", "Engine background task failed")


@pytest.mark.parametrize("path", sorted(MANGLED.glob("*.log")), ids=lambda p: p.name)
def test_both_engines_and_routes_agree(path):
    fast = encode_jsonl(_events(path.name))
    assert encode_jsonl(_events(path.name, "lark")) == fast
    pipeline.FAST_PATHS = False
    try:
        assert encode_jsonl(_events(path.name)) == fast
    finally:
        pipeline.FAST_PATHS = True


def test_untouched_lines_have_no_flags():
    e, = parse_lines("INFO 02-28 21:48:18 metrics.py:161] Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 44.9 tokens/s, "
                     "Running: 2 reqs, Swapped: 0 reqs, Pending: 3 reqs, GPU KV cache usage: 82.1%, CPU KV cache usage: 0.0%\n", year=2025)
    assert (e.truncated, e.repeat) == (False, None) and b"truncated" not in encode_jsonl([e])


# ------------------------------------------------------------------ property: cut anywhere

# The message keyword of each sample kind (as the dispatcher reads it) and the envelope put
# before the sample text.
_LEAD = {"received": "Received request ", "details": "Request ", "body": "Request ", "request_status": "Request ",
         "added": "Added request ", "aborted": "Aborted request(s) ", "finished": "Finished request ",
         "generated": "Generated response ", "non_default_args": "non-default args: ", "namespace": "args: ",
         "spec_v1": "SpecDecoding metrics: ", "spec_v0": "Speculative metrics: "}
_SAMPLES = [(k, _LEAD.get(k, "") + t.rstrip()) for k, t in grammar.grammar_samples(grammar.MESSAGES_GRAMMAR)
            if k and not k.startswith("trace_") and k not in ("non_default_args", "namespace")]
_ENV = "(APIServer pid=7) INFO 05-07 10:00:05 [x.py:1] "
_KW = 12  # cut after the first characters of the message: past its keyword


@settings(many())
@given(st.sampled_from(_SAMPLES), st.floats(0, 1))
def test_any_cut_after_the_keyword_is_typed_and_flagged_or_clearly_unparsed(sample, where):
    kind, msg = sample
    cut = min(len(msg), _KW + int(where * (len(msg) - _KW)))
    text = msg[:cut]
    (e,) = list(pipeline.parse_stream(io.StringIO(_ENV + text + "\n", newline="\n"), "t.log", pipeline.Clock(year=2026)))
    if isinstance(e, ev.Unparsed):
        assert e.reason and e.text == text.rstrip() and e.line == 1  # clear: why, what, where
    elif cut < len(msg) and e.truncated:
        assert _kind(e) not in ("log", "noise")
    else:  # the cut left a complete line of its kind (or of another known kind)
        assert _kind(e) != "unparsed"
