"""The search of stage 5 with iteration lines: each step's arrivals placed by its
`Iteration(N)` line (iterations.py runs it, then makes and checks the replay).

Consumes: the rebuilt workload, `LogFacts`, the `LogFormat`, the scheduler profile.
Produces: a `Search` whose engine has run the placed log: its step records, the choices
(requests entered before each step), the prompt lengths the lines set (`lengths`), and
whether its own run is the run its inputs make (`rerun`).

The search. One frontend sends requests in the order of its `Added request` lines, so the
engine gets them in that order; what is open is how many of the next ones enter before
each step. A request logged after line N-1 enters at the step of line N + lo .. N + hi
(`LogFormat.iteration_window`). At each step the counts the windows allow are tried, the
lag seen most so far first (an idle engine: all it has been sent); each is run and
compared with its line. Under FCFS a request that arrives and waits leaves the same state
as one that arrives a step later (V1 preempts only for running requests, A7), so a choice
no line can see does not matter. A disagreement is first put to the estimated prompts
(line_lengths.py), then backtracks through the recent choices (engine snapshots); one no
choice explains is reported, and from there each step takes the first choice its line
accepts. iterations.py replays the inputs found once more from the start: that run,
checked line by line, is the replay.

Prompts not logged (estimated): before each step, the requests it will admit get the
lengths its line shows (LineLengths.ahead: alone, exactly; several, as their sum), and the
log is placed in one forward pass, each step its most likely arrivals, nothing gone back
over (SEARCH_STEPS_PER_LINE = 0): the replay then costs about what it costs with prompts,
and what the lines leave open (how a sum splits) is the ensemble's to cover. Where that
pass neither went back nor gave a prompt to a request the scheduler had already tried to
admit with its old one, its own run is the run its inputs make, and is kept as the replay
(checked line by line again) instead of being run a second time.
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from dataclasses import dataclass, replace
from typing import Any

from kvreplay.inference.engines import make_engine
from kvreplay.inference.facts import LogFacts
from kvreplay.inference.log_shape import cut_time
from kvreplay.inference.formats import LogFormat
from kvreplay.inference.iteration_lines import LineCheck, kv_within_split, running_state
from kvreplay.inference.line_lengths import LineLengths
from kvreplay.inference.runs import step_limit
from kvreplay.inference.start_state import StartState, start_engine
from kvreplay.replay.engine import Engine
from kvreplay.replay.records import StepRecord
from kvreplay.replay.snapshots import Snapshot, SnapshotCodec

HORIZON = 64  # choice points kept for backtracking
BUDGET = 400  # steps re-run while looking for a placement that explains one disagreement
PRE_STEPS = 3  # steps back a prompt-length correction may replay from
# An engine snapshot every this many steps (fewer when every prompt is logged: going back
# is then rare); going back to a step is restoring the snapshot before it and taking the
# same choices again (the engine is deterministic).
CHECKPOINT_STEPS = (128, 32)  # prompts logged, estimated
CHECKPOINTS = 64
# NOTE: a snapshot costs about one pickle per live request, so with a long queue (an
# overloaded server: thousands waiting) the spacing grows with it: CHECKPOINT_STEPS per
# LIVE_PER_CHECKPOINT live requests. Snapshots then cost a bounded share of the replay
# instead of growing with queue length x steps. A count, not a clock: the same log always
# takes the same checkpoints.
LIVE_PER_CHECKPOINT = 1024
RESYNC_LINES = 16
# Engine steps the search may run in all, per Iteration line, when prompts are estimated
# (corrections replay from a request's arrival, backtracks from a choice): past it each
# step takes its most likely arrivals. 0: one forward pass. Measured on the 11 logs of
# tools/research/eval_iter_noprompts (three log cases, 8 renders): the search's
# corrections cost 5-40x the replay with prompts, and the count's interval held as often
# without them (11 of 11): a length the search fits to one line is often wrong for the
# next (a sum split another way), and after the first lost step it fits noise.
SEARCH_STEPS_PER_LINE = 0
MAX_SEARCHES = 3  # disagreements no choice explains before the search gives up
SPLIT_BY_KV = True
# Prompt lengths set from the coming step's line before it runs (LineLengths.ahead): what
# a correction would find, without going back
AHEAD = True
# Past the allowance, a step's disagreement is put to the estimated prompts by going back
# a few steps (PRE_STEPS). Off: the same 11 logs, the same intervals, twice as fast.
SPENT_REPAIRS = False


@dataclass(slots=True)
class _Frame:
    step: int  # a choice made before this step ...
    options: list[int]  # ... and the ones not tried yet


@dataclass(slots=True)
class _Checkpoint:
    codec: SnapshotCodec
    snap: Snapshot
    nsteps: int
    p: int
    check: tuple[int, dict[int, int]]

    @property
    def step(self) -> int:
        return self.snap.step


class Search:
    def __init__(self, rebuilt: Any, facts: LogFacts, fmt: LogFormat, profile: Any,
                 start: StartState | None = None, carry_n: int | None = None) -> None:
        # start: from a carried state (start_state.py); carry_n: the lags at that line's step
        lines = facts.iterations
        self.workload = rebuilt.workload
        self.eng: Engine = (make_engine(self.workload, profile) if start is None  # type: ignore[assignment]
                            else start_engine(start, self.workload))
        cfg = self.workload.config
        self.lo, hi = fmt.iteration_window
        self.hi = hi + (1 if cfg.async_scheduling else 0)
        self.fcfs = cfg.policy == "fcfs"
        # N of the first line a request could be scheduled in: one past the last line
        # before it (the line numbers: a lost line does not shift it), in the log's order
        bound, low = [], 0
        for r in facts.requests:
            k = r.iterations_before
            low = max(low, lines[k - 1].step + 1 if k > 0 else 0)
            bound.append(low)
        if start is not None:  # (logged before the window's first line: the whole run's)
            bound = [start.bounds.get(r.id, b) for r, b in zip(self.workload.requests, bound)]
        self.bound = bound
        self.aborts: dict[int, list[str]] = {}
        for r in facts.requests:
            if r.aborted_iterations is not None:
                k = r.aborted_iterations
                b = lines[k - 1].step + 1 if k > 0 else 0
                self.aborts.setdefault(b + 1, []).append(r.log_id)
        self.cut = cut_time(facts) is not None
        self.lc = LineCheck(facts, fmt, self.cut)
        self.lengths = LineLengths(self.workload, list(rebuilt.prompt_estimated),
                                   cfg.max_num_batched_tokens, cfg.block_size)
        self.lag_seen: Counter[int] = Counter(start.lag_seen if start is not None else ())
        self.carry_n = carry_n
        self.lag_at_carry: dict[int, int] | None = None
        self.limit = step_limit(self.workload)
        self.lock = threading.RLock()
        self.steps: list[StepRecord] = []
        self.p = len(start.ids) if start is not None else 0  # next request to enter
        self.frames: list[_Frame] = []
        self.ckpts: list[_Checkpoint] = []
        self._codec: SnapshotCodec | None = None
        self.choice: dict[int, int] = {}  # step -> requests that entered before it
        self.ctx_hist: dict[int, dict[str, int]] = {}
        self.queue: deque[int] = deque()  # choices to take next (a backtrack, a replay)
        # lines loose_from <= N < loose_until take the first choice they accept
        self.loose_from = self.loose_until = 0
        self.exhausted = False
        self.stepped = 0  # engine steps run, replays included
        self.allowance = (SEARCH_STEPS_PER_LINE * (self.lc.last_n + 1)
                          if any(rebuilt.prompt_estimated) else 1 << 62)
        self.unexplained = 0
        self.failures = 0
        self.backtracks = 0
        self.spent = 0
        self.busy = False
        # the search's own run is the run its inputs make from the start, unless it went
        # back to a snapshot or gave a waiting request another prompt after the scheduler
        # had read the old one: then the replay is run again (iteration_replay). The
        # scheduler reads a waiting request's length only as it tries to admit it, and a
        # try that fails is the step's admission_blocked (scheduler.py, phase W), except
        # where an unchunked prompt over the budget is skipped (0.9.2-0.11, chunking off)
        self.rerun = False
        self.tried: set[str] = set()  # requests the scheduler failed to admit
        self.skips = (not cfg.enable_chunked_prefill
                      and getattr(profile, "unchunked_overflow", None) == "skip")
        # step -> the running requests after it, for a step whose only difference from its
        # line is the KV usage (kv_split_explains reads them once every length is known)
        self.kv_running: dict[int, list[tuple[str, int]]] = {}

    # -- choices -------------------------------------------------------------------
    def options(self) -> list[int]:
        """How many of the next requests may enter before this step, most likely first."""
        n, p, bound = self.lc.n, self.p, self.bound
        total = len(bound)
        if p >= total:
            return [0]
        if n > self.lc.last_n:
            return [total - p]  # no line left to place them by: all that remain come
        e = m = 0
        while p + e < total and bound[p + e] + self.lo <= n:
            e += 1
        while p + m < total and bound[p + m] + self.hi <= n:
            m += 1
        idle = not self.eng.has_work()
        if idle or (self.steps and self.steps[-1].num_scheduled_tokens == 0
                    and not self.eng.batch_queue):
            # an idle engine (or one that could schedule nothing) steps, or prints its
            # next line, only once a request comes
            m, e = max(m, 1), max(e, 1)
        if idle:
            pref = e  # it takes all it has been sent (EngineCore drains its input queue)
        else:
            usual = self.lag_seen.most_common(1)[0][0] if self.lag_seen else 1
            pref = 0
            while p + pref < total and bound[p + pref] + usual <= n:
                pref += 1
            pref = min(max(pref, m), e)
        return sorted(range(m, e + 1), key=lambda k: (abs(k - pref), k))

    def apply(self, k: int) -> StepRecord:
        eng = self.eng
        self.busy = eng.has_work()
        step = eng.step_index
        self.choice[step] = k
        for j in range(k):
            eng.submit(self.p + j)
        self.p += k
        for rid in self.aborts.get(self.lc.n, ()):
            eng.abort(rid)
        if self.lengths and AHEAD:
            self._ahead(step)
        rec = eng.step()
        self.stepped += 1
        self.steps.append(rec)
        if rec.blocked is not None:
            self.tried.add(rec.blocked.request)
        out = eng.last_output
        if out is not None and self.lengths:
            self.ctx_hist[step] = {rid: out.num_scheduled_tokens[rid] for rid in out.ctx_req_ids}
            self.ctx_hist.pop(step - PRE_STEPS - 1, None)
        return rec

    def _ahead(self, step: int) -> None:
        """Give the requests the coming step admits the prompt lengths its line shows
        (LineLengths.ahead), before it runs: what a correction would otherwise replay."""
        it = self.lc.by_n.get(self.lc.n)
        if it is None:
            return
        fix = self.lengths.ahead(self.eng.scheduler, self.eng.submitted, it, step,
                                 self.workload.config.enable_prefix_caching)
        if fix is None:
            return
        live = self.eng.scheduler.requests
        for i in fix.lengths:
            rid = self.workload.requests[i].id
            if rid in live and (rid in self.tried or self.skips):
                self.rerun = True  # (the scheduler read its old prompt)
        self.lengths.applied(fix)
        for i, n in fix.lengths.items():
            tokens = self.lengths.tokens(i, n)
            self.workload.requests[i] = _with_prompt(self.workload.requests[i], tokens)
            self.eng.set_prompt(i, tokens)

    # -- snapshots -----------------------------------------------------------------
    def _take(self) -> tuple[SnapshotCodec, Snapshot]:
        if self._codec is None or self._codec.master is not self.eng:
            self._codec = SnapshotCodec(self.eng, self.lock)
        return self._codec, self._codec.take()

    def _restore(self, codec: SnapshotCodec, snap: Snapshot, nsteps: int, p: int,
                 check: tuple) -> None:
        self.eng = codec.restore(snap)
        self.rerun = True
        del self.steps[nsteps:]
        self.p = p
        self.lc.reset(check, snap.step)
        for i in self.lengths.changed:  # what the lines said of a prompt holds on any path
            self.eng.set_prompt(i, self.workload.requests[i].prompt_token_ids)

    def checkpoint(self) -> None:
        step = self.eng.step_index
        every = CHECKPOINT_STEPS[bool(self.lengths)]
        every *= max(1, len(self.eng.scheduler.requests) // LIVE_PER_CHECKPOINT)
        if self.ckpts and step - self.ckpts[-1].step < every:
            return
        self.ckpts.append(_Checkpoint(*self._take(), len(self.steps), self.p, self.lc.state()))
        if len(self.ckpts) > CHECKPOINTS:
            del self.ckpts[0]
            first = self.ckpts[0].step
            self.frames = [f for f in self.frames if f.step >= first]

    def goto(self, step: int) -> bool:
        """Back to the state before `step`: the last checkpoint at or before it, then the
        choices made since. False if no checkpoint reaches that far."""
        while self.ckpts and self.ckpts[-1].step > step:
            self.ckpts.pop()
        if not self.ckpts:
            return False
        c = self.ckpts[-1]
        self._restore(c.codec, c.snap, c.nsteps, c.p, c.check)
        while self.eng.step_index < step:
            self.check(self.apply(self.choice[self.eng.step_index]))
        return True

    def push(self, options: list[int]) -> None:
        self.frames.append(_Frame(self.eng.step_index, options))
        if len(self.frames) > HORIZON:
            del self.frames[0]

    def backtrack(self) -> bool:
        """Resume at the latest choice with an untried option (and take it); False when
        none is left or the budget is spent."""
        while self.frames:
            f = self.frames[-1]
            if self.spent > BUDGET:
                self.frames.clear()
                return False
            if not f.options:
                self.frames.pop()
                continue
            k = f.options.pop(0)
            self.spent += self.eng.step_index - f.step + 1
            if not f.options:
                self.frames.pop()
            if not self.goto(f.step):
                self.frames.clear()
                return False
            self.backtracks += 1
            self.queue.append(k)
            return True
        return False

    def repair(self, rec: StepRecord, max_back: int | None = None) -> bool:
        """Put the disagreement at `rec` to the estimated prompts: replay from the step the
        correction needs (no more than `max_back` steps back), with the same choices."""
        it = self.lc.by_n.get(self.lc.line_of_step.get(rec.step, -1))
        out = self.eng.last_output
        if it is None or out is None:
            return False
        fix = self.lengths.fix(rec.step, out, self.ctx_hist.get(rec.step - 1),
                               self.eng.scheduler.requests, rec.blocked, it)
        if fix is None and SPLIT_BY_KV:
            kv_it = self.lc.by_n.get(self.lc.line_of_step.get(
                rec.updated_batch if rec.updated_batch is not None else rec.step, -1))
            if kv_it is not None and kv_it.kv_usage is not None:
                fix = self.lengths.split(rec, kv_it.kv_usage,
                                         self.eng.scheduler.pool.num_usable_blocks)
        if fix is None or any(n < 1 for n in fix.lengths.values()):
            return False
        # a prompt is what it is from the request's arrival on (while it waited, the
        # full-sequence gate and the token budget read it)
        arrived = self.eng.arrival_step
        if max_back is None:  # (past the allowance: from the step its line is, a shortcut)
            fix.restore_step = min([fix.restore_step, *(arrived[i] for i in fix.lengths if arrived[i] >= 0)])
        if not self.ckpts or self.ckpts[0].step > fix.restore_step:
            return False
        if max_back is not None and fix.restore_step < rec.step - max_back:
            return False
        choices = [self.choice[s] for s in range(fix.restore_step, rec.step + 1)]
        self.lengths.applied(fix)
        for i, n in fix.lengths.items():
            self.workload.requests[i] = _with_prompt(self.workload.requests[i],
                                                     self.lengths.tokens(i, n))
        self.goto(fix.restore_step)
        self.frames = [f for f in self.frames if f.step < fix.restore_step]
        self.queue = deque(choices + list(self.queue))  # then what was queued after it
        return True

    # -- the loop ------------------------------------------------------------------
    def check(self, rec: StepRecord) -> list[str]:
        """The step against its line (LineCheck.check); the running requests kept when
        the KV usage is all that differs."""
        diffs = self.lc.check(rec)
        if diffs and self.lengths and all(d.startswith("KV usage") for d in diffs):
            self.kv_running[rec.step] = running_state(self.eng.scheduler)
        return diffs

    def done(self) -> bool:
        eng = self.eng
        if eng.done or eng.step_index >= self.limit:
            return True
        if self.lc.n > self.lc.last_n and self.cut and not self.lc.kv_due:
            eng.stop()  # the log ends here
            return True
        return False

    def run(self) -> None:
        best: tuple[int, tuple] | None = None  # the furthest failed path: (N, its state)
        while not self.done():
            if best is not None and self.lc.n > best[0] + 2:
                best, self.spent = None, 0  # past the line that failed: that one is solved
            if self.stepped > self.allowance:
                self._spent_out()
                break
            strict = not self.loose_from <= self.lc.n < self.loose_until
            self.checkpoint()
            if self.queue:
                k = self.queue.popleft()
            else:
                opts = self.options()
                if len(opts) > 1 and strict:
                    self.push(opts[1:])
                elif len(opts) > 1:
                    if self._greedy(opts):
                        continue
                    rec = self.steps[-1]
                    if not self.repair(rec):
                        self.unexplained += 1
                    continue
                k = opts[0]
            rec = self.apply(k)
            diffs = self.check(rec)
            if diffs and self._soft(rec, diffs):
                # a KV usage a sum's split may explain: split it when a member left the
                # pool (line_lengths.split), else take the step as it is
                if self.repair(rec):
                    continue
                diffs = []
            if not diffs:
                self._learn(rec, k)
                continue
            if self.repair(rec):
                continue
            if self.lengths and not any("requests" in d for d in diffs):
                # the request counts agree: the arrivals are placed, and the tokens are
                # the estimated prompts' (a sum no line split yet); going back through the
                # arrival choices would only trade a length error for a placement error
                self.unexplained += 1
                self._learn(rec, k)
                continue
            if not strict:
                self.unexplained += 1
                continue
            if best is None or self.lc.n > best[0]:
                best = (self.lc.n, self._state())
            self.queue.clear()
            if self.backtrack():
                continue
            # nothing explains this line: go on from the furthest path; the next lines
            # take the first choice each accepts, without going back, until one has matched
            # for a while (a replay off by a little may come back in step)
            self._resume(best[1])
            self.unexplained += 1
            self.failures += 1
            self.loose_from = self.lc.n - 1
            # a replay that keeps losing step is off for good: stop searching (each search
            # costs its budget) and only take, step by step, what the lines accept
            self.loose_until = self.lc.n + RESYNC_LINES if self.failures < MAX_SEARCHES else 1 << 62
            best = None
        if self.steps and not self.eng.done:
            self.eng.stop()

    def _spent_out(self) -> None:
        """The search's allowance is spent: the rest of the log, each step its most likely
        choice, nothing corrected."""
        self.exhausted = True
        while not self.done():
            if SPENT_REPAIRS:  # (else nothing goes back: no snapshot needed)
                self.checkpoint()
            k = self.queue.popleft() if self.queue else self.options()[0]
            rec = self.apply(k)
            diffs = self.check(rec)
            if diffs and SPENT_REPAIRS and self.repair(rec, max_back=PRE_STEPS):
                continue  # a length the step's own line shows: a few steps replayed
            if not diffs:
                self._learn(rec, k)

    def _soft(self, rec: StepRecord, diffs: list[str]) -> bool:
        """A KV usage off by no more blocks than there are prompts known only as a sum in
        the pool: how the sums split, not a wrong step."""
        return kv_within_split(rec, diffs, self.lc, self.eng.scheduler, self.lengths)

    def _learn(self, rec: StepRecord, k: int) -> None:
        self._lags(rec, k)
        if self.carry_n is not None and self.lc.line_of_step.get(rec.step) == self.carry_n:
            self.lag_at_carry = dict(self.lag_seen)  # (the last path through it: the run's)

    def _lags(self, rec: StepRecord, k: int) -> None:
        out = self.eng.last_output
        if self.lengths and out is not None:
            self.lengths.observe(out)
        # how many lines late a request scheduled as it came in entered a busy engine
        if not k or not self.busy or not rec.admitted or rec.step not in self.lc.line_of_step:
            return
        new = {a.request for a in rec.admitted if not a.resumed}
        specs = self.workload.requests
        for i in range(self.p - k, self.p):
            if specs[i].id in new:
                self.lag_seen[self.lc.line_of_step[rec.step] - self.bound[i]] += 1

    def _greedy(self, opts: list[int]) -> bool:
        """After a disagreement nothing explained: the first option its line accepts (True),
        else the most likely one (False)."""
        step = self.eng.step_index
        for k in opts:
            if k != opts[0] and not self.goto(step):
                break
            rec = self.apply(k)
            diffs = self.check(rec)
            if not diffs or self._soft(rec, diffs):
                self._learn(rec, k)
                return True
        if self.goto(step):
            self.check(self.apply(opts[0]))
        return False

    def _state(self) -> tuple:
        codec, snap = self._take()
        return (codec, snap, list(self.steps), self.p, self.lc.state(),
                dict(self.lc.line_of_step))

    def _resume(self, state: tuple) -> None:
        codec, snap, steps, p, check, los = state
        self.steps = steps
        self._restore(codec, snap, len(steps), p, check)
        self.lc.line_of_step = los
        self.frames.clear()
        self.queue.clear()


def _with_prompt(spec: Any, tokens: list[int]) -> Any:
    return replace(spec, prompt_token_ids=tokens)
