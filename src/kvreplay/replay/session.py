"""What the TUI, the audit and the pytest plugin open: a workload ready to replay, plus
what is known about where it came from.

`open_source(paths)` takes a workload JSON (conformance format) or vLLM log files.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from kvreplay.errors import UserError
from kvreplay.replay.engine import Engine
from kvreplay.replay.profile import SchedulerProfile, get_profile
from kvreplay.replay.workload import Workload, load_workload, parse_workload


@dataclass(slots=True)
class ReplaySource:
    """A workload to replay and its provenance."""

    workload: Workload
    profile: SchedulerProfile
    label: str  # e.g. "workload fcfs_heavy.workload.json" or "log server.log (vLLM 0.33.0)"
    kind: str  # "workload" | "log"
    paths: list[str]
    # How much to trust each preemption: "exact" (the log recorded the step, or the input is
    # a workload), "consistent", or "inferred" (reconstructed from a thin log).
    confidence: str = "exact"
    # Engine step -> the log lines (file, 1-based line) behind it, when replaying a log.
    log_lines: dict[int, list[tuple[str, int]]] = field(default_factory=dict)
    # Free-form facts about the reconstruction (fitted step-time model, estimates, gaps).
    notes: list[str] = field(default_factory=list)
    # Anything else a front end may show (e.g. the verification report of a log replay).
    extra: dict[str, Any] = field(default_factory=dict)

    def engine(self, *, check_invariants: bool = False) -> Engine:
        return Engine(self.workload, self.profile, check_invariants=check_invariants)


def open_source(paths: Sequence[str | Path], *, profile: str | None = None) -> ReplaySource:
    """Open a workload JSON, or vLLM log file(s), for replay."""
    paths = [str(p) for p in paths]
    if not paths:
        raise UserError("nothing to open: give a workload JSON or vLLM log files")
    for p in paths:
        if p != "-" and not Path(p).exists():
            raise UserError(f"{p}: no such file")
    if len(paths) == 1 and _looks_like_workload(paths[0]):
        data = load_workload(paths[0])
        if data.get("engine") == "v0":
            raise UserError(f"{paths[0]}: V0 workloads replay with `kvreplay simulate`")
        workload = parse_workload(data)
        return ReplaySource(
            workload=workload,
            profile=get_profile(profile),
            label=f"workload {Path(paths[0]).name}",
            kind="workload",
            paths=paths,
        )
    # Logs need the parsers; the glue that joins parsers and replay lives outside the
    # replay package (parsers -> events <- replay).
    import importlib

    sources = importlib.import_module("kvreplay.sources")
    return sources.source_from_logs(paths, profile=profile)


def _looks_like_workload(path: str) -> bool:
    if path.endswith(".json"):
        return True
    try:
        with open(path, "rb") as f:
            head = f.read(64).lstrip()
    except OSError:
        return False
    return head.startswith(b"{") and b'"config"' in head or head.startswith(b'{"name"')
