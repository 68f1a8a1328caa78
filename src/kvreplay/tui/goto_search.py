"""The go-to and search prompts of `kvreplay tui` (modal screens), and what a go-to answer
means: a step (`120`, `+5`, `50%`, `end`) or, for a replayed log, a wall-clock time."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label, OptionList
from textual.widgets.option_list import Option

from kvreplay.replay.timeline import Timeline
from kvreplay.tui import panel_text


class GotoScreen(ModalScreen[str | None]):
    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, last: int, times: str | None = None) -> None:
        super().__init__()
        self.last = last
        self.times = times  # "10:00:59.802 – 10:01:04.485" for a log, None for a workload

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Label(f"Go to a step: 0..{self.last}, +N / -N relative, 50%, end", id="goto-help")
            if self.times:
                yield Label(f"or a time: 10:01:02, 10:01:02.350, +1.5s / -200ms relative"
                            f"\n(log times {self.times})", id="goto-times")
            else:
                yield Label("This replay has no wall-clock times (not from a log): "
                            "steps only.", id="goto-times")
            yield Input(placeholder="step or time" if self.times else "step", id="goto-input")

    @on(Input.Submitted)
    def submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value)

    def action_cancel(self) -> None:
        self.dismiss(None)


class SearchScreen(ModalScreen[str | None]):
    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, tl: Timeline) -> None:
        super().__init__()
        self.tl = tl

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Label("Search a request id (Enter: select, ↓: pick from the list)")
            yield Input(placeholder="request id", id="search-input")
            yield OptionList(id="search-results")

    @on(Input.Changed)
    def changed(self, event: Input.Changed) -> None:
        results = self.query_one("#search-results", OptionList)
        results.clear_options()
        for rid in self.tl.find_requests(event.value):
            results.add_option(Option(rid, id=rid))

    @on(Input.Submitted)
    def submitted(self, event: Input.Submitted) -> None:
        found = self.tl.find_requests(event.value, limit=1)
        self.dismiss(found[0] if found else event.value)

    @on(OptionList.OptionSelected)
    def picked(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)

    def on_key(self, event: events.Key) -> None:
        if event.key == "down" and self.focused is self.query_one(Input):
            self.query_one(OptionList).focus()
            event.stop()

    def action_cancel(self) -> None:
        self.dismiss(None)


def parse_step(value: str, cursor: int, num_steps: int) -> int | None:
    v = value.strip().lower()
    if not v:
        return None
    try:
        if v in ("end", "$", "last"):
            return num_steps - 1
        if v.endswith("%"):
            return int(float(v[:-1]) / 100 * (num_steps - 1))
        if v[0] in "+-":
            return cursor + int(v)
        return int(v.replace("_", "").replace(",", ""))
    except ValueError:
        return None


_REL_TIME = re.compile(r"([+-])\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|sec|secs|m|min|h)")
_ABS_TIME = re.compile(
    r"(?:(?:(\d{4})-)?(\d{1,2})-(\d{1,2})[ T]+)?(\d{1,2}):(\d{2})(?::(\d{2})(?:[.,](\d{1,6}))?)?")
_UNIT_S = {"ms": 1e-3, "s": 1.0, "sec": 1.0, "secs": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def parse_goto(value: str, cursor: int, tl: Timeline) -> tuple[int | None, str | None]:
    """What the go-to prompt means: (step, note) or (None, why not).

    A step (`120`, `+5`, `-5`, `50%`, `end`) or, when the replay came from a log, a time:
    `10:01:02`, `10:01:02.350`, `05-07 10:01:02`, or `+1.5s` / `-200ms` from the current
    step's start. A time goes to the step running then (the last one started by then)."""
    v = value.strip().lower()
    rel = _REL_TIME.fullmatch(v)
    absolute = None if rel else _ABS_TIME.fullmatch(v)
    if rel is None and absolute is None:
        step = parse_step(value, cursor, tl.num_steps)
        return step, None
    if not tl.has_times:
        return None, (f"{value.strip()!r} is a time, but this replay has no wall-clock times "
                      f"({tl.source.label}): go to a step instead.")
    times = tl.step_times
    last = min(len(times), tl.num_steps) - 1
    if last < 0:
        return None, "No step loaded yet."
    if rel is not None:
        here = times[min(max(cursor, 0), last)]
        t = here + (1 if rel[1] == "+" else -1) * float(rel[2]) * _UNIT_S[rel[3]]
    else:
        t = _resolve_clock(absolute, times[0], times[last], times[min(max(cursor, 0), last)])
        if t is None:
            return None, f"Not a time: {value.strip()!r}"
    step = tl.step_at_time(t)
    started = panel_text.clock_of(tl, times[step])
    if t < times[0]:
        return step, f"{panel_text.clock_of(tl, t)} is before the first step: step 0 (at {started})"
    if step == last and not tl.done and len(times) > tl.num_steps and t >= times[last + 1]:
        return step, (f"{panel_text.clock_of(tl, t)}: not loaded yet; the last loaded step is "
                      f"{step} (at {started})")
    if step == last and t > times[last] and len(times) - 1 == last:
        return step, (f"{panel_text.clock_of(tl, t)} is after the last step started: step {step} "
                      f"(at {started})")
    return step, f"{panel_text.clock_of(tl, t)} → step {step} (started at {started})"


def _resolve_clock(m: re.Match, first: float, last: float, here: float) -> float | None:
    """Epoch seconds of a typed log time. Without a date: the day that puts it inside the
    run (nearest the current step if several do), else the one closest to the run."""
    year, month, day, hh, mm, ss, frac = m.groups()
    try:
        clock = timedelta(hours=int(hh), minutes=int(mm), seconds=int(ss or 0),
                          microseconds=int((frac or "0").ljust(6, "0")))
        if int(hh) > 23 or int(mm) > 59 or int(ss or 0) > 59:
            return None
        utc = timezone.utc
        d0 = datetime.fromtimestamp(first, utc)
        if month is not None:
            days = [datetime(int(year) if year else d0.year, int(month), int(day), tzinfo=utc)]
        else:
            start = datetime(d0.year, d0.month, d0.day, tzinfo=utc)
            n_days = int((last - start.timestamp()) // 86400) + 1
            days = [start + timedelta(days=k) for k in range(-1, n_days + 1)]
    except ValueError:
        return None
    cands = [(d + clock).timestamp() for d in days]
    inside = [c for c in cands if first <= c <= last]
    if inside:
        return min(inside, key=lambda c: abs(c - here))
    return min(cands, key=lambda c: first - c if c < first else c - last)
