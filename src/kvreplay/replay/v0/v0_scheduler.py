"""The V0 scheduler (vLLM 0.6.6 `vllm/core/scheduler.py`), spec Part B with Part F.

Waiting / running / swapped deques of single-sequence groups (0.6.6 splits n>1 into n
groups, spec B "Preemption mode"), `_schedule_default` (prefill-first) and
`_schedule_chunked_prefill` (decode-first), preemption by RECOMPUTE or SWAP, priority
force-preemption, the cumulative preemption counter and the per-step Prometheus count.
"""
from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field
from typing import Deque, Dict, List, Optional, Set, Tuple

from .blocks import AllocStatus, BlockSpaceManager, InvariantError, TerminalError

WAITING = "WAITING"
RUNNING = "RUNNING"
SWAPPED = "SWAPPED"
FINISHED_LENGTH_CAPPED = "FINISHED_LENGTH_CAPPED"
FINISHED_IGNORED = "FINISHED_IGNORED"


class PreemptionMode(enum.Enum):
    SWAP = "swap"
    RECOMPUTE = "recompute"


SWAP_SPACE_MESSAGE = ("Aborted due to the lack of CPU swap space. Please increase the swap "
                      "space to avoid this error.")


@dataclass(frozen=True)
class V0Config:
    block_size: int
    num_gpu_blocks: int
    num_cpu_blocks: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    enable_chunked_prefill: bool
    enable_prefix_caching: bool
    policy: str                       # "fcfs" | "priority"
    preemption_mode: Optional[str]    # None | "recompute" | "swap"
    watermark: float = 0.01


@dataclass(frozen=True)
class V0Profile:
    """Release-specific V0 behaviour. Only 0.6.6.post1 was checked against its own code
    (spec Part F); other V0 releases get a profile here once an oracle shows a difference."""
    version: str = "0.6.6.post1"
    # spec B: a warning is logged when the counter (before increment) is a multiple of this.
    warning_every: int = 50


V0_PROFILES: Dict[str, V0Profile] = {"0.6.6": V0Profile(), "0.6.6.post1": V0Profile()}


class SequenceGroup:
    """A single-sequence group: the sequence's data and status live here too."""

    __slots__ = ("request_id", "seq_id", "token_ids", "prompt_len", "num_computed_tokens",
                 "_prefill", "status", "max_tokens", "priority", "arrival_time")

    def __init__(self, request_id: str, seq_id: int, prompt: List[int], max_tokens: int,
                 priority: int, arrival_time: float) -> None:
        self.request_id = request_id
        self.seq_id = seq_id
        self.token_ids: List[int] = list(prompt)
        self.prompt_len = len(prompt)
        self.num_computed_tokens = 0
        self._prefill = True
        self.status = WAITING
        self.max_tokens = max_tokens
        self.priority = priority
        self.arrival_time = arrival_time

    def get_len(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.prompt_len

    def is_prefill(self) -> bool:
        return self._prefill

    def is_finished(self) -> bool:
        return self.status.startswith("FINISHED")

    def update_num_computed_tokens(self, n: int) -> None:
        if self.is_finished():
            return
        self.num_computed_tokens += n
        if self.num_computed_tokens > self.get_len():
            raise InvariantError(f"{self.request_id}: computed tokens past the sequence")
        if self.num_computed_tokens == self.get_len():
            self._prefill = False

    def reset_state_for_recompute(self) -> None:
        # spec B "Recompute": computed tokens back to 0, stage back to PREFILL; outputs kept.
        self.num_computed_tokens = 0
        self._prefill = True


def _priority(g: SequenceGroup) -> Tuple[int, float]:
    return (g.priority, g.arrival_time)


class SchedulingBudget:
    """Token and sequence budget of one step; adds and subtracts are keyed by request id, so
    a second add for the same id is ignored and a subtract without an add is a no-op."""

    def __init__(self, token_budget: int, max_num_seqs: int, on_add=None) -> None:
        self.token_budget = token_budget
        self.max_num_seqs = max_num_seqs
        self._tok_ids: Set[str] = set()
        self._seq_ids: Set[str] = set()
        self.num_batched_tokens = 0
        self.num_cached_tokens = 0
        self.num_curr_seqs = 0
        self._on_add = on_add

    def can_schedule(self, num_new_tokens: int, num_new_seqs: int) -> bool:
        return (self.num_batched_tokens + num_new_tokens <= self.token_budget
                and self.num_curr_seqs + num_new_seqs <= self.max_num_seqs)

    def remaining_token_budget(self) -> int:
        return self.token_budget - self.num_batched_tokens

    def add_num_batched_tokens(self, req_id: str, n: int, cached: int = 0) -> None:
        if self._on_add is not None:
            self._on_add(req_id, n, cached)
        if req_id in self._tok_ids:
            return
        self._tok_ids.add(req_id)
        self.num_batched_tokens += n
        self.num_cached_tokens += cached

    def subtract_num_batched_tokens(self, req_id: str, n: int) -> None:
        if req_id in self._tok_ids:
            self._tok_ids.remove(req_id)
            self.num_batched_tokens -= n

    def add_num_seqs(self, req_id: str, n: int) -> None:
        if req_id in self._seq_ids:
            return
        self._seq_ids.add(req_id)
        self.num_curr_seqs += n

    def subtract_num_seqs(self, req_id: str, n: int) -> None:
        if req_id in self._seq_ids:
            self._seq_ids.remove(req_id)
            self.num_curr_seqs -= n


@dataclass
class _RunningOut:
    decode: List[Tuple[SequenceGroup, int]] = field(default_factory=list)
    prefill: List[Tuple[SequenceGroup, int]] = field(default_factory=list)
    preempted: List[SequenceGroup] = field(default_factory=list)
    swapped_out: List[SequenceGroup] = field(default_factory=list)
    blocks_to_swap_out: List[List[int]] = field(default_factory=list)


@dataclass
class _SwappedOut:
    decode: List[Tuple[SequenceGroup, int]] = field(default_factory=list)
    prefill: List[Tuple[SequenceGroup, int]] = field(default_factory=list)
    blocks_to_swap_in: List[List[int]] = field(default_factory=list)
    infeasible: List[SequenceGroup] = field(default_factory=list)


@dataclass
class _PrefillOut:
    groups: List[Tuple[SequenceGroup, int]] = field(default_factory=list)
    ignored: List[SequenceGroup] = field(default_factory=list)


@dataclass
class SchedulerOutputs:
    scheduled: List[Tuple[SequenceGroup, int, bool]]   # (group, token_chunk_size, do_sample)
    num_prefill_groups: int
    num_batched_tokens: int
    blocks_to_swap_in: List[List[int]]
    blocks_to_swap_out: List[List[int]]
    blocks_to_copy: List[List[int]]
    ignored: List[SequenceGroup]
    preempted: int          # running-phase victims: the vllm:num_preemptions_total increment


class Scheduler:
    def __init__(self, config: V0Config, profile: V0Profile = V0Profile(),
                 check_invariants: bool = False) -> None:
        self.config = config
        self.profile = profile
        self.check_invariants = check_invariants
        self.block_manager = BlockSpaceManager(
            config.block_size, config.num_gpu_blocks, config.num_cpu_blocks,
            config.enable_prefix_caching, config.watermark)
        self.waiting: Deque[SequenceGroup] = deque()
        self.running: Deque[SequenceGroup] = deque()
        self.swapped: Deque[SequenceGroup] = deque()
        self.num_cumulative_preemption = 0
        # per-step instrumentation (what the oracle records; never read by a decision)
        self.preemption_log: List[dict] = []
        self.budget_log: List[Tuple[str, int, int]] = []

    # ------------------------------------------------------------------ queues
    def add_seq_group(self, g: SequenceGroup) -> None:
        self.waiting.append(g)

    def has_unfinished_seqs(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def free_seq(self, g: SequenceGroup) -> None:
        self.block_manager.free(g)

    def free_finished_seq_groups(self) -> None:
        for g in self.running:
            if g.is_finished():
                self.block_manager.free(g)
        self.running = deque(g for g in self.running if not g.is_finished())

    def _prompt_limit(self) -> int:
        c = self.config
        if c.enable_chunked_prefill:
            return c.max_model_len
        return min(c.max_model_len, c.max_num_batched_tokens)

    # ------------------------------------------------------------------ token counting
    def _num_new_tokens(self, g: SequenceGroup, status: str, enable_chunking: bool,
                        budget: SchedulingBudget) -> Tuple[int, int]:
        """(uncached, cached) new tokens for the group if it is in `status`, else (0, 0).

        spec B: a decode is 1 token; a prefill is everything not yet computed, of which the
        tokens in cached blocks are "cached" (free in the budget). A fully cached prefill
        still computes its last token. With chunking the uncached part is capped by the
        remaining budget, rounded down to whole blocks when caching is on.
        """
        if g.status != status:
            return 0, 0
        cached_new = 0
        if not g.is_prefill():
            uncached = 1
        else:
            new = g.get_len() - g.num_computed_tokens
            if not self.config.enable_prefix_caching:
                uncached = new
            else:
                cached = self.block_manager.get_num_cached_tokens(g)
                if cached < g.num_computed_tokens and not (
                        g.status == RUNNING and self.config.enable_chunked_prefill):
                    # 0.6.6 source: a sanity assertion that only a running chunked prefill may
                    # have fewer cached than computed tokens. A group swapped out mid-prefill
                    # (chunked + caching + swap) trips it when it is considered for swap-in,
                    # and vLLM stops: reported as the terminal event.
                    raise TerminalError(
                        "AssertionError",
                        "Number of cached tokens should not be less than the number of computed "
                        "tokens for a sequence that's still in prefill. But there are "
                        f"{cached} cached tokens and {g.num_computed_tokens} computed tokens for "
                        f"sequence {g.seq_id}.", g.request_id)
                cached_new = max(0, cached - g.num_computed_tokens)
                uncached = new - cached_new
        if uncached == 0 and cached_new > 0:
            uncached, cached_new = 1, cached_new - 1
        if enable_chunking:
            remaining = budget.remaining_token_budget()
            if self.config.enable_prefix_caching:
                bs = self.config.block_size
                remaining = remaining // bs * bs
            uncached = min(uncached, remaining)
        return uncached, cached_new

    # ------------------------------------------------------------------ preemption
    def _preempt(self, victim: SequenceGroup, blocks_to_swap_out: List[List[int]],
                 trigger: Optional[SequenceGroup], called_from: str) -> PreemptionMode:
        """spec B "Preemption mode" + "Log and counters"; F.2, F.3."""
        bm = self.block_manager
        user = self.config.preemption_mode
        if user is None:
            mode = PreemptionMode.RECOMPUTE  # one running sequence per group (0.6.6 n-split)
        elif user == "swap":
            mode = PreemptionMode.SWAP
        else:
            mode = PreemptionMode.RECOMPUTE
        rec = {
            "req": victim.request_id,
            "trigger": trigger.request_id if trigger is not None else None,
            "self_preempt": trigger is victim,
            "called_from": called_from,
            "num_computed_tokens_before": victim.num_computed_tokens,
            "num_tokens": victim.get_len(),
            "num_output_tokens": victim.num_output_tokens,
            "blocks_held_before": bm.blocks_held(victim),
            "free_gpu_before": bm.get_num_free_gpu_blocks(),
            "free_cpu_before": bm.get_num_free_cpu_blocks(),
            "cumulative_before": self.num_cumulative_preemption,
            # F.2: warning "... is preempted by PreemptionMode.X mode ...
            # total_num_cumulative_preemption=<before+1>" on preemptions 1, 51, 101, ...
            "warning_logged": self.num_cumulative_preemption % self.profile.warning_every == 0,
        }
        self.preemption_log.append(rec)
        self.num_cumulative_preemption += 1
        if mode == PreemptionMode.RECOMPUTE:
            if victim.status != RUNNING:
                raise InvariantError("recompute victim is not running")
            victim.status = WAITING
            bm.free(victim)
            victim.reset_state_for_recompute()
        else:
            if not bm.can_swap_out(victim):
                # F.3: the counter was already incremented; no fallback to recompute.
                rec["mode"] = "swap"
                rec["error"] = SWAP_SPACE_MESSAGE
                rec["cumulative_after"] = self.num_cumulative_preemption
                raise TerminalError("RuntimeError", SWAP_SPACE_MESSAGE, victim.request_id)
            blocks_to_swap_out.extend(bm.swap_out(victim))
            if victim.status == RUNNING:
                victim.status = SWAPPED
        rec["mode"] = mode.value
        rec["free_gpu_after"] = bm.get_num_free_gpu_blocks()
        rec["free_cpu_after"] = bm.get_num_free_cpu_blocks()
        rec["cumulative_after"] = self.num_cumulative_preemption
        return mode

    # ------------------------------------------------------------------ phases
    def _schedule_running(self, budget: SchedulingBudget, enable_chunking: bool) -> _RunningOut:
        """spec B/_schedule_running; F.1."""
        ret = _RunningOut()
        bm = self.block_manager
        rq = self.running
        while rq:
            g = rq[0]
            n, _ = self._num_new_tokens(g, RUNNING, enable_chunking, budget)
            if n == 0:
                break           # budget exhausted: g and the rest stay at the front of running
            rq.popleft()
            scheduled = True
            while not bm.can_append_slots(g):
                # F.1: the subtraction is for the trigger g, not the victim: the token part is
                # a no-op and, on the default path, g's pre-counted sequence is removed.
                budget.subtract_num_batched_tokens(g.request_id, n)
                budget.subtract_num_seqs(g.request_id, 1)
                if rq:
                    victim, cont = rq.pop(), True       # the last running group
                else:
                    victim, cont = g, False             # nothing left: preempt g itself
                mode = self._preempt(victim, ret.blocks_to_swap_out, g, "_schedule_running")
                (ret.preempted if mode == PreemptionMode.RECOMPUTE else ret.swapped_out).append(victim)
                if not cont:
                    scheduled = False
                    break
            if not scheduled:
                break
            bm.append_slots(g)
            if g.is_prefill():
                ret.prefill.append((g, n))
            else:
                ret.decode.append((g, 1))
            budget.add_num_batched_tokens(g.request_id, n)
            if enable_chunking:
                budget.add_num_seqs(g.request_id, 1)
        return ret

    def _schedule_swapped(self, budget: SchedulingBudget, enable_chunking: bool) -> _SwappedOut:
        """spec B "Swap": can_swap_in LATER stops, NEVER ignores (F.4)."""
        ret = _SwappedOut()
        bm = self.block_manager
        sq = self.swapped
        while sq:
            g = sq[0]
            st = bm.can_swap_in(g)
            if st == AllocStatus.LATER:
                break
            if st == AllocStatus.NEVER:
                # The group keeps its CPU blocks: 0.6.6 never frees an ignored swapped group.
                g.status = FINISHED_IGNORED
                ret.infeasible.append(g)
                sq.popleft()
                continue
            unc, cac = self._num_new_tokens(g, SWAPPED, enable_chunking, budget)
            if unc == 0 or not budget.can_schedule(unc, 1):
                break
            sq.popleft()
            ret.blocks_to_swap_in.extend(bm.swap_in(g))
            g.status = RUNNING
            bm.append_slots(g)
            if g.is_prefill():
                ret.prefill.append((g, unc + cac))
            else:
                ret.decode.append((g, 1))
            budget.add_num_batched_tokens(g.request_id, unc, cac)
            budget.add_num_seqs(g.request_id, 1)
        return ret

    def _schedule_prefills(self, budget: SchedulingBudget, enable_chunking: bool) -> _PrefillOut:
        """spec B/_schedule_prefills; F.5."""
        ret = _PrefillOut()
        bm = self.block_manager
        c = self.config
        wq = self.waiting
        while wq:
            g = wq[0]
            if g.status != WAITING:
                # F.6 consequence: a swapped group put into `waiting` by priority
                # force-preemption makes 0.6.6 fail an assertion here.
                raise TerminalError("AssertionError",
                                    "Waiting sequence group should have only one prompt sequence.",
                                    g.request_id)
            unc, cac = self._num_new_tokens(g, WAITING, enable_chunking, budget)
            num_new = unc + cac
            if num_new > self._prompt_limit():
                g.status = FINISHED_IGNORED          # F.5: only when it reaches the head
                ret.ignored.append(g)
                wq.popleft()
                continue
            st = bm.can_allocate(g)
            if st == AllocStatus.LATER:
                break                                 # head-of-line
            if st == AllocStatus.NEVER:
                g.status = FINISHED_IGNORED
                ret.ignored.append(g)
                wq.popleft()
                continue
            if budget.num_batched_tokens >= c.max_num_batched_tokens:
                break
            if unc == 0 or not budget.can_schedule(unc, 1):
                break
            wq.popleft()
            bm.allocate(g)
            g.status = RUNNING
            ret.groups.append((g, num_new))
            budget.add_num_batched_tokens(g.request_id, unc, cac)
            budget.add_num_seqs(g.request_id, 1)
        return ret

    def _schedule_priority_preemption(self, budget: SchedulingBudget) -> int:
        """spec B "Priority (V0)"; F.6. Returns the number of force-preemptions."""
        bm = self.block_manager
        running = deque(sorted(self.running, key=_priority))
        wq = self.waiting
        count = 0
        if wq:
            g = wq.popleft()
            unc, _ = self._num_new_tokens(g, WAITING, False, budget)
            while running and _priority(running[-1]) > _priority(g):
                if g.status != WAITING:
                    raise TerminalError("IndexError", "list index out of range", g.request_id)
                st = bm.can_allocate(g)
                if unc > 0 and st == AllocStatus.OK and budget.can_schedule(unc, 1):
                    break
                v = running.pop()
                vunc, _ = self._num_new_tokens(v, RUNNING, False, budget)
                budget.subtract_num_batched_tokens(v.request_id, vunc)
                budget.subtract_num_seqs(v.request_id, 1)
                # The swap mapping goes to a local list that 0.6.6 drops (never reported).
                self._preempt(v, [], None, "_schedule_priority_preemption")
                wq.appendleft(v)      # F.6: even a swapped victim goes to waiting
                count += 1
            wq.appendleft(g)
        self.waiting = deque(sorted(wq, key=_priority))
        self.running = running
        return count

    def _schedule_default(self) -> SchedulerOutputs:
        """spec B/_schedule_default (prefill-first, never mixed)."""
        c = self.config
        budget = SchedulingBudget(c.max_num_batched_tokens, c.max_num_seqs, self._on_budget_add)
        for g in self.running:                     # running sequences are pre-counted
            budget.add_num_seqs(g.request_id, 1)
        pf, rs, si = _PrefillOut(), _RunningOut(), _SwappedOut()
        if not self.swapped:                       # any swapped group blocks new prefills
            pf = self._schedule_prefills(budget, False)
        if not pf.groups and c.policy == "priority":
            self._schedule_priority_preemption(budget)
        if not pf.groups:
            rs = self._schedule_running(budget, False)
            if not rs.preempted and not rs.swapped_out:
                si = self._schedule_swapped(budget, False)
        self.waiting.extendleft(rs.preempted)      # front, in original running order
        self.running.extend(g for g, _ in pf.groups)
        self.running.extend(g for g, _ in rs.decode)
        self.running.extend(g for g, _ in si.decode)
        self.swapped.extend(rs.swapped_out)
        if rs.prefill or si.prefill:
            raise InvariantError("default path scheduled a running prefill")
        sched = pf.groups + rs.decode + si.decode
        return self._outputs(sched, len(pf.groups), budget, si, rs, pf.ignored + si.infeasible)

    def _schedule_chunked_prefill(self) -> SchedulerOutputs:
        """spec B/_schedule_chunked_prefill (decode-first); F.7."""
        c = self.config
        budget = SchedulingBudget(c.max_num_batched_tokens, c.max_num_seqs, self._on_budget_add)
        si = _SwappedOut()
        rs = self._schedule_running(budget, True)
        if not rs.preempted and not rs.swapped_out:
            # 0.6.6 source: the chunked path calls _schedule_swapped without enable_chunking, so
            # a group swapped out mid-prefill must fit its whole remaining prefill in the budget
            # (it is never chunked on swap-in).
            si = self._schedule_swapped(budget, False)
        pf = self._schedule_prefills(budget, True)   # unconditionally (F.7)
        self.waiting.extendleft(rs.preempted)        # after the prefill pass: not re-admitted
        self.running.extend(g for g, _ in si.decode)
        self.running.extend(g for g, _ in si.prefill)
        self.running.extend(g for g, _ in rs.decode)
        self.running.extend(g for g, _ in rs.prefill)
        self.running.extend(g for g, _ in pf.groups)
        self.swapped.extend(rs.swapped_out)
        sched = pf.groups + rs.prefill + si.prefill + rs.decode + si.decode
        nprefill = len(pf.groups) + len(si.prefill) + len(rs.prefill)
        return self._outputs(sched, nprefill, budget, si, rs, pf.ignored + si.infeasible)

    def _outputs(self, sched, nprefill, budget, si, rs, ignored) -> SchedulerOutputs:
        out = []
        for g, chunk in sched:
            do_sample = True
            if g.is_prefill() and chunk + g.num_computed_tokens < g.get_len():
                do_sample = False                  # a partial chunk samples nothing
            out.append((g, chunk, do_sample))
        return SchedulerOutputs(
            scheduled=out, num_prefill_groups=nprefill,
            num_batched_tokens=budget.num_batched_tokens + budget.num_cached_tokens,
            blocks_to_swap_in=si.blocks_to_swap_in, blocks_to_swap_out=rs.blocks_to_swap_out,
            blocks_to_copy=[], ignored=ignored,
            preempted=len(rs.preempted) + len(rs.swapped_out))

    def _on_budget_add(self, req_id: str, n: int, cached: int) -> None:
        self.budget_log.append((req_id, n, cached))

    def schedule(self, now: float) -> SchedulerOutputs:
        """One `Scheduler.schedule()`; `now` is the step's access time for the LRU evictor."""
        self.preemption_log = []
        self.budget_log = []
        if self.config.enable_chunked_prefill:
            out = self._schedule_chunked_prefill()
        else:
            out = self._schedule_default()
        bm = self.block_manager
        for g, _, _ in out.scheduled:
            bm.access_all_blocks_in_seq(g, now)
        if out.scheduled:
            # blocks registered during this schedule() become hit candidates from now on
            bm.mark_blocks_as_computed()
        if self.check_invariants:
            self.check()
        return out

    # ------------------------------------------------------------------ invariants
    def check(self) -> None:
        self.block_manager.check()
        ids = [g.request_id for q in (self.waiting, self.running, self.swapped) for g in q]
        if len(ids) != len(set(ids)):
            raise InvariantError("a group is in two queues (or twice in one)")
        for g in self.running:
            if g.status != RUNNING:
                raise InvariantError(f"{g.request_id} in running with status {g.status}")
            if g.seq_id not in self.block_manager.block_tables:
                raise InvariantError(f"running {g.request_id} holds no block table")
        for g in self.swapped:
            if g.status != SWAPPED:
                raise InvariantError(f"{g.request_id} in swapped with status {g.status}")
        for g in self.waiting:
            if g.status == WAITING and g.seq_id in self.block_manager.block_tables:
                raise InvariantError(f"waiting {g.request_id} holds blocks")
            if g.num_computed_tokens != 0 and g.status == WAITING:
                raise InvariantError(f"waiting {g.request_id} has computed tokens")
