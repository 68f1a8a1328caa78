"""V0 blocks and the naive allocator: the block manager's errors, the chained content hash,
`Block` (one logical block of a block table) and `NaiveAllocator` (a pool without prefix
caching). Comments marked "0.6.6 source" are as described in blocks.py.
"""
from __future__ import annotations

from collections import deque
from typing import Deque, Dict, Iterable, List, Optional


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
    runs (prefix caching + swap, tests/unit/replay/test_v0_properties.py) then ended differently from
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
