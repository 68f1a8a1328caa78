"""The scheduler's state between two steps, copied out of a live engine (V1 or V0): the
queues, every live request and the block map, and the difference of two such states; and
a `StepView`, one step's record with the state before and after it (replay/timeline.py
makes them). Nothing here decides anything; it reads the engine."""

from __future__ import annotations

from array import array
from itertools import repeat
from operator import attrgetter
from dataclasses import dataclass
from typing import Any

import msgspec

from kvreplay.replay.records import Admission, PreemptionRecord, StepRecord

# Block states in the block map.
NULL, FREE, CACHED, HELD, SHARED = range(5)
BLOCK_STATE_NAMES = ("null", "free", "cached", "held", "shared")
# min(ref count, 2) -> state, before the cached and null blocks are marked
_BY_REFS = bytes([FREE, HELD, SHARED]) + bytes(253)
_ref_cnt = attrgetter("ref_cnt")
_block_id = attrgetter("block_id")
_index = attrgetter("index")


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
    # block id -> requests whose table holds it, in workload order (None: made from
    # `requests` when first read; most step views never show the block map)
    _owners: dict[int, list[str]] | None
    free_queue: list[int]  # eviction order
    free_blocks: int
    kv_usage: float
    cached_blocks: int

    @classmethod
    def of(cls, engine: Any, step: int, preemptions: dict[str, int] | None = None) -> "EngineState":
        """The state of a V1 `Engine` or a V0 `V0Steps` after `step` (V0 groups do not
        count their preemptions: `preemptions` gives them)."""
        if hasattr(engine, "eng"):
            return _v0_state(cls, engine, step, preemptions or {})
        sched = engine.scheduler
        pool = sched.pool
        kv = sched.kv_cache_manager
        blocks = pool.blocks
        # (C-level passes over the pool: at 10^4-10^5 blocks a Python loop per block is
        # most of a TUI step view)
        refs = array("i", map(_ref_cnt, blocks))
        states = bytearray(bytes(map(min, refs, repeat(2))).translate(_BY_REFS))
        for entry in pool.cached_block_hash_to_block.values():
            for b in entry.values():  # a freed block that keeps its hash
                if b.ref_cnt == 0:
                    states[b.block_id] = CACHED
        if pool.null_block is not None:
            states[pool.null_block.block_id] = NULL
        reqs: dict[str, RequestState] = {}
        tables = kv.req_to_blocks
        for r in sorted(sched.requests.values(), key=_index):
            rid = r.request_id
            table = tables.get(rid)
            ids = tuple(map(_block_id, table)) if table else ()
            reqs[rid] = RequestState(
                rid, r.status.name, r.priority, r.num_prompt_tokens, r.num_tokens,
                r.num_computed_tokens, r.num_preemptions, ids,
            )
        return cls(
            step=step,
            running=[r.request_id for r in sched.running],
            waiting=[r.request_id for r in sched.waiting],
            requests=reqs,
            block_states=bytes(states),
            block_refs=refs,
            _owners=None,
            free_queue=pool.free_block_queue.block_ids(),
            free_blocks=pool.get_num_free_blocks(),
            kv_usage=round(sched.kv_cache_usage, 6),
            cached_blocks=pool.num_cached_hashes(),
        )

    @property
    def owners(self) -> dict[int, list[str]]:
        owners = self._owners
        if owners is None:
            owners = self._owners = {}
            for rid, r in self.requests.items():
                for i in r.blocks:
                    o = owners.get(i)
                    if o is None:
                        owners[i] = [rid]
                    else:
                        o.append(rid)
        return owners

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(BLOCK_STATE_NAMES, 0)
        for c in self.block_states:
            out[BLOCK_STATE_NAMES[c]] += 1
        return out


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




class Scheduled(msgspec.Struct, gc=False):
    """One request scheduled in a step, in vLLM's order, and what its tokens are."""

    rid: str
    tokens: int
    kind: str  # prefill | decode | recompute
    computed_before: int
    detail: str = ""


class StepView(msgspec.Struct):
    """Everything about one step: the replay's `StepRecord` of it, what schedule() gave
    each request, and the state before and after it."""

    step: int
    record: StepRecord  # the replay's own record of the step (Replay.steps[step])
    before: EngineState
    after: EngineState
    scheduled: list[Scheduled]  # every scheduled request, in vLLM's order
    preemptions: list[PreemptionRecord]
    token_budget_left: int | None = None  # schedule()'s budget left (None: V0, not kept)

    @property
    def admitted(self) -> list[Admission]:
        """Admitted from waiting for the first time, in vLLM's order."""
        return [a for a in self.record.admitted if not a.resumed]

    @property
    def resumed(self) -> list[Admission]:
        """Preempted victims admitted again (recomputing), in vLLM's order."""
        return [a for a in self.record.admitted if a.resumed and not a.swapped_in]

    @property
    def swapped_in(self) -> list[Admission]:
        """V0: victims swapped back in from CPU memory, their KV intact."""
        return [a for a in self.record.admitted if a.swapped_in]


def scheduled_tokens(eng: Any) -> tuple[list[tuple[str, int]], int | None]:
    """What the step `eng` just ran gave each request, in vLLM's order, and the token
    budget it left (V1: schedule()'s output, the conformance trace's `scheduled` and
    `token_budget_left`; V0: its record's `scheduled`, the budget left not kept)."""
    if hasattr(eng, "eng"):  # V0Steps
        raw = eng.last_record or {}
        return [(rid, n) for rid, n in raw.get("scheduled") or ()], None
    out = eng.last_output
    if out is None:  # an idle step: nothing scheduled, the whole budget left
        return [], eng.workload.config.max_num_batched_tokens
    return list(out.num_scheduled_tokens.items()), out.token_budget_left


def _v0_state(cls: Any, steps: Any, step: int, preemptions: dict[str, int]) -> EngineState:
    sched = steps.eng.sched
    bm = sched.block_manager
    n = bm.num_total_gpu_blocks
    refs = array("i", [0] * n)
    owners: dict[int, list[str]] = {}
    reqs: dict[str, RequestState] = {}
    for g in sorted([*sched.running, *sched.waiting, *sched.swapped], key=lambda g: g.seq_id):
        table = bm.block_tables.get(g.seq_id)
        ids = tuple(b.block_id for b in table.blocks if b.block_id < n) if table else ()
        for i in ids:
            refs[i] += 1
            owners.setdefault(i, []).append(g.request_id)
        reqs[g.request_id] = RequestState(g.request_id, str(g.status), g.priority, g.prompt_len,
                                          g.get_len(), g.num_computed_tokens,
                                          preemptions.get(g.request_id, 0), ids)
    gpu = bm.gpu
    cached = set(gpu.evictor.free_table) if getattr(gpu, "caching", False) else set()
    states = bytearray(n)
    for i in range(n):
        r = refs[i]
        states[i] = (HELD if r == 1 else SHARED) if r else (CACHED if i in cached else FREE)
    free = bm.get_num_free_gpu_blocks()
    return cls(
        step=step,
        running=[g.request_id for g in sched.running],
        waiting=[g.request_id for g in sched.waiting] + [g.request_id for g in sched.swapped],
        requests=reqs, block_states=bytes(states), block_refs=refs, _owners=owners,
        free_queue=list(gpu.free_ids), free_blocks=free, kv_usage=round(1.0 - free / n, 6),
        cached_blocks=len(cached),
    )

