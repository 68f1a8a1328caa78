"""One watched log, replayed as it grows: each preemption given once, when decided.

A server run is the lines from one startup banner to the next (a restart starts a new
replay: its steps count from 0 again). The run's lines are replayed by the same pipeline
as `kvreplay replay` (sources.open_replay on the lines read so far), so a finished log
gives the offline replay's rows. What is new here is *when* a row is given and *how often*
the lines are replayed:

* decided: with Iteration lines (or the step-trace plugin's lines) a preemption at step s is
  given once the line of step s + `settle` has arrived (a line is an engine step; vLLM's
  Iteration(N) numbers only steps that scheduled a token, so the replay's step of line N is
  N or later: s <= N_last - settle is conservative). From stats lines only, the arrivals
  are placed against the whole log and a prefix cannot pin single rows: what is given is
  each stats interval's count with its 90% interval, once the next interval's line has
  arrived. Everything is decided at the end of the input.
* replayed: a replay costs about the lines read so far (W). One is started when a deciding
  line arrived since the last one and either the run grew by GROWTH x W lines since
  (total cost a geometric sum: O(W / GROWTH) line-replays per run, a bounded cost per line),
  or the last replay took at most a DUTY share of the time since it began (the rows come
  about one replay after their line, and these replays take at most DUTY of a core).

* windowed: with prompts logged, the lines before a decided step are dropped, and the
  replay from there equals the whole run's (steps and Iteration numbers put back by
  offsets; the window's Iteration(0) is the line of the step after it that scheduled a
  token). At the last quiet point the lines have decided (no request running or waiting;
  no prefix cache, whose blocks would outlive it) the window starts with an empty engine
  (`_cut`); on a server never quiet, once the window is over WINDOW_LINES lines, at the
  step of the line CARRY_BACK lines before the last decided one, with the engine's state
  carried into it (`_carry`: inference/start_state.py; its cached blocks too). Estimated
  prompts (the estimate is the whole run's) keep the whole run.

Memory: the window's lines (the startup lines, the live requests' lines and those since
the cut), the carried state, the rows given since the cut, nothing of earlier runs; no
step record outlives its replay: bounded with prompts logged (bench/bench_watch_memory.py),
the lines a replay takes at once bounded by the follower's read (live/follow.py CHUNK).
"""

from __future__ import annotations

import io
import time
from typing import Any, Callable, Iterable

import msgspec

from kvreplay.errors import ReplayError, UserError
from kvreplay.live.carry import (iteration_n as _iteration_n, last_step as _last_step,
                                 renumber as _renumber, token_step as _token_step)

GROWTH = 0.25  # replay when the run grew by this share of its lines since the last replay
DUTY = 0.5  # ... or replays took at most this share of the wall time since the last began
SETTLE = 1  # lines after a preemption's step before it is given (Iteration / step trace)
WINDOWS = True  # cut the window at quiet points (Session._cut)
CARRY = True  # ... and, on a server never quiet, at a decided step with its state (_carry)
# a window of more lines than this (after its startup lines) is cut at a decided step, the
# engine's state carried into the next: the line CARRY_BACK lines before the last the
# lines decide (a later line may still send the Iteration-line search back over the
# last choices, iteration_search.HORIZON; never this far with every prompt logged)
WINDOW_LINES = 2000
CARRY_BACK = 256
CHECK_LINES = 2000  # lines read before input with no vLLM line is refused


class PreemptionRow(msgspec.Struct, kw_only=True, omit_defaults=False):
    """A decided preemption, in the words of the replay report's rows."""

    event: str = "preemption"  # "withdrawn": a row given earlier that later lines undid
    run: int  # server run within the watched log (1: the first banner's)
    step: int
    time: float | None
    victim: str
    trigger: str | None
    rule: str
    self_preemption: bool
    tokens_lost: int
    confidence: str  # exact | exact-by-log | consistent | inferred
    probability: float | None = None


class IntervalRow(msgspec.Struct, kw_only=True):
    """A stats interval's preemptions (stats lines only): the ensemble's median and 90%."""

    event: str = "interval"  # "withdrawn": as for a preemption
    run: int
    start: float
    end: float
    median: int
    low: int
    high: int
    confidence: str = "interval"


class NoticeRow(msgspec.Struct, kw_only=True):
    """What the rows after it are: how they are decided (`mode`), or a new server run."""

    event: str  # "mode" | "restart"
    run: int
    text: str


Row = PreemptionRow | IntervalRow | NoticeRow


def _deciding(line: str) -> bool:
    """A line that can decide a row: an Iteration line, a step-trace step, a stats line."""
    return ("Iteration(" in line or "kvtrace step" in line or "throughput" in line)


def _restart_at(lines: list[str], label: str) -> int | None:
    """Index of the first line of a startup banner (version / args) in `lines`, if any."""
    from kvreplay import events as ev
    from kvreplay.parsers import parse_lines

    if not any("version" in s or "args" in s for s in lines):
        return None
    for e in parse_lines(lines, file=label):
        if isinstance(e, ev.EngineConfig) and e.origin in ("banner", "args", "non_default_args"):
            return e.line - 1
    return None


class Session:
    """Feed lines, take rows. `replay_opts`: open_replay's keyword arguments (profile,
    vllm_version, samples, seed, step_time)."""

    def __init__(self, label: str, *, mtime: float | None = None, year: int | None = None,
                 settle: int = SETTLE, replay_opts: dict[str, Any] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.label, self.mtime, self.year, self.settle = label, mtime, year, settle
        self.opts = dict(replay_opts or {})
        self.clock = clock
        self.run = 1
        self._new_run()
        self.replays = 0
        self.replay_s = 0.0
        self.failed: list[str] = []  # replays of a prefix that failed (the CLI says so once)

    def _new_run(self) -> None:
        self.lines: list[str] = []
        self.served = False  # a request or step line seen in this run (a banner then restarts)
        self.pending = False  # a deciding line since the last replay
        self.at_replay = 0  # lines at the last replay
        self.replay_end = 0.0
        self.last_cost = 0.0
        self.given: dict[tuple, Any] = {}  # key -> the row given
        self.mode: str | None = None
        self.checked = False
        # the window: the run's startup lines (header_len of them) and its lines since the
        # last quiet point; steps and Iteration numbers before it are offsets
        self.header_len: int | None = None
        self.step_offset = 0
        self.n_offset = 0
        self.line0_step: int | None = None  # the whole run's step of the window's first line
        self.cuts = 0
        self.start: Any = None  # inference.start_state.StartState the window starts from
        self.exact = False  # the last replay's prompts were all logged (a state may carry)

    # -- input ---------------------------------------------------------------------
    def feed(self, lines: Iterable[str]) -> list[Row]:
        """Take new lines; the rows a restart banner among them decides (the old run's
        last rows and the restart notice)."""
        lines = list(lines)
        if not lines:
            return []
        out: list[Row] = []
        while lines:
            cut = _restart_at(lines, self.label) if self.served else None
            if cut is None:
                self._take(lines)
                break
            self._take(lines[:cut])
            out += self.finish()
            first = lines[cut]
            self.run += 1
            self._new_run()
            out.append(NoticeRow(event="restart", run=self.run, text=(
                f"vLLM restarted (a new startup banner{_at(first)}): a new replay starts, "
                "its steps count from 0")))
            lines = lines[cut:]  # (the new run has served nothing: taken whole)
        return out

    def _take(self, lines: list[str]) -> None:
        for s in lines:
            if self.n_offset and "Iteration(" in s:
                s = _renumber(s, self.n_offset)
            self.lines.append(s)
            if _deciding(s):
                self.pending = True
                self.served = True
            elif "request" in s:
                self.served = True

    # -- replays ---------------------------------------------------------------------
    def due(self) -> bool:
        """Whether a replay now is worth its cost (see the module docstring)."""
        if not self.pending:
            return False
        grown = len(self.lines) - self.at_replay
        if grown >= GROWTH * max(self.at_replay, 1):
            return True
        # replays (this one included) take at most DUTY of the time since the last began
        return self.last_cost <= DUTY * (self.clock() - self.replay_end + self.last_cost)

    def update(self) -> list[Row]:
        """Replay the run's lines now; the rows they decide that were not given yet."""
        return self._rows(final=False)

    def finish(self, end: bool = False) -> list[Row]:
        """The end of a run: every row its lines give, not given yet. `end`: the end of
        the input, where lines that are no vLLM log, or too thin to replay, are refused
        (UserError) as `kvreplay replay` refuses them."""
        if end and not self.checked and self.lines:
            from kvreplay.parsers import parse_lines
            from kvreplay.sources import check_vllm_log

            check_vllm_log(list(parse_lines(self.lines[:CHECK_LINES], file=self.label)),
                           [self.label])
        if not self.lines or not self.served:
            return []
        return self._rows(final=True, strict=end)

    def _rows(self, final: bool, strict: bool = False) -> list[Row]:
        t0 = self.clock()
        self.pending = False
        self.at_replay = len(self.lines)
        try:
            rep = self._replay(strict, carry=not final)
        finally:
            self.replay_end = self.clock()
            self.last_cost = self.replay_end - t0
            self.replays += 1
            self.replay_s += self.last_cost
        if rep is None:
            return []
        out: list[Row] = []
        mode = _mode(rep)
        if mode == "intervals" and not final and (self.events_last >= 0 or not self.stats_seen):
            # the Iteration lines have not come yet (the first requests come before them),
            # or no stats line has: nothing is decided by the lines so far
            return out
        if mode != self.mode:
            self.mode = mode
            out.append(NoticeRow(event="mode", run=self.run, text=_mode_text(rep, mode)))
        if mode == "intervals":
            out += self._intervals(rep, final)
        else:
            if self.line0_step is not None:
                first = _token_step(rep.steps, 0)
                self.step_offset = self.line0_step - (first or 0)
            out += self._preemptions(rep, final)
            if mode == "iterations" and not final and WINDOWS:
                if not self._cut(rep) and CARRY and rep.carried is not None:
                    self._carry(rep)
        return out

    def _cut(self, rep: Any) -> bool:
        """Start the window at the last quiet point the lines have decided: a step after
        which no request was running or waiting (all rows before it are given). From there
        the replay is the same as one of the whole run, when nothing outlives the quiet
        (no prefix cache: its blocks would; prompts logged, not estimated from the whole
        run) and each window numbers its steps and its
        Iteration lines from 0 again (the offsets put them back)."""
        if (rep.workload.config.enable_prefix_caching or rep.info.prompts != "exact"
                or self.events_last < 0):
            return False  # (estimated prompts: the estimate is the whole run's, not a window's)
        horizon = self.events_last - self.settle
        steps = rep.steps
        quiet = None
        for rec in steps[:max(0, min(len(steps) - 1, horizon))]:
            if rec.num_running == 0 and rec.num_waiting == 0 and not rec.idle:
                quiet = rec.step
        if quiet is None:
            return False
        arrivals = rep.inputs.arrival_steps
        nxt = [i for i, a in enumerate(arrivals) if a > quiet]
        k = len(self.start.ids) if self.start is not None else 0  # (carried in: done by then)
        if not nxt or any(a < 0 for a in arrivals[k:nxt[0]]):
            return False
        first = rep.facts.requests[nxt[0]]
        if not self._header(rep):  # the startup lines: up to the first request's first line
            return False
        # from the line after the last Iteration line before it (between them the engine
        # was idle: the old requests' access lines, stats lines, this one's JSON body)
        cut = first.line - 1  # (the window's lines, 0-based)
        while cut > self.header_len and "Iteration(" not in self.lines[cut - 1]:
            cut -= 1
        if cut <= self.header_len:
            return False
        # the window's first line: that of the first step after the quiet point that
        # scheduled a token (LineCheck's numbering); lines of steps up to the quiet point
        # may come after the new requests' lines (0.26+ writes a step's line as its output
        # arrives, after the requests logged meanwhile): they are the old window's
        at = next((rec.step for rec in steps if rec.step > quiet
                   and rec.num_scheduled_tokens > 0), None)
        if at is None:
            return False
        n0 = sum(1 for rec in steps if rec.step < at and rec.num_scheduled_tokens > 0)
        if any(_iteration_n(x) >= n0 for x in self.lines[self.header_len:cut]
               if "Iteration(" in x):
            return False
        body = [x for x in self.lines[cut:] if "Iteration(" not in x or _iteration_n(x) >= n0]
        if not any("Iteration(" in x for x in body):
            return False
        self.lines = self.lines[:self.header_len] + [_renumber(x, n0) if "Iteration(" in x
                                                     else x for x in body]
        self.n_offset += n0
        # the whole run's step of the new window's Iteration(0) line: steps with no line
        # (idle, or a step that scheduled nothing: one may come between the quiet point
        # and the next request) are not the window's, so the offset is taken from the
        # lines, and each replay of the window puts its own first token step there
        self.step_offset += at
        self.line0_step = self.step_offset
        self.start = None  # (an empty engine: none carried)
        self.at_replay = len(self.lines)
        # every row before the quiet point is given for good; those after it stay open
        self.given = {k: r for k, r in self.given.items()
                      if not isinstance(r, PreemptionRow) or r.step >= self.step_offset}
        self.cuts += 1
        return True

    def _carry(self, rep: Any) -> None:
        """On a server never quiet: start the window after a decided step (`rep.carried`,
        the state the replay carried out after the step of the line CARRY_BACK lines before
        the last decided one), with the engine's state carried into it. The window keeps
        the startup lines, the lines of the requests the engine holds or has not had yet
        (live/carry.py), and the lines after that step's Iteration line, renumbered from 0;
        its replays start from the carried state (inference/start_state.py), and steps and
        Iteration numbers before it are offsets, as after a quiet point."""
        from kvreplay.live.carry import carried_ids, kept_lines

        st = rep.carried
        if rep.info.prompts != "exact" or self.events_last < 0:
            return
        if st.step > self.events_last - self.settle or not self._header(rep):
            return  # (a row at or before the step not given yet)
        h = self.header_len
        assert h is not None
        at = next((i for i in range(len(self.lines) - 1, h - 1, -1)
                   if "Iteration(" in self.lines[i] and _iteration_n(self.lines[i]) == st.n), None)
        if at is None:
            return
        tail = self.lines[at + 1:]
        if any(_iteration_n(x) <= st.n for x in tail if "Iteration(" in x):
            return
        old = self.lines[h:at + 1]
        inside, later = carried_ids(rep, len(self.start.ids) if self.start is not None else 0)
        keep, received = kept_lines(old, inside | later, self.label)
        if not inside <= received:
            return  # a request in the engine logged after the step's line (before 0.26)
        n0 = st.n + 1
        self.lines = self.lines[:h] + [old[i] for i in keep] + [
            _renumber(x, n0) if "Iteration(" in x else x for x in tail]
        self.n_offset += n0
        self.step_offset += st.step + 1
        self.line0_step = None
        self.start = st
        self.at_replay = len(self.lines)
        self.given = {k: r for k, r in self.given.items()
                      if not isinstance(r, PreemptionRow) or r.step >= self.step_offset}
        self.cuts += 1

    def _header(self, rep: Any) -> bool:
        """The run's startup lines (header_len of them): up to its first request's first
        line. False if they cannot be told apart."""
        if self.header_len is None:
            self.header_len = next((i for i, x in enumerate(self.lines) if any(
                w in x for w in ("Received request", "JSON body", "Added request"))), None)
            if self.header_len is None or self.header_len > rep.facts.requests[0].line - 1:
                self.header_len = None
                return False
        return True

    def _replay(self, strict: bool = False, carry: bool = False) -> Any:
        from kvreplay import events as ev
        from kvreplay.parsers import detect_version, merge_config
        from kvreplay.parsers.timestamps import _clock_for
        from kvreplay.parsers.pipeline import parse_stream
        from kvreplay.inference.start_state import Window
        from kvreplay.sources import LogInput, check_vllm_log, open_replay

        text = "".join(self.lines)
        if not text.endswith("\n"):
            text += "\n"
        events = list(parse_stream(io.StringIO(text, newline="\n"), self.label,
                                   _clock_for(self.year, self.mtime)))
        if not self.checked:
            if len(self.lines) < CHECK_LINES and all(
                    isinstance(e, (ev.Unparsed, ev.Noise)) for e in events):
                return None  # nothing of vLLM's yet: wait for more before refusing
            check_vllm_log(events, [self.label])
            self.checked = True
        log = LogInput([self.label], events, detect_version(events, self.opts.get("vllm_version")),
                       merge_config(events))
        self.events_last = _last_step(events)
        self.stats_seen = any(isinstance(e, ev.Stats) for e in events)
        window = None
        if CARRY and WINDOWS and (self.start is not None or carry and self.exact):
            n = self.events_last - self.settle - CARRY_BACK
            big = len(self.lines) - (self.header_len or 0) > WINDOW_LINES
            window = Window(self.start, n if carry and big and n >= 0 else None)
        try:  # ("-": no file to look at beside the lines: no span or KV-event files here)
            rep = open_replay(["-"], log=log, window=window, **self.opts)
            self.exact = rep.kind == "log" and rep.info.prompts == "exact"
            return rep
        except (ReplayError, UserError):
            if strict:
                raise
            return None  # too thin yet (no request, no config): more lines will tell
        except Exception as exc:  # noqa: BLE001  (a prefix the pipeline cannot take yet)
            if strict:
                raise
            self.failed.append(f"{type(exc).__name__}: {exc}")
            return None

    def check_input(self) -> None:
        """Refuse input that has shown no vLLM line in CHECK_LINES lines (UserError)."""
        if not self.checked and len(self.lines) >= CHECK_LINES:
            from kvreplay.parsers import parse_lines
            from kvreplay.sources import check_vllm_log

            check_vllm_log(list(parse_lines(self.lines[:CHECK_LINES], file=self.label)),
                           [self.label])
            self.checked = True

    def _preemptions(self, rep: Any, final: bool) -> list[Row]:
        horizon = (1 << 62) if final else self.events_last - self.settle
        off = self.step_offset
        rows = [preemption_row(p, self.run, off) for p in rep.preemptions if p.step <= horizon]
        return self._reconcile(rows, lambda r: r.step <= horizon + off)

    def _intervals(self, rep: Any, final: bool) -> list[Row]:
        unc = rep.uncertainty.to_json() if rep.uncertainty is not None else None
        if unc is None:  # no ensemble (a very large log): its rows, as inferred
            return self._preemptions(rep, final)
        wins = unc["windows"] if final else unc["windows"][:-1]  # the last may still grow
        rows = [IntervalRow(run=self.run, start=w["start"], end=w["end"], median=w["median"],
                            low=w["low"], high=w["high"]) for w in wins if w["high"] > 0]
        until = wins[-1]["start"] if wins else float("-inf")
        return self._reconcile(rows, lambda r: isinstance(r, IntervalRow) and r.start <= until)

    def _reconcile(self, rows: list[Any], covered: Callable[[Any], bool]) -> list[Row]:
        """The rows not given yet, and a withdrawal of each given row of the decided part
        that this replay no longer has (an estimated prompt corrected by a later line)."""
        keys = {_key(r): r for r in rows}
        out: list[Row] = []
        for k, r in list(self.given.items()):
            if k not in keys and covered(r):
                del self.given[k]
                out.append(msgspec.structs.replace(r, event="withdrawn"))
        for k, r in keys.items():
            if k not in self.given:
                self.given[k] = r
                out.append(r)
        return out


def _key(r: Any) -> tuple:
    """What a row says in words (not its probability: a figure, revised by every replay)."""
    if isinstance(r, IntervalRow):
        return ("interval", r.start, r.end, r.median, r.low, r.high)
    return ("preemption", r.step, r.victim, r.trigger, r.tokens_lost, r.confidence, r.rule)


def preemption_row(p: Any, run: int, offset: int = 0) -> PreemptionRow:
    """A replay's PreemptionRecord as a watch row."""
    rule = (p.victim_rule or "").split(":")[0] + (" self" if p.self_preemption and
                                                   p.victim_rule != "self" else "")
    return PreemptionRow(run=run, step=p.step + offset, time=p.time, victim=str(p.victim),
                         trigger=p.trigger, rule=rule, self_preemption=p.self_preemption,
                         tokens_lost=p.computed_tokens_lost, confidence=p.confidence,
                         probability=p.probability)


def _mode(rep: Any) -> str:
    if rep.kind == "step-trace":
        return "step-trace"
    if rep.info.placement == "iteration lines":
        return "iterations"
    return "intervals"


def _mode_text(rep: Any, mode: str) -> str:
    if mode == "step-trace":
        return ("kvreplay's step-trace lines: one row per preemption, exact, within a line "
                "of its step")
    version = rep.info.vllm_version or "?"
    if mode == "iterations":
        return (f"vLLM {version}, Iteration lines: one row per preemption, within a line "
                "of its step")
    return (f"vLLM {version}, stats lines only: no line pins a single preemption; one row per "
            "stats interval with preemptions (the median of the replays the log allows and "
            "their 90% interval), given when the next stats line arrives")


def _at(line: str) -> str:
    """' at HH:MM:SS' of a log line's time stamp, when it has one."""
    import re

    m = re.search(r"\d\d-\d\d (\d\d:\d\d:\d\d)", line)
    return f" at {m.group(1)}" if m else ""
