"""Load conformance cases and compare a kvreplay trace with vLLM's, field by field."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any, Iterable

# The fields the conformance README says are compared; `compare_traces(strict=True)`
# compares every field vLLM's trace has.
CONFORMANCE_FIELDS = (
    "scheduled",
    "preempted",
    "finished",
    "running",
    "waiting",
    "free_blocks",
    "num_computed_tokens",
    "prefix_hit_tokens",
)


def read_trace(case_dir: Path) -> list[dict[str, Any]]:
    plain = case_dir / "trace.jsonl"
    if plain.exists():
        text = plain.read_text()
    else:
        with gzip.open(case_dir / "trace.jsonl.gz", "rt") as f:
            text = f.read()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def read_workload(case_dir: Path) -> dict[str, Any]:
    return json.loads((case_dir / "workload.json").read_text())


def case_dirs(root: Path) -> list[Path]:
    if not root.exists():
        return []
    return sorted(p.parent for p in root.glob("*/workload.json"))


def first_difference(
    ours: list[dict[str, Any]],
    theirs: list[dict[str, Any]],
    fields: Iterable[str] | None = None,
) -> str | None:
    """None if equal; else a readable description of the first step and field that differ.

    With `fields=None` every field of vLLM's records is compared (preemption records on
    the keys vLLM's have)."""
    for a, b in zip(ours, theirs):
        keys = list(fields) if fields is not None else list(b)
        for key in keys:
            want = b.get(key)
            got = a.get(key)
            if key == "preemptions" and isinstance(got, list) and isinstance(want, list):
                if len(got) == len(want):
                    got = [{k: p.get(k) for k in q} for p, q in zip(got, want)]
            if got != want:
                return (
                    f"step {b.get('step')}: field {key!r} differs\n"
                    f"  kvreplay: {json.dumps(got)[:600]}\n"
                    f"  vLLM:     {json.dumps(want)[:600]}"
                )
    if len(ours) != len(theirs):
        return f"number of steps differs: kvreplay {len(ours)}, vLLM {len(theirs)}"
    return None
