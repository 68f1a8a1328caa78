"""The follow loop `kvreplay watch` and `kvreplay tui --follow` share: read a batch of the
followed log, feed it to the session, check the input, replay when due, say a failing
replay once, and end the input (the end of stdin, or `exit_idle` seconds without a line).

    for tick in follow(follower, session, label, exit_idle=...):
        ... tick.notices (the follower's: rotation, truncation), tick.rows (decided),
            tick.failed (a replay that failed, said once), tick.end (the input ended)

A consumer does its own work between ticks (print the rows, build a timeline, read a
/metrics feed) and stops by leaving the loop (the TUI's worker cancelled). At the end of
the input the last tick's rows hold the session's final rows (`Session.finish(end=True)`:
input that is no vLLM log is refused there, UserError); input with no line at all is
refused as an empty log.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Iterator

from kvreplay.errors import UserError
from kvreplay.live.follow import POLL_S


@dataclass(slots=True)
class Tick:
    """What one pass of the loop read and decided."""

    lines: int = 0  # new complete lines read
    notices: list[str] = field(default_factory=list)  # what happened to the followed file
    rows: list[Any] = field(default_factory=list)  # rows decided (session.Row)
    replayed: bool = False  # a replay ran in this tick
    failed: str | None = None  # the first replay that failed (then never again)
    end: bool = False  # the input ended: `rows` has the final ones; the last tick


def follow(follower: Any, session: Any, label: str, *, exit_idle: float | None = None,
           poll_s: float = POLL_S) -> Iterator[Tick]:
    """The ticks of following `follower` (live.follow) into `session` (live.session)."""
    seen_any = told = False
    idle_since = time.monotonic()
    while True:
        batch = follower.read(poll_s)
        tick = Tick(len(batch.lines), list(batch.notices))
        if batch.lines:
            seen_any = True
            idle_since = time.monotonic()
            tick.rows += session.feed(batch.lines)
            session.check_input()
        end = batch.eof
        if not end and session.due():
            tick.rows += session.update()
            tick.replayed = True
            if session.failed and not told:
                told = True
                tick.failed = session.failed[-1]
            idle_since = time.monotonic()  # (time spent replaying is not the log's idle)
        elif (not end and exit_idle is not None and not batch.lines
              and time.monotonic() - idle_since >= exit_idle):
            tail = getattr(follower, "partial", b"")
            if tail:  # a last line without its newline: the end of the log
                seen_any = True
                tick.rows += session.feed([tail.decode("utf-8", "replace")])
            end = True
        if end:
            if not seen_any:
                raise UserError(f"{label}: empty log")
            tick.rows += session.finish(end=True)
            tick.replayed = True
            tick.end = True
            yield tick
            return
        yield tick
