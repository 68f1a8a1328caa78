"""`Replay`: one replay of one input, computed once; every view reads it.

A `Replay` holds the engine inputs (workload, scheduler profile, `EngineInputs`), the run's
step records and preemption records, the clock, the verification against the log and the
step -> log lines map. The report, the JSON, the audit, the TUI, the golden files, the
what-if baseline and the trace export read it; none runs a different simulation. A view
that needs the whole state at a step (the TUI's block map, the conformance trace) re-runs
exactly these inputs with `rerun()`, which checks every step against the stored records.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import msgspec

from kvreplay.replay.checks import StepCheck, Verification, WarningsCheck
from kvreplay.replay.engine import Engine, without_cyclic_gc
from kvreplay.replay.records import (EngineInputs, PreemptionRecord, StepRecord, Totals,
                                     totals)
from kvreplay.replay.v0.steps import V0Steps, V0Workload

STORM_GAP_STEPS = 50  # preemptions no more than this many steps apart form one storm


class Provenance(msgspec.Struct, kw_only=True):
    """Where a replay's inputs came from and how each was made; a log replay fills most, a
    workload only the first four. None: not applicable to this replay."""

    vllm_version: str | None = None  # the release that wrote the log
    requests: int | None = None  # requests replayed
    prompts: str | None = None  # "exact" (logged) | "estimated"
    output_lengths: str | None = None  # "exact" | "estimated"
    step_time_model: str | None = None  # the clock's model of a step, described
    arrival_pattern: str | None = None  # "burst" | "closed-loop" | "poisson" ...
    fit_loss: float | None = None  # the placement's disagreement with the stats lines
    config_sources: dict[str, str] = {}  # each config value: the line that gave it, or default
    log_format: str | None = None  # formats.LogFormat.name
    stats_phase: float | None = None  # where in its second a stats line was written
    placement: list[float] | str | None = None  # the fit's placement, or "iteration lines"
    spans: dict[str, Any] | None = None  # request spans: the join and the replay's check


class CountEstimate(msgspec.Struct, kw_only=True):
    """The preemption count over plausible variants of what the log lacks (formats without
    an uncertainty ensemble): low, high and median of the variants' counts."""

    preemptions_low: int
    preemptions_high: int
    preemptions_median: int
    variants: dict[str, int]  # variant -> its replay's preemptions
    why: str
    make_it_exact: str

    def to_json(self) -> dict[str, Any]:
        return msgspec.structs.asdict(self)


class ReplayMismatch(RuntimeError):
    """A re-run of a replay's inputs did not give its records (a bug: the engine is
    deterministic)."""


@dataclass(slots=True)
class Replay:
    kind: str  # "workload" | "log" | "step-trace"
    label: str
    paths: list[str]
    workload: Any  # Workload (V1) | V0Workload
    profile: Any  # SchedulerProfile | V0ProfileRef
    inputs: EngineInputs
    steps: list[StepRecord]
    preemptions: list[PreemptionRecord]
    clock: list[float] | None = None  # wall-clock start of each step (log replays)
    verification: Verification | None = None  # the replay against the stats lines
    warnings: WarningsCheck | None = None  # V0: the every-50th warnings against it
    step_check: StepCheck | None = None  # step-trace logs: every step checked
    log_lines: dict[int, list[tuple[str, int]]] = field(default_factory=dict)
    estimate: CountEstimate | None = None  # a count interval where the log cannot pin it
    uncertainty: Any = None  # inference.uncertainty.Uncertainty: what the log leaves open
    notes: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    info: Provenance = field(default_factory=Provenance)
    facts: Any = None  # LogFacts of a log replay
    unfinished: list[str] = field(default_factory=list)
    confidence: str = "exact"  # the replay as a whole: exact | consistent | inferred
    hasher: Callable[[], Any] | None = None  # block identities of a step-trace log
    step_time_model: Any = None  # the clock's model of a step's duration (log replays)
    # step-trace logs: the whole-second stamp of each step's line (its iteration's end)
    stamps: list[float] | None = None
    # a log replay asked to carry its engine state out (inference.start_state.Window): it
    carried: Any = None

    @property
    def engine_name(self) -> str:
        return "V0" if isinstance(self.workload, V0Workload) else "V1"

    @property
    def num_steps(self) -> int:
        return len(self.steps)

    @property
    def cut_short(self) -> bool:
        return self.inputs.max_steps is not None

    @property
    def terminal(self) -> StepRecord | None:
        """The step in which vLLM itself stops (V0: the swap-space RuntimeError, an assertion
        of the 0.6.6 scheduler), the run's last; None when the run ended otherwise."""
        last = self.steps[-1] if self.steps else None
        return last if last is not None and last.terminal_error else None

    def totals(self) -> Totals:
        return totals(self.steps, self.preemptions)

    def storms(self, gap_steps: int = STORM_GAP_STEPS) -> list[dict[str, Any]]:
        """Bursts: preemptions no more than `gap_steps` apart."""
        out: list[dict[str, Any]] = []
        for p in self.preemptions:
            if out and p.step - out[-1]["last_step"] <= gap_steps:
                s = out[-1]
                s["last_step"] = p.step
                s["end_time"] = p.time
                s["preemptions"] += 1
                s["tokens_lost"] += p.computed_tokens_lost
                s["tokens_recomputed"] += p.tokens_recomputed or 0
                s["victims"].append(p.victim)
            else:
                out.append({"first_step": p.step, "last_step": p.step, "start_time": p.time,
                            "end_time": p.time, "preemptions": 1,
                            "tokens_lost": p.computed_tokens_lost,
                            "tokens_recomputed": p.tokens_recomputed or 0,
                            "victims": [p.victim]})
        for s in out:
            s["victims"] = sorted(set(s["victims"]))
        return out

    def step_time(self, step: int) -> float | None:
        c = self.clock
        return c[step] if c is not None and 0 <= step < len(c) else None

    # -- re-running exactly these inputs ------------------------------------------------
    def new_engine(self, *, check_invariants: bool = False) -> Engine | V0Steps:
        """A fresh engine that makes this replay's run again, step for step."""
        if isinstance(self.workload, V0Workload):
            return V0Steps(self.workload, inputs=self.inputs)
        return Engine(self.workload, self.profile, inputs=self.inputs,
                      check_invariants=check_invariants,
                      block_hasher=self.hasher() if self.hasher is not None else None)

    def rerun(self, *, check_invariants: bool = False) -> Iterator[tuple[Any, StepRecord]]:
        """(engine, record) for every step of a re-run of the inputs; raises
        `ReplayMismatch` at the first step whose record differs from the stored one."""
        eng = self.new_engine(check_invariants=check_invariants)
        for want in self.steps:
            if eng.done:
                raise ReplayMismatch(f"the re-run ended at step {eng.step_index}, the replay "
                                     f"has {len(self.steps)} steps")
            got = eng.step()
            if got != want:
                raise ReplayMismatch(f"the re-run differs from the replay at step {want.step}")
            yield eng, got

    @without_cyclic_gc
    def trace(self) -> list[dict[str, Any]]:
        """The replay's per-step trace in the conformance format (every field), from a
        checked re-run of its inputs."""
        from kvreplay.replay.trace import conformance_record

        out = []
        for eng, rec in self.rerun():
            out.append(eng.last_record if isinstance(eng, V0Steps)  # type: ignore[union-attr]
                       else conformance_record(eng, rec))
        return out

    def summary(self) -> dict[str, Any]:
        """The replay's totals and provenance, as every report prints them."""
        t = self.totals()
        info = self.info
        out = {
            "vllm_version": info.vllm_version,
            "engine": self.engine_name,
            "profile": self.profile.name,
            "requests": len(self.inputs.arrival_steps) if info.requests is None else info.requests,
            "steps": len(self.steps),
            "preemptions": t.preemptions,
            "self_preemptions": t.self_preemptions,
            "requests_preempted": t.requests_preempted,
            "computed_tokens_lost": t.computed_tokens_lost,
            "tokens_recomputed": t.tokens_recomputed,
            "processed_tokens": t.processed_tokens,
            "recompute_ratio": None if t.recompute_ratio is None else round(t.recompute_ratio, 6),
            "cut_short": self.cut_short,
            "unfinished_requests": self.unfinished,
            "confidence": self.confidence,
        }
        for k in ("step_time_model", "arrival_pattern", "fit_loss", "prompts", "output_lengths",
                  "spans"):
            if getattr(info, k) is not None:
                out[k] = getattr(info, k)
        if self.engine_name == "V0":
            out["swap_preemptions"] = sum(1 for p in self.preemptions if p.mode == "swap")
            w = self.warnings
            out["warnings_logged"] = w.warnings_logged if w is not None else 0
            out["warnings_matched"] = w.warnings_matched if w is not None else 0
            out["prometheus_num_preemptions_total"] = sum(
                r.prometheus_preemptions for r in self.steps)
            out["num_cumulative_preemption"] = max(
                (p.cumulative or 0 for p in self.preemptions), default=0)
            out["terminal_error"] = self.terminal.terminal_error if self.terminal else None
        return out


@without_cyclic_gc
def replay_workload(data: dict[str, Any], *, profile: Any = None, label: str = "workload",
                    paths: list[str] | None = None, check_capacity: bool = True,
                    check_invariants: bool = False) -> Replay:
    """A workload (conformance format, V1 or `"engine": "v0"`) run through the model: every
    step and preemption exact, no clock."""
    from kvreplay.replay.profile import DEFAULT_PROFILE, get_profile
    from kvreplay.replay.records import preemption_records
    from kvreplay.replay.v0.steps import V0ProfileRef, v0_workload
    from kvreplay.replay.workload import parse_workload

    if data.get("engine") == "v0":
        wl, arrivals = v0_workload(data)
        prof: Any = V0ProfileRef()
        eng: Any = V0Steps(wl, inputs=EngineInputs(arrivals))
    else:
        wl = parse_workload(data, check_capacity=check_capacity)
        prof = get_profile(profile) if profile else DEFAULT_PROFILE
        arrivals = [s.arrival_step for s in wl.requests]
        eng = Engine(wl, prof, inputs=EngineInputs(arrivals), check_invariants=check_invariants)
    steps = list(eng.run()) if hasattr(eng, "run") else _steps(eng)
    ended = {rid for rec in steps for rid in (*rec.finished, *rec.aborted)}
    parent = getattr(wl, "parent", {})
    unfinished = list(dict.fromkeys(parent.get(s.id, s.id) for s in wl.requests
                                    if s.id not in ended))
    return Replay(kind="workload", label=label, paths=list(paths or []), workload=wl,
                  profile=prof, inputs=eng.inputs(), steps=steps,
                  preemptions=preemption_records(steps), unfinished=unfinished,
                  info=Provenance(requests=len(arrivals), prompts="exact", output_lengths="exact"))


def _steps(eng: Any) -> list[StepRecord]:
    out = []
    while not eng.done:
        out.append(eng.step())
    return out
