"""Engine snapshots, so that any step's full state is rebuilt in bounded time (the TUI).

Snapshots are pickles, not `copy.deepcopy`: deepcopy (and a plain pickle) recurse along
the free-queue links and hit the recursion limit beyond a few hundred blocks. The V1 codec
stores the pool as arrays (ref counts, hashes, free-queue order), rebuilds the blocks on
restore, and shares what never changes during a run (workload, prompts, profile, hasher)
through a preset pickle memo, so a snapshot costs about one live request set. The V0
engine is small and has no free-queue links: it is pickled whole.
"""

from __future__ import annotations

import io
import pickle
import sys
import threading
from array import array
from dataclasses import dataclass
from typing import Any

from kvreplay.replay.block_pool import FreeKVCacheBlockQueue, KVCacheBlock
from kvreplay.replay.engine import Engine


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
                             engine.by_step, engine.aborts_at, engine.mid_aborts, engine.order,
                             engine.all_ids]
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
        # what the last step left for its observers is not state
        last = (e.last_output, e.last_sample_ids, e.last_update)
        e.last_output, e.last_sample_ids, e.last_update = None, [], None
        try:
            p.dump(e)
        finally:
            e.last_output, e.last_sample_ids, e.last_update = last
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




class PickleCodec:
    """Snapshots of an engine pickled whole (the V0 engine)."""

    def __init__(self, engine: Any, lock: threading.RLock) -> None:
        self.master = engine
        self.lock = lock

    def take(self) -> Snapshot:
        e = self.master
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(max(limit, 20000))
        try:
            blob = pickle.dumps(e, protocol=pickle.HIGHEST_PROTOCOL)
        finally:
            sys.setrecursionlimit(limit)
        return Snapshot(e.step_index, blob, array("i"), None, array("i"), 0)

    def restore(self, snap: Snapshot) -> Any:
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(max(limit, 20000))
        try:
            return pickle.loads(snap.blob)
        finally:
            sys.setrecursionlimit(limit)
