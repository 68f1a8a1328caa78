"""The fast paths agree with the general route, byte for byte.

The parser has two routes to the same events: the general one (`FileParser.feed`, the
matchers of matchers.py that the grammar tests tie to messages.lark, the builders of
build.py) and the fast one (the hot loop of `pipeline.parse_chunks`, the fused handlers of
fast.py, the memoised envelope / time stamp / SamplingParams, the chunked reader).
`pipeline.FAST_PATHS = False` selects the general route; these tests compare the JSON Lines
of both on the grammar samples, every corpus and sample line, and mutated lines, and check
each rewritten helper against the code it replaces.
"""

from __future__ import annotations

import ast
import codecs
import gzip
import io
import random
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from helpers.examples import many

from kvreplay.events import encode_jsonl
from kvreplay.parsers import build, fast, grammar, matchers, parse_files, pipeline

ROOT = Path(__file__).parents[3]
DATA = Path(__file__).parents[2] / "data"
LOGS = sorted([*DATA.glob("corpus/*.log"), *(ROOT / "src" / "kvreplay" / "samples").glob("*.log"), *DATA.glob("logcases/*/server*.log")])
REAL_LINES = sorted({ln for p in LOGS for ln in p.read_text(encoding="utf-8").splitlines() if len(ln) < 4000})
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::SyntaxWarning")  # literal_eval of "\\ "
FUZZ = many()


def _both(text: str) -> tuple[bytes, bytes]:
    """JSON Lines of (fast route, general route) for a text."""
    def run() -> bytes:
        pipeline._ENV_CACHE.clear()
        fast._PARAMS_CACHE.clear()
        fast._SHAPED.clear()
        stream = io.StringIO(text, newline="\n")
        return encode_jsonl(pipeline.parse_stream(stream, "t.log", pipeline.Clock(year=2026)))

    a = run()
    pipeline.FAST_PATHS = False
    try:
        b = run()
    finally:
        pipeline.FAST_PATHS = True
    return a, b


def _same(text: str) -> None:
    a, b = _both(text)
    if a != b:  # show the first differing event
        for x, y in zip(a.split(b"\n"), b.split(b"\n")):
            assert x == y
    assert a == b


def test_fast_route_is_used():
    line = "(APIServer pid=1) INFO 05-07 10:00:05 [loggers.py:335] Engine 000: Avg prompt throughput: 1.0 tokens/s, Avg generation throughput: 2.0 tokens/s, Running: 3 reqs, Waiting: 0 reqs, GPU KV cache usage: 5.0%"
    calls = []
    orig = fast.FAST["Eng"]
    fast.FAST["Eng"] = lambda *a: calls.append(1) or orig(*a)
    try:
        _same(line + "\n" + line + "\n")
    finally:
        fast.FAST["Eng"] = orig
    assert calls  # the comparison above really exercised a fused handler


def test_grammar_samples_same_on_both_routes():
    lead = {"received": "Received request ", "details": "Request ", "body": "Request ", "request_status": "Request ",
            "added": "Added request ", "aborted": "Aborted request(s) ", "finished": "Finished request ",
            "generated": "Generated response ", "non_default_args": "non-default args: ", "namespace": "args: ",
            "spec_v1": "SpecDecoding metrics: ", "spec_v0": "Speculative metrics: "}
    lines = [f"(APIServer pid=7) INFO 05-07 10:00:05 [x.py:1] {lead.get(k, '')}{t.rstrip()}" for k, t in grammar.grammar_samples(grammar.MESSAGES_GRAMMAR)]
    lines += [ln for _k, ln in grammar.grammar_samples(grammar.ENVELOPE_GRAMMAR)]
    _same("\n".join(lines) + "\n")
    _same("\n".join(lines[::-1]))


@pytest.mark.parametrize("path", LOGS, ids=[p.name for p in LOGS])
def test_logs_same_on_both_routes(path):
    _same(path.read_text(encoding="utf-8"))


@st.composite
def mangled(draw):
    lines = draw(st.lists(st.sampled_from(REAL_LINES), min_size=1, max_size=8))
    out = []
    for ln in lines:
        op = draw(st.sampled_from(["keep", "keep", "cut", "splice", "insert", "dup_space", "crlf", "ansi", "swap_digit", "level"]))
        if op == "cut" and ln:
            ln = ln[: draw(st.integers(0, len(ln)))]
        elif op == "splice" and ln:
            i = draw(st.integers(0, len(ln)))
            ln = ln[:i] + draw(st.text(alphabet="()[]{}'\",=:.%| 0123456789aZ\\\x1b\ufffd\t", max_size=8)) + ln[i:]
        elif op == "insert":
            ln = draw(st.sampled_from(["Traceback (most recent call last):", "  File \"x.py\", line 1", "ValueError: x", "[rank0]: ", "INFO:     ", "{", ""])) + ln
        elif op == "dup_space":
            ln = ln.replace(" ", "  ", 1)
        elif op == "crlf":
            ln = ln + "\r"
        elif op == "ansi":
            ln = "\x1b[1;36m" + ln.replace(" ", "\x1b[0;0m ", 1)
        elif op == "swap_digit":
            ln = re.sub(r"\d", lambda m: draw(st.sampled_from(["0", "9", "x", "", "99999"])), ln, count=draw(st.integers(1, 3)))
        elif op == "level":
            ln = ln.replace(" INFO ", draw(st.sampled_from([" ERROR ", " WARNING ", " DEBUG ", " INFO  "])), 1)
        out.append(ln.replace("\n", " "))
    return "\n".join(out) + draw(st.sampled_from(["", "\n"]))


@FUZZ
@given(mangled())
def test_mangled_lines_same_on_both_routes(text):
    _same(text)


@FUZZ
@given(st.lists(st.sampled_from(REAL_LINES), min_size=2, max_size=30))
def test_real_line_sequences_same_on_both_routes(lines):
    _same("\n".join(lines) + "\n")


# ------------------------------------------------------------------ reader


def _readline_reference(text: str, limit: int) -> list[tuple[str, str | None]]:
    """The reader's contract, written as the readline(limit) loop it replaced."""
    stream = io.StringIO(text, newline="\n")
    out = []
    while True:
        s = stream.readline(limit)
        if not s:
            return out
        note = None
        if s[-1] == "\n":
            s = s[:-1]
        elif len(s) >= limit:
            dropped = 0
            while True:
                rest = stream.readline(limit)
                if not rest:
                    break
                if rest[-1] == "\n":
                    dropped += len(rest) - 1
                    break
                dropped += len(rest)
            note = f"line truncated to {limit} characters ({dropped} dropped)"
        if s and s[-1] == "\r":
            s = s[:-1]
        if "\ufffd" in s:
            note = "invalid UTF-8 replaced" if note is None else note + "; invalid UTF-8 replaced"
        out.append((s, note))


def _chunked(text: str, limit: int, size: int) -> list[tuple[str, str | None]]:
    out = []
    for lines, notes in pipeline.line_chunks(io.StringIO(text, newline="\n").read, limit, size=size):
        out += [(s, None if notes is None else notes.get(i)) for i, s in enumerate(lines)]
    return out


@FUZZ
@given(st.lists(st.sampled_from(["a", "bc", "\r", "\n", "\r\n", "\ufffd", "xyz" * 5, "\n\n", " "]), max_size=40),
       st.sampled_from([1, 2, 3, 5, 8, 40, 4096]), st.sampled_from([1, 2, 3, 7, 64, 1 << 20]))
def test_chunked_reader_equals_readline(parts, limit, size):
    text = "".join(parts)
    assert _chunked(text, limit, size) == _readline_reference(text, limit)


@FUZZ
@given(st.binary(max_size=300), st.sampled_from([1, 2, 3, 5, 64]))
def test_chunked_bytes_reader_equals_text_wrapper(data, size):
    """Invalid or cut UTF-8 across read boundaries decodes as TextIOWrapper does."""
    data = data + "é€😀\n".encode() + data[::-1]
    dec = codecs.getincrementaldecoder("utf-8")("replace").decode
    got = []
    for lines, notes in pipeline.line_chunks(io.BytesIO(data).read, decode=dec, size=size):
        got += [(s, None if notes is None else notes.get(i)) for i, s in enumerate(lines)]
    ref = list(pipeline.physical_lines(io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", errors="replace", newline="\n")))
    assert got == ref == _readline_reference(data.decode("utf-8", "replace"), pipeline.MAX_LINE)


def test_long_line_across_reads_keeps_memory_bounded():
    text = "a" * 50 + "\n" + "b" * 1000 + "\r\n" + "c\n" + "d" * 30
    assert _chunked(text, 20, 7) == _readline_reference(text, 20)
    assert _chunked(text, 20, 7)[1] == ("b" * 20, "line truncated to 20 characters (981 dropped)")


def test_truncated_gzip_reports_read_error(tmp_path):
    line = b"(APIServer pid=1) INFO 05-07 10:00:05 [x.py:1] hello\n"
    p = tmp_path / "cut.log.gz"
    p.write_bytes(gzip.compress(line * 5000)[:-40])
    evs = list(parse_files([str(p)], year=2026))
    assert evs[-1].note and evs[-1].note.startswith("read error")
    assert all(e.message == "hello" for e in evs[:-2])


# ------------------------------------------------------------------ rewritten helpers


_OLD_SCALAR = re.compile(r"(?:\(|, )(\w+)=([^,()\[\]{}'\"]*)(?=[,)])")


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(["n", "best_of", "max_tokens", "min_tokens", "ignore_eos", "temperature", "priority", "stop",
                                           "stop_token_ids", "seed", "xn", "n_"]),
                          st.sampled_from(["1", "None", "True", "0.5", "[]", "[1, 2]", "['a', \"b,)\"]", "'x'", "X(n=3, max_tokens=4)",
                                           "{'a': 1}", "", "-3", "a b", "[1,", "(", ")", ","])), max_size=8),
       st.sampled_from([", ", ","]), st.sampled_from(["SamplingParams", "P", ""]), st.sampled_from([")", "", "))"]))
def test_request_params_equal_parse_params(items, sep, call, close):
    text = call + "(" + sep.join(f"{k}={v}" for k, v in items) + close
    ref = build.parse_params(text)
    got = fast.request_params(text)
    for k in ("n", "best_of", "max_tokens", "min_tokens", "ignore_eos", "temperature", "priority", "stop_token_ids"):
        assert got.get(k) == ref.get(k), k
    rs, gs = ref.get("stop"), got.get("stop")
    assert (rs if isinstance(rs, list) else None) == (gs if isinstance(gs, list) else None)


def _old_ids(text):
    if text is None or text == "None" or not text.startswith("["):
        return None
    inner = text[1:-1].strip()
    if not inner:
        return []
    return [int(p.strip()) for p in inner.split(",") if p.strip().lstrip("-").isdigit()]


@FUZZ
@given(st.text(alphabet="[]0123456789-, \t+.e", max_size=30))
def test_ids_equal_the_loop(text):
    def run(f):
        try:
            return f(text)
        except ValueError as exc:
            return type(exc)
    assert run(build._ids) == run(_old_ids)


def _old_pystr(text):
    try:
        v = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text[1:-1]
    return v if isinstance(v, str) else str(v)


@FUZZ
@given(st.text(alphabet="'\"\\abn \n\r\t\x00é", max_size=12))
def test_pystr_equals_literal_eval(body):
    for text in (f"'{body}'", f'"{body}"', body):
        if text in ("", "None"):
            continue
        assert build._pystr(text) == _old_pystr(text)


_OLD_STR = r"""'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*\""""


@FUZZ
@given(st.text(alphabet="'\"\\ab)(,\n", max_size=20))
def test_unrolled_string_regex_equals_alternation(text):
    for old, new in ((rf"(?:{_OLD_STR}|None)(.*)", rf"(?:{matchers._STR}|None)(.*)"),
                     (r"\w+\(.*?\)(, x.*)?", r"\w+\((?:[^)\n]*+\))+?(, x.*)?")):
        a, b = re.fullmatch(old, "P(" + text), re.fullmatch(new, "P(" + text)
        assert (a and a.span(1)) == (b and b.span(1))
        a, b = re.fullmatch(old, text), re.fullmatch(new, text)
        assert (a and a.span(1)) == (b and b.span(1))


@FUZZ
@given(mangled())
def test_common_envelope_regex_agrees_with_envelope(text):
    """`_ENV_COMMON` (tried first on a memo miss) never disagrees with ENVELOPE."""
    for s in text.split("\n"):
        m = pipeline._ENV_COMMON(s)
        if m is not None:
            procs, level, date, hms, source = m.groups()
            ref = pipeline._envelope_plain(s)
            assert ref is not None and ref[1:5] == (level, date, hms, source) and ref[8] == m.end() and ref[0] is None
            assert ref[5:8] == (pipeline._procs(procs) if procs else (None, None, None))


def test_envelope_memo_agrees_with_envelope():
    pipeline._ENV_CACHE.clear()
    for s in REAL_LINES:
        assert pipeline._envelope(s) == pipeline._envelope_plain(s)
        assert pipeline._envelope(s) == pipeline._envelope_plain(s)  # now from the memo


def test_fast_route_takes_iteration_lines():
    """The per-step line has a fused handler too (`_engine`, for both first words); both
    routes give the same event, with and without the engine prefix."""
    lines = ["(APIServer pid=1) INFO 05-07 10:01:00 [loggers.py:199] Engine 000: Iteration(4): 1 context "
             "requests, 336 context tokens, 2 generation requests, 2 generation tokens, iteration "
             "elapsed time: 15.26 ms, GPU KV cache usage: 7.5%",
             "(EngineCore pid=2) INFO 05-07 10:01:00 [core.py:400] Iteration(5): 0 context requests, "
             "0 context tokens, 3 generation requests, 3 generation tokens, iteration elapsed time: 6.54 ms"]
    calls = []
    orig = fast._engine
    wrapped = lambda *a: calls.append(1) or orig(*a)  # noqa: E731
    fast.FAST["Ite"] = fast.FAST["Eng"] = wrapped
    try:
        _same("\n".join(lines) + "\n")
    finally:
        fast.FAST["Ite"] = fast.FAST["Eng"] = orig
    assert len(calls) == 2


_NUM = st.one_of(st.integers(0, 40000).map(str), st.sampled_from(["007", "0", "16383", "16384", "99999999999"]))
_MS = st.one_of(st.floats(0, 1e5, allow_nan=False).map(lambda x: f"{x:.2f}"), st.sampled_from(["nan", "inf", "-1", "12"]))


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(["", "Engine 000: ", "Engine 3: ", "Engine 12345678901: "]), _NUM, _NUM, _NUM, _NUM, _NUM, _MS,
                          st.sampled_from([None, ("GPU", "6.4"), ("XPU", "100.0"), ("GPU", "nan"), ("GPU + host", "0")]),
                          st.sampled_from(["(APIServer pid=1) INFO 05-07 10:01:00 [loggers.py:199] ",
                                           "(APIServer pid=1) INFO 05-07 10:01:01 [loggers.py:199] ",
                                           "(EngineCore_DP1 pid=9) DEBUG 05-07 10:01:01 [loggers.py:199] "])),
                min_size=1, max_size=6))
def test_iteration_fast_path_agrees_with_general_route(rows):
    """The Iteration fast path (numbers from caches, the event a copy of a template shared by
    lines of the same envelope) gives the general route's events, line after line."""
    out = []
    for eng, step, cr, ct, gr, gt, ms, kv, env in rows:
        tail = "" if kv is None else f", {kv[0]} KV cache usage: {kv[1]}%"
        out.append(f"{env}{eng}Iteration({step}): {cr} context requests, {ct} context tokens, {gr} generation requests, "
                   f"{gt} generation tokens, iteration elapsed time: {ms} ms{tail}")
    _same("\n".join(out) + "\n")
