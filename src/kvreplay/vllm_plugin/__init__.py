"""kvreplay's step-trace plugin for vLLM >= 0.33 (V1 engine).

Turn it on with either

    vllm serve MODEL --scheduler-cls kvreplay.vllm_plugin.StepTraceScheduler
    KVREPLAY_STEP_TRACE=1 vllm serve MODEL          # via vLLM's general-plugin entry point

and vLLM's scheduler writes one compact INFO line per engine iteration through vLLM's own
logger (`kvtrace step ...`), one per arriving request (`kvtrace req ...`), and one at start
(`kvtrace config ...`). The line format is documented in `kvreplay.vllm_plugin.lineformat`.

`StepTraceScheduler` follows vLLM's own choice of scheduler: with async scheduling on it
builds a `StepTraceAsyncScheduler` (vLLM's AsyncScheduler with the trace), otherwise a
`StepTraceScheduler` (vLLM's Scheduler with the trace). Both only wrap vLLM's methods
(`add_request`, `schedule`, `update_from_output`, `_preempt_request`, `_free_request`) and
call them unchanged.

Importing this package never imports vLLM; the classes are built on first attribute access.
"""

from __future__ import annotations

import os

__all__ = ["StepTraceScheduler", "StepTraceAsyncScheduler", "register", "ENV_VAR"]

ENV_VAR = "KVREPLAY_STEP_TRACE"
CLASS_PATH = "kvreplay.vllm_plugin.StepTraceScheduler"


def __getattr__(name: str):
    if name in ("StepTraceScheduler", "StepTraceAsyncScheduler", "StepTraceMixin"):
        from kvreplay.vllm_plugin import _scheduler

        return getattr(_scheduler, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _enabled() -> bool:
    return os.environ.get(ENV_VAR, "").strip().lower() in ("1", "true", "yes", "on")


def register() -> None:
    """vLLM general-plugin entry point (group `vllm.general_plugins`).

    vLLM calls it in every process (API server, engine core, workers). With
    KVREPLAY_STEP_TRACE=1 it makes `SchedulerConfig.get_scheduler_cls()` return the traced
    subclass of whatever vLLM would have chosen, unless the user named a scheduler class
    with --scheduler-cls. Without the variable it does nothing. Safe to call repeatedly.
    """
    if not _enabled():
        return
    from vllm.config.scheduler import SchedulerConfig

    original = SchedulerConfig.get_scheduler_cls
    if getattr(original, "_kvreplay_wrapped", False):
        return

    def get_scheduler_cls(self):
        if self.scheduler_cls is None:
            from kvreplay.vllm_plugin import _scheduler

            base = original(self)  # vLLM's own choice (Scheduler / AsyncScheduler)
            return _scheduler.traced_class_for(base)
        return original(self)

    get_scheduler_cls._kvreplay_wrapped = True  # type: ignore[attr-defined]
    SchedulerConfig.get_scheduler_cls = get_scheduler_cls  # type: ignore[method-assign]
