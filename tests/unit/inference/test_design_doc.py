"""docs/design.md names every module of kvreplay.inference with its job."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
INFERENCE = ROOT / "src" / "kvreplay" / "inference"
DESIGN = ROOT / "docs" / "design.md"


def _table_modules(text: str) -> set[str]:
    """The `name.py` cells of the inference table (rows from '| stage | module | job |' on)."""
    part = text[text.index("| stage | module | job |"):]
    rows = []
    for line in part.splitlines()[2:]:
        if not line.startswith("|"):
            break
        rows.append(line.split("|")[2])
    return {m for cell in rows for m in re.findall(r"`([a-z_0-9]+\.py)`", cell)}


def test_every_inference_module_is_in_the_design_doc():
    modules = {p.name for p in INFERENCE.glob("*.py") if p.name != "__init__.py"}
    assert len(modules) > 20
    named = _table_modules(DESIGN.read_text(encoding="utf-8"))
    assert not modules - named, f"missing from docs/design.md: {sorted(modules - named)}"
    assert not named - modules, f"named in docs/design.md but not in the package: {sorted(named - modules)}"


def test_the_check_reads_the_table_only():
    text = "intro `facts.py`\n| stage | module | job |\n|---|---|---|\n| a | `x.py`, `y.py` | j `z.py` |\n\nafter `w.py`\n"
    assert _table_modules(text) == {"x.py", "y.py"}
