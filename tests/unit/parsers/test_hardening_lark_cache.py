"""The Lark grammar cache is a pickle: a file another user could have planted is never loaded."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest


BUILD = "from kvreplay.parsers import grammar; grammar.envelope_parser(); print(grammar._cache_path(grammar.ENVELOPE_GRAMMAR, grammar.ENVELOPE_GRAMMAR.read_text(encoding='utf-8') + repr([])))"


class _Plant:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _run(cache_home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "XDG_CACHE_HOME": str(cache_home)}
    return subprocess.run([sys.executable, "-c", BUILD], capture_output=True, text=True, env=env, timeout=120)


def _plant(cache_home: Path, marker: Path) -> Path:
    """Build once (writes the cache file), then replace its pickle with one that runs a command."""
    r = _run(cache_home)
    assert r.returncode == 0, r.stderr
    (f,) = (cache_home / "kvreplay").glob("envelope-*.lark.cache")
    head = f.read_bytes().split(b"\n", 1)[0]  # Lark's grammar hash line: the plant passes Lark's own check
    f.write_bytes(head + b"\n" + pickle.dumps(_Plant(str(marker))))
    return f


def test_planted_file_in_a_trusted_place_would_run(tmp_path):
    """The control: what the other tests keep out does run when loaded."""
    marker = tmp_path / "ran"
    f = _plant(tmp_path / "c", marker)
    os.chmod(f, 0o600)
    _run(tmp_path / "c")
    assert marker.exists()


def test_planted_world_writable_file_is_not_loaded(tmp_path):
    marker = tmp_path / "ran"
    f = _plant(tmp_path / "c", marker)
    os.chmod(f, 0o666)
    r = _run(tmp_path / "c")
    assert r.returncode == 0, r.stderr
    assert not marker.exists()
    assert r.stdout.strip() == "None"


def test_file_in_a_shared_directory_is_not_loaded(tmp_path):
    marker = tmp_path / "ran"
    f = _plant(tmp_path / "c", marker)
    os.chmod(f, 0o600)
    os.chmod(f.parent, 0o777)
    r = _run(tmp_path / "c")
    assert r.returncode == 0 and not marker.exists()


def test_symlinked_cache_directory_is_not_used(tmp_path):
    marker = tmp_path / "ran"
    f = _plant(tmp_path / "c", marker)
    os.chmod(f, 0o600)
    (tmp_path / "d").mkdir()
    os.rename(tmp_path / "c" / "kvreplay", tmp_path / "elsewhere")
    os.symlink(tmp_path / "elsewhere", tmp_path / "c" / "kvreplay")
    r = _run(tmp_path / "c")
    assert r.returncode == 0 and not marker.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file another owner")
def test_file_of_another_user_is_not_loaded(tmp_path):
    marker = tmp_path / "ran"
    f = _plant(tmp_path / "c", marker)
    os.chmod(f, 0o600)
    os.chown(f, 12345, 12345)
    r = _run(tmp_path / "c")
    assert r.returncode == 0 and not marker.exists()


def test_cache_can_be_turned_off(tmp_path, monkeypatch):
    from kvreplay.parsers import grammar

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("KVREPLAY_LARK_CACHE", "0")
    assert grammar._cache_path(grammar.ENVELOPE_GRAMMAR, "x") is None
    monkeypatch.setenv("KVREPLAY_LARK_CACHE", "1")
    p = grammar._cache_path(grammar.ENVELOPE_GRAMMAR, "x")
    assert p is not None and p.startswith(str(tmp_path))
    assert (os.stat(tmp_path / "kvreplay").st_mode & 0o777) == 0o700
