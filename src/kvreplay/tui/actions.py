"""The TUI's key actions: moving through the steps and events, selecting a request, go to
and search, bookmarks, the diff and block-map modes, zoom, tabs and the trace export. A
mixin of ReplayApp (it holds the timeline, the cursor and what is selected)."""

from __future__ import annotations

from pathlib import Path

from textual import work
from textual.widgets import OptionList, TabbedContent

from kvreplay.errors import UserError
from kvreplay.tui.goto_search import GotoScreen, SearchScreen, parse_goto
from kvreplay.tui.keys import HelpScreen
from kvreplay.tui import panel_text
from kvreplay.tui.widgets import TimelineBar


class Actions:
    """ReplayApp's key actions (the bindings are in tui/keys.py)."""

    def action_step(self, delta: int) -> None:
        self.move_to(self.cursor + delta)

    def action_first(self) -> None:
        self.move_to(0)

    def action_last(self) -> None:
        if self.tl is not None:
            self.move_to(self.tl.num_steps - 1)

    def action_event(self, kind: str, direction: int) -> None:
        tl = self.tl
        if tl is None:
            return
        step = tl.next_event(kind, self.cursor, forward=direction > 0)
        if step is None and kind == "preemption" and direction > 0 and self.tailing:
            # following a live log at its newest step: the newest preemption seen
            step = tl.next_event(kind, tl.num_steps, forward=False)
        if step is None:
            self.notify(f"No {'next' if direction > 0 else 'previous'} {kind}.", timeout=2)
            return
        if kind == "preemption":
            self.selected = tl.preemptions_at(step)[0].victim
        self.move_to(step)
        if kind == "preemption":
            self.query_one(TabbedContent).active = "why"
            self.refresh_panels()

    def _need_selection(self) -> bool:
        if self.selected is None:
            self.notify("Select a request first: / to search, [ ] in this step.", timeout=3)
            return False
        return True

    def action_request_event(self, direction: int) -> None:
        if self.tl is None or not self._need_selection():
            return
        step = self.tl.next_request_event(self.selected, self.cursor, direction > 0)  # type: ignore[arg-type]
        if step is None:
            self.notify(f"No {'later' if direction > 0 else 'earlier'} event of {self.selected}.",
                        timeout=2)
            return
        self.move_to(step)

    def action_request_preemption(self, direction: int) -> None:
        if self.tl is None or not self._need_selection():
            return
        step = self.tl.next_request_event(self.selected, self.cursor, direction > 0,  # type: ignore[arg-type]
                                          kinds=("preempted",))
        if step is None:
            self.notify(f"No {'later' if direction > 0 else 'earlier'} preemption of "
                        f"{self.selected}.", timeout=2)
            return
        self.move_to(step)
        self.query_one(TabbedContent).active = "why"

    def action_select(self, direction: int) -> None:
        v = self.view
        if v is None:
            return
        ids = list(dict.fromkeys([s.rid for s in v.scheduled] + v.after.running + v.after.waiting
                                 + [p.victim for p in v.preemptions] + v.record.finished))
        if not ids:
            return
        if self.selected in ids:
            i = (ids.index(self.selected) + direction) % len(ids)
        else:
            i = 0 if direction > 0 else len(ids) - 1
        self.select_request(ids[i])

    def select_request(self, rid: str | None) -> None:
        self.selected = rid
        self.refresh_panels()

    def action_goto(self) -> None:
        tl = self.tl
        if tl is None:
            return

        def done(value: str | None) -> None:
            if value is None or self.tl is None:
                return
            step, note = parse_goto(value, self.cursor, self.tl)
            if step is None:
                self.notify(note or f"Not a step or a time: {value!r}", severity="error",
                            timeout=4)
                return
            if note:
                self.notify(note, timeout=4)
            self.move_to(step)

        times = None
        if tl.has_times:
            last = min(len(tl.step_times), max(tl.num_steps, 1)) - 1
            times = (f"{panel_text.clock_of(tl, tl.step_times[0])} – "
                     f"{panel_text.clock_of(tl, tl.step_times[last])}")
        self.push_screen(GotoScreen(tl.num_steps - 1, times), done)

    def action_search(self) -> None:
        tl = self.tl
        if tl is None:
            return

        def done(rid: str | None) -> None:
            if rid is None:
                return
            if rid not in tl.life:
                self.notify(f"No request {rid!r}.", severity="error", timeout=3)
                return
            self.selected = rid
            self.action_tab("request")
            step = tl.next_request_event(rid, self.cursor - 1)
            if step is None:
                step = tl.next_request_event(rid, self.cursor + 1, forward=False)
            if step is not None and step != self.cursor:
                self.move_to(step)
            else:
                self.refresh_panels()

        self.push_screen(SearchScreen(tl), done)

    def action_bookmark(self) -> None:
        s = self.cursor
        if s in self.bookmarks:
            self.bookmarks.discard(s)
            self._bookmark_order.remove(s)
            self.notify(f"Bookmark removed: step {s}", timeout=2)
        else:
            self.bookmarks.add(s)
            self._bookmark_order.append(s)
            self.notify(f"Bookmarked step {s}", timeout=2)
        self.refresh_panels()

    def action_next_bookmark(self, direction: int) -> None:
        marks = sorted(self.bookmarks)
        cands = [m for m in marks if (m > self.cursor if direction > 0 else m < self.cursor)]
        if not cands:
            self.notify("No more bookmarks.", timeout=2)
            return
        self.move_to(cands[0] if direction > 0 else cands[-1])

    def action_diff_mode(self) -> None:
        self.diff_mode = "bookmarks" if self.diff_mode == "previous" else "previous"
        self.query_one(TabbedContent).active = "diff"
        self.refresh_panels()

    def action_before_after(self) -> None:
        self.show_before = not self.show_before
        self.query_one(TabbedContent).active = "blocks"
        self.refresh_panels()

    def action_zoom(self, delta: int) -> None:
        self.zoom = max(0, min(24, self.zoom + delta))
        if self.tl is not None:
            self.query_one(TimelineBar).render_for(self)

    def action_export(self) -> None:
        if self.tl is None or self.tl.num_steps == 0:
            self.notify("Nothing to export yet.", timeout=2)
            return
        lo, hi = self.window()  # the timeline's steps: all, or the zoomed window
        self.export_trace(lo, hi - 1)

    @work(thread=True, group="export", exit_on_error=False)
    def export_trace(self, lo: int, hi: int) -> None:
        from kvreplay.export import build_trace, write_trace
        from kvreplay.export.perfetto import protos

        try:
            protos()
            fmt, ext, note = "perfetto", ".pftrace", ""
        except UserError:
            fmt, ext = "chrome", ".json"
            note = " (JSON: pip install 'kvreplay[perfetto]' for .pftrace)"
        stem = Path(self.paths[0]).stem if self.paths else "replay"
        path = self.export_dir / f"{stem}.steps{lo}-{hi}{ext}"
        try:
            size = write_trace(build_trace(self.tl.replay, (lo, hi)), path, fmt)  # type: ignore[union-attr]
        except UserError as exc:
            self.call_from_thread(self.notify, str(exc), severity="error", timeout=6)
            return
        self.exported = path
        self.call_from_thread(self.notify, f"Steps {lo}-{hi} written to {path} ({size:,} bytes)"
                              f"{note}: open it in ui.perfetto.dev", timeout=8)

    def action_tab(self, tab: str) -> None:
        self.query_one(TabbedContent).active = tab
        if tab == "request":
            self.query_one("#request-life", OptionList).focus()

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())
