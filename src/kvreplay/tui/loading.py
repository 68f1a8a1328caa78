"""The TUI's loading job: the replay opened in a worker thread, its steps loaded into the
timeline while the first ones are shown, and what ends it (a default log's summary screen,
a one-line error, a bug re-raised after the screen is restored, Esc)."""

from __future__ import annotations

import gc
from dataclasses import dataclass

from rich.text import Text
from textual import work
from textual.message import Message
from textual.widgets import Label, ProgressBar
from textual.worker import Worker, WorkerState, get_current_worker

from kvreplay.errors import ReplayError, UserError
from kvreplay.replay.timeline import Timeline
from kvreplay.tui.later import ensemble_pending
from kvreplay.tui.opening import Opening
from kvreplay.tui.widgets import Panel, TimelineBar


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



class Loading:
    """ReplayApp's loading part (a mixin: its handlers run on the UI thread, `load` in the
    load worker)."""

    @work(thread=True, exclusive=True, group="load", exit_on_error=False)
    def load(self) -> None:
        worker = get_current_worker()
        if self.follow_path is not None:  # --follow: tui/follow.py
            self._follow(worker)
            return
        from kvreplay import progress
        from kvreplay.tui.opening import OpeningSink

        old = progress.set_sink(OpeningSink(self))  # the stages, on the status bar
        try:
            from kvreplay.sources import open_replay

            if self.metric_paths and not self.log_paths:
                raise UserError("Prometheus scrapes are read beside their server's log: "
                                "give the log too")
            rep = open_replay(self.log_paths, profile=self.profile_name, year=self.year,
                              config=self.config, samples=0 if self.ensemble_later else None)
            if self.metric_paths:  # the same server's counters: each scrape window checked
                from kvreplay.tui.check_text import scrape_check

                self.scrapes = scrape_check(rep, self.metric_paths)
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
