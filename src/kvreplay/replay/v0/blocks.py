"""V0 KV block manager: GPU and CPU pools, watermark, swap, prefix caching with an LRU evictor.

Models vLLM 0.6.6's v2 block manager (`SelfAttnBlockSpaceManager` over a
`CpuGpuBlockAllocator`), spec Part B "can_allocate" / "Prefix caching in V0" with the
corrections of Part F. Written from the spec; where the spec is silent the behaviour was
checked against vLLM 0.6.6.post1's public source (`vllm/core/block_manager.py`,
`vllm/core/block/*.py`, `vllm/core/evictor.py`) and is described in our own words in the
comments marked "0.6.6 source".

Only what a replay of single-sequence groups needs is modelled: no sliding window, no
encoder/decoder, no LoRA (the extra hash is always None), no lookahead slots.
"""
from __future__ import annotations

import enum
import heapq
from collections import deque
from typing import Deque, Dict, Iterable, List, Optional, Set, Tuple


class AllocStatus(enum.Enum):
    """spec B/can_allocate: OK schedules, LATER stops the prefill loop, NEVER ignores."""
    OK = enum.auto()
    LATER = enum.auto()
    NEVER = enum.auto()


class Device(enum.Enum):
    GPU = 0
    CPU = 1


class NoFreeBlocksError(Exception):
    """An allocation found no free block. The scheduler's checks make this unreachable."""


class InvariantError(AssertionError):
    """A model invariant broke (a bug in kvreplay, not in the input)."""


class TerminalError(Exception):
    """vLLM itself stops here (for example RuntimeError "lack of CPU swap space", spec B/F.3).

    Reported as the run's terminal event, not raised to the caller of `run_workload`.
    """

    def __init__(self, type_name: str, message: str, victim: Optional[str]) -> None:
        super().__init__(message)
        self.type_name = type_name
        self.message = message
        self.victim = victim


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def hash_block_tokens(prev_hash: Optional[int], token_ids: Iterable[int]) -> int:
    """Content hash of one full block, chained on the previous block's hash.

    Any collision-free function of (is-first, parent hash, tokens) reproduces hits and
    misses (spec A4). We use Python's builtin tuple hash over ints and bools only: before
    Python 3.12, hash(None) is the object's address, different in every process, and some
    runs (prefix caching + swap, tests/test_v0_properties.py) then ended differently from
    run to run.
    """
    return hash((prev_hash is None, 0 if prev_hash is None else prev_hash, *token_ids, 0))


class Block:
    """One logical block of a sequence's block table (tokens + the physical id it sits on)."""
    __slots__ = ("block_id", "token_ids", "prev", "size", "_hash", "num_tokens_total")

    def __init__(self, prev: Optional["Block"], size: int, block_id: Optional[int],
                 token_ids: Optional[List[int]] = None) -> None:
        self.prev = prev
        self.size = size
        self.block_id = block_id
        self.token_ids: List[int] = list(token_ids) if token_ids else []
        self._hash: Optional[int] = None
        self.num_tokens_total = 0
        self._update_total()

    def _update_total(self) -> None:
        self.num_tokens_total = (self.prev.num_tokens_total if self.prev else 0) + len(self.token_ids)

    @property
    def is_full(self) -> bool:
        return len(self.token_ids) == self.size

    @property
    def num_empty_slots(self) -> int:
        return self.size - len(self.token_ids)

    @property
    def content_hash(self) -> Optional[int]:
        """Hash of a full block whose parent chain is hashed; None otherwise (cached once set)."""
        if self._hash is not None:
            return self._hash
        if not self.is_full:
            return None
        if self.prev is None:
            prev_hash = None
        else:
            prev_hash = self.prev.content_hash
            if prev_hash is None:
                return None
        self._hash = hash_block_tokens(prev_hash, self.token_ids)
        return self._hash


# --------------------------------------------------------------------------------------
# allocators
# --------------------------------------------------------------------------------------

class NaiveAllocator:
    """Free block ids in a deque: allocation pops the head, a freed id goes back to the head.

    0.6.6 source (`NaiveBlockAllocator`): the free list starts in id order, `_allocate_block_id`
    takes from the left and `_free_block_id` puts the id back on the left (LIFO reuse).
    """

    caching = False

    def __init__(self, block_ids: List[int], block_size: int,
                 refcount: Optional[Dict[int, int]] = None) -> None:
        self.block_size = block_size
        self.all_ids = list(block_ids)
        self._sorted_ids = sorted(self.all_ids)
        self.free_ids: Deque[int] = deque(block_ids)
        self.refcount: Dict[int, int] = refcount if refcount is not None else {}
        for b in block_ids:
            self.refcount[b] = 0

    # -- ids
    def allocate_id(self) -> int:
        if not self.free_ids:
            raise NoFreeBlocksError()
        b = self.free_ids.popleft()
        self.refcount[b] += 1
        return b

    def free_id(self, b: int) -> None:
        rc = self.refcount[b] - 1
        if rc < 0:
            raise InvariantError(f"ref count of block {b} below 0")
        self.refcount[b] = rc
        if rc == 0:
            self.free_ids.appendleft(b)

    # -- blocks
    def allocate_mutable(self, prev: Optional[Block]) -> Block:
        return Block(prev, self.block_size, self.allocate_id())

    def allocate_immutable(self, prev: Optional[Block], token_ids: List[int]) -> Block:
        return Block(prev, self.block_size, self.allocate_id(), token_ids)

    def append_tokens(self, block: Block, token_ids: List[int]) -> None:
        if not token_ids:
            return
        if len(token_ids) > block.num_empty_slots:
            raise InvariantError("append past the end of a block")
        # Copy-on-write only triggers for a block shared by several sequences (fork / beam
        # search); single-sequence groups never share an appendable block.
        if block.block_id is not None and self.refcount[block.block_id] > 1:
            raise InvariantError("append to a shared mutable block (copy-on-write)")
        block.token_ids.extend(token_ids)
        block._update_total()

    def free(self, block: Block) -> None:
        assert block.block_id is not None
        self.free_id(block.block_id)
        block.block_id = None

    @property
    def num_free(self) -> int:
        return len(self.free_ids)

    @property
    def num_total(self) -> int:
        return len(self.all_ids)

    def physical_id(self, absolute_id: int) -> int:
        # position among this device's ids (the ids of a device are contiguous)
        return absolute_id - self._sorted_ids[0]

    def full_blocks_touched(self, blocks: List[Block]) -> int:
        # 0.6.6 source: every full block needs a new block on the destination device.
        return sum(1 for b in blocks if b.is_full)

    def swap_out(self, blocks: List[Block]) -> None:
        for b in blocks:
            assert b.block_id is not None
            self.free_id(b.block_id)

    def swap_in(self, blocks: List[Block]) -> None:
        for b in blocks:
            b.block_id = self.allocate_id()

    def mark_accessed(self, block_ids: List[int], now: float) -> None:
        pass

    def mark_computed(self) -> None:
        pass

    def check(self) -> None:
        held = sum(1 for b in self.all_ids if self.refcount[b] > 0)
        if held + len(self.free_ids) != len(self.all_ids):
            raise InvariantError("naive pool: free + held != total")
        if len(set(self.free_ids)) != len(self.free_ids):
            raise InvariantError("naive pool: duplicate free id")
        for b in self.free_ids:
            if self.refcount[b] != 0:
                raise InvariantError(f"free block {b} has ref count {self.refcount[b]}")


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
            # another block that is in use (found by tests/test_v0_properties.py; vLLM
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


# --------------------------------------------------------------------------------------
# block table and block manager
# --------------------------------------------------------------------------------------

class BlockTable:
    """A sequence's blocks plus `num_full_slots`, the tokens written into them so far."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.blocks: List[Block] = []
        self.num_full_slots = 0

    @property
    def physical_block_ids(self) -> List[int]:
        return [b.block_id for b in self.blocks]  # type: ignore[misc]

    def allocate(self, alloc: NaiveAllocator, token_ids: List[int]) -> None:
        # The whole current sequence (prompt + outputs) is allocated at admission, also with
        # chunked prefill (0.6.6 source: `BlockTable.allocate`): full chunks as immutable
        # blocks (prefix hits with caching), the tail as one mutable block.
        bs = self.block_size
        prev: Optional[Block] = None
        nfull = len(token_ids) // bs
        for i in range(nfull):
            prev = alloc.allocate_immutable(prev, token_ids[i * bs:(i + 1) * bs])
            self.blocks.append(prev)
        tail = token_ids[nfull * bs:]
        if tail:
            blk = alloc.allocate_mutable(prev)
            alloc.append_tokens(blk, tail)
            self.blocks.append(blk)
        self.num_full_slots = len(token_ids)

    def num_blocks_touched_by_append(self, num_tokens: int) -> int:
        # Worst case: every touched block may need a new block (copy-on-write or new). Even
        # one token into a half-full block counts 1; zero tokens count 1 when the last block
        # is partial (0.6.6 source: `get_num_blocks_touched_by_append_slots`).
        first_chunk = self.block_size - (self.num_full_slots % self.block_size)
        return 1 + cdiv(num_tokens - first_chunk, self.block_size)

    def append_token_ids(self, alloc: NaiveAllocator, token_ids: List[int]) -> None:
        bs = self.block_size
        empty = len(self.blocks) * bs - self.num_full_slots
        if empty < len(token_ids):
            for _ in range(cdiv(len(token_ids) - empty, bs)):
                self.blocks.append(alloc.allocate_mutable(self.blocks[-1]))
        if token_ids:
            idx = self.num_full_slots // bs
            first = bs - (self.num_full_slots % bs)
            chunks = [token_ids[:first]] + [token_ids[i:i + bs] for i in range(first, len(token_ids), bs)]
            for i, chunk in enumerate(chunks):
                alloc.append_tokens(self.blocks[idx + i], chunk)
        self.num_full_slots += len(token_ids)


class BlockSpaceManager:
    """spec B "can_allocate" (v2 manager): watermark, AllocStatus, can_append_slots, swap."""

    def __init__(self, block_size: int, num_gpu_blocks: int, num_cpu_blocks: int,
                 enable_caching: bool, watermark: float = 0.01) -> None:
        self.block_size = block_size
        self.num_total_gpu_blocks = num_gpu_blocks
        self.num_total_cpu_blocks = num_cpu_blocks
        self.enable_caching = enable_caching
        self.watermark_blocks = int(watermark * num_gpu_blocks)   # spec B: int(0.01 x N)
        cls = PrefixCachingAllocator if enable_caching else NaiveAllocator
        # GPU ids 0..N-1, CPU ids N..N+M-1; swap mappings report ids relative to each device.
        self.alloc: Dict[Device, NaiveAllocator] = {
            Device.GPU: cls(list(range(num_gpu_blocks)), block_size),
            Device.CPU: cls(list(range(num_gpu_blocks, num_gpu_blocks + num_cpu_blocks)), block_size),
        }
        self.block_tables: Dict[int, BlockTable] = {}
        self._last_access: Dict[int, Optional[float]] = {}
        # ComputedBlocksTracker: per-sequence block hashes and the memoised cached-token count
        self._seq_hashes: Dict[int, List[int]] = {}
        self._seq_cached_tokens: Dict[int, int] = {}

    @property
    def gpu(self) -> NaiveAllocator:
        return self.alloc[Device.GPU]

    @property
    def cpu(self) -> NaiveAllocator:
        return self.alloc[Device.CPU]

    def _owner(self, block_id: int) -> NaiveAllocator:
        return self.gpu if block_id < self.num_total_gpu_blocks else self.cpu

    def get_num_free_gpu_blocks(self) -> int:
        return self.gpu.num_free

    def get_num_free_cpu_blocks(self) -> int:
        return self.cpu.num_free

    # ---- admission
    def can_allocate(self, seq) -> AllocStatus:
        # spec B: required counts every token (prompt + outputs); prefix hits not subtracted.
        required = cdiv(seq.get_len(), self.block_size)
        if self.num_total_gpu_blocks - required < self.watermark_blocks:
            return AllocStatus.NEVER
        if self.gpu.num_free - required >= self.watermark_blocks:
            return AllocStatus.OK
        return AllocStatus.LATER

    def allocate(self, seq) -> None:
        if seq.seq_id in self.block_tables:
            raise InvariantError("block table already exists")
        table = BlockTable(self.block_size)
        table.allocate(self.gpu, seq.token_ids)
        self.block_tables[seq.seq_id] = table
        self._last_access[seq.seq_id] = None

    # ---- running
    def can_append_slots(self, seq) -> bool:
        # spec B: v2 counts the blocks the append would touch, needs <= free, no watermark.
        table = self.block_tables[seq.seq_id]
        touched = table.num_blocks_touched_by_append(seq.get_len() - table.num_full_slots)
        return touched <= self.gpu.num_free

    def append_slots(self, seq) -> None:
        table = self.block_tables[seq.seq_id]
        table.append_token_ids(self.gpu, seq.token_ids[table.num_full_slots:])

    def free(self, seq) -> None:
        table = self.block_tables.get(seq.seq_id)
        if table is None:
            return
        ts = self._last_access.pop(seq.seq_id)
        if ts is not None:
            self.gpu.mark_accessed(table.physical_block_ids, ts)
        if self.enable_caching:
            self._seq_hashes.pop(seq.seq_id, None)
            self._seq_cached_tokens.pop(seq.seq_id, None)
        for b in table.blocks:
            self._owner(b.block_id).free(b)  # type: ignore[arg-type]
        del self.block_tables[seq.seq_id]

    def access_all_blocks_in_seq(self, seq, now: float) -> None:
        if self.enable_caching:
            self._last_access[seq.seq_id] = now

    def mark_blocks_as_computed(self) -> None:
        self.gpu.mark_computed()

    def blocks_held(self, seq) -> int:
        t = self.block_tables.get(seq.seq_id)
        return len(t.blocks) if t is not None else 0

    # ---- prefix caching
    def get_num_cached_tokens(self, seq) -> int:
        """spec B: tokens of the sequence found in computed cached blocks (whole blocks).

        0.6.6 source (`ComputedBlocksTracker`): the answer is memoised per sequence and, while
        the sequence is in its prefill stage, the memo is returned unchanged. A waiting request
        therefore keeps the count from the first time the scheduler looked at it, until it is
        freed (recompute preemption or finish) and the memo dropped.
        """
        if not self.enable_caching:
            return 0
        hashes = self._seq_hashes.setdefault(seq.seq_id, [])
        bs = self.block_size
        toks = seq.token_ids
        for i in range(len(hashes), len(toks) // bs):
            hashes.append(hash_block_tokens(hashes[-1] if hashes else None, toks[i * bs:(i + 1) * bs]))
        memo = self._seq_cached_tokens.get(seq.seq_id)
        if memo is not None and seq.is_prefill():
            return memo
        n = self.gpu.find_cached_prefix_len(hashes) * bs  # type: ignore[attr-defined]
        self._seq_cached_tokens[seq.seq_id] = n
        return n

    # ---- swap
    def _can_swap(self, seq, device: Device) -> AllocStatus:
        table = self.block_tables[seq.seq_id]
        touched = table.num_blocks_touched_by_append(seq.get_len() - table.num_full_slots)
        touched += self.alloc[device].full_blocks_touched(table.blocks)
        watermark = self.watermark_blocks if device == Device.GPU else 0
        if self.alloc[device].num_total < touched:
            return AllocStatus.NEVER              # F.4: no watermark in the NEVER test
        if self.alloc[device].num_free - touched >= watermark:
            return AllocStatus.OK
        return AllocStatus.LATER

    def can_swap_in(self, seq) -> AllocStatus:
        return self._can_swap(seq, Device.GPU)

    def can_swap_out(self, seq) -> bool:
        return self._can_swap(seq, Device.CPU) == AllocStatus.OK

    def _swap(self, seq, src: Device, dst: Device) -> List[List[int]]:
        table = self.block_tables[seq.seq_id]
        if not table.blocks:
            return []
        src_ids = table.physical_block_ids
        self.alloc[src].swap_out(table.blocks)
        self.alloc[dst].swap_in(table.blocks)
        mapping: Dict[int, int] = {}
        for s, d in zip(src_ids, table.physical_block_ids):
            mapping[s] = d
        sa, da = self.alloc[src], self.alloc[dst]
        return [[sa.physical_id(s), da.physical_id(d)] for s, d in mapping.items()]

    def swap_out(self, seq) -> List[List[int]]:
        return self._swap(seq, Device.GPU, Device.CPU)

    def swap_in(self, seq) -> List[List[int]]:
        return self._swap(seq, Device.CPU, Device.GPU)

    # ---- invariants
    def check(self) -> None:
        for a in self.alloc.values():
            a.check()
        # every block a table holds is counted by the ref counts, and nothing else is held
        held: Dict[int, int] = {}
        for t in self.block_tables.values():
            for b in t.blocks:
                if b.block_id is None:
                    raise InvariantError("block table holds a block with no id")
                held[b.block_id] = held.get(b.block_id, 0) + 1
        for a in self.alloc.values():
            for b in a.all_ids:
                if a.refcount[b] != held.get(b, 0):
                    raise InvariantError(f"block {b}: ref count {a.refcount[b]} != holders {held.get(b, 0)}")
