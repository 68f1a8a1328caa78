"""What a log replay was checked against, typed: one `StatsLineCheck` per stats line and the
`Verification` they make (inference/verify.py fills them; `Replay.verification` holds one).

A counter is a pair [replayed, logged] (logged None where the line does not print it).
`to_json` gives the report's JSON, the same keys in the same order as ever.
"""

from __future__ import annotations

from typing import Any

import msgspec

Pair = list[Any]  # [replayed, logged]


class StatsLineCheck(msgspec.Struct, kw_only=True):
    """One stats line against the replay. `read_at` None: the replay has no step at its
    time (the line is not read)."""

    file: str
    line: int
    time: float
    step: int | None = None
    read_at: str | None = None  # where the line was read (verify.LineRead.read_at)
    running: Pair | None = None
    waiting: Pair | None = None
    swapped: Pair | None = None  # V0
    kv_usage: Pair | None = None
    cpu_kv_usage: Pair | None = None  # V0
    generation_throughput: Pair | None = None
    prompt_throughput: Pair | None = None
    preemptions: Pair | None = None
    differences: list[str] | None = None  # the tolerant check: what disagrees
    exact: bool | None = None  # the exact check (V1): matched at its anchor step
    exact_differences: list[str] | None = None
    agrees: bool | None = None  # no difference

    @property
    def read(self) -> bool:
        return self.read_at is not None

    @property
    def judged(self) -> bool:
        """The line was compared (an unread line only where the format says it disagrees)."""
        return self.differences is not None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"file": self.file, "line": self.line, "time": self.time,
                               "step": self.step}
        if not self.read:
            out["replayed"] = None
            if self.judged:
                out.update(agrees=self.agrees, differences=self.differences)
            return out
        out["read_at"] = self.read_at
        for k in ("running", "waiting", "swapped", "kv_usage", "cpu_kv_usage",
                  "generation_throughput", "prompt_throughput", "preemptions",
                  "differences", "exact", "exact_differences", "agrees"):
            v = getattr(self, k)
            if v is not None:
                out[k] = v
        return out


class LineDifference(msgspec.Struct):
    """The first line that disagrees, and how."""

    file: str
    line: int
    step: int | None
    differences: list[str]


class Verification(msgspec.Struct, kw_only=True):
    """The replay against every stats line: how many agree (tolerant check) and match
    exactly (V1), the first that does not, each line's check; with Iteration lines, their
    check too (inference/iterations.py's report)."""

    stats_lines: int
    agreeing_lines: int
    first_divergence: LineDifference | None = None
    first_inexact: LineDifference | None = None  # the first line not matched exactly
    lines: list[StatsLineCheck] = []
    exact_lines: int | None = None  # lines matched without tolerance (V1 logs only)
    iterations: dict[str, Any] | None = None  # the Iteration lines' check

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "stats_lines": self.stats_lines, "agreeing_lines": self.agreeing_lines,
            "first_divergence": _difference(self.first_divergence),
            "first_inexact": _difference(self.first_inexact),
            "lines": [r.to_json() for r in self.lines]}
        if self.exact_lines is not None:
            out["exact_lines"] = self.exact_lines
        if self.iterations is not None:
            out["iterations"] = self.iterations
        return out


def _difference(d: LineDifference | None) -> dict[str, Any] | None:
    return None if d is None else {"file": d.file, "line": d.line, "step": d.step,
                                   "differences": d.differences}
