"""Fuzz: arbitrary bytes and mangled real lines never raise, and every line is accounted for."""

from __future__ import annotations

import io
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st
from helpers.examples import many

from kvreplay.parsers import pipeline

CORPUS = Path(__file__).parents[2] / "data" / "corpus"
SAMPLES = Path(__file__).parents[3] / "src" / "kvreplay" / "samples"
REAL_LINES = sorted(
    {ln for p in [*CORPUS.glob("*.log"), *SAMPLES.glob("*.log")] for ln in p.read_text(encoding="utf-8").splitlines() if len(ln) < 3000}
)


def _parse_bytes(data: bytes, engine: str = "fast") -> list:
    stream = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", errors="replace", newline="\n")
    return list(pipeline.parse_stream(stream, "fuzz", pipeline.Clock(year=2026), engine == "lark"))


def _physical(data: bytes) -> int:
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


FUZZ = many()


@FUZZ
@given(st.binary(max_size=600))
def test_arbitrary_bytes(data):
    evs = _parse_bytes(data)
    assert sum(e.lines for e in evs) == _physical(data)


@st.composite
def mangled(draw):
    lines = draw(st.lists(st.sampled_from(REAL_LINES), min_size=1, max_size=6))
    out = []
    for ln in lines:
        op = draw(st.sampled_from(["keep", "cut", "splice", "insert", "dup_space", "crlf", "ansi"]))
        if op == "cut" and ln:
            ln = ln[: draw(st.integers(0, len(ln)))]
        elif op == "splice" and ln:
            i = draw(st.integers(0, len(ln)))
            ln = ln[:i] + draw(st.text(alphabet="()[]{}'\",=:.%| 0123456789aZ\x1b\ufffd", max_size=8)) + ln[i:]
        elif op == "insert":
            ln = draw(st.text(max_size=20)).replace("\n", "") + ln
        elif op == "dup_space":
            ln = ln.replace(" ", "  ", 1)
        elif op == "crlf":
            ln = ln + "\r"
        elif op == "ansi":
            ln = "\x1b[1;36m" + ln.replace(" ", "\x1b[0;0m ", 1)
        out.append(ln.replace("\n", " "))
    return ("\n".join(out) + "\n").encode("utf-8", "replace")


@FUZZ
@given(mangled())
def test_mangled_real_lines(data):
    evs = _parse_bytes(data)
    assert sum(e.lines for e in evs) == _physical(data)


@given(mangled())
def test_mangled_real_lines_lark_engine(data):
    evs = _parse_bytes(data, "lark")
    assert sum(e.lines for e in evs) == _physical(data)
