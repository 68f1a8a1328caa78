"""Glue between the parsers and the replay: log files -> events -> facts -> replay.

The only module (with the CLIs) that imports both kvreplay.parsers and kvreplay.replay:
parsers -> events <- replay.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from kvreplay.errors import UserError


def read_facts(paths: Sequence[str], *, vllm_version: str | None = None, year: int | None = None):
    """Parse log files into `LogFacts`."""
    from kvreplay.parsers import detect_version, merge_config, parse_files
    from kvreplay.inference.facts import collect

    events = list(parse_files(list(paths), year=year, vllm_version=vllm_version))
    if not events:
        raise UserError(f"{', '.join(paths)}: empty log")
    dialect = detect_version(events, vllm_version)
    config = merge_config(events)
    return collect(
        events,
        list(paths),
        config=config,
        vllm_version=dialect.vllm_version,
        engine_version=dialect.engine_version,
    )


def replay_logs(paths: Sequence[str], *, profile: str | None = None,
                vllm_version: str | None = None, year: int | None = None,
                support: int | None = None):
    """Parse, rebuild, fit and replay: a `LogReplay` (`support`: see from_log.replay_facts)."""
    from kvreplay.inference import replay_log

    facts = read_facts(paths, vllm_version=vllm_version, year=year)
    return replay_log(facts, profile=profile, support=support)


def source_from_logs(paths: Sequence[str], *, profile: str | None = None,
                     vllm_version: str | None = None, year: int | None = None):
    """A `ReplaySource` for the TUI and the pytest plugin: the log's rebuilt workload with
    every request entering at the step the log replay placed it, so a plain `Engine` run of
    it is the log replay."""
    from kvreplay.replay.session import ReplaySource

    from kvreplay.replay.from_log import ReplayError, finish_steps, replay_facts

    facts = read_facts(paths, vllm_version=vllm_version, year=year)
    if facts.engine_version == "V0":  # known from the startup lines: fail before replaying
        raise UserError(
            "this is a V0-engine log: `kvreplay replay` reports its preemptions; stepping "
            "through it needs the V1 engine's step view, which V0 does not have yet"
        )
    try:
        rep = replay_facts(facts, profile=None if profile in (None, "auto") else profile)
    except ReplayError as exc:
        raise UserError(str(exc)) from None
    if type(rep).__name__ == "V0LogReplay":
        raise UserError(
            "this is a V0-engine log: `kvreplay replay` reports its preemptions; stepping "
            "through it needs the V1 engine's step view, which V0 does not have yet"
        )
    arrival = rep.run.arrival_step
    workload = rep.workload()
    log_lines: dict[int, list[tuple[str, int]]] = {}
    for r in rep.facts.requests:
        log_lines.setdefault(arrival.get(r.log_id, 0), []).append((r.file, r.line))
    finishes = finish_steps(rep.run.records)
    for (file, line, _, _), step in zip(rep.facts.completions, finishes):
        log_lines.setdefault(step, []).append((file, line))
    for row in rep.verification["lines"]:
        if row.get("step") is not None:
            log_lines.setdefault(row["step"], []).append((row["file"], row["line"]))
    for lines in log_lines.values():
        lines.sort(key=lambda x: (x[0], x[1]))
    confidence = "consistent" if all(
        p.get("confidence") == "consistent" for p in rep.preemptions) else "inferred"
    summary = rep.summary()
    return ReplaySource(
        workload=workload,
        profile=rep.profile,
        label=f"log {', '.join(Path(p).name for p in paths)} "
        f"(vLLM {summary['vllm_version'] or '?'}, replayed)",
        kind="log",
        paths=list(paths),
        confidence=confidence,
        log_lines=log_lines,
        notes=[summary["step_time_model"], f"arrivals: {summary['arrival_pattern']}"]
        + rep.rebuilt.notes + rep.facts.missing,
        extra={"step_times": rep.run.step_start, "replay": rep,
               "preemption_confidence": {p["step"]: p.get("confidence") for p in rep.preemptions},
               # (step, victim) -> share of the alternative replays that find it too
               "preemption_support": {(p["step"], p["victim"]): p["support"]
                                      for p in rep.preemptions if p.get("support") is not None},
               "support_replays": getattr(rep, "support_replays", 0)},
    )
