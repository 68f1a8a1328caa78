"""The core never imports the UI (DEVELOPERS.md: parsers -> events <- replay <- tui)."""

from __future__ import annotations

import subprocess
import sys


def test_core_does_not_import_textual() -> None:
    code = (
        "import sys\n"
        "import kvreplay, kvreplay.cli, kvreplay.replay, kvreplay.replay.engine\n"
        "import kvreplay.replay.cli\n"
        "try:\n"
        "    import kvreplay.parsers, kvreplay.events\n"
        "except ImportError:\n"
        "    pass\n"
        "from kvreplay.cli import build_parser\n"
        "build_parser()\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('textual', 'polars'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"core imported: {out.stdout.strip()}"


def test_replay_does_not_import_parsers() -> None:
    code = (
        "import sys\n"
        "import kvreplay.replay, kvreplay.replay.engine, kvreplay.replay.cli\n"
        "print(','.join(sorted(m for m in sys.modules if m.startswith('kvreplay.parsers'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
