"""The README's examples are real output of the shipped samples.

Every fenced block of README.md and of the pages under docs/ (not docs/spec/) that starts
with `$ kvreplay ...` and shows output is run (from the repository's root) and compared
line by line with the block. What may differ is
documented in the README: a line `...` stands for any lines, a line ending in ` ...` for
its own end; timings ("in 1.7 s") and the install path of the samples (`.../samples/`)
vary. Every other line must be the command's, in order.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))  # the user's pages; docs/spec/ is not globbed
SAMPLES = ROOT / "src" / "kvreplay" / "samples"
TIMING = re.compile(r"\bin \d+(\.\d+)? s\b")


def examples(page: Path = README) -> list[tuple[str, list[str]]]:
    """(command, expected lines) of each block of `page` that starts with `$ kvreplay`."""
    out = []
    blocks: list[list[str]] = []
    block: list[str] | None = None
    for line in page.read_text(encoding="utf-8").split("\n"):
        if line.startswith("```"):
            if block is None:
                block = []
            else:
                blocks.append(block)
                block = None
        elif block is not None:
            block.append(line)
    for lines in blocks:
        if not lines:
            continue
        if not lines[0].startswith("$ kvreplay ") or len(lines) < 2 or lines[1].startswith("$ "):
            continue  # no output shown (a fleet on a cluster, ...): nothing to compare
        cmd = lines[0][2:].split("  #")[0].strip()
        out.append((cmd, lines[1:]))
    return out


def _norm(line: str) -> str:
    line = line.replace(str(SAMPLES.parent) + os.sep, ".../").rstrip()
    return TIMING.sub("in <t> s", line)


def _matches(want: str, got: str) -> bool:
    want, got = _norm(want), _norm(got)
    if want.endswith(" ..."):
        return got.startswith(want[:-4])
    return want == got


def compare(want: list[str], got: list[str]) -> str | None:
    """None if `got` is `want` with its gaps filled; else the first README line that is not
    in the output where it should be."""
    i = 0  # next output line
    gap = False
    for w in want:
        if w.strip() == "...":
            gap = True
            continue
        if gap:
            while i < len(got) and not _matches(w, got[i]):
                i += 1
        if i >= len(got) or not _matches(w, got[i]):
            near = got[i] if i < len(got) else "<end of output>"
            return f"README line {w!r} not in the output (at: {near!r})"
        i += 1
        gap = False
    return None


README_EXAMPLES = examples()
EXAMPLES = README_EXAMPLES + [ex for page in DOCS for ex in examples(page)]


def test_the_readme_has_its_examples() -> None:
    cmds = [c.split()[1] for c, _ in README_EXAMPLES]
    assert {"replay", "audit", "whatif", "simulate"} <= set(cmds), cmds


def test_the_docs_pages_examples_are_collected() -> None:
    # docs/replay.md shows the sample without prompts (the ensemble's report)
    replay_page = examples(ROOT / "docs" / "replay.md")
    assert [c for c, _ in replay_page] == [
        "kvreplay replay src/kvreplay/samples/vllm033_fcfs_heavy.log"], replay_page


@pytest.mark.parametrize("cmd,want", EXAMPLES, ids=[c for c, _ in EXAMPLES])
def test_readme_example_is_the_commands_output(cmd: str, want: list[str]) -> None:
    argv = shlex.split(cmd)
    env = dict(os.environ, KVREPLAY_PROGRESS="0", COLUMNS="200")
    proc = subprocess.run([sys.executable, "-m", "kvreplay", *argv[1:]], cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=300)
    assert proc.returncode in (0, 1), proc.stdout  # 1: an --fail-on gate that holds
    problem = compare(want, proc.stdout.splitlines())
    assert problem is None, problem + "\n--- output ---\n" + proc.stdout


def test_compare_fills_gaps_only_where_the_readme_has_them() -> None:
    got = ["a", "b", "c 1.7 s", "d long line"]
    assert compare(["a", "...", "d long ..."], got) is None
    assert compare(["a", "b", "c 1.7 s", "d long line"], got) is None
    assert compare(["a", "c 1.7 s"], got) is not None  # b left out without a gap
    assert compare(["a", "...", "x"], got) is not None
    assert compare(["replayed in 0.4 s"], ["replayed in 12 s"]) is None
