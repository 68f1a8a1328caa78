"""The test suite's own rules (tests/README.md), checked on its source:
- a test imports shared code from tests/helpers, never another test module or conftest;
- nothing edits sys.path (helpers and tools are packages on pytest's `pythonpath`);
- Hypothesis example counts live in the profiles (conftest.py, helpers/examples.py);
- data a test needs is asserted present: no skip in a test module (only the `needs_vllm`
  helper skips, outside CI, when vLLM's venv is not installed)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# a script run inside vLLM's venv (not imported by pytest): it puts a dist-info on sys.path
SCRIPTS = {TESTS / "helpers" / "vllm_driver.py"}
COUNTS_AT = {TESTS / "conftest.py", TESTS / "helpers" / "examples.py"}
# vllm_venv: the one skip (vLLM's venv absent; a failure under CI); the Lark-cache test of a
# file owned by another user needs root to chown (CI runs as root)
SKIPS_AT = {TESTS / "helpers" / "vllm_venv.py", TESTS / "unit" / "parsers" / "test_hardening_lark_cache.py"}


def sources() -> list[Path]:
    out = sorted(p for p in TESTS.rglob("*.py") if "data" not in p.relative_to(TESTS).parts)
    assert len(out) > 40
    return out


def test_no_test_imports_another() -> None:
    bad = []
    for p in sources():
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            bad += [f"{p.relative_to(TESTS)}: {n}" for n in names
                    if n.split(".")[-1].startswith("test_") or n.split(".")[0] == "conftest"]
    assert not bad, bad


def test_nothing_edits_sys_path() -> None:
    bad = []
    for p in sources():
        if p in SCRIPTS:
            continue
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Attribute) and node.attr == "path"
                    and isinstance(node.value, ast.Name) and node.value.id == "sys"):
                bad.append(f"{p.relative_to(TESTS)}:{node.lineno}")
    assert not bad, bad


def test_example_counts_live_in_the_profiles() -> None:
    bad = []
    for p in sources():
        if p in COUNTS_AT:
            continue
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.keyword) and node.arg == "max_examples":
                bad.append(f"{p.relative_to(TESTS)}:{node.value.lineno}")
    assert not bad, bad


def test_no_test_skips() -> None:
    bad = []
    for p in sources():
        if p in SKIPS_AT:
            continue
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr in ("skip", "skipif", "importorskip") \
                    and isinstance(node.value, (ast.Name, ast.Attribute)):
                bad.append(f"{p.relative_to(TESTS)}:{node.lineno} {node.attr}")
    assert not bad, bad


def test_hypothesis_profiles() -> None:
    """`ci` (the default: a fixed set) and `thorough` (ten times as many, fresh draws); the
    cost tiers of helpers/examples.py scale with the active one."""
    from hypothesis import settings

    from helpers.examples import few, many

    ci, thorough = settings.get_profile("ci"), settings.get_profile("thorough")
    assert ci.derandomize and not thorough.derandomize
    assert thorough.max_examples == 10 * ci.max_examples and ci.deadline is None
    n = settings.default.max_examples
    assert n in (ci.max_examples, thorough.max_examples)
    assert few().max_examples < n < many().max_examples
