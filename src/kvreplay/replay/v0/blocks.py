"""V0 KV block manager: GPU and CPU pools, watermark, swap, prefix caching with an LRU evictor.

Models vLLM 0.6.6's v2 block manager (`SelfAttnBlockSpaceManager` over a
`CpuGpuBlockAllocator`), spec Part B "can_allocate" / "Prefix caching in V0" with the
corrections of Part F. Written from the spec; where the spec is silent the behaviour was
checked against vLLM 0.6.6.post1's public source (`vllm/core/block_manager.py`,
`vllm/core/block/*.py`, `vllm/core/evictor.py`) and is described in our own words in the
comments marked "0.6.6 source".

This module holds the block table and the block manager; blocks, the errors and the naive
allocator are in allocator.py, the prefix-caching allocator and its evictor in
prefix_caching.py (all importable from here).

Only what a replay of single-sequence groups needs is modelled: no sliding window, no
encoder/decoder, no LoRA (the extra hash is always None), no lookahead slots.
"""
from __future__ import annotations

import enum
from typing import Dict, List, Optional

from .allocator import (Block, InvariantError, NaiveAllocator, NoFreeBlocksError,  # noqa: F401
                        TerminalError, cdiv, hash_block_tokens)
from .prefix_caching import LRUEvictor, PrefixCachingAllocator, _Tracker  # noqa: F401


class AllocStatus(enum.Enum):
    """spec B/can_allocate: OK schedules, LATER stops the prefill loop, NEVER ignores."""
    OK = enum.auto()
    LATER = enum.auto()
    NEVER = enum.auto()


class Device(enum.Enum):
    GPU = 0
    CPU = 1


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
        from kvreplay.limits import check

        check("blocks", num_gpu_blocks + num_cpu_blocks, "num_gpu_blocks + num_cpu_blocks")
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
