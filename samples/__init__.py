"""Logs and workloads kvreplay ships: the embedded defaults and test material."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def sample_path(name: str) -> Path:
    """Path of a shipped sample file."""
    return Path(str(files(__name__).joinpath(name)))
