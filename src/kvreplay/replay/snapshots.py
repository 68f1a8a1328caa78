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
import zlib
from array import array
from operator import attrgetter
from dataclasses import dataclass
from typing import Any

from kvreplay.replay.block_pool import FreeKVCacheBlockQueue, KVCacheBlock
from kvreplay.replay.engine import Engine


@dataclass(slots=True)
class Snapshot:
    step: int  # engine.step_index: the next step to run
    blob: bytes  # zlib: the engine's pickle (blocks, queue and tables by block id)
    refs: bytes  # zlib: array of every block's ref count (V1; empty for V0)
    hashes: array | list | None
    free: bytes  # zlib: array of the free queue's block ids, in order
    n_events: int

    @property
    def nbytes(self) -> int:
        h = 0 if self.hashes is None else len(self.hashes) * 8
        return len(self.blob) + len(self.refs) + h + len(self.free)


_NO_OUTPUTS: list[int] = []  # stands for a request's output tokens inside a snapshot
_block_id = attrgetter("block_id")


class SnapshotCodec:
    """Snapshots of one running Engine (the master) and engines restored from them.

    A restored engine resumes to the identical trace. Its summary holds what the master's
    held at the snapshot (the containers that grow with the run are rebuilt from the
    master's, so a snapshot's size does not grow with the run).

    NOTE: what a snapshot leaves out is made again on restore: the blocks (from the ref
    count and hash arrays), the free-queue links (from its order), each block table (from
    its block ids) and each request's output tokens (the fake model's, a function of
    their number: Workload.fake_outputs). At 128 running long decodes that is 40-60 KiB a
    snapshot instead of 1.3 MiB."""

    def __init__(self, engine: Engine, lock: threading.RLock) -> None:
        self.master = engine
        self.lock = lock
        sched = engine.scheduler
        pool = sched.pool
        self.n_blocks = len(pool.blocks)
        self.id_code = "H" if self.n_blocks < 1 << 16 else "i"
        self.null_id = pool.null_block.block_id if pool.null_block is not None else None
        s = engine.summary
        # memo layout: the block list, the free queue, the containers that grow with the
        # run (summary, arrival steps), shared.
        self._per_restore = [pool.blocks, pool.free_block_queue, s.preemption_events,
                             s.finished_step, s.first_scheduled_step, s.first_token_step,
                             s.preemptions_per_request, engine.arrival_step]
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
        # persistent ids: a block is ("b", its id), the rest their index in the restore table
        self._pids: dict[int, Any] = {id(b): ("b", b.block_id) for b in pool.blocks}
        self._pids.update((id(o), i) for i, o in enumerate(self._per_restore + self._shared))

    def take(self) -> Snapshot:
        e = self.master
        pool = e.scheduler.pool
        kv = e.scheduler.kv_cache_manager
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
        free = array(self.id_code, pool.free_block_queue.block_ids())
        buf = io.BytesIO()
        p = pickle.Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL)
        pids = self._pids.get
        p.persistent_id = lambda obj: pids(id(obj))  # type: ignore[method-assign]
        # what the last step left for its observers is not state
        last = (e.last_output, e.last_sample_ids, e.last_update)
        e.last_output, e.last_sample_ids, e.last_update = None, [], None
        live = list(e.scheduler.requests.values())
        outputs = [r.output_token_ids for r in live]
        for r in live:
            r.output_token_ids = _NO_OUTPUTS
        tables = kv.req_to_blocks
        code = self.id_code
        kv.req_to_blocks = {rid: array(code, map(_block_id, t))  # type: ignore[misc]
                            for rid, t in tables.items()}
        try:
            p.dump(e)
        finally:
            e.last_output, e.last_sample_ids, e.last_update = last
            kv.req_to_blocks = tables
            for r, out in zip(live, outputs):
                r.output_token_ids = out
        return Snapshot(e.step_index, zlib.compress(buf.getvalue(), 1),
                        zlib.compress(refs.tobytes(), 1), hashes,
                        zlib.compress(free.tobytes(), 1), len(e.summary.preemption_events))

    def restore(self, snap: Snapshot) -> Engine:
        blocks = [KVCacheBlock(i) for i in range(self.n_blocks)]
        refs = array("i")
        refs.frombytes(zlib.decompress(snap.refs))
        for b, r in zip(blocks, refs):
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
        free = array(self.id_code)
        free.frombytes(zlib.decompress(snap.free))
        queue = FreeKVCacheBlockQueue(blocks[i] for i in free)
        s = snap.step
        ms = self.master.summary
        with self.lock:
            events = ms.preemption_events[: snap.n_events]
            finished = {k: v for k, v in ms.finished_step.items() if v < s}
            first_sched = {k: v for k, v in ms.first_scheduled_step.items() if v < s}
            first_tok = {k: v for k, v in ms.first_token_step.items() if v < s}
            per_req = dict.fromkeys(ms.preemptions_per_request, 0)
            arrived = [a if a < s else -1 for a in self.master.arrival_step]
        for ev in events:
            per_req[ev["req"]] += 1
        table = [blocks, queue, events, finished, first_sched, first_tok, per_req, arrived,
                 *self._shared]

        def persistent_load(pid: Any) -> Any:
            return blocks[pid[1]] if type(pid) is tuple else table[pid]

        u = pickle.Unpickler(io.BytesIO(zlib.decompress(snap.blob)))
        u.persistent_load = persistent_load  # type: ignore[method-assign]
        eng = u.load()
        kv = eng.scheduler.kv_cache_manager
        kv.req_to_blocks = {rid: [blocks[i] for i in ids] for rid, ids in kv.req_to_blocks.items()}
        fake = eng.workload.fake_outputs
        for r in eng.scheduler.requests.values():
            r.output_token_ids = fake(r.num_output_tokens)
        return eng


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
        return Snapshot(e.step_index, blob, b"", None, b"", 0)

    def restore(self, snap: Snapshot) -> Any:
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(max(limit, 20000))
        try:
            return pickle.loads(snap.blob)
        finally:
            sys.setrecursionlimit(limit)
