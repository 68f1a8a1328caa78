#!/usr/bin/env python3
"""Known vLLM lines typed, per file, on real excerpts (issue 18's figure).

A *known* line is one whose text holds the words of a line kind kvreplay types (stats,
request, preemption, iteration, KV-capacity and startup-config lines), found by plain
substring search, independent of the parser. It is *typed* when the event that covers it is
a typed kind (not unparsed, log or noise). Lines cut before anything identifying (such as
`(EngineCore_7 pid=2095681) I`) are not known lines.

    python -m tools.research.corpus_typed [DIR_OR_FILE ...]   # default: tests/data/corpus tests/data/corpus_mangled
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KNOWN = ("Avg prompt throughput", "Running: ", "Received request", "Added request", "Finished request",
         "Aborted request", "is preempted by", "Iteration(", "GPU KV cache size", "GPU blocks:",
         "Maximum concurrency for", "cache_config_info", "Available KV cache memory", "LLM engine",
         "SpecDecoding metrics", "Chunked prefill is enabled", "non-default args")
UNTYPED = {"unparsed", "log", "noise"}


def figures(path: Path) -> tuple[int, int, list[int]]:
    """(known lines, typed among them, line numbers of the known lines left untyped)."""
    from kvreplay.parsers import parse_files

    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    known = {i + 1 for i, s in enumerate(lines) if any(k in s for k in KNOWN)}
    kind_of: dict[int, str] = {}
    for e in parse_files([str(path)], year=2025):
        for ln in range(e.line, e.line + e.lines):
            kind_of[ln] = e.__struct_config__.tag
    missed = sorted(ln for ln in known if kind_of.get(ln) in UNTYPED)
    return len(known), len(known) - len(missed), missed


def main(argv: list[str]) -> int:
    targets = [Path(a) for a in argv] or [ROOT / "tests" / "data" / "corpus", ROOT / "tests" / "data" / "corpus_mangled"]
    files = [f for t in targets for f in (sorted(t.glob("*.log")) if t.is_dir() else [t])]
    tot_k = tot_t = full = 0
    for f in files:
        k, t, missed = figures(f)
        tot_k, tot_t = tot_k + k, tot_t + t
        full += k == t
        print(f"{f.parent.name}/{f.name:55s} {t:3d} of {k:3d} known lines typed" + (f"  (untyped: lines {missed})" if missed else ""))
    print(f"total: {tot_t} of {tot_k} known lines typed ({100 * tot_t / max(tot_k, 1):.1f}%), {full} of {len(files)} files fully typed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
