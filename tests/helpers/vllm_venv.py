"""vLLM 0.33.0 for the `needs_vllm` tests: its venv (`.ci/install_vllm.sh` makes it) and the
driver script run inside it (helpers/vllm_driver.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

DRIVER = Path(__file__).resolve().parent / "vllm_driver.py"
VLLM_VERSION = "0.33.0"


def vllm_python() -> Path | None:
    """$KVREPLAY_VLLM_PYTHON, else ${XDG_CACHE_HOME:-~/.cache}/kvreplay/vllm-0.33/bin/python,
    else the oracle venv of tools/oracle (the first with vLLM 0.33.0 installed)."""
    env = os.environ.get("KVREPLAY_VLLM_PYTHON")
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvreplay"
    candidates = [Path(env)] if env else []
    candidates += [cache / "vllm-0.33" / "bin" / "python", cache / "oracle-0.33" / "bin" / "python"]
    for py in candidates:
        if py.exists():
            venv = py.parent.parent
            if any(venv.glob(f"lib/python3*/site-packages/vllm-{VLLM_VERSION}.dist-info")):
                return py
    return None


def need_vllm() -> Path:
    """The vLLM venv's python; absent, the test is skipped, except under CI=true where it
    fails (CI installs it: a missing venv must not pass as a skip)."""
    py = vllm_python()
    if py is None:
        msg = (
            f"vLLM {VLLM_VERSION} venv not found (set KVREPLAY_VLLM_PYTHON or run "
            ".ci/install_vllm.sh)"
        )
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(msg + " -- required under CI")
        pytest.skip(msg)
    return py


def vllm_env() -> dict:
    """The environment the driver runs in: deterministic hashing, one thread, no colour."""
    env = dict(os.environ)
    env["PYTHONHASHSEED"] = "0"
    env.setdefault("OMP_NUM_THREADS", "1")
    env["VLLM_LOGGING_COLOR"] = "0"
    return env
