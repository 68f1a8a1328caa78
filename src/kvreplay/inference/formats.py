"""Log-format profiles: what a release's log lines mean, as data (like the scheduler
profile, replay/profile.py). The inference stages read these fields; none of them asks
which release wrote the log.

Consumes: the release and engine the startup lines give (LogFacts). Produces: a
`LogFormat` (spec: vllm-log-formats.md, stats line; vllm-scheduler-spec.md Part B for V0).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from kvreplay.replay.profile import parse_version

# vLLM V1 defaults used when the log does not state a value (A13; `non-default args` lists
# only what the user changed). Each use is reported.
V1_DEFAULTS: dict[str, Any] = {
    "block_size": 16,
    "max_num_seqs": 256,
    "max_num_batched_tokens": 8192,
    "enable_chunked_prefill": True,
    "enable_prefix_caching": True,
    "policy": "fcfs",
    "long_prefill_token_threshold": 0,
    "scheduler_reserve_full_isl": True,
    "watermark": 0.0,
}
# vLLM 0.6.x defaults (EngineArgs / SchedulerConfig) for what a V0 log may not state.
V0_DEFAULTS: dict[str, Any] = {
    "block_size": 16,
    "max_num_seqs": 256,
    "enable_chunked_prefill": False,
    "enable_prefix_caching": False,
    "policy": "fcfs",
    "preemption_mode": None,
}
# Where inside its logged second a V0 request arrived: (phase u, spread s): the j-th of m
# arrivals logged in second S is put at S + u + (1 - u) * s * (j + 1) / (m + 1). Evenly
# spread (Poisson-like), or a burst early, mid or late in the second.
V0_PLACEMENTS = ((0.0, 1.0), (0.0, 0.0), (0.5, 0.0), (0.999, 0.0))


@dataclass(frozen=True, slots=True)
class LogFormat:
    engine: str  # "V1" | "V0": which engine wrote it (and replays it)
    name: str
    # seconds between stats lines when the log does not show it (VLLM_LOG_STATS_INTERVAL
    # 10 s in V1; V0's _LOCAL_LOGGING_INTERVAL_SEC 5 s)
    stats_interval_s: float
    # how a stats line is tied to a step: "anchor" (V1: it shows the state after the last
    # step whose output it had seen, found by its cumulative generated tokens) or
    # "step_end" (V0: printed at the end of the first step more than 5 s after the last)
    stats_read: str
    # the throughputs are averages over the nominal interval (V1) or over the time since
    # the previous line (V0: a little over 5 s, or the idle gap)
    throughput_over_elapsed: bool
    # the arrival placement after the step-time fit: "anchored" (V1: arrivals moved to the
    # steps the line anchors, completions and seconds allow) or "timed" (V0: by the clock)
    placement: str
    # prompt tokens on the stats line leave out the prefix-cache hits (0.16+)
    prompt_excludes_cached: bool
    # regression of the step-time model: token floors tried and whether the context term
    # (tokens the scheduled requests attend to) is fitted
    token_floors: tuple[int, ...]
    context_term: bool
    min_overhead_s: float
    # a request with n > 1 runs as n sequence groups (V0 0.6.6 splits it); V1 replays one
    split_n: bool
    # output lengths without ignore_eos: estimated from `Finished request` lines or the
    # logged generation throughput (V0), else max_tokens is taken (V1, marked estimated)
    estimate_output_lengths: bool
    # unknown prompt lengths: rescaled per stats interval with a count interval over
    # variants (V1), or the mean the prompt throughput implies (V0)
    rescale_unknown_prompts: bool
    # V1's frontend refuses a prompt with no room for an output token, and a request its
    # pool can never hold would be preempted forever (both capped, with a note); V0 ignores
    # a request that cannot fit (FINISHED_IGNORED), and the V0 replay does the same
    caps_to_limits: bool
    # request priorities are in the log (V1: the JSON bodies, 0.31+); V0 servers log none
    priorities_logged: bool
    # the stats line's fields: V0 also counts swapped requests and CPU KV usage, calls the
    # waiting requests "Pending" and the KV usage "GPU KV cache usage"
    stats_has_swap: bool
    waiting_label: str
    kv_label: str
    # a line the replay has no step for: a disagreement (V0 prints a line only at a step's
    # end), or nothing to compare (V1: a line before the first step shows the idle engine)
    unread_line_disagrees: bool
    # the every-50th preemption warning (V0) is checked against the replay
    preemption_warnings: bool
    # a preemption is "consistent" when the stats lines either side match exactly (V1,
    # where an exact check exists) or within the tolerances (V0)
    exact_confidence: bool
    defaults: dict[str, Any] = field(default_factory=dict)
    # (phase, spread) within the second tried by the fit; V1 derives it from the pattern
    placements: tuple[tuple[float, float], ...] = ()
    # the time-driven replay lets an arrival the log shows before the next completion in
    # ahead of an imminent finish: always (V1: the anchored placement corrects it later), or
    # only within this many seconds of its time (V0: the time-driven placement is final)
    order_window_s: float | None = None
    fit_rounds: int = 2  # rounds of replay + refit per placement (a given model: fewer)
    fit_rounds_given: int = 1
    # release defaults that depend on the release: async scheduling on by default (0.14+);
    # max_num_seqs picked with the token budget by GPU (0.9+: 1024 with 8192 on a GPU of
    # 70 GiB or more other than an A100, else 256 with 2048; EngineArgs.get_batch_defaults)
    async_scheduling_default: bool = False
    batch_defaults_by_gpu: bool = False
    # the `Iteration(N)` line (--enable-logging-iteration-details, 0.14+; spec: log formats
    # 4.3): a request logged after line N-1 entered the engine at the step of line
    # N + lo .. N + hi (one more with async scheduling, whose line comes a step later).
    # 0.26+ the API server writes it as the step's output arrives, in order with the
    # request lines (lo 0: the step of line N-1 was over); 0.14-0.25 the engine core
    # writes it, in another process, and only the stream's interleaving orders the two
    iteration_window: tuple[int, int] = (0, 2)
    iteration_kv: bool = True  # the line shows the KV usage after that step (0.26+)


V1_FORMAT = LogFormat(
    engine="V1", name="V1 (0.8+)", stats_interval_s=10.0, stats_read="anchor",
    throughput_over_elapsed=False, placement="anchored", prompt_excludes_cached=False,
    token_floors=(0, 32, 64, 128, 256, 512), context_term=True, min_overhead_s=0.0,
    split_n=False,
    estimate_output_lengths=False, rescale_unknown_prompts=True, caps_to_limits=True,
    priorities_logged=True, stats_has_swap=False, waiting_label="waiting", kv_label="KV usage",
    unread_line_disagrees=False, preemption_warnings=False,
    exact_confidence=True, defaults=V1_DEFAULTS, fit_rounds=2,
)
V0_FORMAT = LogFormat(
    engine="V0", name="V0 (0.5-0.10)", stats_interval_s=5.0, stats_read="step_end",
    throughput_over_elapsed=True, placement="timed", prompt_excludes_cached=False,
    token_floors=(0,), context_term=False, min_overhead_s=1e-4, split_n=True,
    estimate_output_lengths=True,
    rescale_unknown_prompts=False, caps_to_limits=False, priorities_logged=False,
    stats_has_swap=True, waiting_label="pending", kv_label="GPU KV usage",
    unread_line_disagrees=True, preemption_warnings=True,
    exact_confidence=False,
    defaults=V0_DEFAULTS, placements=V0_PLACEMENTS, fit_rounds=4, fit_rounds_given=2,
    order_window_s=1.0,
)


def version_at_least(version: str | None, want: tuple[int, int, int]) -> bool:
    """True for an unknown version (assume a current release)."""
    parsed = parse_version(version) if version else None
    return parsed is None or parsed >= want


def log_format(vllm_version: str | None, engine_version: str | None,
               profile: str | None = None) -> LogFormat:
    """The format of a log: V0 when the startup lines say so, or (no profile given) for a
    release before the V1 engine existed (0.8)."""
    if engine_version == "V0" or (
            not profile and vllm_version and not version_at_least(vllm_version, (0, 8, 0))):
        return V0_FORMAT
    return replace(
        V1_FORMAT, name=f"V1 ({vllm_version or 'release unknown'})",
        prompt_excludes_cached=version_at_least(vllm_version, (0, 16, 0)),
        async_scheduling_default=version_at_least(vllm_version, (0, 14, 0)),
        batch_defaults_by_gpu=version_at_least(vllm_version, (0, 9, 0)),
        iteration_window=(0, 2) if version_at_least(vllm_version, (0, 26, 0)) else (-1, 2),
        iteration_kv=version_at_least(vllm_version, (0, 26, 0)))


def interval_of(facts, fmt: LogFormat) -> float:
    """Seconds one stats line's throughputs average over: the gap the log shows (V1), or
    the V0 logger's nominal 5 s (its lines come a little over 5 s apart)."""
    if fmt.throughput_over_elapsed:
        return fmt.stats_interval_s
    return facts.interval_s or fmt.stats_interval_s
