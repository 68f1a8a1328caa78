"""Every spec section the code cites has a section in docs/spec/.

The scheduler spec (docs/spec/vllm-scheduler-spec.md) is cited by tag in comments and
docstrings: `A6` (heading `### A6.`), `A1.4` (heading `#### A1.4`, or item `4.` of the
numbered list under `### A6.` for `A6.4`), `A6.2-3` (items 2 to 3), `C6` / `C6-self` (row 6
of Part C's table), `E24` (Part E's "Row 24"), `F1` (item 1 of Part F), `Part B`. The log
formats (docs/spec/vllm-log-formats.md) are cited by number: `vllm-log-formats.md 4.3`,
`log formats 4.3`, `vllm-log-formats.md section 9`."""

from __future__ import annotations

import ast
import functools
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "kvreplay"
SPEC = ROOT / "docs" / "spec"
SCHED = SPEC / "vllm-scheduler-spec.md"
FORMATS = SPEC / "vllm-log-formats.md"

TAG = re.compile(r"(?<![\w.-])([A-F])(\d{1,2})(?:\.(\d{1,2})(?:-(\d{1,2}))?)?(?:-self)?(?![\w.])")
PART = re.compile(r"\bPart ([A-F])\b")
FORMAT_REF = re.compile(r"(?:vllm-log-formats\.md|log formats),?\s+(?:section\s+)?(\d{1,2}(?:\.\d{1,2})?)\b")


def prose(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring in a Python file: where specs are cited
    (string literals in code are program text: a key named "F1" cites nothing)."""
    text = path.read_text(encoding="utf-8")
    out = [(t.start[0], t.string) for t in tokenize.generate_tokens(io.StringIO(text).readline)
           if t.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                out.append((body[0].lineno, body[0].value.value))
    return out


def scheduler_sections(text: str) -> set[str]:
    """The tags the scheduler spec defines: headings, their numbered items, table rows."""
    tags: set[str] = set()
    part = section = None
    for line in text.splitlines():
        if m := re.match(r"## Part ([A-F])\b", line):
            part, section = m[1], None
            tags.add(f"Part {part}")
            continue
        if m := re.match(r"#{3,4} ([A-F]\d{1,2}(?:\.\d{1,2})?)[.\s]", line):
            tags.add(m[1])
            section = m[1] if "." not in m[1] else section
            continue
        if part is None:
            continue
        if part == "C" and (m := re.match(r"\|\s*(\d{1,2})\s*\|", line)):
            tags.add(f"C{m[1]}")
        elif part == "E" and (m := re.match(r"\*\s+\*\*Row (\d{1,2})\b", line)):
            tags.add(f"E{m[1]}")
        elif (m := re.match(r"(\d{1,2})\. ", line)):
            tags.add(f"{section or part}.{m[1]}" if section else f"{part}{m[1]}")
    return tags


def format_sections(text: str) -> set[str]:
    return {m[1] for m in re.finditer(r"(?m)^#{2,3} (\d{1,2}(?:\.\d{1,2})?)\.? ", text)}


@functools.cache
def citations() -> list[tuple[str, str]]:
    """(where, tag) for every spec tag cited in src/kvreplay."""
    out = []
    for path in sorted(SRC.rglob("*.py")):
        for line, text in prose(path):
            where = f"{path.relative_to(ROOT)}:{line}"
            for m in TAG.finditer(text):
                letter, num, item, last = m[1], m[2], m[3], m[4]
                if item is None:
                    out.append((where, f"{letter}{num}"))
                    continue
                for i in range(int(item), int(last or item) + 1):
                    out.append((where, f"{letter}{num}.{i}"))
            out += [(where, f"Part {p}") for p in PART.findall(text)]
            out += [(where, f"formats {n}") for n in FORMAT_REF.findall(text)]
    return out


def test_the_spec_is_in_the_repository() -> None:
    assert SCHED.is_file() and FORMATS.is_file()
    assert (SPEC / "README.md").is_file()


def test_the_section_finder_reads_the_spec() -> None:
    """The parse of the spec's structure, checked on sections known by hand."""
    tags = scheduler_sections(SCHED.read_text(encoding="utf-8"))
    for t in ("A1", "A1.4", "A6", "A6.4", "A7", "A11.1", "A12", "A13", "C1", "C6", "C16",
              "E24", "E25", "F1", "F7", "Part B", "Part C"):
        assert t in tags, t
    for t in ("A6.9", "A14", "C24", "E1", "G1"):
        assert t not in tags, t
    fmt = format_sections(FORMATS.read_text(encoding="utf-8"))
    assert {"1", "1.1", "4.3", "9", "10"} <= fmt and "11" not in fmt


def test_the_citation_finder_reads_the_code() -> None:
    """Forms of citation found in comments and docstrings, never in code strings."""
    found = {t for _, t in citations()}
    assert {"A6.4", "A6.2", "A6.3", "C6", "E24", "A1.4", "Part B", "formats 9",
            "formats 4.3"} <= found
    assert len(citations()) >= 100  # the code cites the spec about 110 times


def test_every_cited_spec_section_exists() -> None:
    tags = scheduler_sections(SCHED.read_text(encoding="utf-8"))
    fmt = {f"formats {n}" for n in format_sections(FORMATS.read_text(encoding="utf-8"))}
    missing = [f"{where}: {tag}" for where, tag in citations() if tag not in tags | fmt]
    assert not missing, "spec sections cited but not in docs/spec/:\n" + "\n".join(missing)
