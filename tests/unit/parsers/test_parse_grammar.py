"""Every sample line carried by a grammar is a test: Lark parses it, the fast matcher gives
the same fields, and the whole pipeline turns it into a typed event (never Unparsed)."""

from __future__ import annotations

import pytest

from kvreplay.events import Log, Unparsed
from kvreplay.parsers import grammar, matchers, parse_lines

MESSAGE_SAMPLES = grammar.grammar_samples(grammar.MESSAGES_GRAMMAR)
ENVELOPE_SAMPLES = grammar.grammar_samples(grammar.ENVELOPE_GRAMMAR)

# the words the dispatcher strips before a start symbol begins (inverse of matchers._FIRST)
LEAD = {
    "received": "Received request ", "details": "Request ", "body": "Request ", "request_status": "Request ",
    "added": "Added request ", "aborted": "Aborted request(s) ", "finished": "Finished request ",
    "generated": "Generated response ", "non_default_args": "non-default args: ", "namespace": "args: ",
    "spec_v1": "SpecDecoding metrics: ", "spec_v0": "Speculative metrics: ",
}


def test_grammars_carry_samples_for_every_start():
    assert len(MESSAGE_SAMPLES) >= 50 and len(ENVELOPE_SAMPLES) >= 10
    assert set(grammar.message_starts()) == set(matchers.MATCHERS)


@pytest.mark.parametrize("start,text", MESSAGE_SAMPLES, ids=[f"{k}-{i}" for i, (k, _) in enumerate(MESSAGE_SAMPLES)])
def test_message_sample(start, text):
    text = text.rstrip()
    lark_fields = grammar.lark_message_fields(start, text)
    assert lark_fields is not None, "Lark rejects its own sample"
    assert matchers.match_message(start, text) == lark_fields
    msg = LEAD.get(start, "") + text
    assert matchers.dispatch(msg) == (start, text)
    for engine in ("fast", "lark"):
        (e,) = parse_lines([f"INFO 05-07 10:00:05 [x.py:1] {msg}"], year=2026, engine=engine)
        assert not isinstance(e, (Unparsed, Log)), e


@pytest.mark.parametrize("_k,line", ENVELOPE_SAMPLES, ids=[f"env-{i}" for i in range(len(ENVELOPE_SAMPLES))])
def test_envelope_sample(_k, line):
    assert grammar.lark_envelope_fields(line) == matchers.envelope_fields(line) is not None


def test_pyrepr_payloads():
    v = grammar.parse_pyrepr("SamplingParams(n=2, stop=['\\n', \"it's\"], max_tokens=16, mode=<Mode.X: 2>, seed=None)")
    assert v == {"__call__": "SamplingParams", "n": 2, "stop": ["\n", "it's"], "max_tokens": 16, "mode": "Mode.X", "seed": None}
    kw = grammar.parse_pyrepr("model='m', served_model_name=/mnt/a-b/c, c={\"x\":[1,2]}, dtype=torch.bfloat16", start="kwargs")
    assert kw == {"model": "m", "served_model_name": "/mnt/a-b/c", "c": {"x": [1, 2]}, "dtype": "torch.bfloat16"}


def test_lark_cache_dir_can_be_read_only(tmp_path, monkeypatch):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    monkeypatch.setenv("XDG_CACHE_HOME", str(ro))
    p = grammar._build(grammar.ENVELOPE_GRAMMAR)
    assert p.parse("INFO 01-01 00:00:00 a.py:1] x")
