"""`kvreplay tui --follow LOG`: the debugger on a live replay.

The log is followed by the loop `kvreplay watch` runs (live/driver.py; live/follow.py:
appended, rotated, truncated, as `tail -F`) and replayed by the same session (live/session.py: a replay when a
deciding line arrived and the run grew enough, or replays used under half a core), with
two differences: the session keeps the whole run (no window cut at quiet points or
decided steps: every step stays reachable), and each replay of the run becomes a built `Timeline` that replaces
the one on screen. So the timeline grows as the log grows, the why-panel works on any step
already seen, and `n` at the newest step jumps to the newest preemption. A new startup
banner starts a new replay (its steps count from 0) and the app says so.

What is shown is the point replay of the lines so far (no uncertainty ensemble while
following); a preemption whose replay a later line changes (an estimated prompt corrected)
shows as the later replay has it.
"""

from __future__ import annotations

from typing import Any

from textual.message import Message

from kvreplay.errors import UserError
from kvreplay.live.driver import follow
from kvreplay.live.session import NoticeRow, Session
from kvreplay.replay.timeline import Timeline



class FollowSession(Session):
    """A watch session that keeps its last replay and the whole run (no window cut)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.replay: Any = None  # the last replay of the current run
        self.replay_lines = 0  # the run's lines it replayed

    def _new_run(self) -> None:
        super()._new_run()
        self.replay = None
        self.replay_lines = 0

    def _replay(self, strict: bool = False, carry: bool = False) -> Any:
        rep = super()._replay(strict)  # (no state carried out: the whole run is kept)
        if rep is not None:
            self.replay, self.replay_lines = rep, len(self.lines)
        return rep

    def _cut(self, rep: Any) -> bool:
        return False  # the TUI keeps every step of the run (its timeline holds snapshots)

    def _carry(self, rep: Any) -> None:
        return  # (the same: no cut at a decided step either)

    def charge(self, seconds: float) -> None:
        """Count building the replay's timeline as part of that replay's cost, so replays
        and their timelines together take at most DUTY of a core (Session.due)."""
        self.last_cost += seconds
        self.replay_s += seconds
        self.replay_end = self.clock()


class Grown(Message):
    """A new replay of the followed run, its timeline built (`run`: 1 for the first)."""

    def __init__(self, tl: Timeline, run: int, lines: int) -> None:
        super().__init__()
        self.tl, self.run, self.lines = tl, run, lines


class FollowNotice(Message):
    """What happened to the followed file or the server: a restart, a rotation, the end."""

    def __init__(self, text: str, restart: bool = False, severity: str = "information") -> None:
        super().__init__()
        self.text, self.restart, self.severity = text, restart, severity


class Following:
    """ReplayApp's part that follows a live log (`follow_path`): `_follow` runs in the load
    worker; its messages are handled on the UI thread."""

    def _follow(self, worker: Any) -> None:
        from kvreplay.live.follow import open_follower
        from kvreplay.tui.loading import Loaded
        from kvreplay.tui.opening import Opening

        try:
            follower = open_follower(self.follow_path)
        except UserError as exc:
            self.post_message(Loaded(error=str(exc)))
            return
        session = FollowSession(self.follow_path, mtime=follower.mtime, year=self.year,
                                replay_opts={"profile": self.profile_name, "samples": 0})
        self.session = session
        shown = (0, 0)  # (run, lines) of the replay on screen
        try:
            for tick in follow(follower, session, self.follow_path):
                if worker.is_cancelled:
                    break
                for n in tick.notices:
                    self.post_message(FollowNotice(n))
                for row in tick.rows:
                    if isinstance(row, NoticeRow) and row.event == "restart":
                        self.post_message(FollowNotice(row.text, restart=True,
                                                       severity="warning"))
                if tick.failed is not None:
                    self.post_message(FollowNotice(
                        f"the lines so far could not be replayed ({tick.failed}); "
                        "trying again as more come", severity="warning"))
                rep = session.replay
                if rep is None and tick.lines:
                    self.post_message(Opening(f"following {self.follow_path}: "
                                              f"{len(session.lines):,} lines, nothing to replay "
                                              "yet (waiting for the server's lines)"))
                if rep is not None and (session.run, session.replay_lines) != shown:
                    shown = (session.run, session.replay_lines)
                    tl = Timeline(rep, snapshot_every=self.snapshot_every)
                    tl.lines = session.lines  # the run's lines: the Log tab reads them
                    t0 = session.clock()
                    tl.build(cancelled=lambda: worker.is_cancelled)
                    session.charge(session.clock() - t0)
                    if worker.is_cancelled:
                        break
                    self.post_message(Grown(tl, session.run, session.replay_lines))
                if tick.end:
                    self.post_message(FollowNotice("end of the input: the replay is final"))
        except UserError as exc:
            self.post_message(Loaded(error=str(exc)))
        finally:
            follower.close()

    def on_grown(self, message: Grown) -> None:
        old = self.tl
        new_run = old is None or message.run != self.server_run
        tailing = self.tailing or old is None or old.num_steps == 0
        self.server_run = message.run
        self.tl = message.tl
        if not self.loaded:
            self.loaded = True
            self.query_one("#progress").display = False
        if new_run:
            self.bookmarks.clear()
            self._bookmark_order.clear()
            self.selected = None
        elif self.selected is not None and self.selected not in message.tl.life:
            self.selected = None
        last = max(message.tl.num_steps - 1, 0)
        self.view = None
        if tailing:
            self.tailing = True
            self.cursor = last
        else:
            self.cursor = min(self.cursor, last)
        self.show_step()
        self._refresh_status()

    def on_follow_notice(self, message: FollowNotice) -> None:
        self.follow_note = message.text
        self.notify(message.text, severity=message.severity, timeout=8)  # type: ignore[arg-type]
        self._refresh_status()

    def follow_status(self) -> str:
        """The status line's follow part: the run and how many lines the shown replay has."""
        s = self.session
        if s is None:
            return "following"
        return (f"following run {self.server_run} ({s.replay_lines:,} of {len(s.lines):,} "
                f"lines replayed{', at the newest step' if self.tailing else ''})")
