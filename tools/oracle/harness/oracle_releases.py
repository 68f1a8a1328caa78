"""What differs between the vLLM releases the oracle drives: one class per release.

oracle_core.py holds the one step loop and trace writer; it asks the class of the
installed vLLM (`for_version(vllm.__version__)`) for everything a release does
differently. `V0_33` is vLLM 0.33.0, the release the published conformance cases come
from; `V0_19` (vLLM 0.19.0) overrides only what 0.19 does differently from 0.33, and
`V0_11` (vLLM 0.11.0) only what 0.11 does differently from 0.19. Every override is an
API adaptation, never a change to what vLLM decides: the scheduler, the KV cache manager
and the request are vLLM's own code in every release.

Runs inside a vLLM venv; imports vLLM only inside methods, after oracle_core has set the
environment.
"""
from __future__ import annotations

import sys

EXIT_UNSUPPORTED = 3  # the workload uses a config key this vLLM release lacks


class V0_33:
    """vLLM 0.33.0."""

    version = "0.33.0"

    def unsupported(self, cfg: dict) -> str | None:
        """Why this release cannot run the workload (exit 3), or None."""
        return None

    def prepare_platform(self) -> None:
        """Anything to do before vLLM resolves its platform. 0.33 selects CpuPlatform
        from VLLM_TARGET_DEVICE=cpu (set by oracle_core)."""

    def hash_fn_by_name(self, name: str):
        from vllm.utils.hashing import get_hash_fn_by_name

        return get_hash_fn_by_name(name)

    def scheduler_config_kwargs(self, cfg: dict) -> dict:
        """SchedulerConfig arguments beyond the ones every release takes."""
        return {
            "is_encoder_decoder": False,
            "scheduler_reserve_full_isl": cfg["scheduler_reserve_full_isl"],
            "watermark": cfg["watermark"],
        }

    def vllm_config_kwargs(self) -> dict:
        return {}

    def block_sizes(self, kv_cache_config, vllm_config) -> tuple[int, int]:
        """(scheduler block size, hash block size): the same call EngineCore.__init__
        makes (vllm/v1/engine/core.py, resolve_kv_cache_block_sizes)."""
        from vllm.v1.core.kv_cache_utils import resolve_kv_cache_block_sizes

        return resolve_kv_cache_block_sizes(kv_cache_config, vllm_config)

    def resolved_admission(self, sc) -> dict:
        """The two admission knobs as vLLM's config holds them after post-init."""
        return {"scheduler_reserve_full_isl": sc.scheduler_reserve_full_isl,
                "watermark": sc.watermark}

    def scheduler_kwargs(self, scheduler_block_size: int, hash_block_size: int) -> dict:
        return {"block_size": scheduler_block_size, "hash_block_size": hash_block_size}

    def make_scheduler(self, base_cls, recorder, **kwargs):
        """The scheduler, instrumented to record each preemption: a subclass whose
        _preempt_request records (victim, trigger, state before the reset) and then calls
        vLLM's own _preempt_request unchanged."""

        class TracingScheduler(base_cls):
            def _preempt_request(self, request, timestamp, drop_stale_output=False):
                recorder.before(self, request, sys._getframe(1))
                super()._preempt_request(request, timestamp, drop_stale_output)
                recorder.after(self)

        return TracingScheduler(**kwargs)

    def block_hasher(self, hash_block_size: int, hash_fn, vllm_config):
        """As EngineCore.__init__ builds request_block_hasher."""
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher

        return get_request_block_hasher(
            hash_block_size, hash_fn, vllm_config.num_hash_lookahead_tokens
        )

    def check_batch_queue(self, vllm_config, scheduler, cfg: dict, size: int) -> None:
        """EngineCore: batch_queue_size = max_concurrent_batches (2 with async
        scheduling, 1 without PP otherwise -> plain step())."""
        assert vllm_config.max_concurrent_batches == size, vllm_config.max_concurrent_batches

    def max_concurrent_batches(self, vllm_config):
        return vllm_config.max_concurrent_batches

    def request_kwargs(self) -> dict:
        return {}

    def before_schedule(self, scheduler):
        """State will_sample needs from before schedule() (none in 0.33)."""
        return None

    def will_sample(self, scheduler, rid: str, before) -> bool:
        """The fake model samples a token iff vLLM no longer considers the request a
        prefill chunk after this step (its scheduled chunk reaches the end of its current
        sequence): partial prefill chunks sample nothing, like the model runner's discard
        of partial-prefill samples."""
        return not scheduler.requests[rid].is_prefill_chunk

    def check_preempted(self, so, preempted: list[dict], status_before: dict,
                        scheduler) -> None:
        """The recorded victims are the ones vLLM's SchedulerOutput lists."""
        assert {p["req"] for p in preempted} == set(so.preempted_req_ids), (
            preempted, so.preempted_req_ids)

    def resumed_req_ids(self, so) -> list[str]:
        return sorted(so.scheduled_cached_reqs.resumed_req_ids)

    def batch_stays_queued(self, scheduler, model_executed: bool, queue_len: int,
                           size: int) -> bool:
        """EngineCore.step_with_batch_queue returns early (the batch stays in flight, no
        update this iteration) iff `len(batch_queue) < batch_queue_size and
        (model_executed or scheduler.has_requests())`."""
        return queue_len < size and (model_executed or scheduler.has_requests())

    def waiting_order(self, scheduler) -> list[str]:
        """kv_holding_waiting (0.31+: preempted requests that keep their KV blocks) then
        waiting."""
        return [r.request_id for r in scheduler.kv_holding_waiting] + [
            r.request_id for r in scheduler.waiting
        ]


class V0_19(V0_33):
    """vLLM 0.19.0: what differs from 0.33.0."""

    version = "0.19.0"

    def unsupported(self, cfg: dict) -> str | None:
        # SchedulerConfig has no `watermark` before 0.24.
        if cfg["watermark"] != 0.0:
            return (f"unsupported in vLLM {self.version}: watermark={cfg['watermark']} "
                    "(SchedulerConfig.watermark exists from 0.24)")
        return None

    def prepare_platform(self) -> None:
        # 0.19's cpu_platform_plugin ignores VLLM_TARGET_DEVICE (it detects only CPU
        # builds of vLLM or macOS), so a CUDA wheel on a CPU-only machine resolves to
        # UnspecifiedPlatform, which cannot build a DeviceConfig. Register the builtin
        # "cpu" plugin to return CpuPlatform before vLLM resolves its platform: the
        # platform 0.33 gets from VLLM_TARGET_DEVICE=cpu. Its check_and_update_config
        # keeps a user-given block size and forces async scheduling off (turned back on
        # by oracle_core, as for 0.33).
        import vllm.platforms as _vllm_platforms

        if _vllm_platforms._current_platform is None:  # not yet resolved
            _vllm_platforms.builtin_platform_plugins["cpu"] = (
                lambda: "vllm.platforms.cpu.CpuPlatform"
            )

    def scheduler_config_kwargs(self, cfg: dict) -> dict:
        # no `watermark` (checked by unsupported())
        return {"is_encoder_decoder": False,
                "scheduler_reserve_full_isl": cfg["scheduler_reserve_full_isl"]}

    def block_sizes(self, kv_cache_config, vllm_config) -> tuple[int, int]:
        # No resolve_kv_cache_block_sizes / hash_block_size yet: 0.19's
        # EngineCore.__init__ sizes the scheduler's blocks as cache block_size * DCP * PCP
        # and hashes with the same size.
        pc = vllm_config.parallel_config
        size = (vllm_config.cache_config.block_size
                * pc.decode_context_parallel_size * pc.prefill_context_parallel_size)
        return size, size

    def resolved_admission(self, sc) -> dict:
        return {"scheduler_reserve_full_isl": sc.scheduler_reserve_full_isl,
                "watermark": 0.0}  # no such knob before 0.24 (checked by unsupported())

    def scheduler_kwargs(self, scheduler_block_size: int, hash_block_size: int) -> dict:
        # Scheduler(...) takes block_size= but no hash_block_size=.
        return {"block_size": scheduler_block_size}

    def make_scheduler(self, base_cls, recorder, **kwargs):
        # _preempt_request(request, timestamp): no drop_stale_output argument in 0.19.
        class TracingScheduler(base_cls):
            def _preempt_request(self, request, timestamp):
                recorder.before(self, request, sys._getframe(1))
                super()._preempt_request(request, timestamp)
                recorder.after(self)

        return TracingScheduler(**kwargs)

    def block_hasher(self, hash_block_size: int, hash_fn, vllm_config):
        # get_request_block_hasher(block_size, hash_fn): no lookahead argument in 0.19.
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher

        return get_request_block_hasher(hash_block_size, hash_fn)

    def check_batch_queue(self, vllm_config, scheduler, cfg: dict, size: int) -> None:
        # VllmConfig has no max_concurrent_batches in 0.19; the queue size is 2 with async
        # scheduling, as MultiprocExecutor.max_concurrent_batches.
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler

        assert bool(vllm_config.scheduler_config.async_scheduling) == cfg["async_scheduling"]
        assert (type(scheduler).__mro__[1] is AsyncScheduler) == cfg["async_scheduling"]

    def max_concurrent_batches(self, vllm_config):
        return getattr(vllm_config, "max_concurrent_batches", None)

    def batch_stays_queued(self, scheduler, model_executed: bool, queue_len: int,
                           size: int) -> bool:
        # 0.19's step_with_batch_queue returns early only if `model_executed and
        # len(batch_queue) < size and not batch_queue[-1].done()`: the fake model's
        # futures are taken as not done (GPU still busy).
        return model_executed and queue_len < size

    def waiting_order(self, scheduler) -> list[str]:
        # skipped_waiting (blocked / skipped requests; FCFS serves it first) then
        # waiting: 0.18-0.30 have a skipped_waiting queue, no kv_holding_waiting.
        return [r.request_id for r in scheduler.skipped_waiting] + [
            r.request_id for r in scheduler.waiting
        ]


class V0_11(V0_19):
    """vLLM 0.11.0: what differs from 0.19.0."""

    version = "0.11.0"

    def unsupported(self, cfg: dict) -> str | None:
        # Neither `watermark` (0.24) nor `scheduler_reserve_full_isl` (0.19) exists;
        # workloads at the 0.33 defaults (true / 0.0) run with 0.11's own admission, which
        # has no full-sequence gate at all.
        msg = super().unsupported(cfg)
        if msg is None and cfg["scheduler_reserve_full_isl"] is not True:
            msg = (f"unsupported in vLLM {self.version}: scheduler_reserve_full_isl="
                   f"{cfg['scheduler_reserve_full_isl']} (the knob exists from 0.19)")
        return msg

    def prepare_platform(self) -> None:
        # 0.11's cpu_platform_plugin ignores VLLM_TARGET_DEVICE, and its CpuPlatform
        # rejects any block size but 16 without intel_extension_for_pytorch: keep vLLM's
        # own resolution (UnspecifiedPlatform on a CPU-only machine with the CUDA wheel;
        # its check_and_update_config is a no-op) and pass DeviceConfig(device="cpu")
        # (vllm_config_kwargs). The scheduler code is platform-independent.
        pass

    def hash_fn_by_name(self, name: str):
        from vllm.utils import get_hash_fn_by_name  # vllm.utils.hashing from 0.12

        return get_hash_fn_by_name(name)

    def scheduler_config_kwargs(self, cfg: dict) -> dict:
        # no is_encoder_decoder, scheduler_reserve_full_isl or watermark arguments
        return {}

    def vllm_config_kwargs(self) -> dict:
        from vllm.config import DeviceConfig

        return {"device_config": DeviceConfig(device="cpu")}

    def block_sizes(self, kv_cache_config, vllm_config) -> tuple[int, int]:
        # 0.11's EngineCore.__init__ hashes with cache_config.block_size.
        size = vllm_config.cache_config.block_size
        return size, size

    def resolved_admission(self, sc) -> dict:
        # no such knobs in 0.11 (checked by unsupported()); 0.11 has no admission gate
        return {"scheduler_reserve_full_isl": True, "watermark": 0.0}

    def scheduler_kwargs(self, scheduler_block_size: int, hash_block_size: int) -> dict:
        # Scheduler(...) takes no block_size / hash_block_size.
        return {}

    def make_scheduler(self, base_cls, recorder, **kwargs):
        # No Scheduler._preempt_request before 0.12: preemption is inline in schedule(),
        # and the first thing it does to a victim is kv_cache_manager.free(preempted_req).
        # Wrap free on the instance: a call whose caller frame is schedule() is a
        # preemption (0.11 frees nothing else there); the victim is the argument, the
        # trigger is schedule()'s local `request`. Then run vLLM's own free unchanged.
        scheduler = base_cls(**kwargs)
        orig_free = scheduler.kv_cache_manager.free

        def traced_free(request):
            caller = sys._getframe(1)
            if caller.f_code.co_name != "schedule":
                return orig_free(request)
            assert caller.f_locals.get("preempted_req") is request
            recorder.before(scheduler, request, caller)
            ret = orig_free(request)
            recorder.after(scheduler)
            return ret

        scheduler.kv_cache_manager.free = traced_free
        return scheduler

    def check_batch_queue(self, vllm_config, scheduler, cfg: dict, size: int) -> None:
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler

        assert bool(vllm_config.scheduler_config.async_scheduling) == cfg["async_scheduling"]
        # no subclass here (free is wrapped on the instance)
        assert isinstance(scheduler, AsyncScheduler) == cfg["async_scheduling"]

    def request_kwargs(self) -> dict:
        # Request(...) takes eos_token_id (None: every request ignores EOS anyway).
        return {"eos_token_id": None}

    def before_schedule(self, scheduler):
        return {rid: req.num_output_placeholders for rid, req in scheduler.requests.items()}

    def will_sample(self, scheduler, rid: str, before) -> bool:
        # No Request.is_prefill_chunk: the fake model samples iff num_computed_tokens
        # after schedule() >= num_tokens + num_output_placeholders (placeholders as before
        # schedule()), the same rule as 0.19+'s is_prefill_chunk and the rule 0.11's own
        # AsyncScheduler uses to add a placeholder. The 0.10.2-0.11 PRIORITY rollback bug:
        # a victim already scheduled earlier in the same step is removed from
        # scheduled_running_reqs but keeps its entry in num_scheduled_tokens (and its
        # token budget), so _update_after_schedule advances its num_computed_tokens from
        # 0 to the scheduled count. Such a victim samples nothing here (its
        # num_computed_tokens is far below num_tokens); 0.11's GPUModelRunner would run
        # it from its stale persistent-batch state and discard that sample too in the
        # usual case (seq_len < num_tokens).
        req = scheduler.requests[rid]
        return req.num_computed_tokens >= req.num_tokens + before.get(rid, 0)

    def check_preempted(self, so, preempted: list[dict], status_before: dict,
                        scheduler) -> None:
        # No SchedulerOutput.preempted_req_ids: cross-check with the requests that went
        # RUNNING -> PREEMPTED (no readmission in a step with a preemption).
        from vllm.v1.request import RequestStatus

        went_preempted = {
            rid for rid, st in status_before.items()
            if st == RequestStatus.RUNNING
            and scheduler.requests[rid].status == RequestStatus.PREEMPTED
        }
        assert {p["req"] for p in preempted} == went_preempted, (preempted, went_preempted)

    def resumed_req_ids(self, so) -> list[str]:
        # resumed_from_preemption (a list of bools) instead of resumed_req_ids
        cached = so.scheduled_cached_reqs
        return sorted(rid for rid, resumed in zip(cached.req_ids,
                                                  cached.resumed_from_preemption)
                      if resumed)

    def waiting_order(self, scheduler) -> list[str]:
        # the waiting queue only (0.11 prepends skipped requests back into it; no
        # skipped_waiting / kv_holding_waiting)
        return [r.request_id for r in scheduler.waiting]


RELEASES = {cls.version: cls for cls in (V0_33, V0_19, V0_11)}


def for_version(version: str):
    """The release class for an installed vLLM version; SystemExit if none."""
    cls = RELEASES.get(version)
    if cls is None:
        raise SystemExit(f"no oracle for vLLM {version} (one of {', '.join(RELEASES)})")
    return cls()
