"""V0 prefix caching: `PrefixCachingAllocator` (content-addressed blocks shared by ref count)
and its `LRUEvictor` of freed cached blocks (spec B "Prefix caching in V0"). Comments marked
"0.6.6 source" are as described in blocks.py.
"""
from __future__ import annotations

import heapq
from typing import Dict, List, Optional, Set, Tuple

from .allocator import Block, InvariantError, NaiveAllocator, NoFreeBlocksError, TerminalError


class LRUEvictor:
    """Freed cached blocks, evicted least recently accessed first; ties: more hashed tokens
    first, then lower block id (spec B "Prefix caching in V0").

    0.6.6 source (`LRUEvictor`): a table block_id -> (hash, hashed tokens, last access) plus
    a lazy min-heap of (last_accessed, -hashed_tokens, block_id, hash). `remove` and `update`
    only touch the table; a heap entry is valid at eviction time only if its block is still in
    the table with the same last-access time. The heap is rebuilt from the table when it grows
    past 50x the table. We keep the same structure so stale entries behave the same.
    """

    CLEANUP_THRESHOLD = 50

    def __init__(self) -> None:
        self.free_table: Dict[int, List] = {}     # block_id -> [hash, num_tokens, last_accessed]
        self.heap: List[Tuple[float, int, int, int]] = []

    def __contains__(self, block_id: int) -> bool:
        return block_id in self.free_table

    @property
    def num_blocks(self) -> int:
        return len(self.free_table)

    def add(self, block_id: int, content_hash: int, num_tokens: int, last_accessed: float) -> None:
        self.free_table[block_id] = [content_hash, num_tokens, last_accessed]
        heapq.heappush(self.heap, (last_accessed, -num_tokens, block_id, content_hash))
        if len(self.heap) > self.CLEANUP_THRESHOLD * len(self.free_table):
            self.heap = [(m[2], -m[1], b, m[0]) for b, m in self.free_table.items()]
            heapq.heapify(self.heap)

    def update(self, block_id: int, last_accessed: float) -> None:
        self.free_table[block_id][2] = last_accessed

    def remove(self, block_id: int) -> None:
        if block_id not in self.free_table:
            raise InvariantError("remove of a block that is not in the evictor")
        del self.free_table[block_id]

    def evict(self) -> Tuple[int, int]:
        while self.heap:
            ts, _, block_id, h = heapq.heappop(self.heap)
            meta = self.free_table.get(block_id)
            if meta is not None and meta[2] == ts:
                del self.free_table[block_id]
                return block_id, h
        raise InvariantError("evictor has no valid entry (vLLM: 'No usable cache memory left')")


class _Tracker:
    __slots__ = ("active", "last_accessed", "computed")

    def __init__(self) -> None:
        self.active = False
        self.last_accessed = -1.0
        self.computed = False


class PrefixCachingAllocator(NaiveAllocator):
    """Content-addressed blocks: hash -> block id, hit blocks shared by ref count, freed full
    blocks parked in an `LRUEvictor` and still counted as free (spec B "Prefix caching in V0").

    0.6.6 source (`PrefixCachingBlockAllocator`), the parts that change decisions:
    * a new id comes from the never-cached free list first (same LIFO deque as the naive
      allocator), and only then by evicting from the evictor, which drops that block's hash;
    * a full block is registered ("promoted") when it is filled, at allocation or when a
      decode append fills it. If the same content is already registered, the block gives its
      own id back and shares the registered one (dedup);
    * a block counts as "computed" for prefix lookups when it was a cache hit, or when
      `mark_blocks_as_computed` ran after the schedule() that registered it; a block sitting
      in the evictor is computed;
    * per-block last-access time is reset to -1 whenever the block is (re)activated, and is
      written only when a sequence holding it is freed, with that sequence's last schedule time.
    """

    caching = True

    def __init__(self, block_ids: List[int], block_size: int) -> None:
        super().__init__(block_ids, block_size)
        self.cached: Dict[int, int] = {}           # content hash -> block id
        self.touched: Set[int] = set()
        self.tracker: Dict[int, _Tracker] = {b: _Tracker() for b in block_ids}
        self.evictor = LRUEvictor()

    def _track(self, b: int, computed: bool) -> None:
        t = self.tracker[b]
        if t.active:
            raise InvariantError(f"block {b} tracked twice")
        t.active, t.last_accessed, t.computed = True, -1.0, computed

    def _untrack(self, b: int) -> None:
        t = self.tracker[b]
        if not t.active:
            raise InvariantError(f"block {b} untracked twice")
        t.active, t.last_accessed, t.computed = False, -1.0, False

    def allocate_id(self) -> int:
        if self.free_ids:                       # never-cached blocks first
            b = super().allocate_id()
            self._track(b, computed=False)
            return b
        if self.evictor.num_blocks == 0:
            raise NoFreeBlocksError()
        b, h = self.evictor.evict()             # then evict: the block loses its hash
        if self.cached.get(h) != b or self.refcount[b] != 0:
            # 0.6.6 asserts this too (_maybe_allocate_evicted_block_id) and stops. Reached
            # with prefix caching + swap when a swapped-in block's content is cached on
            # another block that is in use (found by tests/unit/replay/test_v0_properties.py; vLLM
            # 0.6.6.post1's own scheduler fails the same assertion on that workload).
            raise TerminalError(
                "AssertionError", "assert self._refcounter.get(_block_id) == 0 "
                "(prefix_caching_block.py, _maybe_allocate_evicted_block_id)", None)
        del self.cached[h]
        self.refcount[b] += 1
        self._track(b, computed=False)
        return b

    def _incr_cached(self, block: Block) -> None:
        b = block.block_id
        assert b is not None
        self.refcount[b] += 1
        if self.refcount[b] == 1:
            if b in self.evictor:
                self.evictor.remove(b)
            self._track(b, computed=True)

    def _free_hashless(self, block: Block) -> None:
        b = block.block_id
        assert b is not None
        if self.refcount[b] == 1:
            self._untrack(b)
        super().free_id(b)

    def _free_block_id(self, block: Block) -> None:
        b = block.block_id
        assert b is not None
        h = block.content_hash
        if h is None:
            self._free_hashless(block)
        else:
            rc = self.refcount[b] - 1
            if rc < 0:
                raise InvariantError(f"ref count of block {b} below 0")
            self.refcount[b] = rc
            if rc == 0:
                if self.cached.get(h) != b:
                    raise InvariantError("freed hashed block is not the registered one")
                self.evictor.add(b, h, block.num_tokens_total, self.tracker[b].last_accessed)
                self._untrack(b)
        block.block_id = None

    def allocate_immutable(self, prev: Optional[Block], token_ids: List[int]) -> Block:
        block = Block(prev, self.block_size, None, token_ids)
        h = block.content_hash
        assert h is not None
        hit = self.cached.get(h)
        if hit is not None:
            block.block_id = hit
            self._incr_cached(block)
            return block
        block = self.allocate_mutable(prev)
        self.append_tokens(block, token_ids)
        return block

    def append_tokens(self, block: Block, token_ids: List[int]) -> None:
        if block.content_hash is not None:
            raise InvariantError("append to a full hashed block")
        super().append_tokens(block, token_ids)
        if block.content_hash is not None:
            self._promote(block)

    def _promote(self, block: Block) -> None:
        h = block.content_hash
        assert h is not None and block.block_id is not None
        registered = self.cached.get(h)
        if registered is None:
            self.cached[h] = block.block_id
            self.touched.add(block.block_id)
            return
        # same content already cached: give this id back, share the registered block
        self._free_hashless(block)
        block.block_id = registered
        self._incr_cached(block)

    def free(self, block: Block) -> None:
        self._free_block_id(block)

    @property
    def num_free(self) -> int:
        return len(self.free_ids) + self.evictor.num_blocks

    def full_blocks_touched(self, blocks: List[Block]) -> int:
        # 0.6.6 source: a full block needs a new block on this device unless its content is
        # cached here on a block in use (a cached block waiting in the evictor still counts).
        n = 0
        for b in blocks:
            if not b.is_full:
                continue
            h = b.content_hash
            reg = self.cached.get(h) if h is not None else None
            if reg is None or reg in self.evictor:
                n += 1
        return n

    def swap_out(self, blocks: List[Block]) -> None:
        for b in blocks:
            self._free_block_id(b)

    def swap_in(self, blocks: List[Block]) -> None:
        for b in blocks:
            if b.is_full:
                tmp = self.allocate_immutable(b.prev, b.token_ids)
            else:
                tmp = self.allocate_mutable(b.prev)
                self.append_tokens(tmp, b.token_ids)
            b.block_id = tmp.block_id

    def mark_accessed(self, block_ids: List[int], now: float) -> None:
        for b in block_ids:
            t = self.tracker[b]
            if t.active:
                t.last_accessed = now
            elif b in self.evictor:
                self.evictor.update(b, now)
            else:
                raise InvariantError(f"access mark on block {b} not on this device")

    def mark_computed(self) -> None:
        for b in self.touched:
            self.tracker[b].computed = True
        self.touched.clear()

    def block_is_computed(self, b: int) -> bool:
        t = self.tracker[b]
        return t.computed if t.active else b in self.evictor

    def find_cached_prefix_len(self, hashes: List[int]) -> int:
        """Number of leading blocks reported cached.

        0.6.6 source (`find_cached_blocks_prefix`): a binary search (bisect_left) for the first
        block that is not cached-and-computed. It assumes the cached blocks form a prefix; when
        they do not, the answer is whatever the binary search lands on, which we reproduce.
        """
        lo, hi = 0, len(hashes)
        while lo < hi:
            mid = (lo + hi) // 2
            h = hashes[mid]
            reg = self.cached.get(h)
            cached = reg is not None and self.block_is_computed(reg)
            if cached:          # key "not cached" is False < True
                lo = mid + 1
            else:
                hi = mid
        return lo

    def check(self) -> None:
        held = sum(1 for b in self.all_ids if self.refcount[b] > 0)
        if held + len(self.free_ids) + self.evictor.num_blocks != len(self.all_ids):
            raise InvariantError("caching pool: free + evictable + held != total")
        for b in self.free_ids:
            if self.refcount[b] != 0 or b in self.evictor:
                raise InvariantError(f"free block {b} is held or evictable")
        for b in self.evictor.free_table:
            if self.refcount[b] != 0:
                raise InvariantError(f"evictable block {b} is held")
        for b in self.all_ids:
            if (self.refcount[b] > 0) != self.tracker[b].active:
                raise InvariantError(f"block {b}: tracker and ref count disagree")
        for h, b in self.cached.items():
            if self.refcount[b] == 0 and b not in self.evictor:
                raise InvariantError(f"cached block {b} is neither held nor evictable")
