"""A `Replay` with instant random access: the model behind `kvreplay tui`.

The timeline shows the replay the report made: its step records, its preemption records
(with their confidence and probability), its clock and log lines. `build()` re-runs exactly
the replay's inputs once, checking every step against its records (`Replay.rerun`), and
keeps
- compact per-step columns (free blocks, KV usage, running/waiting counts, tokens, event
  flags) and sorted event-step arrays, so the timeline and next/previous-event jumps are a
  bisect away;
- each request's life (arrival, admission, preemptions, resumes, finish, abort);
- periodic engine snapshots (replay/snapshots.py). `view(step)` restores the nearest
  snapshot at or before the step and re-runs to it, so any step's full state (block map,
  queue order) is rebuilt in a bounded time.

Nothing here decides anything. No UI imports (the core never imports textual).
"""

from __future__ import annotations

import bisect
import threading
import time
from array import array
from collections import OrderedDict
from typing import Any, Callable, Iterable, Sequence

import msgspec

from kvreplay.replay.records import PreemptionRecord, StepRecord
from kvreplay.replay.result import Replay, ReplayMismatch
from kvreplay.replay.snapshots import PickleCodec, Snapshot, SnapshotCodec
from kvreplay.replay.state import (BLOCK_STATE_NAMES, CACHED, FREE, HELD, NULL, SHARED,  # noqa: F401
                                   EngineState, RequestState, Scheduled, StateDiff, StepView,
                                   diff_states, scheduled_tokens)
from kvreplay.replay.v0.steps import V0Steps

# Per-step event flags.
F_PREEMPT = 1
F_ADMIT = 2
F_RESUME = 4
F_FINISH = 8
F_ARRIVAL = 16
F_IDLE = 32
F_BLOCKED = 64

EVENT_KINDS: dict[str, int] = {
    "preemption": F_PREEMPT,
    "admission": F_ADMIT,
    "resume": F_RESUME,
    "finish": F_FINISH,
    "arrival": F_ARRIVAL,
    "blocked": F_BLOCKED,
}

DEFAULT_RESIM_BUDGET_S = 0.004  # simulated time between snapshots (bounds a rebuild)
DEFAULT_SNAPSHOT_CAP = 96 << 20  # bytes of snapshots before thinning them out

Preemption = PreemptionRecord  # what the timeline lists is the replay's own record


class LifeEvent(msgspec.Struct, gc=False):
    step: int
    kind: str  # arrival | admitted | preempted | triggered | resumed | finished | aborted
    detail: str = ""
    preemption: int | None = None  # index into Timeline.preemptions


class Timeline:
    """One `Replay`, with instant random access (see the module docstring)."""

    def __init__(
        self,
        replay: Replay,
        *,
        snapshot_every: int | None = None,
        resim_budget_s: float = DEFAULT_RESIM_BUDGET_S,
        snapshot_cap: int = DEFAULT_SNAPSHOT_CAP,
        cache_size: int = 48,
    ) -> None:
        self.replay = replay
        self.engine: Any = replay.new_engine()
        self.lock = threading.RLock()
        v0 = isinstance(self.engine, V0Steps)
        self.codec = PickleCodec(self.engine, self.lock) if v0 else SnapshotCodec(self.engine, self.lock)
        wl = replay.workload
        self.workload = wl
        self.config = wl.config
        self.profile = replay.profile
        self.num_blocks = wl.config.num_gpu_blocks
        self.request_ids: list[str] = [s.id for s in wl.requests]
        self.order = {rid: i for i, rid in enumerate(self.request_ids)}
        # arrival step of each request (a V0 request with n > 1 is n sequence groups)
        parent = getattr(wl, "parent", {})
        logged = list(dict.fromkeys(parent.get(r, r) for r in self.request_ids))
        at = dict(zip(logged, replay.inputs.arrival_steps))
        self._arrival = {r: at.get(parent.get(r, r), -1) for r in self.request_ids}
        self.prompt_len = {s.id: len(s.prompt_token_ids) for s in wl.requests}
        self.snapshot_every = snapshot_every
        self.resim_budget_s = resim_budget_s
        self.snapshot_cap = snapshot_cap
        self.cache_size = cache_size
        # compact per-step columns
        self.free_blocks = array("i")
        self.kv_usage = array("f")
        self.num_running = array("i")
        self.num_waiting = array("i")
        self.num_tokens = array("i")
        self.flags = bytearray()
        self.event_steps: dict[str, array] = {k: array("i") for k in EVENT_KINDS}
        self.preemptions: list[PreemptionRecord] = replay.preemptions
        self._preempt_first = array("i")  # parallel to event_steps["preemption"]
        self._next_preemption = 0
        self.life: dict[str, list[LifeEvent]] = {rid: [] for rid in self.request_ids}
        self._open: dict[str, int] = {}  # victim -> index of its open preemption
        self.finished_step: dict[str, int] = {}
        self.snapshots: list[Snapshot] = []
        self._snap_steps = array("i")
        self.snapshot_bytes = 0
        self.num_steps = 0  # steps loaded
        self.done = False
        self.cancelled = False
        self._cache: OrderedDict[int, StepView] = OrderedDict()
        self._cursor: Any = None  # a scratch engine, step_index = next step
        self._cursor_lock = threading.Lock()
        self.build_seconds = 0.0
        self._log_steps: array | None = None
        # the replayed text's lines, where they are not a file to read back (a followed
        # log: the run's lines, numbered from its banner); None: read the log files
        self.lines: Sequence[str] | None = None

    # -- building --------------------------------------------------------------------
    def build(
        self,
        *,
        progress: Callable[["Timeline"], None] | None = None,
        cancelled: Callable[[], bool] | None = None,
        progress_every_s: float = 0.1,
        max_steps: int | None = None,
    ) -> None:
        """Load the replay's steps, re-running its inputs for snapshots (each step checked
        against the replay's record). Safe to call from a worker thread while another
        thread reads the timeline."""
        engine = self.engine
        codec = self.codec
        lock = self.lock
        perf = time.perf_counter
        t_start = t_last = t_snap = perf()
        every = self.snapshot_every
        budget = self.resim_budget_s
        since_snap = 0
        steps = self.replay.steps
        # NOTE: the run's length is known, so snapshots are spaced to fit the cap from the
        # start (`spacing` steps at least, from their mean size so far) rather than taken
        # densely and thinned: each one costs a pickle, and thinning throws most away.
        spacing = 8
        while self.num_steps < len(steps):
            if max_steps is not None and self.num_steps >= max_steps:
                break
            if every is not None:
                due = since_snap >= every or not self.snapshots
            else:
                due = not self.snapshots or (since_snap >= spacing and perf() - t_snap >= budget)
            if due:
                with lock:
                    snap = codec.take()
                self.snapshots.append(snap)
                self._snap_steps.append(snap.step)
                self.snapshot_bytes += snap.nbytes
                if self.snapshot_bytes > self.snapshot_cap:
                    self._thin()
                    budget *= 2
                mean = self.snapshot_bytes / len(self.snapshots)
                fit = int(len(steps) * mean / (0.8 * self.snapshot_cap)) + 1
                spacing = max(spacing, fit)
                since_snap = 0
                t_snap = perf()
            want = steps[self.num_steps]
            with lock:
                if engine.done or engine.step() != want:
                    raise ReplayMismatch(f"the TUI's re-run differs from the replay at step "
                                         f"{want.step}")
                self._ingest(want)
            since_snap += 1
            # NOTE: counted in steps loaded, not since the last snapshot: snapshots closer
            # than 256 steps apart would otherwise skip every progress and cancel check
            if (self.num_steps & 255) == 0:
                now = perf()
                if now - t_last >= progress_every_s:
                    t_last = now
                    if cancelled is not None and cancelled():
                        self.cancelled = True
                        break
                    if progress is not None:
                        progress(self)
        self.resim_budget_s = budget
        self.done = self.num_steps == len(steps)
        self.build_seconds = perf() - t_start
        if progress is not None:
            progress(self)

    def _thin(self) -> None:
        """Keep every other snapshot (the first always), halving their memory."""
        with self.lock:
            keep = self.snapshots[::2]
            self.snapshots = keep
            self._snap_steps = array("i", [s.step for s in keep])
            self.snapshot_bytes = sum(s.nbytes for s in keep)

    def _ingest(self, rec: StepRecord) -> None:
        """Record one step from the replay's record."""
        step = rec.step
        f = F_IDLE if rec.idle else 0
        life = self.life
        for rid in rec.arrivals:
            life.setdefault(rid, []).append(LifeEvent(step, "arrival"))
            f |= F_ARRIVAL
        if rec.preemptions:
            f |= F_PREEMPT
            self._preempt_first.append(self._next_preemption)
            for _ in rec.preemptions:
                self._add_preemption(self.preemptions[self._next_preemption])
                self._next_preemption += 1
        for a in rec.admitted:
            if a.resumed:
                f |= F_RESUME
                idx = self._open.pop(a.request, None)
                detail = "swapped in" if a.swapped_in else f"prefix hit {a.prefix_hit}"
                life[a.request].append(LifeEvent(step, "resumed", detail, idx))
            else:
                f |= F_ADMIT
                life[a.request].append(LifeEvent(step, "admitted", f"prefix hit {a.prefix_hit}"))
        if rec.blocked is not None:
            f |= F_BLOCKED
        for rid in rec.finished:
            f |= F_FINISH
            life[rid].append(LifeEvent(step, "finished"))
            self.finished_step[rid] = step
        for rid in rec.aborted:
            life.setdefault(rid, []).append(LifeEvent(step, "aborted"))
            self.finished_step[rid] = step
        if f:
            for kind, bit in EVENT_KINDS.items():
                if f & bit:
                    self.event_steps[kind].append(step)
        self.free_blocks.append(rec.free_blocks)
        self.kv_usage.append(rec.kv_usage)
        self.num_running.append(rec.num_running)
        self.num_waiting.append(rec.num_waiting)
        self.num_tokens.append(rec.num_scheduled_tokens)
        self.flags.append(f)
        self.num_steps = step + 1

    def _add_preemption(self, p: PreemptionRecord) -> None:
        self._open[p.victim] = p.index
        self.life[p.victim].append(LifeEvent(p.step, "preempted", f"by {p.trigger}", p.index))
        if not p.self_preemption and p.trigger in self.life:
            self.life[p.trigger].append(LifeEvent(p.step, "triggered", f"preempted {p.victim}",
                                                  p.index))

    # -- queries ---------------------------------------------------------------------
    @property
    def last_step(self) -> int:
        return self.num_steps - 1

    @property
    def source(self) -> Replay:
        return self.replay

    def arrival_step(self, rid: str) -> int | None:
        a = self._arrival.get(rid, -1)
        return a if a >= 0 else None

    def next_event(self, kind: str, step: int, forward: bool = True) -> int | None:
        """The first step after (before) `step` with an event of `kind`."""
        steps = self.event_steps[kind]
        if forward:
            i = bisect.bisect_right(steps, step)
            return steps[i] if i < len(steps) else None
        i = bisect.bisect_left(steps, step)
        return steps[i - 1] if i > 0 else None

    def next_request_event(
        self, rid: str, step: int, forward: bool = True, kinds: Iterable[str] | None = None
    ) -> int | None:
        events = self.life.get(rid, [])
        wanted = set(kinds) if kinds is not None else None
        seq = events if forward else reversed(events)
        for e in seq:
            if wanted is not None and e.kind not in wanted:
                continue
            if (e.step > step) if forward else (e.step < step):
                return e.step
        return None

    def preemptions_at(self, step: int) -> list[PreemptionRecord]:
        steps = self.event_steps["preemption"]
        i = bisect.bisect_left(steps, step)
        if i >= len(steps) or steps[i] != step:
            return []
        lo = self._preempt_first[i]
        hi = self._preempt_first[i + 1] if i + 1 < len(self._preempt_first) else self._next_preemption
        return self.preemptions[lo:hi]

    def last_preemption_before(self, rid: str, step: int) -> PreemptionRecord | None:
        for e in reversed(self.life.get(rid, [])):
            if e.step < step and e.kind == "preempted":
                return self.preemptions[e.preemption]  # type: ignore[index]
        return None

    def find_requests(self, query: str, limit: int = 20) -> list[str]:
        """Request ids equal to, starting with, then containing `query`."""
        q = query.strip()
        if not q:
            return []
        exact = [q] if q in self.life else []
        starts = [r for r in self.request_ids if r.startswith(q) and r != q]
        inside = [r for r in self.request_ids if q in r and not r.startswith(q)]
        return (exact + starts + inside)[:limit]

    def columns(self, lo: int, hi: int, width: int) -> list[tuple[int, int, float, int, int, int]]:
        """Bucket steps [lo, hi) into `width` columns: (first step, last step, max KV
        usage, max running, max waiting, preemptions) each."""
        out = []
        hi = min(hi, self.num_steps)
        if hi <= lo or width <= 0:
            return out
        span = hi - lo
        pre = self.event_steps["preemption"]
        for c in range(width):
            a = lo + span * c // width
            b = lo + span * (c + 1) // width
            if b <= a:
                b = a + 1
            if a >= hi:
                break
            b = min(b, hi)
            n_pre = bisect.bisect_left(pre, b) - bisect.bisect_left(pre, a)
            out.append((a, b - 1, max(self.kv_usage[a:b]), max(self.num_running[a:b]),
                        max(self.num_waiting[a:b]), n_pre))
        return out

    # -- wall-clock times, confidence and log lines (log replays) -----------------------
    @property
    def step_times(self) -> Sequence[float]:
        """Wall-clock start of every replayed step (epoch seconds; a log's server-local
        time read as UTC), or empty: a workload has no times."""
        return self.replay.clock or ()

    @property
    def has_times(self) -> bool:
        return len(self.step_times) > 0

    def step_time(self, step: int) -> float | None:
        times = self.step_times
        return times[step] if 0 <= step < len(times) else None

    def step_at_time(self, t: float) -> int:
        """The loaded step running at time `t`: the last one that started at or before
        it (step 0 for a time before the first step)."""
        times = self.step_times
        n = min(len(times), self.num_steps)
        return max(0, bisect.bisect_right(times, t, 0, n) - 1)

    def preemption_confidence(self, p: PreemptionRecord) -> str:
        return p.confidence

    def preemption_probability(self, p: PreemptionRecord) -> tuple[float, int] | None:
        """(probability, replays in the ensemble) behind `p.probability`; None without an
        ensemble (inference/ensemble.py)."""
        unc = self.replay.uncertainty
        if unc is None or p.probability is None:
            return None
        return p.probability, unc.samples + 1

    @property
    def headline(self) -> str | None:
        """What to trust in this replay and what not (None: nothing left open)."""
        unc = self.replay.uncertainty
        return unc.headline if unc is not None else None

    def nearest_log_steps(self, step: int) -> tuple[int | None, int | None]:
        """The closest steps before and after `step` that have log lines behind them."""
        lines = self.replay.log_lines
        if self._log_steps is None or len(self._log_steps) != len(lines):
            self._log_steps = array("q", sorted(lines))
        steps = self._log_steps
        i = bisect.bisect_left(steps, step)
        before = steps[i - 1] if i > 0 else None
        j = bisect.bisect_right(steps, step)
        after = steps[j] if j < len(steps) else None
        return before, after

    # -- full state of a step ----------------------------------------------------------
    def _preemption_counts(self, step: int) -> dict[str, int]:
        out: dict[str, int] = {}
        for p in self.preemptions:
            if p.step > step:
                break
            out[p.victim] = out.get(p.victim, 0) + 1
        return out

    def _state(self, eng: Any, step: int) -> EngineState:
        counts = self._preemption_counts(step) if isinstance(eng, V0Steps) else None
        return EngineState.of(eng, step, counts)

    def view(self, step: int) -> StepView:
        """The record of `step` and the state before and after it, rebuilt from the
        nearest snapshot (cached)."""
        if not 0 <= step < self.num_steps:
            raise IndexError(f"step {step} is not loaded (0..{self.num_steps - 1})")
        cached = self._cache.get(step)
        if cached is not None:
            self._cache.move_to_end(step)
            return cached
        with self._cursor_lock:
            eng = self._engine_at(step)
            prev = self._cache.get(step - 1)
            before = prev.after if prev is not None else self._state(eng, step - 1)
            rec = eng.step()
            if rec != self.replay.steps[step]:
                raise ReplayMismatch(f"the re-run differs from the replay at step {step}")
            scheduled, left = scheduled_tokens(eng)
            after = self._state(eng, step)
            self._cursor = None if eng.done else eng
        view = StepView(step, rec, before, after, self._classify(rec, scheduled, before, step),
                        self.preemptions_at(step), left)
        self._cache[step] = view
        if len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return view

    def engine_at(self, step: int) -> Any:
        """A fresh engine whose next step is `step` (for callers that want to drive it)."""
        with self._cursor_lock:
            eng = self._engine_at(step)
            self._cursor = None
            return eng

    def _engine_at(self, step: int) -> Any:
        with self.lock:
            i = bisect.bisect_right(self._snap_steps, step) - 1
            snap = self.snapshots[i]
        cur = self._cursor
        if cur is not None and snap.step <= cur.step_index <= step:
            eng = cur
        else:
            eng = self.codec.restore(snap)
        self._cursor = None
        while eng.step_index < step:
            eng.step()
        return eng

    def _classify(self, rec: StepRecord, scheduled: list[tuple[str, int]],
                  before: EngineState, step: int) -> list[Scheduled]:
        """Label each scheduled request: recompute while it re-computes tokens it had
        computed before its last preemption, prefill before its prompt is done, else
        decode. Labels only; the numbers are the replay's."""
        out = []
        hits = {a.request: a.prefix_hit for a in rec.admitted}
        for rid, n in scheduled:
            r = before.requests.get(rid)
            computed = hits[rid] if rid in hits else (r.num_computed_tokens if r is not None else 0)
            last = self.last_preemption_before(rid, step)
            high = last.computed_tokens_lost if last is not None else 0
            prompt = self.prompt_len.get(rid, 0)
            if computed < high:
                kind = "recompute"
                detail = f"{min(high, computed + n) - computed} of {high} lost"
            elif computed < prompt:
                kind = "prefill"
                detail = f"{computed + n}/{prompt}"
            else:
                kind = "decode"
                detail = ""
            if rid in hits and hits[rid]:
                detail = (detail + f" hit {hits[rid]}").strip()
            out.append(Scheduled(rid, n, kind, computed, detail))
        return out

    # -- accounting --------------------------------------------------------------------
    def memory_bytes(self) -> dict[str, int]:
        cols = sum(a.itemsize * len(a) for a in (self.free_blocks, self.kv_usage, self.num_running,
                                                 self.num_waiting, self.num_tokens))
        cols += len(self.flags) + sum(4 * len(a) for a in self.event_steps.values())
        return {"columns": cols, "snapshots": self.snapshot_bytes,
                "num_snapshots": len(self.snapshots)}
