"""vLLM V1 scheduler: `schedule()` and `update_from_output()` (spec A7, A8, A9).

Written from the spec, not from vLLM's code. Version differences are fields of the
profile (replay/profile.py); the control flow below is the same for every V1 release.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvreplay.limits import check as check_limit
from kvreplay.replay.block_pool import BlockPool
from kvreplay.replay.kv_cache_manager import AllocationFailure, KVCacheManager, PrefixCacheStats
from kvreplay.replay.profile import DEFAULT_PROFILE, SchedulerProfile
from kvreplay.replay.records import AdmissionBlocked, PreemptionEvent
from kvreplay.replay.request import Request, RequestStatus
from kvreplay.replay.request_queue import create_request_queue

WAITING = RequestStatus.WAITING
RUNNING = RequestStatus.RUNNING
PREEMPTED = RequestStatus.PREEMPTED


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """The knobs of spec A13 that a replay needs (vLLM's names and defaults)."""

    num_gpu_blocks: int = 64
    block_size: int = 16
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 2048
    max_model_len: int = 2048
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = False
    policy: str = "fcfs"
    long_prefill_token_threshold: int = 0
    scheduler_reserve_full_isl: bool = True
    watermark: float = 0.0
    async_scheduling: bool = False


@dataclass(slots=True)
class SchedulerOutput:
    """What one `schedule()` decided, in vLLM's order."""

    num_scheduled_tokens: dict[str, int]
    new_req_ids: list[str]
    resumed_req_ids: list[str]
    running_req_ids: list[str]
    prefix_hit_tokens: dict[str, int]
    preempted_req_ids: list[str]
    preemptions: list[PreemptionEvent]
    will_sample: list[str]  # scheduled ids that reach the end of their sequence: they sample
    token_budget: int
    token_budget_left: int
    free_blocks_before: int
    free_blocks_after: int
    # waiting requests that could not be admitted, and why (first failure only)
    admission_blocked: AdmissionBlocked | None = None
    # requests skipped in Phase R with n == 0 (async final token in flight, len cap)
    skipped_running: list[str] = field(default_factory=list)
    # num_computed_tokens of the scheduled requests once this schedule advanced them
    context_tokens: int = 0
    # vLLM's IterationDetails (compute_iteration_details): scheduled requests with no output
    # token yet, output placeholders included ("context" requests), and their tokens; every
    # other scheduled request is a "generation" request
    num_ctx_requests: int = 0
    num_ctx_tokens: int = 0
    ctx_req_ids: list[str] = field(default_factory=list)  # those requests, in order

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(self.num_scheduled_tokens.values())


@dataclass(slots=True)
class UpdateResult:
    sampled: list[Request]
    finished: list[Request]


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        profile: SchedulerProfile = DEFAULT_PROFILE,
        *,
        check_invariants: bool = False,
    ) -> None:
        from kvreplay.replay.profile import check_config

        check_config(profile, config)
        check_limit("tokens", config.max_model_len, "max_model_len")
        self.config = config
        self.profile = profile
        self.check_invariants = check_invariants
        self.policy = config.policy
        self.priority = config.policy == "priority"
        self.pool = BlockPool(
            config.num_gpu_blocks,
            config.enable_prefix_caching,
            null_block=profile.null_block,
            free_unhashed_to_head=profile.free_unhashed_to_head,
        )
        watermark_blocks = 0
        if profile.watermark and config.watermark:
            watermark_blocks = int(config.watermark * config.num_gpu_blocks)  # A6.4
        self.kv_cache_manager = KVCacheManager(
            self.pool,
            config.block_size,
            config.max_model_len,
            config.enable_prefix_caching,
            watermark_blocks,
        )
        self.max_num_running_reqs = config.max_num_seqs
        self.max_num_scheduled_tokens = config.max_num_batched_tokens
        self.max_model_len = config.max_model_len
        self.requests: dict[str, Request] = {}
        self.running: list[Request] = []
        self.waiting = create_request_queue(config.policy)
        self.finished_req_ids: set[str] = set()
        self.async_scheduling = config.async_scheduling
        # A7 n cap on running requests (C4).
        cap = profile.max_model_len_cap
        self._len_cap_offset = {"none": None, "len": 0, "len-1": 1}[cap]
        self.num_steps = 0
        self.prefix_stats = self.kv_cache_manager.prefix_stats

    # -- requests ------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        self.requests[request.request_id] = request
        self.waiting.add_request(request)

    def has_unfinished_requests(self) -> bool:
        return bool(self.running) or bool(self.waiting)

    def has_requests(self) -> bool:
        """Unfinished requests, or finished ids not yet reported by a `schedule()`: the
        engine steps once more after the last finish to tell the workers (A8.4)."""
        return bool(self.running) or bool(self.waiting) or bool(self.finished_req_ids)

    @property
    def kv_cache_usage(self) -> float:
        denom = self.pool.num_usable_blocks if self.profile.usage_excludes_null_block else (
            self.config.num_gpu_blocks
        )
        return 1.0 - self.pool.get_num_free_blocks() / denom

    # -- A7 ------------------------------------------------------------------------
    def _threshold(self) -> int:
        """A7: effective long_prefill_token_threshold for this step (C3)."""
        if not self.profile.long_prefill_threshold:
            return 0
        t = self.config.long_prefill_token_threshold
        if t > 0 and self.profile.threshold_lone_request_exempt:
            if len(self.running) + len(self.waiting) <= 1:
                return 0
        return t

    def schedule(self) -> SchedulerOutput:
        profile = self.profile
        kv = self.kv_cache_manager
        pool = self.pool
        running = self.running
        token_budget = self.max_num_scheduled_tokens
        budget_start = token_budget
        threshold = self._threshold()
        len_cap = self._len_cap_offset
        max_model_len = self.max_model_len
        free_before = pool.free_block_queue.num_free_blocks

        num_scheduled_tokens: dict[str, int] = {}
        scheduled_running: list[Request] = []
        preempted: list[Request] = []
        preemptions: list[PreemptionEvent] = []
        skipped_running: list[str] = []
        async_skip = self.async_scheduling and profile.async_skip_final_token
        allocate = kv.allocate_slots

        # ---- Phase R: running requests, in list order -------------------------------
        req_index = 0
        while req_index < len(running) and token_budget > 0:
            request = running[req_index]
            # E25 / A9: async, the final token is already in flight: nothing to do.
            if (
                async_skip
                and request.num_output_placeholders > 0
                and request.num_computed_tokens + 2 - request.num_output_placeholders
                >= request.num_prompt_tokens + request.max_tokens
            ):
                skipped_running.append(request.request_id)
                req_index += 1
                continue
            n = request.num_tokens + request.num_output_placeholders - request.num_computed_tokens
            if 0 < threshold < n:
                n = threshold
            if n > token_budget:
                n = token_budget
            if len_cap is not None:  # C4
                cap = max_model_len - len_cap - request.num_computed_tokens
                if n > cap:
                    n = cap
            if n <= 0:
                # Skip, do not stop (A7).
                skipped_running.append(request.request_id)
                req_index += 1
                continue

            while True:
                alloc = allocate(request, n)
                if alloc.ok:
                    break
                # Choose the victim (A7): FCFS running[-1]; PRIORITY max(priority, arrival).
                if self.priority:
                    victim = max(running, key=_priority_key)
                    victim_index = running.index(victim)
                    rule = "priority: max(priority, arrival_time) over running"
                else:
                    victim = running[-1]
                    victim_index = len(running) - 1
                    rule = "fcfs: running[-1]"
                del running[victim_index]
                was_scheduled = victim.request_id in num_scheduled_tokens and victim is not request
                rolled_back = 0
                if was_scheduled and victim in scheduled_running:
                    # C6: undo the victim's scheduling this step.
                    mode = profile.priority_rollback
                    if mode == "full":
                        scheduled_running.remove(victim)
                        rolled_back = num_scheduled_tokens.pop(victim.request_id)
                        token_budget += rolled_back
                    elif mode == "partial":
                        # 0.10.2-0.11 defect: its tokens stay scheduled, budget not refunded.
                        scheduled_running.remove(victim)
                    # "none" (0.9.2-0.10.0): it stays scheduled with its tokens.
                idx_rule = profile.rollback_index
                if (idx_rule == "if_before" and victim_index < req_index) or (
                    idx_rule == "if_scheduled" and was_scheduled
                ):
                    req_index -= 1
                preemptions.append(self._preempt_request(
                    victim, request, rule, rolled_back, was_scheduled, alloc))
                preempted.append(victim)
                if victim is request:
                    break  # nothing left to preempt for this request
            if not alloc.ok:
                # r could not be scheduled.
                if (
                    self.priority
                    and profile.priority_self_preempt_continues
                    and request.status == PREEMPTED
                ):
                    continue  # 0.33: keep scanning; running[req_index] is the next one
                break  # Phase R stops; later running requests get nothing this step
            scheduled_running.append(request)
            num_scheduled_tokens[request.request_id] = n
            token_budget -= n
            req_index += 1

        # ---- Phase W: waiting requests, only if nothing was preempted ----------------
        new_reqs: list[Request] = []
        resumed_reqs: list[Request] = []
        prefix_hits: dict[str, int] = {}
        admission_blocked: AdmissionBlocked | None = None
        if not preempted:
            waiting = self.waiting
            skipped: list[Request] = []
            stale_skip = self.async_scheduling and profile.async_stale_output
            chunked = self.config.enable_chunked_prefill
            unchunked = profile.unchunked_overflow
            gate = self.config.scheduler_reserve_full_isl and profile.full_sequence_gate
            stats = self.prefix_stats
            at_admission = profile.prefix_stats_at_admission
            split_stats = profile.preempted_prefix_stats
            while waiting and token_budget > 0:
                if len(running) >= self.max_num_running_reqs:
                    break
                request = waiting.peek_request()
                # A9 (0.30+): stale async output still in flight: not resumable yet.
                if stale_skip and request.num_stale_output_tokens > 0:
                    skipped.append(waiting.pop_request())
                    continue
                hit_blocks: list = []
                num_hit = 0
                if request.num_computed_tokens == 0:
                    hit_blocks, num_hit = kv.get_computed_blocks(request)
                    if self.config.enable_prefix_caching and not at_admission:
                        stats.record(
                            request.num_tokens, num_hit,
                            split_stats and request.num_preemptions > 0,
                        )
                    base = num_hit
                else:
                    # 0.10.2-0.11 rollback defect: stale computed tokens count as done.
                    base = request.num_computed_tokens
                n = request.num_tokens - base
                if 0 < threshold < n:
                    n = threshold
                if not chunked and n > token_budget:
                    if unchunked == "break":  # C7, 0.12+
                        admission_blocked = _blocked(request, "token budget (chunked prefill off)", n, token_budget)
                        break
                    if unchunked == "skip":  # C7, 0.9.2-0.11
                        skipped.append(waiting.pop_request())
                        continue
                    # "chunk": V1 <= 0.9.0 always chunks
                if n > token_budget:
                    n = token_budget
                alloc = kv.allocate_slots(
                    request,
                    n,
                    hit_blocks,
                    num_hit,
                    full_sequence_must_fit=gate,
                    has_running_reqs=bool(running),
                )
                if not alloc.ok:
                    admission_blocked = _blocked(
                        request, "full-sequence gate" if alloc.gate else "KV blocks", n,
                        token_budget, alloc)
                    break  # head-of-line blocking (A7)
                if self.config.enable_prefix_caching and at_admission:
                    stats.record(
                        request.num_tokens, num_hit, split_stats and request.num_preemptions > 0
                    )
                waiting.pop_request()
                running.append(request)
                if request.status == PREEMPTED:
                    resumed_reqs.append(request)
                else:
                    new_reqs.append(request)
                request.status = RUNNING
                request.num_computed_tokens = base
                prefix_hits[request.request_id] = base
                num_scheduled_tokens[request.request_id] = n
                token_budget -= n
            if skipped:
                if profile.skipped_requeued_reversed:
                    skipped.reverse()  # E24 (0.11)
                waiting.prepend_requests(skipped)

        # ---- _update_after_schedule: advance num_computed_tokens at schedule time -----
        requests = self.requests
        will_sample: list[str] = []
        async_mode = self.async_scheduling
        context = 0
        ctx_requests = ctx_tokens = 0
        ctx_ids: list[str] = []
        for req_id, n in num_scheduled_tokens.items():
            request = requests[req_id]
            # read before this step's placeholder is added, as _make_cached_request_data
            # reads num_output_tokens + num_output_placeholders (new requests have neither)
            if request.num_output_tokens + request.num_output_placeholders == 0:
                ctx_requests += 1
                ctx_tokens += n
                ctx_ids.append(req_id)
            request.num_computed_tokens += n
            context += request.num_computed_tokens
            request.num_in_flight_tokens += n
            is_chunk = request.num_computed_tokens < (
                request.num_tokens + request.num_output_placeholders
            )
            request.is_prefill_chunk = is_chunk
            if async_mode and not is_chunk:
                request.num_output_placeholders += 1
            if not is_chunk:
                will_sample.append(req_id)

        self.num_steps += 1
        self.finished_req_ids = set()  # reported with this step's output
        if self.check_invariants:
            self.check()
        return SchedulerOutput(
            num_scheduled_tokens=num_scheduled_tokens,
            new_req_ids=[r.request_id for r in new_reqs],
            resumed_req_ids=[r.request_id for r in resumed_reqs],
            # Scheduled ids that were RUNNING before this step (with the 0.9-0.11 rollback
            # defect a preempted victim can still be among them).
            running_req_ids=[rid for rid in num_scheduled_tokens if rid not in prefix_hits],
            prefix_hit_tokens=prefix_hits,
            preempted_req_ids=[r.request_id for r in preempted],
            preemptions=preemptions,
            will_sample=will_sample,
            token_budget=budget_start,
            token_budget_left=token_budget,
            free_blocks_before=free_before,
            free_blocks_after=pool.free_block_queue.num_free_blocks,
            admission_blocked=admission_blocked,
            skipped_running=skipped_running,
            context_tokens=context,
            num_ctx_requests=ctx_requests,
            num_ctx_tokens=ctx_tokens,
            ctx_req_ids=ctx_ids,
        )

    def _preempt_request(self, request: Request, trigger: Request, rule: str,
                         rolled_back: int, was_scheduled: bool,
                         failure: AllocationFailure) -> PreemptionEvent:
        """A1.4: free the blocks, reset to PREEMPTED with 0 computed tokens, put it at the
        front of waiting (a heap push under PRIORITY). Outputs are kept."""
        kv = self.kv_cache_manager
        free_queue = self.pool.free_block_queue
        num_computed = request.num_computed_tokens
        free_before = free_queue.num_free_blocks
        blocks_held = kv.free(request)
        request.status = PREEMPTED
        request.num_computed_tokens = 0
        if self.profile.async_stale_output:
            request.num_stale_output_tokens = request.num_in_flight_tokens
        request.num_output_placeholders = 0
        request.num_preemptions += 1
        self.waiting.prepend_request(request)
        return PreemptionEvent(
            victim=request.request_id,
            trigger=trigger.request_id,
            self_preempt=request is trigger,
            num_computed_tokens=num_computed,
            num_tokens=request.num_tokens,
            num_output_tokens=request.num_output_tokens,
            blocks_held=blocks_held,
            free_blocks_before=free_before,
            free_blocks_after=free_queue.num_free_blocks,
            victim_rule=rule,
            rolled_back_tokens=rolled_back,
            was_scheduled_this_step=was_scheduled,
            blocks_needed=failure.blocks_needed,
            free_blocks_at_failure=failure.free_blocks,
        )

    # -- A8 ------------------------------------------------------------------------
    def update_from_output(
        self,
        output: SchedulerOutput,
        sampled_token_ids: dict[str, int],
    ) -> UpdateResult:
        """Apply one batch's output: tokens appended, stop checks, finished requests freed.

        `sampled_token_ids` maps request id -> the one token the model produced for it.
        """
        requests = self.requests
        stopped_running: list[Request] = []
        stopped_waiting: list[Request] = []
        sampled: list[Request] = []
        max_model_len = self.max_model_len
        async_mode = self.async_scheduling
        stale_rule = self.profile.async_stale_output
        kv = self.kv_cache_manager
        caching = self.config.enable_prefix_caching
        for req_id, n in output.num_scheduled_tokens.items():
            request = requests.get(req_id)
            if request is None:
                continue
            request.num_in_flight_tokens -= n
            output_is_stale = False
            if stale_rule and request.num_stale_output_tokens > 0:
                output_is_stale = True
                request.num_stale_output_tokens -= n
            if request.status > PREEMPTED:  # finished
                continue
            token = sampled_token_ids.get(req_id)
            if token is None:
                continue
            status_before = request.status
            request.append_output_token(token)
            sampled.append(request)
            # check_stop (A8.3): the fake model has no EOS, so only the length rules apply.
            stopped = (
                request.num_tokens >= max_model_len
                or request.num_output_tokens >= request.max_tokens
            )
            if async_mode:
                if not output_is_stale and request.num_output_placeholders > 0:
                    request.num_output_placeholders -= 1
                # Registered even when it just stopped: it is freed right after, and a
                # hashed block goes to the tail of the free queue, not the head (A3.4).
                if caching and status_before == RUNNING:
                    kv.cache_blocks(
                        request, request.num_computed_tokens - request.num_output_placeholders
                    )
            if stopped:
                request.status = RequestStatus.FINISHED_LENGTH_CAPPED
                if status_before == RUNNING:
                    stopped_running.append(request)
                else:
                    stopped_waiting.append(request)
        finished = stopped_running + stopped_waiting
        if stopped_running:
            drop = set(id(r) for r in stopped_running)
            self.running = [r for r in self.running if id(r) not in drop]
        if stopped_waiting:
            self.waiting.remove_requests(stopped_waiting)
        for request in finished:
            self._free_request(request)
        if self.check_invariants:
            self.check()
        return UpdateResult(sampled=sampled, finished=finished)

    def _free_request(self, request: Request) -> None:
        self.kv_cache_manager.free(request)
        del self.requests[request.request_id]
        self.finished_req_ids.add(request.request_id)

    def finish_requests(self, request_ids: list[str], status: RequestStatus) -> None:
        """Aborts between steps (A8): blocks freed at once."""
        for req_id in request_ids:
            request = self.requests.get(req_id)
            if request is None or request.status.is_finished:
                continue
            if request.status == RUNNING:
                self.running.remove(request)
            else:
                self.waiting.remove_request(request)
            request.status = status
            self._free_request(request)

    # -- invariants ------------------------------------------------------------------
    def check(self) -> None:
        self.pool.check()
        running_ids = [r.request_id for r in self.running]
        waiting_ids = [r.request_id for r in self.waiting]
        assert len(set(running_ids)) == len(running_ids), "request twice in running"
        assert not set(running_ids) & set(waiting_ids), "request both running and waiting"
        assert len(running_ids) + len(waiting_ids) == len(self.requests), "request lost"
        for r in self.running:
            assert r.status == RUNNING, f"{r} in running"
        for r in self.waiting:
            assert r.status in (WAITING, PREEMPTED), f"{r} in waiting"
        self.kv_cache_manager.check(self.requests)


def _priority_key(r: Request) -> tuple[int, float]:
    return (r.priority, r.arrival_time)


def _blocked(request: Request, reason: str, n: int, budget: int,
             failure: AllocationFailure | None = None) -> AdmissionBlocked:
    if failure is None:
        return AdmissionBlocked(request.request_id, reason, n, budget)
    return AdmissionBlocked(request.request_id, reason, n, budget, failure.blocks_needed,
                            failure.free_blocks, failure.watermark_blocks)
