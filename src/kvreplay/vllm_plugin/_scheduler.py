"""The traced schedulers. Imported only when a class is asked for (this imports vLLM).

Only wrappers: each overridden method calls vLLM's own method unchanged and records what it
did. See lineformat.py for what is written.

Invariant: kvreplay's own code never raises into vLLM. Every piece of bookkeeping runs
inside a guard (`_kvt_guard`); vLLM's methods run outside it, so what they raise is theirs
and reaches vLLM unchanged. On kvreplay's first internal error the plugin logs one WARNING
with the reason, stops tracing (`_kvt_on` False: from then on each wrapper only calls
vLLM's method) and vLLM runs on exactly as without the plugin.
"""

from __future__ import annotations

import sys

from vllm.logger import init_logger
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from kvreplay.vllm_plugin.lineformat import LOGGER_NAME, short_hash

logger = init_logger(LOGGER_NAME)


def _vllm_version() -> str:
    try:
        from vllm import __version__

        return str(__version__)
    except Exception:  # pragma: no cover
        return "?"


class StepTraceMixin:
    """Step-trace bookkeeping on top of vLLM's Scheduler (or a subclass of it)."""

    _kvt_on = False  # tracing (set once the set-up succeeded; cleared by the first internal error)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        try:
            self._kvt_setup()
            self._kvt_on = True
        except Exception as exc:  # noqa: BLE001 - kvreplay's fault: vLLM runs on untraced
            self._kvt_stop("start-up", exc)

    def _kvt_stop(self, where: str, exc: BaseException) -> None:
        """The first internal error: one WARNING, tracing off. Never raises."""
        was_on = self.__dict__.get("_kvt_on", True)
        self._kvt_on = False
        if not was_on:
            return
        try:
            logger.warning(
                "kvreplay step trace stopped: internal error in %s (%s: %s); vLLM runs on "
                "unchanged, without trace lines from here on", where, type(exc).__name__, str(exc)[:200])
        except Exception:  # noqa: BLE001 - not even a log line may raise into vLLM
            pass

    def _kvt_setup(self) -> None:
        self._kvt_line = 0  # index of the step line being built / next to write
        self._kvt_open: list[str] | None = None  # parts of the open step line
        self._kvt_next_handle = 0
        self._kvt_pre: list[str] = []  # preemptions during the running schedule()
        self._kvt_fin: list[str] = []  # finished inside update_from_output()
        self._kvt_ab: list[str] = []  # aborts not yet placed
        self._kvt_ab_next: list[str] = []  # aborts that precede the next schedule()
        self._kvt_in_update = False
        self._kvt_batch: dict[int, int] = {}  # id(SchedulerOutput) -> its step
        self._kvt_caching = bool(self.cache_config.enable_prefix_caching)
        self._kvt_pool = self.kv_cache_manager.block_pool
        self._kvt_log = logger.info
        # Async: an iteration may end right after schedule() (no update); its line is
        # written later, so the state at that moment is kept when schedule() returns.
        self._kvt_async = isinstance(self, AsyncScheduler)
        self._kvt_snap: tuple | None = None
        # KV-cache events: count the batches vLLM publishes, so the trace can say which
        # batches belong to which step (vLLM numbers them 0, 1, 2 ... in publish order).
        self._kvt_ev = -1
        pub = getattr(self, "kv_event_publisher", None)
        if pub is not None and type(pub).__name__ != "NullEventPublisher":
            self._kvt_ev = 0
            publish = pub.publish

            def counting_publish(batch, _publish=publish):
                if self._kvt_on:
                    try:
                        self._kvt_ev += 1
                    except Exception as exc:  # noqa: BLE001
                        self._kvt_stop("publish", exc)
                return _publish(batch)

            pub.publish = counting_publish
        sc = self.scheduler_config
        spec = getattr(self, "num_spec_tokens", 0) or 0
        self._kvt_log(
            "kvtrace config v=%s sched=%s blocks=%d bs=%d hbs=%d seqs=%d tokens=%d len=%d "
            "chunked=%d prefix=%d policy=%s lpt=%d isl=%d wm=%s async=%d interval=%d spec=%d",
            _vllm_version(),
            next(c.__name__ for c in type(self).__mro__ if c.__module__.startswith("vllm.")),
            self.kv_cache_config.num_blocks,
            self.block_size,
            getattr(self, "hash_block_size", None) or self.block_size,
            self.max_num_running_reqs,
            self.max_num_scheduled_tokens,
            self.max_model_len,
            int(bool(sc.enable_chunked_prefill)),
            int(self._kvt_caching),
            getattr(sc.policy, "value", sc.policy),
            int(sc.long_prefill_token_threshold or 0),
            int(bool(getattr(sc, "scheduler_reserve_full_isl", True))),
            getattr(sc, "watermark", 0.0),
            int(isinstance(self, AsyncScheduler)),
            int(getattr(sc, "prefill_schedule_interval", 1) or 1),
            int(spec),
        )

    # -- writing -------------------------------------------------------------------
    def _kvt_flush(self, updated: bool) -> None:
        parts = self._kvt_open
        if parts is None:
            parts = []
        if self._kvt_ab:
            if updated:  # aborted between schedule() and update_from_output()
                parts.append("abm=" + ",".join(self._kvt_ab))
            else:  # after an iteration without update: they precede the next schedule()
                self._kvt_ab_next.extend(self._kvt_ab)
            self._kvt_ab = []
        if not updated:
            parts.append("u=-")
        if self._kvt_ev >= 0:
            parts.append(f"ev={self._kvt_ev}")
        snap = self._kvt_snap
        if updated or snap is None:
            snap = self._kvt_state()
        self._kvt_snap = None
        self._kvt_log("kvtrace step %d %s free=%d kv=%.4f q=%d/%d", self._kvt_line, " ".join(parts), *snap)
        self._kvt_line += 1
        self._kvt_open = None

    def _kvt_state(self) -> tuple:
        pool = self._kvt_pool
        waiting = len(self.waiting)
        khw = getattr(self, "kv_holding_waiting", None)
        if khw is not None:
            waiting += len(khw)
        return pool.get_num_free_blocks(), pool.get_usage(), len(self.running), waiting

    # -- wrapped vLLM methods --------------------------------------------------------
    def add_request(self, request) -> None:
        if not self._kvt_on:
            return super().add_request(request)
        try:
            known = request.request_id in self.requests
        except Exception as exc:  # noqa: BLE001
            self._kvt_stop("add_request", exc)
            return super().add_request(request)
        super().add_request(request)
        if self._kvt_on:
            try:
                self._kvt_added(request, known)
            except Exception as exc:  # noqa: BLE001
                self._kvt_stop("add_request", exc)

    def _kvt_added(self, request, known: bool) -> None:
        if known or request.request_id not in self.requests:
            return
        if self._kvt_open is not None:  # an iteration ended without update (async)
            self._kvt_flush(updated=False)
        h = str(self._kvt_next_handle)
        self._kvt_next_handle += 1
        request._kvt_h = h
        hashes = request.block_hashes
        request._kvt_nh = len(hashes)
        if self._kvt_caching and hashes:
            self._kvt_log(
                "kvtrace req %s at=%d p=%d max=%d prio=%d id=%s bh=%s",
                h, self._kvt_line, request.num_prompt_tokens, request.max_tokens,
                request.priority, request.request_id, ",".join(map(short_hash, hashes)),
            )
        else:
            self._kvt_log(
                "kvtrace req %s at=%d p=%d max=%d prio=%d id=%s",
                h, self._kvt_line, request.num_prompt_tokens, request.max_tokens,
                request.priority, request.request_id,
            )

    def schedule(self, *args, **kwargs):
        if not self._kvt_on:
            return super().schedule(*args, **kwargs)
        try:
            if self._kvt_open is not None:  # previous iteration had no update (async)
                self._kvt_flush(updated=False)
            self._kvt_pre = []
        except Exception as exc:  # noqa: BLE001
            self._kvt_stop("schedule", exc)
        out = super().schedule(*args, **kwargs)
        if self._kvt_on:
            try:
                self._kvt_scheduled(out)
            except Exception as exc:  # noqa: BLE001
                self._kvt_stop("schedule", exc)
        return out

    def _kvt_scheduled(self, out) -> None:
        pre = self._kvt_pre
        parts: list[str] = []
        if self._kvt_ab_next or self._kvt_ab:
            parts.append("ab=" + ",".join(self._kvt_ab_next + self._kvt_ab))
            self._kvt_ab_next = []
            self._kvt_ab = []
        requests = self.requests
        nst = out.num_scheduled_tokens
        if nst:
            s = []
            for rid, n in nst.items():
                h = requests[rid]._kvt_h
                s.append(h if n == 1 else f"{h}:{n}")
            parts.append("s=" + ",".join(s))
            admitted = {r.req_id for r in out.scheduled_new_reqs}
            resumed = out.scheduled_cached_reqs.resumed_req_ids
            if resumed:
                admitted.update(resumed)
            if admitted:
                new, res = [], []
                for rid, n in nst.items():
                    if rid in admitted:
                        r = requests[rid]
                        item = f"{r._kvt_h}:{r.num_computed_tokens - n}"
                        (res if r.num_preemptions else new).append(item)
                if new:
                    parts.append("new=" + ",".join(new))
                if res:
                    parts.append("res=" + ",".join(res))
        else:
            parts.append("s=-")
        if pre:
            parts.append("pre=" + ",".join(pre))
        self._kvt_open = parts
        self._kvt_batch[id(out)] = self._kvt_line
        if self._kvt_async:
            self._kvt_snap = self._kvt_state()

    def _preempt_request(self, request, *args, **kwargs):
        if not self._kvt_on:
            return super()._preempt_request(request, *args, **kwargs)
        try:
            trigger, lost = self._kvt_trigger(request)
        except Exception as exc:  # noqa: BLE001
            self._kvt_stop("_preempt_request", exc)
            return super()._preempt_request(request, *args, **kwargs)
        result = super()._preempt_request(request, *args, **kwargs)
        if self._kvt_on:
            try:
                self._kvt_pre.append(f"{getattr(request, '_kvt_h', '-')}/{trigger}/{lost}")
            except Exception as exc:  # noqa: BLE001
                self._kvt_stop("_preempt_request", exc)
        return result

    def _kvt_trigger(self, request) -> tuple[str, int]:
        # The trigger is the request whose allocation failed: the local `request` of
        # vLLM's schedule() (skipping other _preempt_request wrappers on the way).
        trigger = "-"
        f = sys._getframe(1)
        for _ in range(4):
            if f is None:
                break
            name = f.f_code.co_name
            if name == "schedule":
                t = f.f_locals.get("request")
                trigger = getattr(t, "_kvt_h", "-") if t is not None else "-"
                break
            if name != "_preempt_request":
                break
            f = f.f_back
        return trigger, request.num_computed_tokens

    def _free_request(self, request, *args, **kwargs):
        if self._kvt_on:
            try:
                h = getattr(request, "_kvt_h", None)
                if h is not None:
                    item = f"{h}:{request.num_output_tokens}"
                    (self._kvt_fin if self._kvt_in_update else self._kvt_ab).append(item)
            except Exception as exc:  # noqa: BLE001
                self._kvt_stop("_free_request", exc)
        return super()._free_request(request, *args, **kwargs)

    def update_from_output(self, scheduler_output, model_runner_output):
        if not self._kvt_on:
            return super().update_from_output(scheduler_output, model_runner_output)
        self._kvt_in_update = True
        try:
            result = super().update_from_output(scheduler_output, model_runner_output)
        finally:
            self._kvt_in_update = False
        if self._kvt_on:
            try:
                self._kvt_updated(scheduler_output)
            except Exception as exc:  # noqa: BLE001
                self._kvt_stop("update_from_output", exc)
        return result

    def _kvt_updated(self, scheduler_output) -> None:
        parts = self._kvt_open
        if parts is None:
            parts = self._kvt_open = []
        b = self._kvt_batch.pop(id(scheduler_output), None)
        if b != self._kvt_line:
            parts.append(f"u={b if b is not None else '?'}")
        if self._kvt_fin:
            parts.append("f=" + ",".join(self._kvt_fin))
            self._kvt_fin = []
        if self._kvt_caching:
            requests = self.requests
            bh = []
            for rid in scheduler_output.num_scheduled_tokens:
                r = requests.get(rid)
                if r is None:
                    continue
                hashes = r.block_hashes
                k = r._kvt_nh
                if len(hashes) > k:
                    bh.append(r._kvt_h + ":" + ".".join(map(short_hash, hashes[k:])))
                    r._kvt_nh = len(hashes)
            if bh:
                parts.append("bh=" + ",".join(bh))
        self._kvt_flush(updated=True)


class StepTraceAsyncScheduler(StepTraceMixin, AsyncScheduler):
    """vLLM's AsyncScheduler with the step trace."""


class StepTraceScheduler(StepTraceMixin, Scheduler):
    """vLLM's Scheduler with the step trace; becomes a StepTraceAsyncScheduler when vLLM's
    config has async scheduling on (so one class path fits both modes)."""

    def __new__(cls, *args, **kwargs):
        if cls is StepTraceScheduler:
            vllm_config = kwargs.get("vllm_config", args[0] if args else None)
            sc = getattr(vllm_config, "scheduler_config", None)
            if sc is not None and getattr(sc, "async_scheduling", False):
                obj = object.__new__(StepTraceAsyncScheduler)
                obj.__init__(*args, **kwargs)
                return obj
        return super().__new__(cls)


_TRACED: dict[type, type] = {Scheduler: StepTraceScheduler, AsyncScheduler: StepTraceAsyncScheduler}


def traced_class_for(base: type) -> type:
    """The traced subclass of a vLLM scheduler class (made on demand for other subclasses)."""
    cls = _TRACED.get(base)
    if cls is None:
        if issubclass(base, StepTraceMixin):
            return base
        cls = type("StepTrace" + base.__name__, (StepTraceMixin, base), {"__module__": __name__})
        _TRACED[base] = cls
    return cls
