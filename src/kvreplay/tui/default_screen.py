"""A default log (no request lines) in the TUI: no step or request to walk through, so
instead of refusing, a summary screen of what the log's answer gives
(inference/default_log.py, the same text `kvreplay replay` prints): the preemption count,
recomputed tokens and recompute ratio as 90% intervals (the count exact when a scraped
counter bounds it), the storm windows, and the flags that would make it exact. No victim
is named."""

from __future__ import annotations

from typing import Any, Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static


def default_answer(paths: Sequence[str], *, profile: str | None, year: int | None) -> Any:
    """(report text, DefaultAnswer) of a default log, or None when `paths` are not one
    (the caller keeps its error). Prometheus files among `paths` are the same server's
    scrapes. Raises UserError when the log cannot be answered."""
    from kvreplay.audit import default_report
    from kvreplay.audit.prom import looks_like_prometheus
    from kvreplay.sources import read_log

    metric_paths = [p for p in paths if p != "-" and looks_like_prometheus(p)]
    logs = [p for p in paths if p not in metric_paths]
    log = read_log(logs, year=year)
    if not default_report.is_default_log(log.facts):
        return None
    ans, how = default_report.answer_for(log.facts, metric_paths, profile=profile)
    return default_report.report_text(", ".join(logs), log.facts, ans, how), ans


class DefaultLogScreen(Screen[None]):
    """The default log's answer, as text; q quits."""

    BINDINGS = [Binding("q,escape", "app.quit", "Quit")]

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def compose(self) -> ComposeResult:
        t = Text()
        t.append("A default log (no request lines): no step or request to walk through. "
                 "What its stats lines allow, as 90% intervals over the workloads they are "
                 "consistent with:\n\n", style="bold yellow")
        t.append(self.text)
        with VerticalScroll(id="default-scroll"):
            panel = Static(t, id="default-summary")
            panel.plain = t.plain  # type: ignore[attr-defined]  (for tests)
            yield panel
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#default-scroll").focus()
