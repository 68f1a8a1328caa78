"""The import contract: parsers -> events <- model <- inference <- front ends.

Every module of src/kvreplay is read (its imports, function-level ones included) and each
import must point down the layers; only the TUI imports textual, only the audit polars.
A second test imports every module, so none is dead or broken, and checks that the core
loads neither textual nor polars. The checker itself is tested on a tree that breaks the
contract.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).parent.parent / "src"

# layer -> the layers (and third-party roots) it may import. A module's layer is the
# longest prefix below that matches its dotted name.
LAYERS: dict[str, str] = {
    "kvreplay": "base",
    "kvreplay.errors": "base",
    "kvreplay.samples": "base",
    "kvreplay.events": "events",
    "kvreplay.parsers": "parsers",
    "kvreplay.replay": "model",
    "kvreplay.inference": "inference",
    "kvreplay.export": "export",
    "kvreplay.vllm_plugin": "vllm_plugin",
    "kvreplay.__main__": "front",
    "kvreplay.sources": "front",
    "kvreplay.cli": "front",
    "kvreplay.live": "front",
    "kvreplay.audit": "front",
    "kvreplay.pytest_plugin": "front",
    "kvreplay.tui": "tui",
}
MAY_IMPORT: dict[str, set[str]] = {
    "base": {"base"},
    "events": {"base", "events"},
    "parsers": {"base", "events", "parsers"},
    "model": {"base", "events", "model"},
    "inference": {"base", "events", "model", "inference"},
    "export": {"base", "events", "model", "inference", "export"},  # core side: no UI
    "vllm_plugin": {"vllm_plugin"},  # runs inside vLLM: nothing of kvreplay's core
    "front": {"base", "events", "parsers", "model", "inference", "export", "front", "tui"},
    "tui": {"base", "events", "model", "inference", "export", "front", "tui"},
}
# third-party packages only some layers may import
RESTRICTED = {"textual": {"tui"}, "polars": {"front"}, "rich": {"tui", "front"},
              "dask": {"front"}, "distributed": {"front"},  # the fleet executor (audit)
              "vllm": {"vllm_plugin"}, "perfetto": {"export"},
              "opentelemetry": {"parsers"}}  # OTLP spans (the `otlp` extra)


def layer_of(module: str) -> str:
    best = ""
    for prefix in LAYERS:
        if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > len(best):
            best = prefix
    return LAYERS[best]


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports_of(path: Path, module: str) -> list[tuple[int, str]]:
    """(line, imported module) for every import in the file, relative ones resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")
                up = up[: len(up) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            out.append((node.lineno, base))
            # `from kvreplay import replay` imports kvreplay.replay
            if base == "kvreplay":
                out += [(node.lineno, f"kvreplay.{a.name}") for a in node.names]
    return out


def violations(root: Path) -> list[str]:
    bad = []
    for path in sorted(root.rglob("*.py")):
        module = module_name(path, root)
        layer = layer_of(module)
        for line, imported in imports_of(path, module):
            top = imported.split(".")[0]
            where = f"{path.relative_to(root)}:{line}: {module} ({layer}) imports {imported}"
            if top == "kvreplay":
                if imported == "kvreplay":
                    continue
                if layer_of(imported) not in MAY_IMPORT[layer]:
                    bad.append(f"{where} ({layer_of(imported)})")
            elif top in RESTRICTED and layer not in RESTRICTED[top]:
                bad.append(where)
    return bad


def test_every_import_points_down_the_layers() -> None:
    assert violations(SRC) == []


def test_every_module_imports_and_the_core_loads_no_ui() -> None:
    code = (
        "import importlib, pkgutil, sys\n"
        "import kvreplay\n"
        "names = sorted(m.name for m in pkgutil.walk_packages(kvreplay.__path__, 'kvreplay.'))\n"
        "core = [n for n in names if not n.endswith('__main__') and n.split('.')[1] in (\n"
        "        'events', 'errors', 'parsers', 'replay', 'inference', 'export', 'sources', 'samples',\n"
        "        'cli')]\n"
        "for n in core:\n"
        "    importlib.import_module(n)\n"
        "from kvreplay.cli import build_parser\n"
        "build_parser()\n"
        "loaded = sorted(m for m in sys.modules\n"
        "                if m.split('.')[0] in ('textual', 'polars', 'perfetto'))\n"
        "print('core-loaded:' + ','.join(loaded))\n"
        "for n in names:\n"
        "    if n == 'kvreplay.vllm_plugin._scheduler' or n.endswith('__main__'):\n"
        "        continue  # imports vllm: loaded inside vLLM only (tests/conformance/test_vllm_plugin.py)\n"
        "    importlib.import_module(n)\n"
        "print('modules:%d' % len(names))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    lines = dict(line.split(":", 1) for line in out.stdout.split())
    assert lines["core-loaded"] == "", f"the core loaded {lines['core-loaded']}"
    assert int(lines["modules"]) > 60


BROKEN = {
    "kvreplay/__init__.py": "",
    "kvreplay/parsers/__init__.py": "",
    "kvreplay/parsers/x.py": "def f():\n    from kvreplay.replay import engine\n",
    "kvreplay/replay/__init__.py": "",
    "kvreplay/replay/y.py": "from ..tui import app\nimport textual\n",
    "kvreplay/replay/z.py": "from kvreplay.inference.driver import replay_log\n",
    "kvreplay/inference/__init__.py": "from kvreplay.sources import open_replay\n",
    "kvreplay/tui/__init__.py": "import textual\nfrom kvreplay.replay import y\n",
}


def test_the_checker_sees_a_broken_contract(tmp_path: Path) -> None:
    for rel, text in BROKEN.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    got = violations(tmp_path)
    assert [g.split(": ", 1)[1] for g in got] == [
        "kvreplay.inference (inference) imports kvreplay.sources (front)",
        "kvreplay.parsers.x (parsers) imports kvreplay.replay (model)",
        "kvreplay.replay.y (model) imports kvreplay.tui (tui)",
        "kvreplay.replay.y (model) imports textual",
        "kvreplay.replay.z (model) imports kvreplay.inference.driver (inference)",
    ]


@pytest.mark.parametrize("name, layer", [("kvreplay.replay.v0.steps", "model"),
                                         ("kvreplay.inference.facts", "inference"),
                                         ("kvreplay.export.model", "export"),
                                         ("kvreplay.cli.tui", "front"), ("kvreplay", "base")])
def test_layer_of(name: str, layer: str) -> None:
    assert layer_of(name) == layer
