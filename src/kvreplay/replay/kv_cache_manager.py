"""KV cache manager for one full-attention group (spec A5, A6, A10).

NOTE: a request's block table is append-only while it runs; it is released whole, in
reverse order, at finish or preemption.
NOTE: `allocate_slots` has no side effect when it fails; it returns `KVCacheBlocks` (the
new blocks) or `AllocationFailure` (why not), never None and nothing through a side
channel. The scheduler reads nothing else of the manager's state.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvreplay.replay.block_pool import BlockPool, KVCacheBlock
from kvreplay.replay.request import Request, RequestStatus


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(slots=True)
class PrefixCacheStats:
    """A10, per step: new requests and (0.12+) preempted requests kept apart, in tokens."""

    requests: int = 0
    queries: int = 0
    hits: int = 0
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0

    def record(self, num_tokens: int, num_hits: int, preempted: bool) -> None:
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += num_tokens
            self.preempted_hits += num_hits
        else:
            self.requests += 1
            self.queries += num_tokens
            self.hits += num_hits


class KVCacheBlocks:
    """A successful `allocate_slots`: the blocks newly taken from the free queue."""

    __slots__ = ("blocks",)
    ok = True

    def __init__(self, blocks: list[KVCacheBlock]) -> None:
        self.blocks = blocks


NO_NEW_BLOCKS = KVCacheBlocks([])  # the table already covers the new tokens


@dataclass(slots=True)
class AllocationFailure:
    """A failed `allocate_slots`: what the caller needed vs had."""

    blocks_needed: int
    free_blocks: int
    watermark_blocks: int
    gate: bool  # failed at the full-sequence gate (A6.1) rather than the slot check
    ok = False


@dataclass(slots=True)
class KVCacheManager:
    pool: BlockPool
    block_size: int
    max_model_len: int
    enable_caching: bool
    watermark_blocks: int = 0
    prefix_stats: PrefixCacheStats = field(default_factory=PrefixCacheStats)
    req_to_blocks: dict[str, list[KVCacheBlock]] = field(default_factory=dict)
    num_cached_block: dict[str, int] = field(default_factory=dict)

    # -- A5 ------------------------------------------------------------------------
    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """Longest chain of cached full blocks, capped at num_tokens - 1 (A5.2-3)."""
        if not self.enable_caching:
            return [], 0
        max_blocks = (request.num_tokens - 1) // self.block_size
        hashes = request.block_hashes
        cache = self.pool.cached_block_hash_to_block
        hits: list[KVCacheBlock] = []
        for i in range(min(max_blocks, len(hashes))):
            entry = cache.get(hashes[i])
            if entry is None:
                break
            hits.append(next(iter(entry.values())))
        return hits, len(hits) * self.block_size

    # -- A6 ------------------------------------------------------------------------
    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        hit_blocks: list[KVCacheBlock] | None = None,
        num_hit_tokens: int = 0,
        *,
        full_sequence_must_fit: bool = False,
        has_running_reqs: bool = True,
    ) -> KVCacheBlocks | AllocationFailure:
        """Reserve slots for `num_new_tokens` more tokens (A6)."""
        req_id = request.request_id
        table = self.req_to_blocks.get(req_id)
        if table is not None and not hit_blocks and not full_sequence_must_fit:
            # NOTE: a running request whose table already covers the new tokens needs no
            # block; only its newly full blocks are registered (A4, A6.5). Same result as
            # the general path below, without its arithmetic.
            slots = request.num_computed_tokens + num_new_tokens
            if slots > self.max_model_len:
                slots = self.max_model_len
            bs = self.block_size
            if len(table) * bs >= slots:
                if self.enable_caching:
                    n_cache = slots if slots < request.num_tokens else request.num_tokens
                    if n_cache // bs > self.num_cached_block[req_id]:
                        self.cache_blocks(request, n_cache)
                return NO_NEW_BLOCKS
        bs = self.block_size
        pool = self.pool
        held = len(table) if table is not None else 0
        free = pool.free_block_queue.num_free_blocks
        n_hit_blocks = len(hit_blocks) if hit_blocks else 0
        evictable_hits = 0
        if n_hit_blocks:
            evictable_hits = sum(1 for b in hit_blocks if b.ref_cnt == 0)  # type: ignore[union-attr]
        # A6.4: the watermark holds back blocks from admissions while others run.
        watermark = 0
        if self.watermark_blocks and has_running_reqs and (
            request.status == RequestStatus.WAITING or request.status == RequestStatus.PREEMPTED
        ):
            watermark = self.watermark_blocks
        # A6.1: full-sequence gate (0.19+): the whole current sequence must fit now.
        if full_sequence_must_fit:
            need_full = (
                max(cdiv(min(request.num_tokens, self.max_model_len), bs) - held - n_hit_blocks, 0)
                + evictable_hits
            )
            if need_full + watermark > free:
                return AllocationFailure(need_full, free, watermark, True)
        # A6.2-3
        slots = request.num_computed_tokens + num_hit_tokens + num_new_tokens
        if slots > self.max_model_len:
            slots = self.max_model_len
        num_required = cdiv(slots, bs)
        need = num_required - held - n_hit_blocks
        if need < 0:
            need = 0
        need += evictable_hits
        if need + watermark > free:
            return AllocationFailure(need, free, watermark, False)
        # A6.5: touch hits, then take new blocks from the head, then register full blocks.
        if table is None:
            table = self.req_to_blocks[req_id] = []
            self.num_cached_block[req_id] = 0
        if n_hit_blocks:
            pool.touch(hit_blocks)  # type: ignore[arg-type]
            table.extend(hit_blocks)  # type: ignore[arg-type]
            self.num_cached_block[req_id] = len(table)
        num_new_blocks = num_required - len(table)
        new_blocks: list[KVCacheBlock] = []
        if num_new_blocks > 0:
            new_blocks = pool.get_new_blocks(num_new_blocks)
            table.extend(new_blocks)
        if self.enable_caching:
            num_to_cache = request.num_computed_tokens + num_hit_tokens + num_new_tokens
            if num_to_cache > request.num_tokens:
                num_to_cache = request.num_tokens
            self.cache_blocks(request, num_to_cache)
        return KVCacheBlocks(new_blocks) if new_blocks else NO_NEW_BLOCKS

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """A4: register the request's blocks that are full within `num_tokens`."""
        req_id = request.request_id
        table = self.req_to_blocks.get(req_id)
        if table is None:
            return
        num_full = num_tokens // self.block_size
        done = self.num_cached_block[req_id]
        if num_full <= done:
            return
        hashes = request.block_hashes
        num_full = min(num_full, len(hashes), len(table))
        pool = self.pool
        for i in range(done, num_full):
            block = table[i]
            if block.block_hash is None:
                pool.cache_block(block, hashes[i])
        if num_full > done:
            self.num_cached_block[req_id] = num_full

    # -- A3.4 ----------------------------------------------------------------------
    def free(self, request: Request) -> int:
        """Release a request's blocks, last block first. Returns how many it held."""
        table = self.req_to_blocks.pop(request.request_id, None)
        self.num_cached_block.pop(request.request_id, None)
        if not table:
            return 0
        self.pool.free_blocks(reversed(table))
        return len(table)

    def num_blocks(self, request_id: str) -> int:
        table = self.req_to_blocks.get(request_id)
        return len(table) if table else 0

    def check(self, live: dict[str, Request]) -> None:
        """Only live requests hold blocks, and each block's ref count is the number of
        tables holding it."""
        held: dict[int, int] = {}
        for req_id, table in self.req_to_blocks.items():
            assert req_id in live, f"finished request {req_id} holds blocks"
            for b in table:
                held[b.block_id] = held.get(b.block_id, 0) + 1
        for block in self.pool.blocks:
            if not block.is_null:
                assert block.ref_cnt == held.get(block.block_id, 0), f"ref count of {block}"
