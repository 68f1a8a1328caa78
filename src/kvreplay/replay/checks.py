"""What a log replay was checked against, typed: one `StatsLineCheck` per stats line and the
`Verification` they make (inference/verify.py fills them; `Replay.verification` holds one);
a V0 log's every-50th preemption warnings (`WarningsCheck`, `Replay.warnings`); a step-trace
log's steps (`StepCheck`, `Replay.step_check`, inference/step_trace.py).

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


class IterationMismatch(msgspec.Struct, kw_only=True):
    """The first Iteration line the replay does not match, and how."""

    iteration: int  # N of the line
    file: str
    line: int
    step: int  # the replay's step
    differences: list[str]

    def to_json(self) -> dict[str, Any]:
        return {"iteration": self.iteration, "file": self.file, "line": self.line,
                "step": self.step, "differences": self.differences}


class IterationCheck(msgspec.Struct, kw_only=True):
    """The replay against the log's `Iteration(N)` lines (inference/iterations.py)."""

    lines: int  # Iteration lines in the log
    checked: int  # lines the replay had a step for
    matched: int  # ... that it matched in every field
    first_mismatch: IterationMismatch | None
    exact_until_step: int  # steps before this one are pinned by the log
    arrival_lag: dict[str, int]  # arrival line - lower bound: requests
    backtracks: int
    prompt_lengths: dict[str, int]  # what the lines said of estimated prompts: requests
    kv_unsure_lines: int  # lines whose KV usage may differ by how a sum of prompts splits
    search_allowance_spent: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"lines": self.lines, "checked": self.checked, "matched": self.matched,
                "first_mismatch": self.first_mismatch.to_json() if self.first_mismatch else None,
                "exact_until_step": self.exact_until_step, "arrival_lag": self.arrival_lag,
                "backtracks": self.backtracks, "prompt_lengths": self.prompt_lengths,
                "kv_unsure_lines": self.kv_unsure_lines,
                **({"search_allowance_spent": True} if self.search_allowance_spent else {})}


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
    iterations: IterationCheck | None = None  # the Iteration lines' check

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "stats_lines": self.stats_lines, "agreeing_lines": self.agreeing_lines,
            "first_divergence": _difference(self.first_divergence),
            "first_inexact": _difference(self.first_inexact),
            "lines": [r.to_json() for r in self.lines]}
        if self.exact_lines is not None:
            out["exact_lines"] = self.exact_lines
        if self.iterations is not None:
            out["iterations"] = self.iterations.to_json()
        return out


def _difference(d: LineDifference | None) -> dict[str, Any] | None:
    return None if d is None else {"file": d.file, "line": d.line, "step": d.step,
                                   "differences": d.differences}


# ---------------------------------------------------------------- V0 warnings
class WarningReplayed(msgspec.Struct, kw_only=True):
    """The replay's preemption a logged warning is checked against (same cumulative count)."""

    victim: str
    mode: str
    step: int
    time: float | None  # its step's wall-clock start (rounded to ms)


class WarningLineCheck(msgspec.Struct, kw_only=True):
    """One logged every-50th V0 preemption warning against the replay's preemption with the
    same cumulative count: victim, mode, and about the same second. `replayed` None: the
    replay has no preemption of that count (or the line none)."""

    file: str
    line: int
    time: float | None
    request_id: str | None
    mode: str | None  # lower case, as logged
    cumulative: int | None
    replayed: WarningReplayed | None = None
    time_diff_s: float | None = None  # replayed step start - the logged second's middle
    victim_matches: bool | None = None  # None: nothing replayed to compare
    matched: bool = False
    differences: list[str] = []

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"file": self.file, "line": self.line, "time": self.time,
                               "request_id": self.request_id, "mode": self.mode,
                               "cumulative": self.cumulative}
        if self.replayed is None:
            out.update(replayed=None, matched=self.matched, differences=self.differences)
        else:
            out.update(replayed=msgspec.structs.asdict(self.replayed),
                       time_diff_s=self.time_diff_s, victim_matches=self.victim_matches,
                       matched=self.matched, differences=self.differences)
        return out


class UnloggedWarning(msgspec.Struct, kw_only=True):
    """A warning the replay's V0 scheduler would have printed, inside the log's time span,
    that the log does not show."""

    cumulative: int | None
    victim: str
    step: int
    time: float | None


class WarningsCheck(msgspec.Struct, kw_only=True):
    """A V0 log's every-50th preemption warnings against the replay (`Replay.warnings`)."""

    warnings_logged: int
    warnings_matched: int
    victims_matched: int
    first_divergence: WarningLineCheck | None = None  # the first line not matched
    replay_warnings_not_in_log: list[UnloggedWarning] = []
    lines: list[WarningLineCheck] = []

    def to_json(self) -> dict[str, Any]:
        return {"warnings_logged": self.warnings_logged,
                "warnings_matched": self.warnings_matched,
                "victims_matched": self.victims_matched,
                "first_divergence": (None if self.first_divergence is None
                                     else self.first_divergence.to_json()),
                "replay_warnings_not_in_log": [msgspec.structs.asdict(w) for w in
                                               self.replay_warnings_not_in_log],
                "lines": [r.to_json() for r in self.lines]}


# ---------------------------------------------------------------- step-trace logs
class StepDivergence(msgspec.Struct, kw_only=True):
    """The first logged step (kvreplay's step-trace line) where vLLM and the replay differ:
    the field, and its value in the log and in the replay."""

    step: int
    file: str | None
    line: int | None
    field: str
    logged: Any
    replayed: Any

    def to_json(self) -> dict[str, Any]:
        return msgspec.structs.asdict(self)


class SessionCheck(msgspec.Struct, kw_only=True):
    """One scheduler instance of a step-trace log: its steps logged, checked, where first
    different."""

    steps_logged: int
    steps_checked: int
    first_divergence: StepDivergence | None = None

    def to_json(self) -> dict[str, Any]:
        return {"steps_logged": self.steps_logged, "steps_checked": self.steps_checked,
                "first_divergence": _json(self.first_divergence)}


class StepCheck(msgspec.Struct, kw_only=True):
    """A step-trace log replayed (`Replay.step_check`): every logged step checked against the
    replay's, up to the first divergence (None: none), over every scheduler instance."""

    steps_logged: int  # of the replayed instance
    steps_checked: int  # over every instance
    first_divergence: StepDivergence | None = None  # of the replayed instance
    requests_left_out: list[str] = []  # aborted before any schedule() saw them
    kv_events_checked: int | None = None  # steps whose KV-cache events were checked
    sessions: list[SessionCheck] = []

    def to_json(self) -> dict[str, Any]:
        return {"steps_logged": self.steps_logged, "steps_checked": self.steps_checked,
                "first_divergence": _json(self.first_divergence),
                "requests_left_out": self.requests_left_out,
                "kv_events_checked": self.kv_events_checked,
                "sessions": [s.to_json() for s in self.sessions]}


def _json(d: StepDivergence | None) -> dict[str, Any] | None:
    return None if d is None else d.to_json()
