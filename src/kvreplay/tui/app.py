"""`kvreplay tui`: step through every scheduling decision of a replay.

The replay runs once in a worker thread (replay/timeline.py keeps compact per-step records
and engine snapshots); every panel shows a `StepView` the timeline rebuilds on demand.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from rich.text import Text
from textual import events, on, work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.message import Message
from textual.reactive import reactive
from textual.screen import ModalScreen, Screen
from textual.widget import Widget
from textual.widgets import (
    Footer, Label, OptionList, ProgressBar, Static, TabbedContent, TabPane,
)
from textual.widgets.option_list import Option
from textual.worker import Worker, WorkerState, get_current_worker

from kvreplay.errors import ReplayError, UserError
from kvreplay.replay.timeline import StepView, Timeline, diff_states
from kvreplay.tui import panel_text
from kvreplay.tui.later import EnsembleLater, ensemble_pending
from kvreplay.tui.opening import Opening
from kvreplay.tui.goto_search import GotoScreen, SearchScreen, parse_goto, parse_step  # noqa: F401

PAGE = 100
TABS = ("why", "blocks", "request", "diff", "log")

# (key, action, description, shown in the footer). The help screen and the command
# palette are generated from this list, so every key appears in both.
KEYS: list[tuple[str, str, str, bool]] = [
    ("right,l,.", "step(1)", "Next step", True),
    ("left,h,comma", "step(-1)", "Previous step", True),
    ("pagedown,space", f"step({PAGE})", f"Forward {PAGE} steps", False),
    ("pageup,b", f"step(-{PAGE})", f"Back {PAGE} steps", False),
    ("n", "event('preemption',1)", "Next preemption", True),
    ("N", "event('preemption',-1)", "Previous preemption", True),
    ("a", "event('admission',1)", "Next admission", False),
    ("A", "event('admission',-1)", "Previous admission", False),
    ("r", "event('resume',1)", "Next readmission (resume)", False),
    ("R", "event('resume',-1)", "Previous readmission (resume)", False),
    ("f", "event('finish',1)", "Next finish", False),
    ("F", "event('finish',-1)", "Previous finish", False),
    ("w", "event('blocked',1)", "Next blocked admission", False),
    ("W", "event('blocked',-1)", "Previous blocked admission", False),
    ("o", "request_event(1)", "Next event of the selected request", False),
    ("O", "request_event(-1)", "Previous event of the selected request", False),
    ("p", "request_preemption(1)", "Next preemption of the selected request", False),
    ("P", "request_preemption(-1)", "Previous preemption of the selected request", False),
    ("right_square_bracket", "select(1)", "Select the next request of this step", False),
    ("left_square_bracket", "select(-1)", "Select the previous request of this step", False),
    ("g,home", "first", "First step", False),
    ("G,end", "last", "Last step", False),
    ("colon", "goto", "Go to a step or a time", True),
    ("slash", "search", "Search a request id", True),
    ("m", "bookmark", "Toggle a bookmark on this step", False),
    ("u", "next_bookmark(1)", "Next bookmark", False),
    ("U", "next_bookmark(-1)", "Previous bookmark", False),
    ("x", "diff_mode", "Diff: vs previous step / between the last two bookmarks", False),
    ("t", "before_after", "Block map: after / before this step", False),
    ("plus,equals_sign", "zoom(1)", "Zoom the timeline in", False),
    ("minus", "zoom(-1)", "Zoom the timeline out", False),
    ("1", "tab('why')", "Why panel", False),
    ("2", "tab('blocks')", "Block map", False),
    ("3", "tab('request')", "Request view", False),
    ("4", "tab('diff')", "State diff", False),
    ("5", "tab('log')", "Log lines", False),
    ("e", "export", "Export the timeline's steps as a Perfetto trace (JSON without the package)",
     False),
    ("question_mark,f1", "help", "Help: every key", True),
    ("escape", "stop", "Stop loading", False),
    ("q", "quit", "Quit", True),
]

# Shorter footer labels, so every footer key fits at 130 columns (help keeps the long ones).
FOOTER_LABELS = {"event('preemption',-1)": "Prev preemption", "goto": "Go to step/time",
                 "search": "Search id", "help": "Help"}

KEY_NAMES = {"right": "→", "left": "←", "comma": ",", "colon": ":", "slash": "/",
             "question_mark": "?", "right_square_bracket": "]", "left_square_bracket": "[",
             "plus": "+", "equals_sign": "=", "minus": "-", "pagedown": "PgDn",
             "pageup": "PgUp", "space": "Space", "escape": "Esc", "home": "Home", "end": "End",
             "f1": "F1"}


def key_display(keys: str) -> str:
    return " ".join(KEY_NAMES.get(k, k) for k in keys.split(","))


class TimelineBar(Static):
    """KV usage, running and waiting over the steps; preemptions marked; click to move."""

    LABEL_W = 6

    def render_for(self, app: "ReplayApp") -> None:
        lo, hi = app.window()
        self._window = (lo, hi)
        self.update(panel_text.timeline_text(app.tl, lo, hi, self.size.width or 80, app.cursor,
                                         app.bookmarks))

    def on_click(self, event: events.Click) -> None:
        app = self.app
        if not isinstance(app, ReplayApp) or app.tl is None:
            return
        lo, hi = getattr(self, "_window", (0, 0))
        width = max(1, (self.size.width or 80) - self.LABEL_W)
        span = min(hi, app.tl.num_steps) - lo
        x = event.x - self.LABEL_W
        if span <= 0 or x < 0:
            return
        col = min(x, width - 1)
        app.move_to(lo + span * col // width + (span // width) // 2)


class Panel(Static):
    """A Static that remembers its plain text (for tests and the tmux check)."""

    plain: str = ""

    def show(self, text: Text) -> None:
        self.plain = text.plain
        self.update(text)


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "close", "Close")]

    def compose(self) -> ComposeResult:
        t = Text()
        t.append("kvreplay tui: keys", style="bold")
        t.append("   (↑ ↓ PgUp PgDn scroll, Esc closes)\n\n", style="dim")
        for keys, _action, desc, _show in KEYS:
            t.append(f"{key_display(keys):<18}", style="bold cyan").append(f"{desc}\n")
        t.append(f"{'ctrl+p':<18}", style="bold cyan").append("Command palette (every action)\n")
        t.append(f"{'click':<18}", style="bold cyan").append("Timeline: move to that step; "
                                                              "Request view: jump to an event\n")
        t.append("\nBlock map: ×× null  ·· free  ○○ free but cached (evictable)  "
                 "██ held (colour = request)  ▓▓ shared (ref>1); the selected request's "
                 "blocks are highlighted.\n")
        t.append("Step kinds: prefill (first computation), decode, recompute (tokens "
                 "computed before a preemption, computed again).\n")
        t.append("Go to (:) takes a step (120, +5, -5, 50%, end) or, for a replayed log, a "
                 "time: 10:01:02, 10:01:02.350 (the log's clock), +1.5s / -200ms from this "
                 "step's start.\n")
        with VerticalScroll(id="help"):
            help_panel = Panel(id="help-text")
            help_panel.show(t)
            yield help_panel

    def on_mount(self) -> None:
        self.query_one("#help").focus()

    def action_close(self) -> None:
        self.dismiss(None)


@dataclass
class Loaded(Message):
    error: str | None = None
    default_text: str | None = None  # a default log's answer (tui/default_screen.py)


class Progress(Message):
    pass


class SourceReady(Message):
    def __init__(self, tl: Timeline) -> None:
        super().__init__()
        self.tl = tl


class ReplayApp(EnsembleLater, App[None]):
    CSS_PATH = str(Path(__file__).with_name("app.tcss"))  # absolute: subclasses elsewhere
    TITLE = "kvreplay"
    BINDINGS = [Binding(k, a, FOOTER_LABELS.get(a, d), show=s,
                        key_display=key_display(k).split()[0])
                for k, a, d, s in KEYS]

    cursor: reactive[int] = reactive(0, init=False)

    def __init__(
        self,
        paths: Sequence[str],
        *,
        profile: str | None = None,
        year: int | None = None,
        snapshot_every: int | None = None,
        config: str | None = None,
        ensemble_later: bool = True,
    ) -> None:
        super().__init__()
        self.paths = list(paths)
        self.config = config  # engine config of request spans opened alone (open_replay)
        self.profile_name = profile
        self.year = year  # of the log's time stamps (vLLM prints none)
        self.snapshot_every = snapshot_every
        self.tl: Timeline | None = None
        self.selected: str | None = None
        self.bookmarks: set[int] = set()
        self._bookmark_order: list[int] = []
        self.diff_mode = "previous"
        self.show_before = False
        self.zoom = 0
        self.view: StepView | None = None
        self.load_error: str | None = None
        self.load_exception: BaseException | None = None
        self.loaded = False
        # the uncertainty ensemble, computed after the point replay is shown (tui/later.py):
        # None (none to compute), "computing", "done", "stopped", or the error line
        self.ensemble_later = ensemble_later
        self.ensemble: str | None = None
        self.ensemble_stage = ""
        self.default_answer: Any = None  # a default log's DefaultAnswer, once loaded
        self.export_dir = Path.cwd()  # where `e` writes its trace
        self.exported: Path | None = None

    # -- layout --------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        with Horizontal(id="status"):
            yield Label("kvreplay: opening…", id="status-label")
            yield ProgressBar(id="progress", show_eta=False)
        yield TimelineBar(id="timeline")
        with Horizontal(id="main"):
            with VerticalScroll(id="step-scroll"):
                yield Panel(id="step")
            with TabbedContent(id="tabs"):
                with TabPane("Why", id="why"):
                    with VerticalScroll():
                        yield Panel(id="why-panel")
                with TabPane("Blocks", id="blocks"):
                    with VerticalScroll():
                        yield Panel(id="block-map")
                with TabPane("Request", id="request"):
                    yield Panel(id="request-header")
                    yield OptionList(id="request-life")
                with TabPane("Diff", id="diff"):
                    with VerticalScroll():
                        yield Panel(id="diff-panel")
                with TabPane("Log", id="log"):
                    with VerticalScroll():
                        yield Panel(id="log-panel")
        yield Footer()

    def on_mount(self) -> None:
        self.load()

    # -- loading -------------------------------------------------------------------------
    @work(thread=True, exclusive=True, group="load", exit_on_error=False)
    def load(self) -> None:
        worker = get_current_worker()
        from kvreplay import progress
        from kvreplay.tui.opening import OpeningSink

        old = progress.set_sink(OpeningSink(self))  # the stages, on the status bar
        try:
            from kvreplay.sources import open_replay

            rep = open_replay(self.paths, profile=self.profile_name, year=self.year,
                              config=self.config, samples=0 if self.ensemble_later else None)
        except ReplayError as exc:
            # a default log (no request lines): its answer on a summary screen, not a refusal
            self.post_message(self._default_log(exc))
            return
        except UserError as exc:
            self.post_message(Loaded(error=str(exc)))
            return
        finally:
            progress.set_sink(old)
        tl = Timeline(rep, snapshot_every=self.snapshot_every)
        self.post_message(SourceReady(tl))
        pending = self.ensemble_later and ensemble_pending(rep)
        if pending:
            self.ensemble = "computing"
        tl.build(progress=lambda _tl: self.post_message(Progress()),
                 cancelled=lambda: worker.is_cancelled, progress_every_s=0.25)
        self.post_message(Loaded())
        if pending:
            self._ensemble_later(rep, worker)

    def _default_log(self, exc: ReplayError) -> "Loaded":
        from kvreplay import progress
        from kvreplay.tui.default_screen import default_answer
        from kvreplay.tui.opening import OpeningSink

        old = progress.set_sink(OpeningSink(self))
        try:
            got = default_answer(self.paths, profile=self.profile_name, year=self.year)
        except UserError as why:
            return Loaded(error=f"{exc} | no answer from its stats lines either: {why}")
        finally:
            progress.set_sink(old)
        if got is None:
            return Loaded(error=str(exc))
        self.default_answer = got[1]
        return Loaded(default_text=got[0])

    def on_opening(self, message: Opening) -> None:
        if self.tl is None:
            self.query_one("#status-label", Label).update(f"kvreplay: {message.text}")

    def on_source_ready(self, message: SourceReady) -> None:
        self.tl = message.tl
        self.query_one("#progress", ProgressBar).update(total=len(self.tl.request_ids) or 1)
        self._refresh_status()

    def on_progress(self, message: Progress) -> None:
        tl = self.tl
        if tl is None:
            return
        self.query_one("#progress", ProgressBar).update(progress=len(tl.finished_step))
        if self.view is None and tl.num_steps:
            self.show_step()
        else:
            self.query_one(TimelineBar).render_for(self)
        self._refresh_status()

    def on_loaded(self, message: Loaded) -> None:
        self.loaded = True
        gc.freeze()  # the loaded records live as long as the app: keep them out of GC passes
        self.query_one("#progress", ProgressBar).display = False
        if message.default_text is not None:
            from kvreplay.tui.default_screen import DefaultLogScreen

            self.query_one("#status-label", Label).update(
                "kvreplay: a default log (no request lines): its answer, no steps")
            self.push_screen(DefaultLogScreen(message.default_text))
            return
        if message.error:
            # nothing to show: leave the screen, `kvreplay tui` prints the one-line error
            self.load_error = message.error
            self.query_one("#status-label", Label).update(f"kvreplay: {message.error}")
            self.query_one("#step", Panel).show(Text(message.error, style="bold red"))
            self.exit(return_code=2)
            return
        tl = self.tl
        if tl is not None and tl.cancelled:
            self.notify(f"Stopped loading at step {tl.num_steps}; later steps are not available.",
                        severity="warning")
        if tl is not None and tl.num_steps:
            self.show_step()
        self._refresh_status()

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        # A bug while loading: leave the screen so `kvreplay tui` re-raises it (traceback
        # on a restored terminal) instead of a stuck "opening…".
        if event.worker.group == "load" and event.state == WorkerState.ERROR:
            self.load_exception = event.worker.error
            self.exit(return_code=1)
        elif event.worker.group == "export" and event.state == WorkerState.ERROR:
            self.notify(f"Export failed: {event.worker.error!r}", severity="error", timeout=8)

    def action_stop(self) -> None:
        if not self.loaded or self.ensemble == "computing":
            for w in self.workers:
                if w.group == "load":
                    w.cancel()
        if self.loaded and self.ensemble == "computing":
            self.ensemble = "stopped"
            self._refresh_status()

    # -- state ---------------------------------------------------------------------------
    def window(self) -> tuple[int, int]:
        n = self.tl.num_steps if self.tl else 0
        if self.zoom <= 0 or n == 0:
            return 0, n
        size = max(40, n >> self.zoom)
        lo = max(0, min(self.cursor - size // 2, n - size))
        return lo, min(n, lo + size)

    def move_to(self, step: int) -> None:
        tl = self.tl
        if tl is None or tl.num_steps == 0:
            return
        step = max(0, min(step, tl.num_steps - 1))
        if step != self.cursor or self.view is None:
            self.cursor = step

    def watch_cursor(self, step: int) -> None:
        self.show_step()

    def show_step(self) -> None:
        tl = self.tl
        if tl is None or tl.num_steps == 0:
            return
        step = max(0, min(self.cursor, tl.num_steps - 1))
        self.view = tl.view(step)
        self.refresh_panels()

    def refresh_panels(self) -> None:
        tl, v = self.tl, self.view
        if tl is None or v is None:
            return
        self.query_one(TimelineBar).render_for(self)
        self.query_one("#step", Panel).show(panel_text.step_text(tl, v, self.selected))
        self.query_one("#why-panel", Panel).show(panel_text.why_text(tl, v))
        state = v.before if self.show_before else v.after
        label = (f"Before step {v.step}" if self.show_before else f"After step {v.step}")
        width = self.query_one("#tabs").size.width or 80
        self.query_one("#block-map", Panel).show(
            panel_text.block_map_text(tl, state, self.selected, width - 2, label))
        self._refresh_request()
        self._refresh_diff()
        self.query_one("#log-panel", Panel).show(panel_text.log_text(tl, v.step))
        self._refresh_status()

    def _refresh_request(self) -> None:
        tl, v = self.tl, self.view
        header = self.query_one("#request-header", Panel)
        life = self.query_one("#request-life", OptionList)
        life.clear_options()
        if tl is None or self.selected is None:
            header.show(Text("No request selected: / to search, [ ] to pick one of this step, "
                             "n jumps to a preemption and selects its victim.", style="dim"))
            return
        header.show(panel_text.request_header(tl, self.selected, v))
        highlight = None
        for i, e in enumerate(tl.life.get(self.selected, [])):
            life.add_option(Option(panel_text.life_line(tl, e, v.step if v else -1), id=f"{i}:{e.step}"))
            if v is not None and e.step <= v.step:
                highlight = i
        if highlight is not None:
            life.highlighted = highlight

    def _refresh_diff(self) -> None:
        tl, v = self.tl, self.view
        panel = self.query_one("#diff-panel", Panel)
        if tl is None or v is None:
            return
        if self.diff_mode == "bookmarks":
            marks = self._bookmark_order[-2:]
            if len(marks) < 2:
                panel.show(Text("Bookmark two steps (m) to diff them; x switches back to "
                                "'vs previous step'.", style="dim"))
                return
            a, b = sorted(marks)
            d = diff_states(tl.view(a).after, tl.view(b).after)
            panel.show(panel_text.diff_text(d, f"Bookmarks {a} and {b}"))
            return
        panel.show(panel_text.diff_text(diff_states(v.before, v.after), "This step vs the previous"))

    def _refresh_status(self) -> None:
        tl = self.tl
        label = self.query_one("#status-label", Label)
        if tl is None:
            return
        src = tl.source
        state = ("loaded" if tl.done else ("stopped" if tl.cancelled else "loading (Esc stops)"))
        if self.ensemble == "computing":
            state += (" · uncertainty still computing"
                      + (f" ({self.ensemble_stage})" if self.ensemble_stage else "")
                      + "; figures are this replay's until it is in (Esc stops)")
        elif self.ensemble == "stopped":
            state += " · uncertainty stopped: figures are this one replay's"
        elif self.ensemble and self.ensemble != "done":
            state += f" · {self.ensemble}"
        sel = f" · selected {self.selected}" if self.selected else ""
        marks = f" · bookmarks {len(self.bookmarks)}" if self.bookmarks else ""
        at = panel_text.clock(tl, self.cursor) if tl.num_steps else None
        at = f" at {at}" if at else ""
        label.update(
            f"step {self.cursor}/{max(tl.num_steps - 1, 0)}{at} · "
            f"{panel_text.preemption_count(src, len(tl.preemptions))} · "
            f"{state}{sel}{marks} · confidence {src.confidence} · profile {tl.profile.name} · "
            f"{src.label}"
        )

    # -- actions -------------------------------------------------------------------------
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
                                 + [p.victim for p in v.preemptions] + v.record.get("finished", [])))
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

    @on(OptionList.OptionSelected, "#request-life")
    def life_selected(self, event: OptionList.OptionSelected) -> None:
        if event.option.id:
            self.move_to(int(event.option.id.split(":")[1]))

    def on_resize(self, event: events.Resize) -> None:
        if self.view is not None:
            self.call_after_refresh(self.refresh_panels)

    # -- command palette -----------------------------------------------------------------
    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for keys, action, desc, _show in KEYS:
            if action in ("quit", "help"):
                continue
            yield SystemCommand(f"{desc}  ({key_display(keys)})", desc,
                                lambda a=action: self.run_action(a))
