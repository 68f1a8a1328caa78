"""`kvreplay tui`: step through every scheduling decision of a replay.

The replay runs once in a worker thread (replay/timeline.py keeps compact per-step records
and engine snapshots); every panel shows a `StepView` the timeline rebuilds on demand.
The app is split by job: the keys (keys.py), loading (loading.py), following a live log
(follow.py), the key actions (actions.py), the ensemble computed later (later.py); this
module lays out the screen and fills its panels.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Sequence

from rich.text import Text
from textual import events, on
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Footer, Label, OptionList, ProgressBar, TabbedContent, TabPane
from textual.widgets.option_list import Option

from kvreplay.replay.timeline import StepView, Timeline, diff_states
from kvreplay.tui import panel_text
from kvreplay.tui.actions import Actions
from kvreplay.tui.check_text import ScrapeCheck, check_text
from kvreplay.tui.goto_search import parse_goto, parse_step  # noqa: F401  (tests import them here)
from kvreplay.tui.keys import FOOTER_LABELS, KEYS, PAGE, TABS, key_display  # noqa: F401
from kvreplay.tui.follow import Following
from kvreplay.tui.later import EnsembleLater
from kvreplay.tui.loading import Loaded, Loading, Progress, SourceReady  # noqa: F401
from kvreplay.tui.widgets import Panel, TimelineBar


class ReplayApp(Loading, Following, Actions, EnsembleLater, App[None]):
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
        follow: bool = False,
    ) -> None:
        super().__init__()
        self.paths = list(paths)
        # Prometheus scrapes of the same server beside its log (as `kvreplay replay LOG
        # metrics.prom`): the log is replayed, the scrapes checked against it (Check tab)
        from kvreplay.audit.prom import looks_like_prometheus

        self.metric_paths = [p for p in self.paths if p != "-" and looks_like_prometheus(p)]
        self.log_paths = [p for p in self.paths if p not in self.metric_paths]
        self.scrapes: ScrapeCheck | None = None  # the scrapes against the replay shown
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
        # --follow: the one log followed live (tui/follow.py), its session once started,
        # the server run shown, and whether the cursor stays at the newest step
        self.follow_path: str | None = self.paths[0] if follow else None
        self.session: Any = None
        self.server_run = 1
        self.tailing = follow
        self.follow_note: str | None = None

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
                with TabPane("Check", id="check"):
                    with VerticalScroll():
                        yield Panel(id="check-panel")
        yield Footer()

    def on_mount(self) -> None:
        self.load()

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
        if self.follow_path is not None:  # at the newest step: stay there as the log grows
            self.tailing = step == tl.num_steps - 1
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
        self.query_one("#check-panel", Panel).show(check_text(tl, v.step, self.scrapes))
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
        if self.follow_path is not None:
            state = self.follow_status()
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
