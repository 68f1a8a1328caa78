"""Stage 5 with iteration lines: every arrival placed on its step, and every step checked,
against vLLM's own `Iteration(N)` lines (`--enable-logging-iteration-details`, 0.14+).

Consumes: the rebuilt workload (stage 3), `LogFacts` (the first engine's iteration lines,
each request's position among them), the `LogFormat` (how late a request may enter after
the line before it). Produces: an `IterationMatch`: the `Run` (its inputs are the
placement), the lines checked and matched, and the first line no placement explains.

What a line says (vLLM 0.33 `EngineCore.capture_iteration_details`,
`compute_iteration_details`, `LoggingStatLogger._log_iteration_details`; spec:
vllm-log-formats.md 4.3):
* N counts the engine steps that scheduled a token; idle and 0-token steps have none;
* "context" requests are the scheduled ones with no output token yet (output placeholders
  included): new ones, later chunks of a first prefill, ones preempted before their first
  token; every other scheduled request is a "generation" request, a preempted one being
  recomputed included (StepRecord.num_ctx_requests / num_ctx_tokens);
* the KV usage is the scheduler's once that step's output was applied;
* 0.26+ the API server writes the line as the step's output arrives, in order with its
  request lines: a request logged after line N-1 entered after that step ended.

The search. One frontend sends requests in the order of its `Added request` lines, so the
engine gets them in that order; what is open is how many of the next ones enter before
each step. A request logged after line N-1 enters at the step of line N + lo .. N + hi
(`LogFormat.iteration_window`). At each step the counts the windows allow are tried, the
lag seen most so far first; each is run and compared with its line. A request that
arrives and waits leaves the same state as one that arrives a step later (V1 preempts only
for running requests, A7), so a choice no line can see does not matter. A mismatch
backtracks through the recent choices (engine snapshots); one that no choice explains is
reported with its file and line, and from there the replay takes, step by step, the first
choice its line accepts (else the usual lag), no longer pinned by the log.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from kvreplay.inference.clock import StepTimeModel, nnls_gram
from kvreplay.inference.engines import make_engine
from kvreplay.inference.facts import LogFacts, cut_time
from kvreplay.inference.formats import LogFormat
from kvreplay.inference.runs import Run, step_limit
from kvreplay.replay.engine import Engine, without_cyclic_gc
from kvreplay.replay.records import StepRecord
from kvreplay.replay.snapshots import Snapshot, SnapshotCodec

HORIZON = 64  # choice points kept for backtracking
BUDGET = 400  # steps re-run while looking for a placement that explains one mismatch
OVERHEADS_S = (0.0, 0.0002, 0.0005, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.008)


def unusable(facts: LogFacts, fmt: LogFormat) -> str | None:
    """Why the iteration lines cannot place the arrivals (None: they can)."""
    its = facts.iterations
    if not its:
        return "no Iteration lines"
    if fmt.engine != "V1":
        return "a V0 log"
    if len(facts.iteration_engines) > 1:
        return (f"the lines come from {len(facts.iteration_engines)} engines (data parallel): "
                "which engine ran which request is not logged")
    if its[0].step != 0:
        return (f"the first Iteration line is Iteration({its[0].step}): the log does not "
                "start with the engine's first step")
    if not facts.requests or facts.requests[0].iterations_before > 0:
        return "Iteration lines before the first request line: the log starts mid-run"
    return None


def _kv_text(x: float) -> str:
    return f"{x * 100:.1f}"


@dataclass(slots=True)
class Mismatch:
    iteration: int  # N of the line
    file: str
    line: int
    step: int  # the replay's step
    differences: list[str]

    def to_dict(self) -> dict[str, Any]:
        return {"iteration": self.iteration, "file": self.file, "line": self.line,
                "step": self.step, "differences": self.differences}


@dataclass(slots=True)
class IterationMatch:
    run: Run
    lines: int  # iteration lines in the log
    checked: int  # lines the replay had a step for
    matched: int  # ... that it matched in every field
    first_mismatch: Mismatch | None
    exact_until_step: int  # steps before this one are pinned by the log (all, if no mismatch)
    line_of_step: dict[int, int] = field(default_factory=dict)  # step -> N
    lag: dict[int, int] = field(default_factory=dict)  # arrival step - lower bound: count
    backtracks: int = 0
    overhead_s: float = 0.0  # the clock's fixed cost between steps

    def report(self) -> dict[str, Any]:
        return {"lines": self.lines, "checked": self.checked, "matched": self.matched,
                "first_mismatch": self.first_mismatch.to_dict() if self.first_mismatch else None,
                "exact_until_step": self.exact_until_step,
                "arrival_lag": {str(k): v for k, v in sorted(self.lag.items())},
                "backtracks": self.backtracks}


@dataclass(slots=True)
class _Frame:
    codec: SnapshotCodec
    snap: Snapshot
    nsteps: int
    p: int
    n: int
    kv_due: dict[int, int]
    options: list[int]


class _Search:
    def __init__(self, rebuilt: Any, facts: LogFacts, fmt: LogFormat, profile: Any) -> None:
        self.facts = facts
        self.lines = facts.iterations
        self.by_n = {it.step: it for it in self.lines}
        self.last_n = self.lines[-1].step
        self.workload = rebuilt.workload
        self.eng: Engine = make_engine(self.workload, profile)  # type: ignore[assignment]
        cfg = self.workload.config
        lo, hi = fmt.iteration_window
        self.lo = lo
        self.hi = hi + (1 if cfg.async_scheduling else 0)
        self.check_kv = fmt.iteration_kv
        self.async_lag = 1 if cfg.async_scheduling else 0
        reqs = facts.requests
        # N of the first line the request could have been scheduled in: one past the
        # last line before it (the line numbers, so a lost line does not shift it)
        bound, low = [], 0
        for r in reqs:
            k = r.iterations_before
            b = self.lines[k - 1].step + 1 if k > 0 else 0
            low = max(low, b)  # arrivals keep the log's order
            bound.append(low)
        self.bound = bound
        self.aborts: dict[int, list[str]] = {}
        for r in reqs:
            if r.aborted_iterations is not None:
                k = r.aborted_iterations
                b = self.lines[k - 1].step + 1 if k > 0 else 0
                self.aborts.setdefault(b + 1, []).append(r.log_id)
        self.lag_seen: Counter[int] = Counter()
        self.cut = cut_time(facts) is not None
        self.limit = step_limit(self.workload)
        self.lock = threading.RLock()
        # search state
        self.steps: list[StepRecord] = []
        self.p = 0  # next request to enter
        self.n = 0  # N of the next line a token step will print
        self.kv_due: dict[int, int] = {}  # async: step -> its N, KV usage not yet compared
        self.frames: list[_Frame] = []
        self.strict = True
        self.first: Mismatch | None = None
        self.exact_until: int | None = None
        self.backtracks = 0
        self.checked = 0
        self.mismatched_lines: set[int] = set()
        self.line_of_step: dict[int, int] = {}

    # -- choices -------------------------------------------------------------------
    def options(self) -> list[int]:
        """How many of the next requests may enter before this step, most likely first."""
        n, p, bound = self.n, self.p, self.bound
        total = len(bound)
        if p >= total:
            return [0]
        if self.n > self.last_n:
            return [total - p]  # no line left to place them by: all that remain come
        e = m = 0
        while p + e < total and bound[p + e] + self.lo <= n:
            e += 1
        while p + m < total and bound[p + m] + self.hi <= n:
            m += 1
        if not self.eng.has_work() or (self.steps and self.steps[-1].num_scheduled_tokens == 0
                                       and not self.eng.batch_queue):
            # an idle engine (or one that could schedule nothing) steps, or prints its
            # next line, only once a request comes
            m = max(m, 1)
            e = max(e, 1)
        if not self.eng.has_work():
            # an idle engine takes every request it has been sent once the first wakes
            # it (EngineCore drains its input queue before it schedules)
            pref = e
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
        for j in range(k):
            eng.submit(self.p + j)
        self.p += k
        for rid in self.aborts.get(self.n, ()):
            eng.abort(rid)
        rec = eng.step()
        self.steps.append(rec)
        return rec

    # -- the check -----------------------------------------------------------------
    def check(self, rec: StepRecord) -> list[str]:
        """Differences between the step just run and its line(s); advances N."""
        diffs: list[str] = []
        if rec.num_scheduled_tokens > 0:
            n = self.n
            self.n += 1
            self.line_of_step[rec.step] = n
            it = self.by_n.get(n)
            if it is None:
                if n > self.last_n and not self.cut:
                    diffs.append(f"the replay runs a step the log has no Iteration({n}) line for")
            else:
                ours = (rec.num_ctx_requests, rec.num_ctx_tokens,
                        rec.num_scheduled - rec.num_ctx_requests,
                        rec.num_scheduled_tokens - rec.num_ctx_tokens)
                logged = (it.context_requests, it.context_tokens, it.generation_requests,
                          it.generation_tokens)
                for name, a, b in zip(("context requests", "context tokens",
                                       "generation requests", "generation tokens"), ours, logged):
                    if a != b:
                        diffs.append(f"{name} {a} vs logged {b}")
                if self.check_kv and it.kv_usage is not None:
                    if self.async_lag:
                        self.kv_due[rec.step] = n
                    elif _kv_text(rec.kv_usage) != f"{it.kv_usage:.1f}":
                        diffs.append(f"KV usage {_kv_text(rec.kv_usage)}% vs logged {it.kv_usage:.1f}%")
        if self.kv_due and rec.updated_batch is not None and rec.updated_batch in self.kv_due:
            it = self.by_n[self.kv_due.pop(rec.updated_batch)]
            if _kv_text(rec.kv_usage) != f"{it.kv_usage:.1f}":
                diffs.append(f"KV usage {_kv_text(rec.kv_usage)}% after Iteration({it.step}) vs "
                             f"logged {it.kv_usage:.1f}%")
        return diffs

    def _mismatch(self, rec: StepRecord, diffs: list[str]) -> Mismatch:
        n = self.line_of_step.get(rec.step, self.n - 1)
        if rec.updated_batch is not None and any("after Iteration" in d for d in diffs):
            n = self.line_of_step.get(rec.updated_batch, n)
        it = self.by_n.get(n) or self.lines[-1]
        return Mismatch(n, it.file, it.line, rec.step, diffs)

    # -- snapshots -----------------------------------------------------------------
    def push(self, options: list[int]) -> None:
        codec = SnapshotCodec(self.eng, self.lock)
        self.frames.append(_Frame(codec, codec.take(), len(self.steps), self.p, self.n,
                                  dict(self.kv_due), options))
        if len(self.frames) > HORIZON:
            del self.frames[0]

    def restore(self, f: _Frame) -> None:
        self.eng = f.codec.restore(f.snap)
        del self.steps[f.nsteps:]
        self.p, self.n, self.kv_due = f.p, f.n, dict(f.kv_due)
        for s in [s for s in self.line_of_step if s >= f.snap.step]:
            del self.line_of_step[s]

    def backtrack(self) -> bool:
        """Resume at the latest choice with an untried option (and take it); False when
        none is left or the budget is spent."""
        while self.frames:
            f = self.frames[-1]
            if not f.options or self.spent > BUDGET:
                self.frames.pop()
                if self.spent > BUDGET:
                    self.frames.clear()
                    return False
                continue
            k = f.options.pop(0)
            self.spent += len(self.steps) - f.nsteps + 1
            self.restore(f)
            self.backtracks += 1
            if not f.options:
                self.frames.pop()
            self.trial = k
            return True
        return False

    # -- the loop ------------------------------------------------------------------
    def done(self) -> bool:
        eng = self.eng
        if eng.done or eng.step_index >= self.limit:
            return True
        if self.n > self.last_n and self.cut and not (self.async_lag and self.kv_due):
            eng.stop()  # the log ends here
            return True
        return False

    def run(self) -> None:
        self.trial: int | None = None
        self.spent = 0
        best: tuple[int, Any] | None = None  # (N reached, state) of the furthest failed path
        while not self.done():
            if best is not None and self.n > best[0] + 1 + self.async_lag:
                best, self.spent = None, 0  # past the line that failed: that one is solved
            if self.trial is not None:
                k, self.trial = self.trial, None
            else:
                opts = self.options()
                if len(opts) > 1:
                    if not self.strict:
                        k = self._greedy(opts)
                        continue
                    self.push(opts[1:])
                k = opts[0]
            rec = self.apply(k)
            diffs = self.check(rec)
            if not self.strict:
                if diffs:
                    self.mismatched_lines.add(self._mismatch(rec, diffs).iteration)
                continue
            if not diffs:
                self._learn_lag(rec, k)
                continue
            m = self._mismatch(rec, diffs)
            if best is None or m.iteration > best[0]:
                best = (m.iteration, self._state(m))
            if self.backtrack():
                continue
            # nothing explains this line: report the furthest one and go on from there
            self._resume(best[1])
            self.first = best[1][-1]
            self.exact_until = self.first.step
            self.mismatched_lines.add(self.first.iteration)
            self.strict = False
            best = None
        if self.steps and not self.eng.done:
            self.eng.stop()

    def _learn_lag(self, rec: StepRecord, k: int) -> None:
        """How many lines late a request that was scheduled as it came in entered: the lag
        the next choices try first."""
        if not k or not self.busy or not rec.admitted or rec.step not in self.line_of_step:
            return  # an idle engine's step says nothing of the lag
        new = {a.request for a in rec.admitted if not a.resumed}
        specs = self.workload.requests
        for i in range(self.p - k, self.p):
            if specs[i].id in new:
                self.lag_seen[self.line_of_step[rec.step] - self.bound[i]] += 1

    def _greedy(self, opts: list[int]) -> int:
        """After a mismatch: the first option whose step its line accepts."""
        codec = SnapshotCodec(self.eng, self.lock)
        snap = codec.take()
        state = (len(self.steps), self.p, self.n, dict(self.kv_due))
        for i, k in enumerate(opts):
            if i:
                self.eng = codec.restore(snap)
                del self.steps[state[0]:]
                self.p, self.n, self.kv_due = state[1], state[2], dict(state[3])
            rec = self.apply(k)
            diffs = self.check(rec)
            if not diffs:
                return k
        self.eng = codec.restore(snap)
        del self.steps[state[0]:]
        self.p, self.n, self.kv_due = state[1], state[2], dict(state[3])
        rec = self.apply(opts[0])
        diffs = self.check(rec)
        if diffs:
            self.mismatched_lines.add(self._mismatch(rec, diffs).iteration)
        return opts[0]

    def _state(self, m: Mismatch) -> tuple:
        codec = SnapshotCodec(self.eng, self.lock)
        return (codec, codec.take(), list(self.steps), self.p, self.n, dict(self.kv_due),
                dict(self.line_of_step), m)

    def _resume(self, state: tuple) -> None:
        codec, snap, steps, p, n, kv_due, los, _ = state
        self.eng = codec.restore(snap)
        self.steps, self.p, self.n, self.kv_due, self.line_of_step = steps, p, n, kv_due, los
        self.frames.clear()


@without_cyclic_gc
def iteration_replay(rebuilt: Any, facts: LogFacts, fmt: LogFormat, profile: Any) -> IterationMatch:
    """Place every arrival by the iteration lines and check every step against them."""
    s = _Search(rebuilt, facts, fmt, profile)
    s.run()
    steps = s.steps
    inputs = s.eng.inputs()
    lag: Counter[int] = Counter()
    for a, b in zip(inputs.arrival_steps, s.bound):
        if a >= 0:
            n = _line_at_or_after(s.line_of_step, a)
            if n is not None:
                lag[n - b] += 1
    matched = sum(1 for st, n in s.line_of_step.items() if n <= s.last_n
                  and n not in s.mismatched_lines)
    checked = sum(1 for n in s.line_of_step.values() if n <= s.last_n)
    clock, end, model, overhead = iteration_clock(steps, s.line_of_step, facts, fmt)
    ended = {rid for rec in steps for rid in (*rec.finished, *rec.aborted)}
    unfinished = [spec.id for spec in rebuilt.workload.requests if spec.id not in ended]
    run = Run(steps, clock, end, inputs, model, (0.0, 0.0),
              facts.last_time if s.eng.stopped and s.cut else None, unfinished)
    return IterationMatch(run, len(s.lines), checked, matched, s.first,
                          s.exact_until if s.exact_until is not None else len(steps),
                          s.line_of_step, dict(lag), s.backtracks, overhead)


def _line_at_or_after(line_of_step: dict[int, int], step: int) -> int | None:
    for st in range(step, step + 64):
        if st in line_of_step:
            return line_of_step[st]
    return None


# ---------------------------------------------------------------- the clock from the lines
def iteration_clock(steps: list[StepRecord], line_of_step: dict[int, int], facts: LogFacts,
                    fmt: LogFormat) -> tuple[list[float], float, StepTimeModel, float]:
    """Wall-clock start of every step, from the logged model time of each step plus a
    fixed cost between steps (scheduling, IPC), chosen so that each line's second holds
    the end of its step; each busy span (the engine idle before it) is placed on its own,
    after the second of the request that starts it. Also the step-time model fitted to
    the logged durations (for what-if), and the cost between steps."""
    by_n = {it.step: it for it in facts.iterations}
    elapsed = [0.0] * len(steps)
    for st, n in line_of_step.items():
        it = by_n.get(n)
        if it is not None and st < len(steps):
            elapsed[st] = it.elapsed_ms / 1000.0
    arrival_sec: dict[str, float] = {r.log_id: r.time for r in facts.requests if r.time is not None}
    # busy spans: a step starts one when the engine had nothing before it
    spans: list[tuple[int, int]] = []
    start = 0
    for k in range(1, len(steps)):
        prev = steps[k - 1]
        if prev.num_running == 0 and prev.num_waiting == 0 and steps[k].arrivals:
            spans.append((start, k))
            start = k
    if steps:
        spans.append((start, len(steps)))
    best: tuple[tuple[int, float], float, list[float]] | None = None
    for c in OVERHEADS_S:
        dur = [e + c for e in elapsed]
        out = [0.0] * (len(steps) + 1)
        bad, width = 0, 0.0
        for a, b in spans:
            cum, acc = [], 0.0
            for k in range(a, b):
                cum.append(acc)
                acc += dur[k]
            cum.append(acc)
            lo, hi = -1e18, 1e18
            for k in range(a, b):
                n = line_of_step.get(k)
                it = by_n.get(n) if n is not None else None
                if it is None or it.time is None:
                    continue
                end = cum[k + 1 - a]  # written as its output arrives
                lo, hi = max(lo, it.time - end), min(hi, it.time + 1.0 - end)
            for rid in steps[a].arrivals:
                t = arrival_sec.get(rid)
                if t is not None:
                    lo = max(lo, t)
            if lo > 1e17:
                lo = hi = 0.0
            elif hi > 1e17:
                hi = lo + 1.0
            if lo > hi:
                bad += 1
                t0 = (lo + hi) / 2
            else:
                width += hi - lo
                t0 = (lo + hi) / 2
            for k in range(a, b + 1):
                out[k] = t0 + cum[k - a]
        score = (bad, -width)
        if best is None or score < best[0]:
            best = (score, c, out)
    if best is None:
        t0 = facts.requests[0].time if facts.requests and facts.requests[0].time else 0.0
        return [], t0, StepTimeModel(), 0.0
    _, c, out = best
    model = _duration_model(steps, elapsed, c, fmt)
    return out[: len(steps)], out[len(steps)], model, c


def _duration_model(steps: list[StepRecord], elapsed: list[float], c: float,
                    fmt: LogFormat) -> StepTimeModel:
    """Least squares (non-negative) of each logged step duration on the step-time
    model's terms, for each token floor the format tries."""
    best = None
    for floor in fmt.token_floors:
        rows = [(1.0, float(max(r.num_scheduled_tokens, floor)), float(r.num_scheduled),
                 float(r.context_tokens), e + c)
                for r, e in zip(steps, elapsed) if r.num_scheduled_tokens > 0 and e > 0]
        if len(rows) < 4:
            break
        fit_ = nnls_gram(rows, 4)
        if fit_ is not None and (best is None or fit_[0] < best[0]):
            best = (fit_[0], fit_[1], floor)
    if best is None:
        return StepTimeModel(overhead_s=c + 0.005)
    _, k, floor = best
    return StepTimeModel(overhead_s=k[0], per_token_s=k[1], per_request_s=k[2],
                         per_context_token_s=k[3], token_floor=floor if k[1] > 0 else 0)
