"""Logs and workloads kvreplay ships: the embedded defaults and test material."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def sample_path(name: str) -> Path:
    """Path of a shipped sample file."""
    return Path(str(files(__name__).joinpath(name)))


# The embedded default log: a vLLM 0.33 serving run (12 requests, heavy FCFS load on a
# 64-block pool) with the JSON-body lines; see SOURCES.md. Its time stamps have no year;
# DEFAULT_LOG_YEAR pins one so the embedded parse is deterministic.
DEFAULT_LOG = "vllm033_fcfs_heavy.reqbody.log"
DEFAULT_LOG_YEAR = 2026
