"""What the TUI computes after the steps are shown: the uncertainty ensemble of a log whose
arrivals the stats lines only anchor (inference/ensemble.py). The point replay
(`--samples 0`) is opened first and stepped through at once; the same log's full replay
(the ensemble, as `kvreplay replay` computes it: same seed, same figures) comes in later.

Invariant: the full replay's run is the point replay's run unless the ensemble found a
member that fits the stats lines far better (driver.replay_log shows that one instead);
`same_run` tells which, and the app adopts the ensemble onto the shown timeline or swaps
in the other run's timeline.
"""

from __future__ import annotations

from typing import Any

from textual.message import Message

from kvreplay.errors import UserError
from kvreplay.inference.ensemble import MAX_REQUESTS
from kvreplay.replay.timeline import Timeline
from kvreplay.tui.opening import Computing


def ensemble_pending(rep: Any) -> bool:
    """The point replay of a log whose full replay would add an uncertainty ensemble
    (stats lines anchor the arrivals, not Iteration lines; at most MAX_REQUESTS requests)."""
    facts = getattr(rep, "facts", None)
    if rep.kind != "log" or rep.uncertainty is not None or facts is None:
        return False
    if not facts.stats or not facts.requests or len(facts.requests) > MAX_REQUESTS:
        return False
    by_iterations = bool(facts.iterations) and not any(
        str(n).startswith("Iteration lines not used") for n in facts.notes)
    return not by_iterations


def same_run(a: Any, b: Any) -> bool:
    """The two replays ran the same steps: same arrivals, preemptions and step records
    (the shown timeline re-runs and checks its steps against the replay's)."""
    return (len(a.steps) == len(b.steps)
            and list(a.inputs.arrival_steps) == list(b.inputs.arrival_steps)
            and [(p.step, p.victim) for p in a.preemptions] ==
            [(p.step, p.victim) for p in b.preemptions]
            and all(x == y for x, y in zip(a.steps, b.steps)))


def adopt(tl: Any, full: Any) -> None:
    """Show `full` (the same run with its ensemble) through the built timeline `tl`: its
    records (with probabilities), uncertainty, estimate and notes. Call on the UI thread."""
    with tl.lock:
        tl.replay = full
        tl.preemptions = full.preemptions
        tl._cache.clear()  # its views hold the point replay's records


class EnsembleReady(Message):
    """The full replay (with its uncertainty ensemble); `timeline`: its own, built, when
    the ensemble showed another run than the one on screen (else None: adopt it)."""

    def __init__(self, replay: Any, timeline: Timeline | None, error: str | None = None) -> None:
        super().__init__()
        self.replay, self.timeline, self.error = replay, timeline, error


class EnsembleLater:
    """ReplayApp's part that computes the full replay after the steps are shown: called in
    the load worker (`_ensemble_later`), its messages handled on the UI thread. The app
    holds `ensemble` (None, "computing", "done", "stopped" or the error line) and
    `ensemble_stage` (the stage shown on the status line)."""

    def _ensemble_later(self, rep: Any, worker: Any) -> None:
        """In the load worker, after the steps are in: the full replay, posted to the app."""
        from kvreplay import progress
        from kvreplay.tui.opening import OpeningSink

        if worker.is_cancelled:
            return
        old = progress.set_sink(OpeningSink(self, later=True))
        try:
            full = self.compute_full_replay()
        except UserError as exc:
            self.post_message(EnsembleReady(None, None, error=str(exc)))
            return
        finally:
            progress.set_sink(old)
        if worker.is_cancelled:
            return
        tl = None
        if not same_run(rep, full):
            tl = Timeline(full, snapshot_every=self.snapshot_every)
            tl.build(cancelled=lambda: worker.is_cancelled)
            if self.metric_paths:  # the scrapes against the run now shown
                from kvreplay.tui.check_text import scrape_check

                self.scrapes = scrape_check(full, self.metric_paths)
        self.post_message(EnsembleReady(full, tl))

    def compute_full_replay(self) -> Any:
        """The replay `kvreplay replay` gives (its ensemble, default samples and seed)."""
        from kvreplay.sources import open_replay

        return open_replay(self.log_paths, profile=self.profile_name, year=self.year,
                           config=self.config)

    def on_computing(self, message: Computing) -> None:
        if self.ensemble == "computing":
            self.ensemble_stage = message.text
            self._refresh_status()

    def on_ensemble_ready(self, message: EnsembleReady) -> None:
        if self.ensemble != "computing":
            return  # stopped meanwhile
        if message.error or message.replay is None:
            self.ensemble = f"uncertainty not computed: {message.error}"
            self._refresh_status()
            return
        if message.timeline is not None:
            # the ensemble found a run that fits the stats lines far better: it is shown
            self.tl = message.timeline
            self.cursor = min(self.cursor, max(self.tl.num_steps - 1, 0))
            self.notify("The uncertainty ensemble found a replay that agrees with the stats "
                        "lines far better: it is shown now.", severity="warning", timeout=8)
        elif self.tl is not None:
            adopt(self.tl, message.replay)
        self.ensemble = "done"
        self.view = None
        self.show_step()
        self._refresh_status()
