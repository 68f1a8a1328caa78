"""KV block pool: blocks, the free queue and the prefix-cache map (spec A3).

Invariants (checked by `BlockPool.check`):
- a block is in the free queue iff its ref_cnt is 0 (the null block is never in it);
- every entry of the cache map points at a block that carries that hash;
- free blocks + blocks with ref_cnt > 0 = usable blocks.
"""

from __future__ import annotations

from typing import Iterable


class KVCacheBlock:
    __slots__ = ("block_id", "ref_cnt", "block_hash", "prev", "next", "is_null")

    # Links are not part of a block's state: the free queue rebuilds them (see below).
    def __getstate__(self) -> tuple:
        return (self.block_id, self.ref_cnt, self.block_hash, self.is_null)

    def __setstate__(self, state: tuple) -> None:
        self.block_id, self.ref_cnt, self.block_hash, self.is_null = state
        self.prev = self.next = None

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: int | None = None
        # Free-queue links; None when the block is not in the queue.
        self.prev: KVCacheBlock | None = None
        self.next: KVCacheBlock | None = None
        self.is_null = False

    def __repr__(self) -> str:
        return f"KVCacheBlock({self.block_id}, ref={self.ref_cnt}, hash={self.block_hash})"


class FreeKVCacheBlockQueue:
    """Doubly linked list of free blocks (spec A3.1): pop from the head, remove anywhere,
    append at the tail, insert at the head. Sentinel head/tail keep the links simple."""

    __slots__ = ("head", "tail", "num_free_blocks")

    def __init__(self, blocks: Iterable[KVCacheBlock]) -> None:
        self.head = KVCacheBlock(-1)
        self.tail = KVCacheBlock(-1)
        self.head.next = self.tail
        self.tail.prev = self.head
        self.num_free_blocks = 0
        for block in blocks:
            self.append(block)

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        out: list[KVCacheBlock] = []
        node = self.head.next
        for _ in range(n):
            assert node is not self.tail, "free queue exhausted"
            out.append(node)
            nxt = node.next
            node.prev = node.next = None
            node = nxt
        self.head.next = node
        node.prev = self.head  # type: ignore[union-attr]
        self.num_free_blocks -= n
        return out

    def remove(self, block: KVCacheBlock) -> None:
        prev, nxt = block.prev, block.next
        prev.next = nxt  # type: ignore[union-attr]
        nxt.prev = prev  # type: ignore[union-attr]
        block.prev = block.next = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        last = self.tail.prev
        last.next = block  # type: ignore[union-attr]
        block.prev = last
        block.next = self.tail
        self.tail.prev = block
        self.num_free_blocks += 1

    def prepend_n(self, blocks: list[KVCacheBlock]) -> None:
        """Insert `blocks` at the head, keeping their order (spec A3.4, 0.28+)."""
        first = self.head.next
        prev = self.head
        for block in blocks:
            prev.next = block
            block.prev = prev
            prev = block
        prev.next = first
        first.prev = prev  # type: ignore[union-attr]
        self.num_free_blocks += len(blocks)

    # Pickle / deepcopy without following the links (a long list would recurse too deep):
    # the queue is stored as its order, and the links are rebuilt.
    def __getstate__(self) -> dict:
        order = []
        node = self.head.next
        while node is not self.tail:
            order.append(node)
            node = node.next  # type: ignore[union-attr]
        return {"order": order}

    def __setstate__(self, state: dict) -> None:
        self.head = KVCacheBlock(-1)
        self.tail = KVCacheBlock(-1)
        self.head.next = self.tail
        self.tail.prev = self.head
        self.num_free_blocks = 0
        for block in state["order"]:
            self.append(block)

    def block_ids(self) -> list[int]:
        out = []
        node = self.head.next
        while node is not self.tail:
            out.append(node.block_id)  # type: ignore[union-attr]
            node = node.next  # type: ignore[union-attr]
        return out


class BlockPool:
    """All KV blocks of one full-attention group (spec A3)."""

    def __init__(
        self,
        num_gpu_blocks: int,
        enable_caching: bool,
        *,
        null_block: bool = True,
        free_unhashed_to_head: bool = True,
    ) -> None:
        from kvreplay.limits import check

        check("blocks", num_gpu_blocks, "num_gpu_blocks")
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        self.free_unhashed_to_head = free_unhashed_to_head
        self.blocks = [KVCacheBlock(i) for i in range(num_gpu_blocks)]
        # A3.1: block 0 is the null block, taken out before the queue is built (0.8.3+).
        self.null_block: KVCacheBlock | None = None
        first = 0
        if null_block:
            self.null_block = self.blocks[0]
            self.null_block.is_null = True
            first = 1
        self.num_usable_blocks = num_gpu_blocks - first
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks[first:])
        # Prefix-cache map: hash -> {block_id: block}; lookups return the first inserted
        # (A4: identical content in two blocks registers both, no deduplication).
        self.cached_block_hash_to_block: dict[int, dict[int, KVCacheBlock]] = {}

    # -- queries ---------------------------------------------------------------------
    def get_num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks

    def get_cached_block(self, block_hash: int) -> KVCacheBlock | None:
        entry = self.cached_block_hash_to_block.get(block_hash)
        if entry is None:
            return None
        return next(iter(entry.values()))

    def num_cached_hashes(self) -> int:
        """Entries of the prefix-cache map (one per distinct hash, as vLLM counts them)."""
        return len(self.cached_block_hash_to_block)

    # -- mutations -------------------------------------------------------------------
    def get_new_blocks(self, n: int) -> list[KVCacheBlock]:
        """A3.2: take n blocks from the head; a block that carries a hash is evicted here
        (and only here)."""
        blocks = self.free_block_queue.popleft_n(n)
        for block in blocks:
            if block.block_hash is not None:
                self._evict(block)
            block.ref_cnt = 1
        return blocks

    def _evict(self, block: KVCacheBlock) -> None:
        entry = self.cached_block_hash_to_block[block.block_hash]  # type: ignore[index]
        del entry[block.block_id]
        if not entry:
            del self.cached_block_hash_to_block[block.block_hash]  # type: ignore[arg-type]
        block.block_hash = None

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """A3.3: a prefix hit takes evictable blocks out of the free queue."""
        queue = self.free_block_queue
        for block in blocks:
            if block.ref_cnt == 0 and not block.is_null:
                queue.remove(block)
            block.ref_cnt += 1

    def cache_block(self, block: KVCacheBlock, block_hash: int) -> None:
        """A4: register a full block under its chained hash."""
        assert block.block_hash is None
        block.block_hash = block_hash
        entry = self.cached_block_hash_to_block.get(block_hash)
        if entry is None:
            self.cached_block_hash_to_block[block_hash] = {block.block_id: block}
        else:
            entry[block.block_id] = block

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """A3.4: drop one reference from each block, in the given order (the caller passes
        a request's table reversed). Blocks reaching 0 join the free queue: all at the tail
        up to 0.27; from 0.28 unhashed ones (or all, caching off) at the head, in
        processing order, and hashed ones at the tail. Hashes stay (no eviction here)."""
        to_head: list[KVCacheBlock] = []
        queue = self.free_block_queue
        head_rule = self.free_unhashed_to_head
        caching = self.enable_caching
        for block in ordered_blocks:
            block.ref_cnt -= 1
            if block.ref_cnt == 0 and not block.is_null:
                if head_rule and (not caching or block.block_hash is None):
                    to_head.append(block)
                else:
                    queue.append(block)
        if to_head:
            queue.prepend_n(to_head)

    # -- invariants ------------------------------------------------------------------
    def check(self) -> None:
        free_ids = self.free_block_queue.block_ids()
        assert len(free_ids) == self.free_block_queue.num_free_blocks, "free count drifted"
        assert len(set(free_ids)) == len(free_ids), "block twice in the free queue"
        free_set = set(free_ids)
        held = 0
        for block in self.blocks:
            if block.is_null:
                assert block.block_id not in free_set
                continue
            assert block.ref_cnt >= 0, f"negative ref count on {block}"
            if block.ref_cnt == 0:
                assert block.block_id in free_set, f"{block} unreferenced but not free"
            else:
                assert block.block_id not in free_set, f"{block} free and referenced"
                held += 1
        assert held + len(free_ids) == self.num_usable_blocks, "blocks not conserved"
        for block_hash, entry in self.cached_block_hash_to_block.items():
            assert entry, "empty cache entry"
            for block in entry.values():
                assert block.block_hash == block_hash, f"cache map points at {block}"
