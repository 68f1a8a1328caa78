"""Glue between the parsers and the replay: log files -> events -> facts -> replay.

The only module (with the CLIs) that imports both kvreplay.parsers and kvreplay.replay:
parsers -> events <- replay.
"""

from __future__ import annotations

from typing import Sequence

from kvreplay.errors import UserError


def read_facts(paths: Sequence[str], *, vllm_version: str | None = None, year: int | None = None):
    """Parse log files into `LogFacts`."""
    from kvreplay.parsers import detect_version, merge_config, parse_files
    from kvreplay.replay.logfacts import collect

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
                vllm_version: str | None = None, year: int | None = None):
    """Parse, rebuild, fit and replay: a `LogReplay`."""
    from kvreplay.replay.from_log import ReplayError, replay_facts

    facts = read_facts(paths, vllm_version=vllm_version, year=year)
    try:
        return replay_facts(facts, profile=None if profile in (None, "auto") else profile)
    except ReplayError as exc:
        raise UserError(str(exc)) from None
