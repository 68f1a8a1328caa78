"""A request as vLLM's V1 scheduler sees it (spec A1)."""

from __future__ import annotations

import enum
from array import array
from operator import attrgetter
from typing import Callable


class RequestStatus(enum.IntEnum):
    """A1.2, 0.33 order; anything after PREEMPTED is finished."""

    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    FINISHED_STOPPED = 3
    FINISHED_LENGTH_CAPPED = 4
    FINISHED_ABORTED = 5
    FINISHED_IGNORED = 6
    FINISHED_ERROR = 7

    def __str__(self) -> str:
        return self.name

    @property
    def is_finished(self) -> bool:
        return self > RequestStatus.PREEMPTED


class Request:
    __slots__ = (
        "request_id",
        "index",
        "prompt_token_ids",
        "output_token_ids",
        "num_prompt_tokens",
        "num_tokens",
        "max_tokens",
        "priority",
        "arrival_time",
        "status",
        "num_computed_tokens",
        "num_preemptions",
        "block_hashes",
        "is_prefill_chunk",
        "num_output_placeholders",
        "num_in_flight_tokens",
        "num_stale_output_tokens",
        "block_hasher",
        "first_prefix_hit",
        "num_output_tokens",
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        max_tokens: int,
        *,
        arrival_time: float,
        priority: int = 0,
        index: int = 0,
        block_hasher: Callable[["Request"], None] | None = None,
    ) -> None:
        self.request_id = request_id
        self.index = index  # position in the workload; orders trace dicts
        self.prompt_token_ids = prompt_token_ids
        self.output_token_ids: list[int] = []
        self.num_prompt_tokens = len(prompt_token_ids)
        self.num_tokens = self.num_prompt_tokens  # prompt + outputs
        self.num_output_tokens = 0  # NOTE: num_tokens - num_prompt_tokens, kept in step
        self.max_tokens = max_tokens
        self.priority = priority
        self.arrival_time = arrival_time
        self.status = RequestStatus.WAITING
        # A1.1: tokens whose KV is computed or being computed; advanced at schedule time.
        self.num_computed_tokens = 0
        self.num_preemptions = 0
        # A4: chained hashes of every full block of prompt + outputs, extended eagerly.
        self.block_hashes: list[int] = []
        self.is_prefill_chunk = False
        # A9, async scheduling only.
        self.num_output_placeholders = 0
        self.num_in_flight_tokens = 0
        self.num_stale_output_tokens = 0
        self.block_hasher = block_hasher
        self.first_prefix_hit = 0  # A5 hit at its first admission (the stat logger's cached part)
        if block_hasher is not None:
            block_hasher(self)

    # NOTE: a snapshot (replay/snapshots.py) pickles the token lists as arrays: one object
    # each, where a list costs a pickle call per token (the log replay's search takes many)
    def __getstate__(self) -> tuple:
        state = list(_ALL_SLOTS(self))  # (one C call for every slot)
        for i in _ARRAY_AT:
            state[i] = _packed(state[i])
        return tuple(state)

    def __setstate__(self, state: tuple) -> None:
        for k, v in zip(Request.__slots__, state):
            setattr(self, k, v.tolist() if isinstance(v, array) else v)

    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def append_output_token(self, token: int) -> None:
        self.output_token_ids.append(token)
        self.num_tokens += 1
        self.num_output_tokens += 1
        hasher = self.block_hasher
        # Only a token that completes a block adds a hash.
        if hasher is not None and self.num_tokens % hasher.block_size == 0:
            hasher(self)

    def sort_key(self) -> tuple[int, float, str]:
        """PRIORITY order (A2): priority, then arrival time, then id."""
        return (self.priority, self.arrival_time, self.request_id)

    def __lt__(self, other: "Request") -> bool:
        return self.sort_key() < other.sort_key()

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id}, {self.status.name}, "
            f"computed={self.num_computed_tokens}/{self.num_tokens})"
        )


_ARRAYS = frozenset(("output_token_ids", "block_hashes"))
_ALL_SLOTS = attrgetter(*Request.__slots__)
_ARRAY_AT = [i for i, k in enumerate(Request.__slots__) if k in _ARRAYS]


def _packed(v: list) -> array | list:
    if not v:
        return []  # (a fresh empty list: one pickle opcode, not an array's reduce)
    try:
        return array("q", v)
    except (OverflowError, TypeError):  # hashes of a step-trace log may not fit
        return v


class BlockHasher:
    """Chained block hashes (A4). Only equality matters for replay, so a hash is an
    interned id of (parent id, block tokens): collision-free and deterministic."""

    __slots__ = ("block_size", "_ids", "_next")

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._ids: dict[tuple[int, tuple[int, ...]], int] = {}
        self._next = 0  # ids are never reused (collect() drops entries)

    def __deepcopy__(self, memo: dict) -> "BlockHasher":
        # Shared by snapshots: the (parent, tokens) -> id table only grows, and a replay
        # resumed from a snapshot assigns the same ids to the same content.
        return self

    def collect(self, reachable: set[int]) -> int:
        """Forget the entries no live request or cached block can reach (and that are no
        ancestor of one): the table then grows with what is live, not with every token ever
        processed. Returns how many were dropped.

        NOTE: equivalent for the replay. A dropped key seen again gets a new id where it
        would have got its old one; the old id, and every id chained on it, is in no cached
        block and no request, so both miss the prefix cache alike. A snapshot taken before
        a collect holds ids the table no longer knows: engines that snapshot do not collect."""
        by_id = {h: key for key, h in self._ids.items()}
        keep: set[int] = set()
        stack = list(reachable)
        while stack:
            h = stack.pop()
            if h in keep or h not in by_id:
                continue
            keep.add(h)
            stack.append(by_id[h][0])  # the parent: a cached child needs its chain
        dropped = len(self._ids) - len(keep)
        if dropped:
            self._ids = {key: h for key, h in self._ids.items() if h in keep}
        return dropped

    def __call__(self, request: Request) -> None:
        bs = self.block_size
        hashes = request.block_hashes
        num_full = request.num_tokens // bs
        if len(hashes) >= num_full:
            return
        prompt = request.prompt_token_ids
        outputs = request.output_token_ids
        n_prompt = len(prompt)
        parent = hashes[-1] if hashes else -1
        ids = self._ids
        for i in range(len(hashes), num_full):
            start, end = i * bs, (i + 1) * bs
            if end <= n_prompt:
                tokens = tuple(prompt[start:end])
            elif start >= n_prompt:
                tokens = tuple(outputs[start - n_prompt : end - n_prompt])
            else:
                tokens = tuple(prompt[start:]) + tuple(outputs[: end - n_prompt])
            key = (parent, tokens)
            h = ids.get(key)
            if h is None:
                h = self._next
                self._next = h + 1
                ids[key] = h
            hashes.append(h)
            parent = h
