"""A replay run once and kept for random access: the model behind `kvreplay tui`.

`Timeline.build()` runs the engine once and keeps
- compact per-step columns (free blocks, KV usage, running/waiting counts, tokens, event
  flags) and sorted event-step arrays, so the timeline and next/previous-event jumps are a
  bisect away;
- every preemption with its details, completed when the victim is readmitted;
- each request's life (arrival, admission, preemptions, resumes, finish);
- periodic engine snapshots. `view(step)` restores the nearest snapshot at or before the
  step and re-simulates to it, so any step's full state (block map, queue order) is
  rebuilt in a bounded time.

Nothing here decides anything: every value comes from the engine's trace records or its
live state. No UI imports (the core never imports textual).

Snapshots are pickles, not `copy.deepcopy`: deepcopy (and a plain pickle) recurse along
the free-queue links and hit the recursion limit beyond a few hundred blocks. The codec
stores the pool as arrays (ref counts, hashes, free-queue order), rebuilds the blocks on
restore, and shares what never changes during a run (workload, prompts, profile, hasher)
through a preset pickle memo, so a snapshot costs about one live request set.
"""

from __future__ import annotations

import bisect
import io
import pickle
import threading
import time
from array import array
from collections import OrderedDict
from itertools import islice
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from kvreplay.replay.block_pool import FreeKVCacheBlockQueue, KVCacheBlock
from kvreplay.replay.engine import Engine

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

# Block states in the block map.
NULL, FREE, CACHED, HELD, SHARED = range(5)
BLOCK_STATE_NAMES = ("null", "free", "cached", "held", "shared")

DEFAULT_RESIM_BUDGET_S = 0.004  # simulated time between snapshots (bounds a rebuild)
DEFAULT_SNAPSHOT_CAP = 96 << 20  # bytes of snapshots before thinning them out


# -- snapshots -----------------------------------------------------------------------
@dataclass(slots=True)
class Snapshot:
    step: int  # engine.step_index: the next step to run
    blob: bytes
    refs: array
    hashes: array | list | None
    free: array
    n_events: int

    @property
    def nbytes(self) -> int:
        h = 0 if self.hashes is None else len(self.hashes) * 8
        return len(self.blob) + self.refs.itemsize * len(self.refs) + h + 4 * len(self.free)


class SnapshotCodec:
    """Snapshots of one running Engine (the master) and engines restored from them.

    A restored engine resumes to the identical trace. Its summary holds what the master's
    held at the snapshot (the containers that grow with the run are rebuilt from the
    master's, so a snapshot's size does not grow with the run)."""

    def __init__(self, engine: Engine, lock: threading.RLock) -> None:
        self.master = engine
        self.lock = lock
        sched = engine.scheduler
        pool = sched.pool
        self.n_blocks = len(pool.blocks)
        self.null_id = pool.null_block.block_id if pool.null_block is not None else None
        s = engine.summary
        # memo layout: blocks, the free queue, the summary's growing containers, shared.
        self._per_restore = [*pool.blocks, pool.free_block_queue, s.preemption_events,
                             s.finished_step, s.first_scheduled_step, s.first_token_step,
                             s.preemptions_per_request]
        shared: list[Any] = [engine.workload, engine.profile, sched.profile, sched.config,
                             engine.by_step, engine.order, engine.all_ids]
        if engine.block_hasher is not None:
            shared.append(engine.block_hasher)
        shared += [spec.prompt_token_ids for spec in engine.workload.requests]
        seen: set[int] = {id(o) for o in self._per_restore}
        self._shared: list[Any] = []
        for o in shared:
            if id(o) not in seen:
                seen.add(id(o))
                self._shared.append(o)
        # persistent ids: 0..n-1 blocks, then the queue, the summary containers, shared
        self._pids = {id(o): i for i, o in enumerate(self._per_restore + self._shared)}

    def take(self) -> Snapshot:
        e = self.master
        pool = e.scheduler.pool
        blocks = pool.blocks
        refs = array("i", [b.ref_cnt for b in blocks])
        hashes: array | list | None = None
        if pool.enable_caching:
            raw = [b.block_hash for b in blocks]
            try:
                hashes = array("q", [-1 if h is None else h for h in raw])
                if any(h is not None and h < 0 for h in raw):
                    hashes = raw
            except (TypeError, OverflowError):
                hashes = raw
        free = array("i", pool.free_block_queue.block_ids())
        buf = io.BytesIO()
        p = pickle.Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL)
        pids = self._pids
        p.persistent_id = lambda obj: pids.get(id(obj))  # type: ignore[method-assign]
        p.dump(e)
        return Snapshot(e.step_index, buf.getvalue(), refs, hashes, free,
                        len(e.summary.preemption_events))

    def restore(self, snap: Snapshot) -> Engine:
        blocks = [KVCacheBlock(i) for i in range(self.n_blocks)]
        for b, r in zip(blocks, snap.refs):
            b.ref_cnt = r
        if snap.hashes is not None:
            if isinstance(snap.hashes, array):
                for b, h in zip(blocks, snap.hashes):
                    if h >= 0:
                        b.block_hash = h
            else:
                for b, h in zip(blocks, snap.hashes):
                    b.block_hash = h
        if self.null_id is not None:
            blocks[self.null_id].is_null = True
        queue = FreeKVCacheBlockQueue(blocks[i] for i in snap.free)
        s = snap.step
        ms = self.master.summary
        with self.lock:
            events = ms.preemption_events[: snap.n_events]
            finished = {k: v for k, v in ms.finished_step.items() if v < s}
            first_sched = {k: v for k, v in ms.first_scheduled_step.items() if v < s}
            first_tok = {k: v for k, v in ms.first_token_step.items() if v < s}
            per_req = dict.fromkeys(ms.preemptions_per_request, 0)
        for ev in events:
            per_req[ev["req"]] += 1
        table = [*blocks, queue, events, finished, first_sched, first_tok, per_req,
                 *self._shared]
        u = pickle.Unpickler(io.BytesIO(snap.blob))
        u.persistent_load = table.__getitem__  # type: ignore[method-assign]
        return u.load()


# -- records -------------------------------------------------------------------------
@dataclass(slots=True)
class Preemption:
    """One preemption-by-recompute, as the replay decided it."""

    index: int  # ordinal in the run
    step: int
    victim: str
    trigger: str
    self_preempt: bool
    victim_rule: str
    computed_lost: int  # victim's num_computed_tokens thrown away
    num_tokens: int
    num_output_tokens: int
    blocks_held_before: int
    free_blocks_before: int
    free_blocks_after: int
    blocks_needed: int | None
    free_blocks_at_failure: int | None
    rolled_back_tokens: int
    was_scheduled_this_step: bool
    nth_of_victim: int  # 1 for the victim's first preemption
    readmitted_step: int | None = None
    prefix_hit_at_readmission: int | None = None

    @property
    def recompute_tokens(self) -> int | None:
        """Tokens the victim had computed that it must compute again (lost - cache hit)."""
        if self.prefix_hit_at_readmission is None:
            return None
        return max(self.computed_lost - self.prefix_hit_at_readmission, 0)

    @property
    def reprefill_tokens(self) -> int | None:
        """Tokens prefilled again at readmission (its sequence minus the cache hit)."""
        if self.prefix_hit_at_readmission is None:
            return None
        return max(self.num_tokens - self.prefix_hit_at_readmission, 0)

    @property
    def waited_steps(self) -> int | None:
        return None if self.readmitted_step is None else self.readmitted_step - self.step


@dataclass(slots=True)
class LifeEvent:
    step: int
    kind: str  # arrival | admitted | preempted | triggered | resumed | finished
    detail: str = ""
    preemption: int | None = None  # index into Timeline.preemptions


@dataclass(slots=True)
class RequestState:
    rid: str
    status: str
    priority: int
    num_prompt_tokens: int
    num_tokens: int
    num_computed_tokens: int
    num_preemptions: int
    blocks: tuple[int, ...]

    @property
    def num_output_tokens(self) -> int:
        return self.num_tokens - self.num_prompt_tokens


@dataclass(slots=True)
class EngineState:
    """The scheduler's state between two steps, copied out of a live engine."""

    step: int  # state after this step (-1: before step 0)
    running: list[str]
    waiting: list[str]
    requests: dict[str, RequestState]
    block_states: bytes  # one code per block: NULL FREE CACHED HELD SHARED
    block_refs: array
    owners: dict[int, list[str]]  # block id -> requests whose table holds it
    free_queue: list[int]  # eviction order
    free_blocks: int
    kv_usage: float
    cached_blocks: int

    @classmethod
    def of(cls, engine: Engine, step: int) -> "EngineState":
        sched = engine.scheduler
        pool = sched.pool
        kv = sched.kv_cache_manager
        refs = array("i", [b.ref_cnt for b in pool.blocks])
        states = bytearray(len(refs))
        for b in pool.blocks:
            i = b.block_id
            if b.is_null:
                states[i] = NULL
            elif b.ref_cnt == 0:
                states[i] = FREE if b.block_hash is None else CACHED
            else:
                states[i] = HELD if b.ref_cnt == 1 else SHARED
        owners: dict[int, list[str]] = {}
        reqs: dict[str, RequestState] = {}
        for r in sorted(sched.requests.values(), key=lambda r: r.index):
            table = kv.req_to_blocks.get(r.request_id) or ()
            ids = tuple(b.block_id for b in table)
            for i in ids:
                owners.setdefault(i, []).append(r.request_id)
            reqs[r.request_id] = RequestState(
                r.request_id, r.status.name, r.priority, r.num_prompt_tokens, r.num_tokens,
                r.num_computed_tokens, r.num_preemptions, ids,
            )
        return cls(
            step=step,
            running=[r.request_id for r in sched.running],
            waiting=[r.request_id for r in sched.waiting],
            requests=reqs,
            block_states=bytes(states),
            block_refs=refs,
            owners=owners,
            free_queue=pool.free_block_queue.block_ids(),
            free_blocks=pool.get_num_free_blocks(),
            kv_usage=round(sched.kv_cache_usage, 6),
            cached_blocks=pool.num_cached_hashes(),
        )

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(BLOCK_STATE_NAMES, 0)
        for c in self.block_states:
            out[BLOCK_STATE_NAMES[c]] += 1
        return out


@dataclass(slots=True)
class Scheduled:
    rid: str
    tokens: int
    kind: str  # prefill | decode | recompute
    computed_before: int
    detail: str = ""


@dataclass(slots=True)
class StepView:
    """Everything about one step: its trace record and the state before and after it."""

    step: int
    record: dict[str, Any]
    before: EngineState
    after: EngineState
    scheduled: list[Scheduled]
    preemptions: list[Preemption]


@dataclass(slots=True)
class StateDiff:
    a: int
    b: int
    blocks: list[tuple[int, str, str]]  # block id, "state owners" in a, in b
    added: list[str]
    removed: list[str]
    changed: list[tuple[str, str, Any, Any]]  # rid, field, a, b
    running: tuple[list[str], list[str]]
    waiting: tuple[list[str], list[str]]
    counters: list[tuple[str, Any, Any]]


def diff_states(a: EngineState, b: EngineState) -> StateDiff:
    blocks = []
    for i, (sa, sb) in enumerate(zip(a.block_states, b.block_states)):
        oa, ob = a.owners.get(i, []), b.owners.get(i, [])
        if sa != sb or oa != ob:
            blocks.append((i, _block_desc(sa, oa), _block_desc(sb, ob)))
    added = [r for r in b.requests if r not in a.requests]
    removed = [r for r in a.requests if r not in b.requests]
    changed = []
    for rid, rb in b.requests.items():
        ra = a.requests.get(rid)
        if ra is None:
            continue
        for f in ("status", "num_computed_tokens", "num_tokens", "num_preemptions"):
            va, vb = getattr(ra, f), getattr(rb, f)
            if va != vb:
                changed.append((rid, f, va, vb))
        if len(ra.blocks) != len(rb.blocks):
            changed.append((rid, "blocks", len(ra.blocks), len(rb.blocks)))
    counters = [
        (name, getattr(a, name), getattr(b, name))
        for name in ("free_blocks", "kv_usage", "cached_blocks")
        if getattr(a, name) != getattr(b, name)
    ]
    return StateDiff(a.step, b.step, blocks, added, removed, changed,
                     (a.running, b.running), (a.waiting, b.waiting), counters)


def _block_desc(state: int, owners: list[str]) -> str:
    name = BLOCK_STATE_NAMES[state]
    return f"{name} {','.join(owners)}" if owners else name


# -- the timeline --------------------------------------------------------------------
class Cancelled(Exception):
    pass


class Timeline:
    """One replay, run once, with instant random access (see the module docstring)."""

    def __init__(
        self,
        source: Any,
        *,
        snapshot_every: int | None = None,
        resim_budget_s: float = DEFAULT_RESIM_BUDGET_S,
        snapshot_cap: int = DEFAULT_SNAPSHOT_CAP,
        cache_size: int = 48,
    ) -> None:
        self.source = source
        self.engine: Engine = source.engine()
        self.lock = threading.RLock()
        self.codec = SnapshotCodec(self.engine, self.lock)
        sched = self.engine.scheduler
        self.config = sched.config
        self.profile = sched.profile
        self.num_blocks = len(sched.pool.blocks)
        self.request_ids: list[str] = list(self.engine.all_ids)
        self.prompt_len = {r.id: len(r.prompt_token_ids) for r in self.engine.workload.requests}
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
        self.preemptions: list[Preemption] = []
        self._preempt_first = array("i")  # parallel to event_steps["preemption"]
        self.life: dict[str, list[LifeEvent]] = {rid: [] for rid in self.request_ids}
        self._open: dict[str, Preemption] = {}
        self.snapshots: list[Snapshot] = []
        self._snap_steps = array("i")
        self.snapshot_bytes = 0
        self.num_steps = 0  # steps loaded
        self.done = False
        self.cancelled = False
        self._cache: OrderedDict[int, StepView] = OrderedDict()
        self._cursor: Engine | None = None  # a scratch engine, step_index = next step
        self._cursor_lock = threading.Lock()
        self.build_seconds = 0.0
        self._log_steps: array | None = None  # sorted steps of source.log_lines

    # -- building --------------------------------------------------------------------
    def build(
        self,
        *,
        progress: Callable[["Timeline"], None] | None = None,
        cancelled: Callable[[], bool] | None = None,
        progress_every_s: float = 0.1,
        max_steps: int | None = None,
    ) -> None:
        """Run the replay to the end (or until `cancelled()` is true). Safe to call from a
        worker thread while another thread reads the timeline."""
        engine = self.engine
        codec = self.codec
        lock = self.lock
        step_fn = engine.step
        ingest = self._ingest
        sched = engine.scheduler
        by_step = engine.by_step
        finished = engine.summary.finished_step
        perf = time.perf_counter
        t_start = t_last = t_snap = perf()
        every = self.snapshot_every
        budget = self.resim_budget_s
        since_snap = 0
        while not engine.done:
            if max_steps is not None and self.num_steps >= max_steps:
                break
            if every is not None:
                due = since_snap >= every or not self.snapshots
            else:
                due = not self.snapshots or (since_snap >= 8 and perf() - t_snap >= budget)
            if due:
                with lock:
                    snap = codec.take()
                self.snapshots.append(snap)
                self._snap_steps.append(snap.step)
                self.snapshot_bytes += snap.nbytes
                if self.snapshot_bytes > self.snapshot_cap:
                    self._thin()
                    budget *= 2
                since_snap = 0
                t_snap = perf()
            with lock:
                step = engine.step_index
                arrivals = by_step.get(step, ())
                idle = not arrivals and not sched.has_requests() and not engine.batch_queue
                n_fin = len(finished)
                step_fn(trace=False)
                if len(finished) > n_fin:
                    fin = list(islice(reversed(finished), len(finished) - n_fin))
                    fin.reverse()
                else:
                    fin = []
                ingest(step, arrivals, engine.last_output, fin, idle)
            since_snap += 1
            if (since_snap & 255) == 0:
                now = perf()
                if now - t_last >= progress_every_s:
                    t_last = now
                    if cancelled is not None and cancelled():
                        self.cancelled = True
                        break
                    if progress is not None:
                        progress(self)
        self.resim_budget_s = budget
        self.done = engine.done
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

    def _ingest(self, step: int, arrivals: Any, out: Any, fin: list[str], idle: bool) -> None:
        """Record one step from what the engine just did: its SchedulerOutput (the object
        its trace record is made from), the arrivals and the finished ids."""
        f = F_IDLE if idle else 0
        life = self.life
        for _idx, spec in arrivals:
            life[spec.id].append(LifeEvent(step, "arrival"))
            f |= F_ARRIVAL
        tokens = 0
        if out is not None:
            tokens = out.total_num_scheduled_tokens
            pre = out.preemptions
            if pre:
                f |= F_PREEMPT
                self._preempt_first.append(len(self.preemptions))
                for p in pre:
                    self._add_preemption(step, p)
            hits = out.prefix_hit_tokens
            if out.new_req_ids:
                f |= F_ADMIT
                for rid in out.new_req_ids:
                    life[rid].append(LifeEvent(step, "admitted", f"prefix hit {hits.get(rid, 0)}"))
            if out.resumed_req_ids:
                f |= F_RESUME
                for rid in out.resumed_req_ids:
                    pr = self._open.pop(rid, None)
                    hit = hits.get(rid, 0)
                    if pr is not None:
                        pr.readmitted_step = step
                        pr.prefix_hit_at_readmission = hit
                    life[rid].append(LifeEvent(step, "resumed", f"prefix hit {hit}",
                                               pr.index if pr is not None else None))
            if out.admission_blocked is not None:
                f |= F_BLOCKED
        if fin:
            f |= F_FINISH
            for rid in fin:
                life[rid].append(LifeEvent(step, "finished"))
        if f:
            for kind, bit in EVENT_KINDS.items():
                if f & bit:
                    self.event_steps[kind].append(step)
        sched = self.engine.scheduler
        self.free_blocks.append(sched.pool.free_block_queue.num_free_blocks)
        self.kv_usage.append(sched.kv_cache_usage)
        self.num_running.append(len(sched.running))
        self.num_waiting.append(len(sched.waiting))
        self.num_tokens.append(tokens)
        self.flags.append(f)
        self.num_steps = step + 1

    def _add_preemption(self, step: int, p: dict[str, Any]) -> None:
        life = self.life
        victim = p["req"]
        nth = sum(1 for e in life[victim] if e.kind == "preempted") + 1
        pr = Preemption(
            index=len(self.preemptions), step=step, victim=victim,
            trigger=p["trigger"], self_preempt=p["self_preempt"],
            victim_rule=p.get("victim_rule", ""),
            computed_lost=p["num_computed_tokens_before"], num_tokens=p["num_tokens"],
            num_output_tokens=p["num_output_tokens"],
            blocks_held_before=p["blocks_held_before"],
            free_blocks_before=p["free_blocks_before"],
            free_blocks_after=p["free_blocks_after"],
            blocks_needed=p.get("blocks_needed"),
            free_blocks_at_failure=p.get("free_blocks_at_failure"),
            rolled_back_tokens=p.get("rolled_back_tokens", 0),
            was_scheduled_this_step=p.get("was_scheduled_this_step", False),
            nth_of_victim=nth,
        )
        self.preemptions.append(pr)
        self._open[victim] = pr
        life[victim].append(LifeEvent(step, "preempted", f"by {pr.trigger}", pr.index))
        if not pr.self_preempt:
            life[pr.trigger].append(LifeEvent(step, "triggered", f"preempted {victim}", pr.index))

    # -- queries ---------------------------------------------------------------------
    @property
    def last_step(self) -> int:
        return self.num_steps - 1

    @property
    def summary(self):
        return self.engine.summary

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

    def preemptions_at(self, step: int) -> list[Preemption]:
        steps = self.event_steps["preemption"]
        i = bisect.bisect_left(steps, step)
        if i >= len(steps) or steps[i] != step:
            return []
        lo = self._preempt_first[i]
        hi = self._preempt_first[i + 1] if i + 1 < len(self._preempt_first) else len(self.preemptions)
        return self.preemptions[lo:hi]

    def last_preemption_before(self, rid: str, step: int) -> Preemption | None:
        for e in reversed(self.life.get(rid, [])):
            if e.step < step and e.kind == "preempted":
                return self.preemptions[e.preemption]  # type: ignore[index]
        return None

    def find_requests(self, query: str, limit: int = 20) -> list[str]:
        """Request ids equal to, starting with, then containing `query`."""
        q = query.strip()
        if not q:
            return []
        if q in self.life:
            exact = [q]
        else:
            exact = []
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

    # -- wall-clock times and log lines (log sources) ----------------------------------
    @property
    def step_times(self) -> Sequence[float]:
        """Wall-clock start of every replayed step (epoch seconds; a log's server-local
        time read as UTC), or empty: a workload has no times."""
        extra = getattr(self.source, "extra", None) or {}
        return extra.get("step_times") or ()

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

    def preemption_confidence(self, p: Preemption) -> str:
        """How much to trust this preemption: the log replay's own word for its step,
        else the source's overall confidence ("exact" for a workload)."""
        src = self.source
        per = (getattr(src, "extra", None) or {}).get("preemption_confidence") or {}
        return per.get(p.step) or getattr(src, "confidence", None) or "exact"

    def preemption_support(self, p: Preemption) -> tuple[float, int] | None:
        """(share, replays): how many of the log replay's alternative placements find this
        preemption too (from_log.add_support); None when not measured."""
        extra = getattr(self.source, "extra", None) or {}
        k = extra.get("support_replays") or 0
        share = (extra.get("preemption_support") or {}).get((p.step, p.victim))
        return None if not k or share is None else (share, k)

    def nearest_log_steps(self, step: int) -> tuple[int | None, int | None]:
        """The closest steps before and after `step` that have log lines behind them."""
        lines = getattr(self.source, "log_lines", None) or {}
        if self._log_steps is None or len(self._log_steps) != len(lines):
            self._log_steps = array("q", sorted(lines))
        steps = self._log_steps
        i = bisect.bisect_left(steps, step)
        before = steps[i - 1] if i > 0 else None
        j = bisect.bisect_right(steps, step)
        after = steps[j] if j < len(steps) else None
        return before, after

    # -- full state of a step ----------------------------------------------------------
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
            before = prev.after if prev is not None else EngineState.of(eng, step - 1)
            rec = eng.step(trace=True)
            after = EngineState.of(eng, step)
            self._cursor = None if eng.done else eng
        view = StepView(step, rec, before, after, self._classify(rec, before, step),
                        self.preemptions_at(step))
        self._cache[step] = view
        if len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return view

    def engine_at(self, step: int) -> Engine:
        """A fresh engine whose next step is `step` (for callers that want to drive it)."""
        with self._cursor_lock:
            eng = self._engine_at(step)
            self._cursor = None
            return eng

    def _engine_at(self, step: int) -> Engine:
        with self.lock:
            i = bisect.bisect_right(self._snap_steps, step) - 1
            snap = self.snapshots[i]
        cur = self._cursor
        if cur is not None and snap.step <= cur.step_index <= step:
            eng = cur
        else:
            eng = self.codec.restore(snap)
        self._cursor = None
        run = eng.step
        while eng.step_index < step:
            run(trace=False)
        return eng

    def _classify(self, rec: dict[str, Any], before: EngineState, step: int) -> list[Scheduled]:
        """Label each scheduled request: recompute while it re-computes tokens it had
        computed before its last preemption, prefill before its prompt is done, else
        decode. Labels only; the numbers are the replay's."""
        out = []
        hits = rec.get("prefix_hit_tokens") or {}
        for rid, n in rec.get("scheduled", ()):
            r = before.requests.get(rid)
            if rid in hits:
                computed = hits[rid]
            else:
                computed = r.num_computed_tokens if r is not None else 0
            last = self.last_preemption_before(rid, step)
            high = last.computed_lost if last is not None else 0
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
