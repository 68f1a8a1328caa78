"""The TUI's keys: one list (`KEYS`) the bindings, the footer, the help screen and the
command palette are all made from, so every key appears in each."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen

from kvreplay.tui.widgets import Panel

PAGE = 100
TABS = ("why", "blocks", "request", "diff", "log", "check")

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
    ("6", "tab('check')", "Check: the replay against the stats lines and scrapes", False),
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


