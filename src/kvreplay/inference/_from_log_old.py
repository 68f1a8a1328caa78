"""From what a vLLM log says to the preemptions it did not say (issue: `kvreplay replay`).

1. `rebuild_workload`: engine config -> SchedulerConfig; request lines -> requests with
   prompt tokens (JSON-body / DEBUG lines) or estimated lengths, and output lengths (exact
   with ignore_eos + max_tokens, else estimated and marked so).
2. `timed_replay`: the faithful scheduler driven by a wall clock. A step-time model
   (fixed cost + cost per scheduled token + cost per scheduled request) advances the clock;
   a request enters when the clock passes its logged arrival, but never before the
   completions the log shows ahead of it, and never after one it shows behind it.
3. `fit`: the step-time model is fitted so that the replay's token counts line up with the
   logged stats lines (each stats interval has a known length and a known number of
   generated tokens); the within-second arrival spread is chosen by the same criterion.
4. `preemption_records`, `storms`, `verify`: what happened, and how it compares with every
   counter the log did record.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from kvreplay.replay.engine import Engine, without_cyclic_gc
from kvreplay.replay.logfacts import LogFacts, LogRequest, StatsPoint
from kvreplay.replay.profile import SchedulerProfile, get_profile, parse_version
from kvreplay.replay.request import RequestStatus
from kvreplay.replay.scheduler import SchedulerConfig
from kvreplay.replay.workload import RequestSpec, Workload

# vLLM V1 defaults used when the log does not state a value (A13; `non-default args` lists
# only what the user changed). Each use is reported in the output.
V1_DEFAULTS = {
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


@dataclass(slots=True)
class StepTimeModel:
    """Seconds one engine step takes: a fixed cost, a cost per scheduled token (with a
    floor: a step with few tokens is bound by reading the weights), per scheduled request,
    and per token of context the scheduled requests attend to."""

    overhead_s: float = 0.005
    per_token_s: float = 2e-5
    per_request_s: float = 5e-5
    per_context_token_s: float = 0.0
    token_floor: int = 0

    def dt(self, tokens: int, requests: int, context: int = 0) -> float:
        if requests == 0:
            return self.overhead_s
        return (
            self.overhead_s
            + self.per_token_s * max(tokens, self.token_floor)
            + self.per_request_s * requests
            + self.per_context_token_s * context
        )

    def dt_record(self, rec: dict[str, Any]) -> float:
        tokens, reqs, ctx = step_features(rec)
        return self.dt(tokens, reqs, ctx)

    def describe(self) -> str:
        text = f"step time = {self.overhead_s * 1e3:.3f} ms + {self.per_token_s * 1e6:.3f} us x "
        text += f"max(scheduled tokens, {self.token_floor})" if self.token_floor else "scheduled tokens"
        text += f" + {self.per_request_s * 1e6:.2f} us x scheduled requests"
        if self.per_context_token_s:
            text += f" + {self.per_context_token_s * 1e9:.2f} ns x context tokens"
        return text


def n_running(rec: dict[str, Any]) -> int:
    return rec["num_running"] if "num_running" in rec else len(rec.get("running", ()))


def n_waiting(rec: dict[str, Any]) -> int:
    return rec["num_waiting"] if "num_waiting" in rec else len(rec.get("waiting", ()))


def step_features(rec: dict[str, Any]) -> tuple[int, int, int]:
    """(scheduled tokens, scheduled requests, context tokens of the scheduled requests)."""
    sched = rec.get("scheduled", ())
    if "context_tokens" in rec:
        return rec.get("num_scheduled_tokens", 0), len(sched), rec["context_tokens"]
    comp = rec.get("num_computed_tokens", {})
    ctx = 0
    for rid, _ in sched:
        ctx += comp.get(rid, 0)
    return rec.get("num_scheduled_tokens", 0), len(sched), ctx


@dataclass(slots=True)
class Rebuilt:
    workload: Workload
    requests: list[LogRequest]
    prompt_estimated: list[bool]
    output_estimated: list[bool]
    config_sources: dict[str, str]  # knob -> "log" | "default" | "derived"
    notes: list[str] = field(default_factory=list)


class ReplayError(Exception):
    """The log is too thin to replay; the message says what is missing."""


# ---------------------------------------------------------------- 1. workload
def scheduler_config_from(facts: LogFacts, profile: SchedulerProfile) -> tuple[SchedulerConfig, dict[str, str], list[str]]:
    c = facts.config
    src: dict[str, str] = {}
    notes: list[str] = []

    def pick(name: str, logged: Any, default: Any) -> Any:
        if logged is not None:
            src[name] = "log"
            return logged
        src[name] = "default"
        return default

    block_size = pick("block_size", c.block_size if c else None, V1_DEFAULTS["block_size"])
    num_blocks = c.num_gpu_blocks if c else None
    if num_blocks is not None:
        src["num_gpu_blocks"] = "log"
    elif c is not None and c.kv_cache_tokens:
        num_blocks = c.kv_cache_tokens // block_size
        src["num_gpu_blocks"] = "derived"
        notes.append(
            f"num_gpu_blocks = KV cache size {c.kv_cache_tokens} tokens / block size {block_size}"
        )
    else:
        raise ReplayError(
            "the log does not give the KV cache size: keep the startup lines (GPU KV cache "
            "size / # GPU blocks / num_gpu_blocks_override) in the log you replay"
        )
    max_model_len = c.max_model_len if c else None
    if max_model_len is None:
        raise ReplayError("the log does not give max_model_len: keep the startup lines")
    src["max_model_len"] = "log"
    chunked = pick("enable_chunked_prefill", c.enable_chunked_prefill if c else None, True)
    caching = pick("enable_prefix_caching", c.enable_prefix_caching if c else None, True)
    max_seqs = pick("max_num_seqs", c.max_num_seqs if c else None, _default_max_num_seqs(facts))
    budget = pick(
        "max_num_batched_tokens",
        c.max_num_batched_tokens if c else None,
        V1_DEFAULTS["max_num_batched_tokens"],
    )
    policy = pick("policy", c.scheduling_policy if c else None, "fcfs")
    threshold = pick(
        "long_prefill_token_threshold", c.long_prefill_token_threshold if c else None, 0
    )
    watermark = pick("watermark", c.watermark if c else None, 0.0) if profile.watermark else 0.0
    full_isl = pick("scheduler_reserve_full_isl",
                    getattr(c, "scheduler_reserve_full_isl", None) if c else None, True)
    async_default = _version_at_least(facts.vllm_version, (0, 14, 0))
    async_sched = pick("async_scheduling", c.async_scheduling if c else None, async_default)
    for k, v in src.items():
        if v == "default":
            if k == "max_num_seqs" and max_seqs != V1_DEFAULTS["max_num_seqs"]:
                notes.append(
                    f"max_num_seqs not in the log: {max_seqs} assumed, vLLM's default on a GPU "
                    "of 70 GiB or more (not an A100): the default token budget the log shows "
                    f"({budget}) comes from that branch of vLLM's defaults")
                continue
            notes.append(f"{k} not in the log: vLLM's default assumed")
    cfg = SchedulerConfig(
        num_gpu_blocks=int(num_blocks),
        block_size=int(block_size),
        max_num_seqs=int(max_seqs),
        max_num_batched_tokens=int(budget),
        max_model_len=int(max_model_len),
        enable_chunked_prefill=bool(chunked),
        enable_prefix_caching=bool(caching),
        policy=str(policy).lower(),
        long_prefill_token_threshold=int(threshold),
        scheduler_reserve_full_isl=bool(full_isl),
        watermark=float(watermark),
        async_scheduling=bool(async_sched),
    )
    return cfg, src, notes


def _default_max_num_seqs(facts: LogFacts) -> int:
    """vLLM 0.9+ picks its defaults for max_num_seqs and max_num_batched_tokens together,
    by GPU (EngineArgs.get_batch_defaults, API server): 1024 and 8192 on a GPU of 70 GiB or
    more other than an A100, else 256 and 2048. The log shows the token budget in use (the
    chunked-prefill line); when the user did not set it (`non-default args` does not name
    it), it tells which branch, and so the max_num_seqs default."""
    c = facts.config
    budget = c.max_num_batched_tokens if c else None
    if (budget == 8192 and facts.non_default is not None
            and "max_num_batched_tokens" not in facts.non_default
            and _version_at_least(facts.vllm_version, (0, 9, 0))):
        return 1024
    return V1_DEFAULTS["max_num_seqs"]


def _version_at_least(version: str | None, want: tuple[int, int, int]) -> bool:
    """True for an unknown version (assume a current release)."""
    parsed = parse_version(version) if version else None
    return parsed is None or parsed >= want


def rebuild_workload(
    facts: LogFacts,
    profile: SchedulerProfile,
    *,
    prompt_lens: list[int] | None = None,
    shared_prefix: int = 0,
) -> Rebuilt:
    """The workload the log describes. Prompts not in the log get `prompt_lens` (else the
    logged length, else the mean) tokens of their own, after `shared_prefix` tokens every
    estimated prompt shares (shared_prefix_estimate)."""
    if not facts.requests:
        raise ReplayError(
            "the log has no request lines, so there is no workload to replay: start vLLM "
            "with --enable-log-requests (and VLLM_REQUEST_BODY_LOG_LEVEL=INFO for prompts)"
        )
    cfg, src, notes = scheduler_config_from(facts, profile)
    specs: list[RequestSpec] = []
    p_est: list[bool] = []
    o_est: list[bool] = []
    mean_len = _mean_prompt_len(facts)
    usable_tokens = (cfg.num_gpu_blocks - 1) * cfg.block_size
    for i, r in enumerate(facts.requests):
        if r.prompt_token_ids is not None and (r.prompt_len is None or r.prompt_len == len(r.prompt_token_ids)):
            prompt = list(r.prompt_token_ids)
            est = False
        else:
            n = prompt_lens[i] if prompt_lens is not None else (r.prompt_len or mean_len)
            # Unknown content: tokens unique to this request, after the shared prefix the
            # log's prefix-cache hit rate implies (none without caching).
            prompt = [2_000_000 + j for j in range(shared_prefix)]
            prompt += [1_000_000 + i * 100_003 + j for j in range(max(1, int(n)))]
            est = r.prompt_len is None or prompt_lens is not None
        # vLLM's frontend refuses a prompt that leaves no room for one output token.
        prompt = prompt[: cfg.max_model_len - 1]
        max_tokens = r.max_tokens if r.max_tokens is not None else cfg.max_model_len - len(prompt)
        out_est = False
        if r.output_len is not None:
            max_tokens = r.output_len
        elif not r.ignore_eos:
            out_est = True  # max_tokens is an upper bound: EOS may have come earlier
        max_tokens = max(1, min(max_tokens, cfg.max_model_len - len(prompt) + 1))
        # A request that could never fit the pool would loop forever (vLLM rejects such a
        # max_model_len at startup); clamp and say so.
        if min(len(prompt) + max_tokens, cfg.max_model_len) - 1 > usable_tokens:
            max_tokens = max(1, usable_tokens + 1 - len(prompt))
            out_est = True
        specs.append(RequestSpec(r.log_id, 0, prompt, int(max_tokens), r.priority))
        p_est.append(est)
        o_est.append(out_est)
    wl = Workload(
        name="log replay",
        description="rebuilt from " + ", ".join(facts.files),
        config=cfg,
        requests=specs,
        max_steps=10**9,
    )
    if any(p_est):
        notes.append(f"{sum(p_est)} prompt lengths estimated (mean {mean_len} tokens)")
    if any(o_est):
        notes.append(f"{sum(o_est)} output lengths estimated (max_tokens taken as the length)")
    fanned = [r for r in facts.requests if r.n > 1]
    if fanned:
        notes.append(
            f"{len(fanned)} of {len(facts.requests)} requests ask for n > 1 samples (the "
            f"first: {fanned[0].log_id}, "
            f"n={fanned[0].n}): vLLM runs each as n sequences sharing the prompt, this replay "
            "runs one, so it underestimates their KV load and preemptions")
    return Rebuilt(wl, facts.requests, p_est, o_est, src, notes)


def shared_prefix_estimate(facts: LogFacts, cfg: SchedulerConfig) -> int:
    """Prompt tokens every request shares (a system prompt), as the prefix-cache hit rate
    implies, for logs without prompts. From 0.16 on the prompt throughput leaves out what
    the prefix cache supplied, so the logged total P is the computed part only; the last
    line's hit rate h (hits over queried prompt tokens, over the last 1,000 requests) gives
    the queried total Q = P / (1 - h) and the hits C = Q - P. One prefix shared by every
    request after the first explains C with (n - 1) hits of C / (n - 1) tokens each, full
    blocks only. Without it the replay would give every request only the computed part of
    its prompt and hold too few blocks: the f log case's server.log (ten 200-token prompts
    sharing 128 tokens, hit rate 57.6%) has each replayed as 85 tokens, and its interval
    ended at the true count."""
    if not cfg.enable_prefix_caching or len(facts.requests) < 2:
        return 0
    rates = [s.prefix_cache_hit_rate for s in facts.stats if s.prefix_cache_hit_rate is not None]
    if not rates or not 0.0 < rates[-1] < 100.0:
        return 0
    h = rates[-1] / 100.0
    interval = facts.interval_s or 10.0
    computed = sum((s.prompt_throughput or 0.0) * interval for s in facts.stats)
    hits = computed / (1.0 - h) - computed
    per_request = hits / (len(facts.requests) - 1)
    bs = cfg.block_size
    return max(0, min(int(per_request // bs) * bs, (cfg.max_model_len - 2) // bs * bs))


def _mean_prompt_len(facts: LogFacts) -> int:
    known = [len(r.prompt_token_ids) if r.prompt_token_ids is not None else r.prompt_len
             for r in facts.requests]
    known = [k for k in known if k]
    if known:
        return max(1, round(sum(known) / len(known)))
    # From the stats lines: prompt tokens computed over the whole log / requests.
    interval = facts.interval_s or 10.0
    total = sum((s.prompt_throughput or 0.0) * interval for s in facts.stats)
    if total > 0:
        return max(1, round(total / len(facts.requests)))
    return 512


# ---------------------------------------------------------------- 2. timed replay
@dataclass(slots=True)
class TimedRun:
    records: list[dict[str, Any]]
    step_start: list[float]  # wall-clock start of each step
    arrival_step: dict[str, int]
    summary: Any
    model: StepTimeModel
    spread: float
    cut_at: float | None  # the replay stopped at the log's end (server killed)
    unfinished: list[str]


def arrival_times(facts: LogFacts, spread: float) -> list[float]:
    """Logged second + a share of the second: the j-th of m arrivals logged in one second
    is put at S + spread * (j + 1) / (m + 1) (spread 0: a burst at the start of the
    second; 1: evenly spread, the expectation for Poisson arrivals)."""
    reqs = facts.requests
    if facts.precise_times:
        return [r.precise_time for r in reqs]  # type: ignore[misc]
    out: list[float] = []
    base = facts.first_time or 0.0
    i = 0
    while i < len(reqs):
        sec = reqs[i].time if reqs[i].time is not None else (out[-1] if out else base)
        j = i
        while j < len(reqs) and (reqs[j].time if reqs[j].time is not None else sec) == sec:
            j += 1
        m = j - i
        for k in range(m):
            out.append(sec + spread * (k + 1) / (m + 1))
        i = j
    # keep file order monotonic
    for k in range(1, len(out)):
        if out[k] < out[k - 1]:
            out[k] = out[k - 1]
    return out


@without_cyclic_gc
def timed_replay(
    rebuilt: Rebuilt,
    facts: LogFacts,
    profile: SchedulerProfile,
    model: StepTimeModel,
    spread: float,
    *,
    trace: bool = True,
    use_completion_order: bool = True,
) -> TimedRun:
    wl = rebuilt.workload
    engine = Engine(wl, profile)
    engine.by_step = {}
    engine.max_arrival = 1 << 62  # arrivals come by time, not by step
    sched = engine.scheduler
    reqs = facts.requests
    times = arrival_times(facts, spread)
    specs = wl.requests
    pending = deque(range(len(specs)))
    clock = times[0] if times else 0.0
    records: list[dict[str, Any]] = []
    step_start: list[float] = []
    arrival_step: dict[str, int] = {}
    finished = 0
    stop_at = _cut_time(facts)
    cut = None
    aborts = _aborts(facts)
    abort_i = 0
    max_tokens = {s.id: s.max_tokens for s in specs}
    step_limit = _step_limit(wl)
    while not engine.done and engine.step_index < step_limit:
        busy = sched.has_requests() or bool(engine.batch_queue)
        if not busy and pending:
            clock = max(clock, times[pending[0]])
        if stop_at is not None and clock > stop_at:
            cut = stop_at
            break
        abort_i = _apply_aborts(engine, aborts, abort_i, clock)
        step = engine.step_index
        batch = []
        imminent = None
        while pending:
            k = pending[0]
            r = reqs[k]
            need = r.completions_before if use_completion_order else 0
            if finished < need and clock < times[k] + 2.0:
                break  # the log shows more completions before this arrival
            due = times[k] <= clock
            if not due and use_completion_order and finished >= need:
                if imminent is None:
                    imminent = _finish_imminent(sched, max_tokens)
                # The log shows this arrival before the next completion: do not let the
                # replay finish a request first.
                due = imminent and finished == need
            if not due:
                break
            pending.popleft()
            batch.append((k, specs[k]))
            arrival_step[specs[k].id] = step
        if batch:
            engine.by_step[step] = batch
        elif not busy:
            if not pending:
                break
            # idle, and the next arrival is held back by the completion order: let it in.
            k = pending.popleft()
            engine.by_step[step] = [(k, specs[k])]
            arrival_step[specs[k].id] = step
            clock = max(clock, times[k])
        rec = engine.step(trace=True if trace else "light")
        step_start.append(clock)
        clock += model.dt_record(rec)
        finished += len(rec.get("finished", ()))
        records.append(rec)
    summary = engine.summary
    if cut is not None or not engine.done:
        summary.num_steps = engine.step_index
        summary.completed = False
    unfinished = [s.id for s in specs if s.id not in summary.finished_step]
    return TimedRun(records, step_start, arrival_step, summary, model, spread, cut, unfinished)


def _finish_imminent(sched, max_tokens: dict[str, int]) -> bool:
    """Will a running request produce its last token in the coming step?"""
    max_len = sched.max_model_len
    for r in sched.running:
        if r.num_computed_tokens >= r.num_tokens - 1 and (
            r.num_output_tokens + 1 >= max_tokens.get(r.request_id, 1 << 30)
            or r.num_tokens + 1 >= max_len
        ):
            return True
    return False


def _cut_time(facts: LogFacts) -> float | None:
    """When the log stops before the run ended (server killed, log copied mid-run), the
    replay stops at its last line. A clean end is a last stats line showing nothing running
    or waiting after the last arrival, or (non-streaming requests) a completion line for
    every request that was not aborted."""
    if facts.last_time is None or not facts.requests:
        return None
    last_arrival = facts.requests[-1]
    if facts.stats:
        last = facts.stats[-1]
        if (last.running or 0) + (last.waiting or 0) == 0 and last.seq > last_arrival.seq:
            return None
    streaming = any(r.stream for r in facts.requests)
    aborted = sum(1 for r in facts.requests if r.aborted_time is not None)
    if not streaming and facts.completions and len(facts.completions) + aborted >= len(facts.requests):
        return None
    if not streaming and not facts.completions and facts.stats:
        # no access lines at all (uvicorn's access log off): trust the stats lines only
        last = facts.stats[-1]
        if (last.running or 0) + (last.waiting or 0) == 0:
            return None
    return facts.last_time + 1.0


# ---------------------------------------------------------------- 3. fit
@dataclass(slots=True)
class Fit:
    model: StepTimeModel
    spread: float
    loss: float
    run: TimedRun
    tried: list[dict[str, Any]]


def stats_targets(facts: LogFacts) -> list[tuple[float, float]]:
    """Cumulative generated and prompt tokens at each stats line."""
    interval = facts.interval_s or 10.0
    g = p = 0.0
    out = []
    for s in facts.stats:
        g += (s.generation_throughput or 0.0) * interval
        p += (s.prompt_throughput or 0.0) * interval
        out.append((g, p))
    return out


def _state_at(run: TimedRun, t: float) -> dict[str, Any] | None:
    """The replay's record for the last step that started before wall time t."""
    import bisect

    i = bisect.bisect_right(run.step_start, t) - 1
    if i < 0:
        return None
    return run.records[i]


def _cum_sampled(run: TimedRun) -> list[int]:
    out = []
    c = 0
    for rec in run.records:
        c += len(rec.get("sampled", ()))
        out.append(c)
    return out


def loss_of(run: TimedRun, facts: LogFacts, phase: float = 0.5) -> float:
    """How far the replay is from every counter the stats lines recorded."""
    interval = facts.interval_s or 10.0
    targets = stats_targets(facts)
    cum = _cum_sampled(run)
    total = 0.0
    for s, (g, _) in zip(facts.stats, targets):
        t = _line_time(s, phase)
        rec = _state_at(run, t)
        if rec is None:
            continue
        i = rec["step"]
        if s.running is not None:
            total += (n_running(rec) - s.running) ** 2
        if s.waiting is not None:
            total += (n_waiting(rec) - s.waiting) ** 2
        if s.kv_usage is not None:
            total += (100 * (rec["kv_usage"] - s.kv_usage)) ** 2 / 25.0
        # generated tokens so far, in units of one stats interval's average
        scale = max(1.0, g / max(1, s.index + 1))
        total += ((cum[i] - g) / scale) ** 2
    return total / max(1, len(facts.stats))


def _anchor_regression(run: TimedRun, facts: LogFacts) -> StepTimeModel | None:
    """Each stats line i closes an interval of known length in which the replay must have
    produced the logged number of generated tokens; the steps that did so must take that
    long. Least squares over the intervals gives the step-time model."""
    interval = facts.interval_s or 10.0
    targets = stats_targets(facts)
    cum = _cum_sampled(run)
    import bisect

    anchors = []
    for (g, _), s in zip(targets, facts.stats):
        if g <= 0:
            continue
        j = bisect.bisect_left(cum, g - 0.5)
        if j >= len(cum):
            break
        anchors.append(j)
    feats = [step_features(rec) for rec in run.records]
    best = None
    for floor in (0, 32, 64, 128, 256, 512):
        rows = []
        for a, b in zip(anchors, anchors[1:]):
            if b <= a:
                continue
            row = [0.0, 0.0, 0.0, 0.0]
            for k in range(a + 1, b + 1):
                tok, req, ctx = feats[k]
                if req == 0:
                    row[0] += 1  # an empty step costs the overhead only
                    continue
                row[0] += 1
                row[1] += max(tok, floor)
                row[2] += req
                row[3] += ctx
            rows.append(row + [interval])
        if len(rows) < 2:
            return None
        fit_ = _nnls(rows, 4)
        if fit_ is None:
            continue
        err, coef = fit_
        if best is None or err < best[0] - 1e-12:
            best = (err, coef, floor)
    if best is None:
        return None
    _, c, floor = best
    return StepTimeModel(overhead_s=c[0], per_token_s=c[1], per_request_s=c[2],
                         per_context_token_s=c[3], token_floor=floor if c[1] > 0 else 0)


def _nnls(rows: list[list[float]], nvars: int) -> tuple[float, list[float]] | None:
    """Least squares with non-negative coefficients, by trying every subset of free
    variables (nvars <= 4: at most 15 small solves) and keeping the best feasible one."""
    best = None
    for mask in range(1, 1 << nvars):
        idx = [i for i in range(nvars) if mask >> i & 1]
        a = [[sum(r[i] * r[j] for r in rows) for j in idx] for i in idx]
        y = [sum(r[i] * r[nvars] for r in rows) for i in idx]
        sol = _solve(a, y)
        if sol is None or any(v < 0 for v in sol):
            continue
        coef = [0.0] * nvars
        for i, v in zip(idx, sol):
            coef[i] = v
        err = sum((sum(coef[i] * r[i] for i in range(nvars)) - r[nvars]) ** 2 for r in rows)
        if best is None or err < best[0] - 1e-15:
            best = (err, coef)
    return best


def _solve(a: list[list[float]], y: list[float]) -> list[float] | None:
    n = len(y)
    m = [row[:] + [y[i]] for i, row in enumerate(a)]
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[piv][col]) < 1e-18:
            return None
        m[col], m[piv] = m[piv], m[col]
        for r in range(n):
            if r != col:
                f = m[r][col] / m[col][col]
                for k in range(col, n + 1):
                    m[r][k] -= f * m[col][k]
    return [m[i][n] / m[i][i] for i in range(n)]


def initial_model(facts: LogFacts) -> StepTimeModel:
    """A first guess from the logged throughput: ~8 ms a step plus a cost per token that
    makes the busiest interval's tokens fit in it."""
    interval = facts.interval_s or 10.0
    busiest = max(((s.prompt_throughput or 0) + (s.generation_throughput or 0) for s in facts.stats), default=0)
    per_token = 0.5 / busiest if busiest > 0 else 2e-5
    return StepTimeModel(overhead_s=0.004, per_token_s=min(per_token, 1e-3), per_request_s=0.0)


def fit(
    rebuilt: Rebuilt,
    facts: LogFacts,
    profile: SchedulerProfile,
    *,
    spreads: tuple[float, ...] = (0.0, 0.5, 1.0),
    rounds: int = 3,
    model: StepTimeModel | None = None,
) -> Fit:
    tried: list[dict[str, Any]] = []
    best: Fit | None = None
    for spread in spreads:
        m = model or initial_model(facts)
        for _ in range(rounds if model is None else 1):
            run = timed_replay(rebuilt, facts, profile, m, spread, trace=False)
            loss = loss_of(run, facts)
            tried.append({"spread": spread, "model": asdict(m), "loss": round(loss, 4)})
            if best is None or loss < best.loss:
                best = Fit(m, spread, loss, run, tried)
            if model is not None or not facts.stats:
                break
            new = _anchor_regression(run, facts)
            if new is None:
                break
            m = new
    assert best is not None
    best.tried = tried
    return best


# ---------------------------------------------------------------- 4. results
def preemption_records(run: TimedRun, rebuilt: Rebuilt, confidence_of=None) -> list[dict[str, Any]]:
    """One record per preemption, with what it cost and when the victim got back in."""
    ids = {r.log_id: r for r in rebuilt.requests}
    resumed_at: dict[str, list[tuple[int, int, int]]] = {}
    for rec in run.records:
        for rid in rec.get("resumed", ()):
            n = next((n for r2, n in rec.get("scheduled", ()) if r2 == rid), 0)
            hit = rec.get("prefix_hit_tokens", {}).get(rid, 0)
            resumed_at.setdefault(rid, []).append((rec["step"], n, hit))
    out = []
    for rec in run.records:
        for p in rec.get("preemptions", ()):
            victim = p["req"]
            step = rec["step"]
            back = next((x for x in resumed_at.get(victim, ()) if x[0] > step), None)
            item: dict[str, Any] = {
                "step": step,
                "time": round(run.step_start[step], 3) if step < len(run.step_start) else None,
                "victim": victim,
                "victim_internal_id": ids[victim].internal_id if victim in ids else None,
                "trigger": p["trigger"],
                "self_preemption": p["self_preempt"],
                "victim_rule": p.get("victim_rule"),
                "rolled_back_tokens": p.get("rolled_back_tokens", 0),
                "blocks_needed": p.get("blocks_needed"),
                "free_blocks": p.get("free_blocks_at_failure", p["free_blocks_before"]),
                "blocks_freed": p["free_blocks_after"] - p["free_blocks_before"],
                "computed_tokens_lost": p["num_computed_tokens_before"],
                "num_tokens": p["num_tokens"],
                "num_output_tokens": p["num_output_tokens"],
                "readmission_step": back[0] if back else None,
                "readmission_time": round(run.step_start[back[0]], 3) if back else None,
                "prefix_hit_at_readmission": back[2] if back else None,
                "tokens_recomputed": (p["num_tokens"] - back[2]) if back else None,
                "time_lost_s": round(run.step_start[back[0]] - run.step_start[step], 3) if back else None,
            }
            if confidence_of is not None:
                item["confidence"] = confidence_of(step)
            out.append(item)
    return out


# Support: how many of a few replays the log cannot tell apart from this one find the same
# preemption. Measured on the Poisson log case (tests/test_replay_logs.py): 25 of 26 fully
# supported preemptions were true ones, 4 of 11 under half support. It cannot see a replay
# that is off as a whole (README: "Poisson arrivals are the hard case").
SUPPORT_REPLAYS = 10
SUPPORT_JITTER = 2  # steps each arrival moves, inside the window the log allows
SUPPORT_MAX_REQUESTS = 2000  # beyond this the extra replays cost more than the replay


def alternative_placements(base: list[int], windows: list[tuple[int, int]], k: int,
                           jitter: int = SUPPORT_JITTER) -> list[list[int]]:
    """k arrival placements as consistent with the log's line order and seconds as `base`:
    each arrival moved by up to `jitter` steps inside its window, file order kept, the
    first arrival still at step 0. Seeded, so the same log gives the same placements."""
    import random

    out = []
    for seed in range(k):
        rng = random.Random(seed)
        arr = []
        for (lo, hi), b in zip(windows, base):
            hi = max(lo, hi)
            arr.append(min(max(b + rng.randint(-jitter, jitter), lo), hi))
        for i in range(1, len(arr)):
            arr[i] = max(arr[i], arr[i - 1])
        if arr:
            arr[0] = 0
        out.append(arr)
    return out


def add_support(pre: list[dict[str, Any]], rebuilt: Rebuilt, facts: LogFacts,
                profile: SchedulerProfile, run: TimedRun, windows: list[tuple[int, int]],
                k: int, tol: int = 5) -> None:
    """Give each preemption record `support`: the share of `k` alternative placements
    (alternative_placements) whose replay preempts the same victim within `tol` steps."""
    base = [run.arrival_step.get(s.id, 0) for s in rebuilt.workload.requests]
    found: list[dict[str, list[int]]] = []
    for arr in alternative_placements(base, windows, k):
        alt = step_replay(rebuilt, facts, profile, arr, run.model, trace=False)
        by_victim: dict[str, list[int]] = {}
        for rec in alt.records:
            for p in rec.get("preemptions", ()):
                by_victim.setdefault(p["req"], []).append(rec["step"])
        found.append(by_victim)
    for p in pre:
        n = sum(1 for f in found if any(abs(s - p["step"]) <= tol for s in f.get(p["victim"], ())))
        p["support"] = round(n / k, 2)


def storms(preemptions: list[dict[str, Any]], gap_steps: int = 50) -> list[dict[str, Any]]:
    """Bursts: preemptions no more than `gap_steps` apart."""
    out: list[dict[str, Any]] = []
    for p in preemptions:
        if out and p["step"] - out[-1]["last_step"] <= gap_steps:
            s = out[-1]
            s["last_step"] = p["step"]
            s["end_time"] = p["time"]
            s["preemptions"] += 1
            s["tokens_lost"] += p["computed_tokens_lost"]
            s["victims"].append(p["victim"])
        else:
            out.append({"first_step": p["step"], "last_step": p["step"], "start_time": p["time"],
                        "end_time": p["time"], "preemptions": 1,
                        "tokens_lost": p["computed_tokens_lost"], "victims": [p["victim"]]})
    for s in out:
        s["victims"] = sorted(set(s["victims"]))
    return out


def first_token_prompts(run: TimedRun, prompt_len: dict[str, int], exclude_cached: bool) -> list[int]:
    """Prompt tokens the stats logger counts at each step: vLLM V1 adds a request's whole
    prompt length when its first token comes out (IterationStats.update_from_output,
    `is_prefilling`), never for chunks or for the recompute after a preemption; 0.16+
    without the part its first admission found in the prefix cache (spec: log formats,
    stats line). Under async scheduling the first token is a later step's record."""
    first_token, first_hit = _first_tokens(run.records)
    out = [0] * len(run.records)
    for rid, step in first_token.items():
        out[step] += prompt_len.get(rid, 0) - (first_hit.get(rid, 0) if exclude_cached else 0)
    return out


def _first_tokens(records: list[dict[str, Any]]) -> tuple[dict[str, int], dict[str, int]]:
    """(request -> index of the record with its first token, request -> its prefix-cache
    hit at its first admission)."""
    first_token: dict[str, int] = {}
    first_hit: dict[str, int] = {}
    for i, rec in enumerate(records):
        for rid in rec.get("new", ()):
            first_hit.setdefault(rid, rec.get("prefix_hit_tokens", {}).get(rid, 0))
        for rid in rec.get("sampled", ()):
            first_token.setdefault(rid, i)
    return first_token, first_hit


def verify(run: TimedRun, facts: LogFacts, phase: float = 0.5,
           prompt_len: dict[str, int] | None = None) -> dict[str, Any]:
    """Replayed vs logged, per stats line; the first line that disagrees. With the
    requests' prompt lengths, the replayed prompt throughput is counted the way vLLM's
    stats logger counts it (first_token_prompts); it is reported, not judged: one arrival
    a step earlier or later moves a whole prompt across a line."""
    interval = facts.interval_s or 10.0
    rows = []
    prev_step = -1
    per_step = None
    if prompt_len is not None:
        per_step = first_token_prompts(
            run, prompt_len, _version_at_least(facts.vllm_version, (0, 16, 0)))
    # A line is read at its anchor, the step whose output it had seen (where the replay's
    # generated tokens reach the logged count); by the clock only when it has none (no
    # output yet, or the replay never generates that many tokens). Read by the clock, a line
    # can land a step off an exact replay (5 of 64 lines of a conformance run rendered at
    # 1 s a step did).
    cum = _cum_sampled(run)
    targets = stats_targets(facts)
    anchors = _anchors(run, facts, cum, targets)
    for s, anchor, (g, _) in zip(facts.stats, anchors, targets):
        if anchor is not None:
            rec = run.records[anchor]
        elif g <= 0:
            rec = _before_output(run, cum, s, _state_at(run, _line_time(s, phase)))
        else:
            rec = _state_at(run, _line_time(s, phase))
        if rec is None:
            rows.append({"line": s.line, "time": s.time, "replayed": None})
            continue
        step = rec["step"]
        prev_window_start = prev_step + 1
        window = run.records[prev_window_start : step + 1]
        prev_step = step
        gen = sum(len(r.get("sampled", ())) for r in window)
        if per_step is not None:
            prompt = sum(per_step[prev_window_start : step + 1])
        else:  # no prompt lengths: prefill tokens scheduled in the window
            prompt = sum(n for r in window for rid, n in r.get("scheduled", ())
                         if rid in r.get("new", ()) or rid in r.get("resumed", ()) or
                         rid not in r.get("sampled", ()))
        pre = sum(len(r.get("preempted", ())) for r in window)
        row = {
            "file": s.file,
            "line": s.line,
            "time": s.time,
            "step": step,
            "read_at": "anchor" if anchor is not None else "clock" if g > 0 else "before output",
            "running": [n_running(rec), s.running],
            "waiting": [n_waiting(rec), s.waiting],
            "kv_usage": [round(rec["kv_usage"], 4), s.kv_usage],
            "generation_throughput": [round(gen / interval, 1), s.generation_throughput],
            "prompt_throughput": [round(prompt / interval, 1), s.prompt_throughput],
            "preemptions": [pre, s.preemptions],
        }
        diffs = []
        if s.running is not None and row["running"][0] != s.running:
            diffs.append(f"running {row['running'][0]} vs logged {s.running}")
        if s.waiting is not None and row["waiting"][0] != s.waiting:
            diffs.append(f"waiting {row['waiting'][0]} vs logged {s.waiting}")
        if s.kv_usage is not None and abs(rec["kv_usage"] - s.kv_usage) > 0.02:
            diffs.append(f"KV usage {100 * rec['kv_usage']:.1f}% vs logged {100 * s.kv_usage:.1f}%")
        if s.preemptions is not None and pre != s.preemptions:
            diffs.append(f"preemptions {pre} vs logged {s.preemptions}")
        row["differences"] = diffs
        rows.append(row)
    _exact_agreement(rows, run, facts, anchors, cum, targets, per_step)
    return verification_report(rows)


_NOTHING_SEEN = {"step": -1, "num_running": 0, "num_waiting": 0, "kv_usage": 0.0}
KV_PRINT_TOL = 0.0005 + 1e-9  # a stats line prints KV usage to 0.1%


def _before_output(run: TimedRun, cum: list[int], st, by_clock):
    """The state a line shows that had seen no generated token: the engine before its
    first step's output (all zero: no scheduler stats yet) or after a step that produced
    none (a partial prefill chunk). Its token count cannot say which, so the one that
    matches the line is taken, else the clock's."""
    cands = [_NOTHING_SEEN] + [r for r, c in zip(run.records, cum) if c == 0]
    for rec in cands:
        if ((st.running is None or n_running(rec) == st.running)
                and (st.waiting is None or n_waiting(rec) == st.waiting)
                and (st.kv_usage is None or abs(rec["kv_usage"] - st.kv_usage) <= KV_PRINT_TOL)):
            return rec
    return by_clock


def _exact_agreement(rows: list[dict[str, Any]], run: TimedRun, facts: LogFacts,
                     anchors: list[int | None], cum: list[int],
                     targets: list[tuple[float, float]], per_step: list[int] | None) -> None:
    """Mark each row `exact`: the replay is, at that line, the run the log describes.

    A 0.33 stats line shows the state after the last step whose output it had seen: the
    step where the cumulative generated tokens reach the logged count (its anchor). On
    vLLM's own runs of the log cases every line agrees there without tolerance: the count
    is hit, running and waiting are equal, KV usage equal to its printed 0.1%, the
    cumulative prompt tokens equal (tests/test_replay_logs.py). A replay one step off
    somewhere usually misses one of these. The slack is for real logs: an interval is not
    exactly the nominal one, so counts may drift by a fraction of a per mille. `cum` and
    `targets` are _cum_sampled(run) and stats_targets(facts)."""
    cum_prompt: list[int] | None = None
    if per_step is not None:
        cum_prompt, c = [], 0
        for n in per_step:
            c += n
            cum_prompt.append(c)
    interval_rows = [r for r in rows if "differences" in r]
    if len(interval_rows) != len(facts.stats):
        return
    prev_g = prev_p = 0.0
    for row, st, a, (g, p) in zip(interval_rows, facts.stats, anchors, targets):
        why: list[str] = []
        if a is None:
            if g > 0:
                why.append(f"the replay never generates the {g:,.0f} tokens logged by then")
            elif row["read_at"] == "before output" and row["differences"]:
                why = list(row["differences"])
        else:
            rec = run.records[a]
            tol = 0.5 + 0.002 * max(0.0, g - prev_g)
            if abs(cum[a] - g) > tol:
                why.append(f"generated tokens jump from {cum[a - 1] if a else 0:,} to "
                           f"{cum[a]:,} at step {a}, the log says {g:,.0f}")
            if st.running is not None and n_running(rec) != st.running:
                why.append(f"running {n_running(rec)} vs {st.running} at step {a}")
            if st.waiting is not None and n_waiting(rec) != st.waiting:
                why.append(f"waiting {n_waiting(rec)} vs {st.waiting} at step {a}")
            if st.kv_usage is not None and abs(rec["kv_usage"] - st.kv_usage) > KV_PRINT_TOL:
                why.append(f"KV usage {100 * rec['kv_usage']:.2f}% vs {100 * st.kv_usage:.1f}% "
                           f"at step {a}")
            if cum_prompt is not None and st.prompt_throughput is not None:
                ptol = 0.5 + 0.002 * max(0.0, p - prev_p)
                if abs(cum_prompt[a] - p) > ptol:
                    why.append(f"prompt tokens {cum_prompt[a]:,} vs {p:,.0f} by step {a}")
        row["exact"] = not why
        row["exact_differences"] = why
        prev_g, prev_p = g, p


def verification_report(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Rows of replayed-vs-logged counters (each with its `differences`) -> the report:
    how many stats lines agree, and the first one that does not."""
    first_bad = first_inexact = None
    for row in rows:
        if "differences" not in row:
            continue
        row["agrees"] = not row["differences"]
        if row["differences"] and first_bad is None:
            first_bad = row
        if row.get("exact") is False and first_inexact is None:
            first_inexact = row
    report = {
        "stats_lines": len(rows),
        "agreeing_lines": sum(1 for r in rows if r.get("agrees")),
        "first_divergence": None if first_bad is None else {
            "file": first_bad["file"], "line": first_bad["line"], "step": first_bad["step"],
            "differences": first_bad["differences"],
        },
        # the first line the replay does not match exactly at the step it saw
        "first_inexact": None if first_inexact is None else {
            "file": first_inexact["file"], "line": first_inexact["line"],
            "step": first_inexact["step"], "differences": first_inexact["exact_differences"],
        },
        "lines": rows,
    }
    if any("exact" in r for r in rows):
        # lines the replay matches without tolerance at their anchor step (_exact_agreement;
        # V1 logs only)
        report["exact_lines"] = sum(1 for r in rows if r.get("exact"))
    return report


def confidence_function(check: dict[str, Any], run: TimedRun):
    """'consistent' when the stats lines on both sides of the step agree with the replay,
    exactly where the log allows an exact check (_exact_agreement), else 'inferred'. (With
    the tolerant check alone, 11 of the 16 preemptions it called consistent on the
    published Poisson log were true, no better than the 'inferred' ones.)"""
    rows = [r for r in check["lines"] if r.get("step") is not None]

    def conf(step: int) -> str:
        before = [r for r in rows if r["step"] < step]
        after = [r for r in rows if r["step"] >= step]
        near = ([before[-1]] if before else []) + ([after[0]] if after else [])
        # exact where the line could be checked exactly, else within the tolerances
        if near and all(r.get("exact", r.get("agrees")) for r in near):
            return "consistent"
        return "inferred"

    return conf


# ---------------------------------------------------------------- driver
@dataclass(slots=True)
class LogReplay:
    facts: LogFacts
    rebuilt: Rebuilt
    profile: SchedulerProfile
    fit: Fit
    run: TimedRun
    preemptions: list[dict[str, Any]]
    storms: list[dict[str, Any]]
    verification: dict[str, Any]
    estimate: dict[str, Any] | None  # count interval when prompts are unknown
    arrival_pattern: str = "poisson"
    support_replays: int = 0  # alternative replays behind each preemption's `support`

    def workload(self) -> Workload:
        """The rebuilt workload with each request entering at the step the replay placed
        it: a plain `Engine` run of it is this replay (cut where the log was cut)."""
        import dataclasses

        wl = self.rebuilt.workload
        arrival = self.run.arrival_step
        specs = [dataclasses.replace(s, arrival_step=arrival.get(s.id, 0)) for s in wl.requests]
        max_steps = len(self.run.records) if self.run.cut_at is not None else wl.max_steps
        return Workload(wl.name, wl.description, wl.config, specs, max_steps=max_steps)

    def full_trace(self) -> list[dict[str, Any]]:
        """The replay's per-step trace in the conformance format (every field). Aborts
        logged by the server are applied at the same steps."""
        return step_replay(self.rebuilt, self.facts, self.profile,
                           [self.run.arrival_step.get(s.id, 0) for s in self.rebuilt.workload.requests],
                           self.fit.model, trace=True).records

    def summary(self) -> dict[str, Any]:
        n_pre = len(self.preemptions)
        victims = {p["victim"] for p in self.preemptions}
        return {
            "vllm_version": self.facts.vllm_version,
            "profile": self.profile.name,
            "requests": len(self.facts.requests),
            "steps": len(self.run.records),
            "preemptions": n_pre,
            "self_preemptions": sum(1 for p in self.preemptions if p["self_preemption"]),
            "requests_preempted": len(victims),
            "computed_tokens_lost": sum(p["computed_tokens_lost"] for p in self.preemptions),
            "tokens_recomputed": sum(p["tokens_recomputed"] or 0 for p in self.preemptions),
            "step_time_model": self.fit.model.describe(),
            "arrival_pattern": self.arrival_pattern,
            "fit_loss": round(self.fit.loss, 4),
            "prompts": "exact" if not any(self.rebuilt.prompt_estimated) else "estimated",
            "output_lengths": "exact" if not any(self.rebuilt.output_estimated) else "estimated",
            "cut_short": self.run.cut_at is not None,
            "unfinished_requests": self.run.unfinished,
            "support_replays": self.support_replays,
            # preemptions every alternative replay finds too (None: support not measured)
            "robust_preemptions": sum(1 for p in self.preemptions if p.get("support") == 1.0)
            if self.support_replays else None,
        }


@without_cyclic_gc
def replay_facts(
    facts: LogFacts,
    *,
    profile: str | None = None,
    step_time: StepTimeModel | None = None,
    support: int | None = None,
) -> LogReplay:
    """Rebuild, fit and replay. With `step_time` the step-time model is taken as given
    (not fitted). `support`: how many alternative replays measure each preemption's
    support (add_support); None = automatic, 0 = none."""
    if facts.engine_version == "V0" or (
        not profile and facts.vllm_version and not _version_at_least(facts.vllm_version, (0, 8, 0))
    ):
        # --- V0 hook (issue 9, replay/from_log_v0.py): V0-engine logs replay through the
        # V0 engine, checked against their stats lines and every-50th warnings.
        from kvreplay.replay.from_log_v0 import replay_v0_facts

        return replay_v0_facts(facts, profile=profile, step_time=step_time)
    if facts.requests and len(facts.engines) > 1:
        raise ReplayError(
            f"this is a data-parallel log ({len(facts.engines)} engines write stats lines): "
            "its request lines do not say which engine served each request, so the workload "
            "cannot be split per engine, and replaying every request on one engine would "
            "overload it. Replay the step trace of kvreplay's vLLM plugin instead (it traces "
            "each engine process on its own), or the log of a single-engine server (one rank "
            "under external load balancing writes one)")
    prof = get_profile(profile or facts.vllm_version)
    starts = response_starts(facts)
    if starts is not None:
        facts = without_access_lines(facts)
    pattern = arrival_pattern(facts)
    burst = pattern != "poisson"
    spreads = (0.0,) if burst else (1.0,)
    rebuilt = rebuild_workload(facts, prof)
    estimate = None
    if facts.prompts_known or facts.prompt_lengths_known:
        # one round: the anchored iteration below refits the step-time model anyway
        f = fit(rebuilt, facts, prof, spreads=spreads, model=step_time, rounds=2)
    else:
        rebuilt, f, estimate, variants, shared = _fit_unknown_prompts(facts, prof, spreads)
    if starts is not None:
        rebuilt.notes.append(
            f"the access lines are not used: {starts}. uvicorn writes a request's access line "
            "when its response headers go out, which for a streaming response is as it "
            "starts, not when it ends; arrivals are placed by their seconds and the stats "
            "lines only")
    init = f.run
    if pattern == "burst":
        # everything arrived within a couple of seconds: start from "all at once" (the
        # iteration then moves whoever the seconds and completions say came later)
        zeros = [0] * len(rebuilt.workload.requests)
        init = step_replay(rebuilt, facts, prof, zeros, f.model, trace=False)
    anchored, loss = anchored_replay(
        rebuilt, facts, prof, init, f.model, burst=burst, fixed_model=step_time is not None
    )
    if not burst and phase_estimate(facts) is None:
        # Without a phase estimate the iteration can settle one step off; start it again
        # from a burst-like guess and keep whichever agrees better with the stats lines.
        f0 = fit(rebuilt, facts, prof, spreads=(0.0,), model=step_time or f.model, rounds=1)
        alt, alt_loss = anchored_replay(
            rebuilt, facts, prof, f0.run, f.model, burst=False,
            fixed_model=step_time is not None, iterations=3,
        )
        # A global shift of every arrival is invisible to this loss, so only a clearly
        # better fit (half the disagreement) replaces the first one.
        if alt_loss < 0.5 * loss:
            anchored, loss = alt, alt_loss
    if pattern == "burst":
        anchored, loss = _burst_spacing(rebuilt, facts, prof, anchored, loss)
        anchored, loss = _exact_search(rebuilt, facts, prof, anchored, loss)
    model = anchored.run.model
    # light records (counts, no per-request maps); LogReplay.full_trace() gives the
    # conformance-format trace of the same replay
    if _aborts(facts) or _cut_time(facts) is not None:
        # aborts and the cut are applied by wall time: replay again on the final model
        run = step_replay(rebuilt, facts, prof, anchored.arrival_steps, model, trace=False)
    else:
        # the chosen iteration's replay is this one: the model moves only its clock
        run = anchored.run
    anchors = _anchors(run, facts)
    clock = _clock(run, facts, anchors, anchored.phase)
    run.step_start = clock[: len(run.records)]
    run.spread = f.spread
    f = Fit(model, f.spread, loss, run, f.tried)
    prompt_len = None
    if not any(rebuilt.prompt_estimated):
        prompt_len = {s.id: len(s.prompt_token_ids) for s in rebuilt.workload.requests}
    if estimate is not None and len(facts.requests) <= SUPPORT_MAX_REQUESTS:
        _add_placed_variants(estimate, variants, shared, facts, prof, anchored.arrival_steps,
                             model)
    check = verify(run, facts, phase=anchored.phase, prompt_len=prompt_len)
    conf = confidence_function(check, run)
    if any(rebuilt.prompt_estimated):
        conf = lambda step: "inferred"  # noqa: E731 - lengths guessed: nothing is confirmed
    pre = preemption_records(run, rebuilt, conf)
    if support is None:
        # placement uncertainty is what support measures: Poisson arrivals with known
        # prompts (bursts and closed loops pin arrivals by other means; estimated prompts
        # are a larger uncertainty than a step or two)
        support = SUPPORT_REPLAYS if (
            pattern == "poisson" and not any(rebuilt.prompt_estimated)
            and len(facts.requests) <= SUPPORT_MAX_REQUESTS) else 0
    if support > 0 and pre:
        add_support(pre, rebuilt, facts, prof, run,
                    _windows(run, facts, anchors, clock, anchored.phase), support)
    if pattern == "poisson" and pre:
        rebuilt.notes.append(
            "arrivals spread over time: the log pins each one only to a window of steps, and "
            "a step off can change later victims; take the count as an estimate and each "
            "preemption as a lead (its support says how firm), or replay a log written with "
            "kvreplay's step-trace scheduler for the exact sequence")
    rep = LogReplay(facts, rebuilt, prof, f, run, pre, storms(pre), check, estimate)
    rep.arrival_pattern = pattern
    rep.support_replays = support if pre else 0
    return rep


def _fit_unknown_prompts(facts: LogFacts, prof: SchedulerProfile, spreads: tuple[float, ...]):
    """No prompt lengths in the log: give every request the mean length the prompt
    throughput implies, then rescale per stats interval so each interval's prompt tokens
    match; the spread of preemption counts over plausible variants is the estimate."""
    rebuilt = rebuild_workload(facts, prof)
    shared = shared_prefix_estimate(facts, rebuilt.workload.config)
    if shared:
        rebuilt = rebuild_workload(facts, prof, shared_prefix=shared)
    f = fit(rebuilt, facts, prof, spreads=spreads)
    # the lengths after the shared prefix
    lens = [len(s.prompt_token_ids) - shared for s in rebuilt.workload.requests]
    for _ in range(2):
        lens = _rescale_lengths(f.run, facts, lens, shared)
        rebuilt = rebuild_workload(facts, prof, prompt_lens=lens, shared_prefix=shared)
        f = fit(rebuilt, facts, prof, spreads=(f.spread,))
    import random

    counts: dict[str, int] = {}
    variants = length_variants(lens)
    for name, var in variants:
        rb = rebuild_workload(facts, prof, prompt_lens=var, shared_prefix=shared)
        r = timed_replay(rb, facts, prof, f.model, f.spread, trace=False)
        counts[name] = r.summary.total_preemptions
    cfg = rebuilt.workload.config
    priority_unknown = cfg.policy == "priority" and not any(r.priority for r in facts.requests)
    if priority_unknown:
        # 0.33 logs a request's priority only in its JSON body, which this log lacks: the
        # priority policy then orders by priorities nobody knows; replay a few mixes of
        # them (0-4) so the interval covers what they could do
        for seed in (1, 2, 3, 4, 5, 6):
            rng = random.Random(100 + seed)
            rb = rebuild_workload(facts, prof, prompt_lens=lens, shared_prefix=shared)
            specs = [replace(sp, priority=rng.randint(0, 4)) for sp in rb.workload.requests]
            rb.workload = replace(rb.workload, requests=specs)
            r = timed_replay(rb, facts, prof, f.model, f.spread, trace=False)
            counts[f"priorities mix {seed}"] = r.summary.total_preemptions
    estimate = {
        **_count_interval(counts),
        "variants": counts,
        "why": "prompt lengths are not in this log; they were estimated from the stats "
               "lines' prompt throughput, and the count is replayed over plausible variants "
               "of them (total and mix)"
               + (f"; which prompts share what is unknown too: the prefix-cache hit rate is "
                  f"replayed as one {shared}-token prefix every prompt shares" if shared else
                  "; prefix-cache sharing between prompts is unknown too"
                  if rebuilt.workload.config.enable_prefix_caching else "")
               + ("; the scheduling policy is priority but no priority is logged, so the "
                  "count is also replayed over random priorities 0-4"
                  if priority_unknown else ""),
        "make_it_exact": "set VLLM_REQUEST_BODY_LOG_LEVEL=INFO (vLLM 0.31+) or --log-level "
                         "DEBUG so every prompt is logged, or enable kvreplay's step-trace "
                         "scheduler plugin",
    }
    return rebuilt, f, estimate, variants, shared


def _count_interval(counts: dict[str, int]) -> dict[str, int]:
    """Low, high and median of the variants' preemption counts."""
    values = sorted(counts.values())
    return {"preemptions_low": values[0], "preemptions_high": values[-1],
            "preemptions_median": values[len(values) // 2]}


def _add_placed_variants(estimate: dict[str, Any], variants: list[tuple[str, list[int]]],
                         shared: int, facts: LogFacts, prof: SchedulerProfile,
                         arrival_steps: list[int], model: StepTimeModel) -> None:
    """Where the arrivals go is as uncertain as the lengths: replay every length variant
    also with each arrival at the step the anchored replay put it (the estimate's other
    variants place them by the clock), and widen the interval to both. On the Poisson log
    case the clock placement gives 41 preemptions with the true prompt lengths, where
    vLLM had 54."""
    counts = estimate["variants"]
    for name, var in variants:
        rb = rebuild_workload(facts, prof, prompt_lens=var, shared_prefix=shared)
        r = step_replay(rb, facts, prof, arrival_steps, model, trace=False)
        counts[f"{name}, placed as replayed"] = r.summary.total_preemptions
    estimate.update(_count_interval(counts))
    estimate["why"] += ("; each variant is replayed with the arrivals placed by the clock and "
                        "where the replay placed them")


def length_variants(lens: list[int]) -> list[tuple[str, list[int]]]:
    """Plausible prompt lengths around an estimate: its total x0.8-1.2, as estimated
    (alike within a stats interval) and in two log-normal mixes (sigma 0.5: real prompt
    lengths vary widely), renormalised to the same total. Seeded: same log, same variants."""
    import random

    out: list[tuple[str, list[int]]] = []
    for factor in (0.8, 0.9, 1.0, 1.1, 1.2):
        out.append((f"lengths x{factor}", [max(1, round(n * factor)) for n in lens]))
        for seed in (1, 2):
            rng = random.Random(seed)
            raw = [n * rng.lognormvariate(0.0, 0.5) for n in lens]
            k = sum(lens) / max(1e-9, sum(raw))
            out.append((f"lengths x{factor}, mix {seed}",
                        [max(1, round(x * k * factor)) for x in raw]))
    return out


def _rescale_lengths(run: TimedRun, facts: LogFacts, lens: list[int],
                     shared_prefix: int = 0) -> list[int]:
    """Scale the estimated prompt lengths so that each stats interval's prompt tokens match
    the logged prompt throughput, counted as vLLM counts them (first_token_prompts): a
    request's prompt when its first token comes out, less what the prefix cache supplied
    at its first admission. `lens` are the lengths after the shared prefix; an interval is
    (previous line's anchor, this line's anchor], by the clock where a line has none."""
    interval = facts.interval_s or 10.0
    first_token, hit = _first_tokens(run.records)
    pos = {r.log_id: i for i, r in enumerate(facts.requests)}
    bounds = []
    for s, a in zip(facts.stats, _anchors(run, facts)):
        if a is None:
            rec = _state_at(run, s.time + 0.5)
            a = rec["step"] if rec else -1
        bounds.append(a)
    new = list(lens)
    lo = -1
    for s, hi in zip(facts.stats, bounds):
        members = [pos[r] for r, st in first_token.items() if lo < st <= hi and r in pos]
        lo = max(lo, hi)
        want = (s.prompt_throughput or 0.0) * interval
        if not members or want <= 0:
            continue
        # computed tokens = shared + own - hit; only the own parts are scaled
        fixed = sum(shared_prefix - hit.get(facts.requests[i].log_id, 0) for i in members)
        have = sum(lens[i] for i in members)
        if have > 0 and want - fixed > 0:
            f = (want - fixed) / have
            for i in members:
                new[i] = max(1, round(lens[i] * f))
    return new


# ---------------------------------------------------------------- 5. anchored arrivals
@dataclass(slots=True)
class Anchored:
    """A replay whose arrivals sit at fixed engine steps, chosen so that the replay agrees
    with every ordering fact the log gives, and its wall clock."""

    arrival_steps: list[int]
    clock: list[float]  # start time of each step
    phase: float  # sub-second phase of the stats lines
    run: TimedRun
    iterations: int
    violations: int  # arrivals whose windows were empty (constraints relaxed)


@without_cyclic_gc
def step_replay(
    rebuilt: Rebuilt,
    facts: LogFacts,
    profile: SchedulerProfile,
    arrival_steps: list[int],
    model: StepTimeModel,
    *,
    trace: bool = True,
    clock_fn=None,
) -> TimedRun:
    """Replay with each request entering at a given step (the conformance engine)."""
    wl = rebuilt.workload
    specs = [
        RequestSpec(s.id, a, s.prompt_token_ids, s.max_tokens, s.priority)
        for s, a in zip(wl.requests, arrival_steps)
    ]
    engine = Engine(Workload(wl.name, wl.description, wl.config, specs, max_steps=10**9), profile)
    reqs = facts.requests
    aborts = _aborts(facts)
    abort_i = 0
    records: list[dict[str, Any]] = []
    starts: list[float] = []
    # wall clock from the first arrival's second (refined later by the stats anchors)
    t = reqs[0].time if reqs and reqs[0].time is not None else 0.0
    stop_at = _cut_time(facts)
    cut = None
    sched = engine.scheduler
    step_limit = _step_limit(wl) + max(arrival_steps, default=0)
    while not engine.done and engine.step_index < step_limit:
        now = clock_fn(engine.step_index, t) if clock_fn is not None else t
        if stop_at is not None and now > stop_at:
            cut = stop_at
            break
        abort_i = _apply_aborts(engine, aborts, abort_i, now)
        rec = engine.step(trace=True if trace else "light")
        starts.append(now)
        t = now + model.dt_record(rec)
        records.append(rec)
    summary = engine.summary
    if cut is not None:
        summary.num_steps = engine.step_index
        summary.completed = False
    arrival = {s.id: s.arrival_step for s in specs}
    unfinished = [s.id for s in specs if s.id not in summary.finished_step]
    return TimedRun(records, starts, arrival, summary, model, 0.0, cut, unfinished)


def _anchors(run: TimedRun, facts: LogFacts, cum: list[int] | None = None,
             targets: list[tuple[float, float]] | None = None) -> list[int | None]:
    """Stats line i -> the last step whose output it had seen: where the replay's generated
    tokens reach the logged cumulative count. (`cum`, `targets`: _cum_sampled(run) and
    stats_targets(facts), when the caller has them.)"""
    import bisect

    if cum is None:
        cum = _cum_sampled(run)
    out: list[int | None] = []
    for g, _ in targets if targets is not None else stats_targets(facts):
        if g <= 0:
            out.append(None)  # no output seen yet: says nothing about which step ran
            continue
        j = bisect.bisect_left(cum, g - 0.5)
        out.append(j if j < len(cum) else None)
    return out


def _clock(run: TimedRun, facts: LogFacts, anchors: list[int | None], phase: float) -> list[float]:
    """Wall-clock start of every step: the step-time model's durations, stretched between
    anchors so that the step after anchor i starts at stats time S_i + phase."""
    n = len(run.records)
    dur = []
    m = run.model
    for rec in run.records:
        dur.append(m.dt_record(rec))
    cum = [0.0]
    for d in dur:
        cum.append(cum[-1] + d)
    pts = []  # (step index whose start is pinned, time)
    last = -1
    for a, s in zip(anchors, facts.stats):
        if a is None or a + 1 > n or a + 1 <= last:
            continue
        # The line saw step a's output but not step a+1's: it was printed while step
        # a+1 ran; take the middle of that step.
        pts.append((a + 1, _line_time(s, phase) - 0.5 * (dur[a + 1] if a + 1 < n else 0.0)))
        last = a + 1
    if not pts:
        # nothing to pin the clock to: start it at the first arrival's second
        t0 = facts.requests[0].time if facts.requests and facts.requests[0].time else 0.0
        return [t0 + cum[i] for i in range(n + 1)]
    # Step 0 is the first request's step (the engine was idle before it): it started
    # inside that request's logged second. Extrapolated backwards from the first stats
    # line with the model's durations it can miss that second by far (a model fitted on
    # few stats lines: 0.7-0.9 s on a 10-request priority log rendered with a real step-time
    # formula, where every arrival but the first landed 75 steps late); then the second
    # bounds it and the steps up to the first line are stretched to fit.
    first = facts.requests[0].time if facts.requests else None
    precise0 = facts.requests[0].precise_time if facts.requests else None
    if precise0 is not None and pts[0][0] > 0:
        pts.insert(0, (0, precise0))  # the engine was idle: step 0 starts as it comes in
    elif first is not None and pts[0][0] > 0:
        start0 = pts[0][1] - cum[pts[0][0]]
        # an idle engine picks a request up within milliseconds, so step 0 may start just
        # past the end of that second, not later
        latest = first + 1.0 + IDLE_PICKUP_S
        if start0 < first or start0 >= latest:
            pts.insert(0, (0, min(max(start0, first), latest - 1e-3)))
    if facts.completion_times:
        pts = _with_completion_pins(pts, run, facts.completion_times)
    out = [0.0] * (n + 1)
    # before the first pin: model durations backwards
    p0, t0 = pts[0]
    for i in range(0, p0 + 1):
        out[i] = t0 - (cum[p0] - cum[i])
    for (pa, ta), (pb, tb) in zip(pts, pts[1:]):
        span = cum[pb] - cum[pa]
        scale = (tb - ta) / span if span > 0 else 1.0
        for i in range(pa, pb + 1):
            out[i] = ta + (cum[i] - cum[pa]) * scale
    pl, tl = pts[-1]
    for i in range(pl, n + 1):
        out[i] = tl + (cum[i] - cum[pl])
    return out


IDLE_PICKUP_S = 0.05  # an idle engine starts a step this soon after a request arrives


PRECISE_TOL_S = 0.005  # a sub-second stamp's slack: the request reaches the engine a few ms after its line


def _with_completion_pins(pts: list[tuple[int, float]], run: TimedRun,
                          times: list[float]) -> list[tuple[int, float]]:
    """With sub-second times on the access lines, each one pins the clock too: the c-th
    access line was written once the replay's c-th finishing step had ended, as the next one
    ran. Pins that would run the clock backwards are left out."""
    fin = finish_steps(run.records)
    n = len(run.records)
    merged = dict(pts)
    for f, t in zip(fin, times):
        if f + 1 < n and f + 1 not in merged:
            merged[f + 1] = t
    out: list[tuple[int, float]] = []
    for step, t in sorted(merged.items()):
        if out and t <= out[-1][1]:
            continue
        out.append((step, t))
    return out


def finish_steps(records: list[dict[str, Any]]) -> list[int]:
    """The step of each finish, in order: the c-th is the replay's c-th access line."""
    return [rec["step"] for rec in records for _ in rec.get("finished", ())]


def _line_time(st: StatsPoint, phase: float) -> float:
    """When stats line `st` was printed: its sub-second time when the log has one, else its
    second plus the lines' phase."""
    return st.precise_time if st.precise_time is not None else st.time + phase


def _step_at(clock: list[float], t: float) -> int:
    """First step whose start is at or after wall time t."""
    import bisect

    return bisect.bisect_left(clock, t)


def _windows(run: TimedRun, facts: LogFacts, anchors, clock, phase, use_seconds=True):
    """For each arrival, the steps it may enter at: after the completions and stats lines
    the log shows before it, before the ones it shows after it, inside its logged second."""
    fin_steps = finish_steps(run.records)
    n = len(run.records)
    out = []
    first_time = facts.requests[0].time if facts.requests else None
    if first_time is None:
        first_time = float("-inf")
    for r in facts.requests:
        lo, hi = 0, n
        # A request entering at step a was received while step a-1 ran; the access line
        # of a request finished at step f is written once step f has ended, i.e. while
        # step f+1 runs. So a line after finish f means a >= f+2, a line before it a <= f+1
        # (on the log cases' own traces this holds for every arrival; f+1 / f do not).
        c = r.completions_before
        if c > 0 and c - 1 < len(fin_steps):
            lo = max(lo, fin_steps[c - 1] + 2)
        if c < min(len(fin_steps), len(facts.completions)):
            # the next access line the log shows (none when the access log is off or its
            # lines are response starts: then the replay's finishes bound nothing)
            hi = min(hi, fin_steps[c] + 1)
        i = r.stats_before
        if i > 0 and i - 1 < len(anchors) and anchors[i - 1] is not None:
            lo = max(lo, anchors[i - 1] + 1)
        if i < len(anchors) and anchors[i] is not None:
            hi = min(hi, anchors[i] + 1)
        if use_seconds and r.precise_time is not None:
            slo = _step_at(clock, r.precise_time - PRECISE_TOL_S)
            shi = _step_at(clock, r.precise_time + PRECISE_TOL_S)
            if max(lo, slo) <= min(hi, shi):
                lo, hi = max(lo, slo), min(hi, shi)
        elif use_seconds and r.time is not None:
            # step 0 lies in the first request's second, whatever the clock says
            slo = 0 if r.time <= first_time else _step_at(clock, r.time)
            shi = _step_at(clock, r.time + 1.0)
            if max(lo, slo) <= min(hi, shi):
                lo, hi = max(lo, slo), min(hi, shi)
        out.append((lo, hi))
    return out


def _place(windows, clock, facts: LogFacts, burst: bool) -> tuple[list[int], int]:
    """Pick a step in each window, in file order: evenly spread in time inside the window
    (or at its start when the log looks like a burst); monotone in file order."""
    steps: list[int] = []
    bad = 0
    i = 0
    reqs = facts.requests
    prev = 0
    while i < len(windows):
        j = i
        while j < len(windows) and windows[j] == windows[i]:
            j += 1
        lo, hi = windows[i]
        if lo > hi:
            bad += j - i
            lo, hi = hi, hi
        lo = max(lo, prev)
        hi = max(hi, lo)
        m = j - i
        for k in range(m):
            if burst:
                s = lo
            else:
                tl = clock[min(lo, len(clock) - 1)]
                th = clock[min(hi, len(clock) - 1)]
                s = _step_at(clock, tl + (th - tl) * (k + 1) / (m + 1))
                s = min(max(s, lo), hi)
            s = max(s, prev)
            steps.append(s)
            prev = s
        i = j
    return steps, bad


def anchored_loss(
    run: TimedRun,
    facts: LogFacts,
    anchors: list[int | None],
    clock: list[float] | None = None,
    phase: float = 0.5,
) -> float:
    """Disagreement with the stats lines, read at the step each one closes (its anchor):
    running and waiting counts, KV usage (in points of 5%). A line that had seen no output
    yet must not come after the end of a step that produced some (read with the clock)."""
    total = 0.0
    n = 0
    cum = _cum_sampled(run) if clock is not None else None
    for a, st, (g, _) in zip(anchors, facts.stats, stats_targets(facts)):
        if a is None and g <= 0 and clock is not None and cum is not None:
            import bisect

            ended = bisect.bisect_right(clock, _line_time(st, phase)) - 2  # last step ended by then
            if 0 <= ended < len(cum) and cum[ended] > 0:
                total += 25.0
            n += 1
            continue
        if a is None or a >= len(run.records):
            total += 25.0
            n += 1
            continue
        rec = run.records[a]
        if st.running is not None:
            total += (n_running(rec) - st.running) ** 2
        if st.waiting is not None:
            total += (n_waiting(rec) - st.waiting) ** 2
        if st.kv_usage is not None:
            total += (100 * (rec["kv_usage"] - st.kv_usage) / 5.0) ** 2
        n += 1
    return total / max(1, n)


def anchored_replay(
    rebuilt: Rebuilt,
    facts: LogFacts,
    profile: SchedulerProfile,
    init: TimedRun,
    model: StepTimeModel,
    *,
    burst: bool,
    iterations: int = 6,
    fixed_model: bool = False,
) -> tuple[Anchored, float]:
    """Iterate: replay -> anchors, completions, clock -> arrival windows -> placement.
    Returns the iteration that agrees best with the stats lines, and its loss."""
    arrival = [init.arrival_step.get(s.id, 0) for s in rebuilt.workload.requests]
    base = min(arrival) if arrival else 0
    arrival = [a - base for a in arrival]
    best: tuple[float, Anchored] | None = None
    for it in range(iterations + 1):
        run = step_replay(rebuilt, facts, profile, arrival, model, trace=False)
        new_model = None if fixed_model else _anchor_regression(run, facts)
        if new_model is not None:
            model = new_model
            run.model = model
        anchors = _anchors(run, facts)
        phase, windows, clock = _best_phase(run, facts, anchors)
        loss = anchored_loss(run, facts, anchors, clock, phase)
        run.step_start = clock[: len(run.records)]
        if best is None or loss <= best[0]:  # ties: the later, more refined placement
            best = (loss, Anchored(list(arrival), clock, phase, run, it, 0))
        if it == iterations:
            break
        placed, bad = _place(windows, clock, facts, burst)
        # Step 0 is the first arrival's step by definition (the engine was idle before);
        # the clock before the first stats line is extrapolated, so do not trust it there.
        if placed:
            placed[0] = 0
        moved = sum(1 for a, b in zip(placed, arrival) if a != b)
        if moved == 0 or (it >= 2 and moved <= 0.002 * len(arrival)):
            break  # (nearly) a fixed point: another round would replay about the same
        arrival = placed
    assert best is not None
    return best[1], best[0]


def _best_phase(run: TimedRun, facts: LogFacts, anchors):
    """The stats lines are printed at a fixed phase within the second. Arrivals logged in
    the same second as a stats line, before and after it, estimate that phase (for arrivals
    spread over the second, the share before it); with too few of them, the middle of the
    second (the guess with the smallest worst-case error)."""
    phase = phase_estimate(facts)
    if phase is None:
        phase = 0.5
    clock = _clock(run, facts, anchors, phase)
    return phase, _windows(run, facts, anchors, clock, phase), clock


def phase_estimate(facts: LogFacts) -> float | None:
    if facts.precise_times and facts.stats:
        offsets = sorted(st.precise_time - st.time for st in facts.stats)  # type: ignore[operator]
        return offsets[len(offsets) // 2]
    by_second: dict[float, list[int]] = {}
    for r in facts.requests:
        if r.time is not None:
            by_second.setdefault(r.time, []).append(r.stats_before)
    before = after = 0
    for st in facts.stats:
        for stats_before in by_second.get(st.time, ()):
            if stats_before <= st.index:
                before += 1
            else:
                after += 1
    if before == 0 or after == 0 or before + after < 8:
        return None
    return (before + 0.5) / (before + after + 1)


def _aborts(facts: LogFacts) -> list[tuple[float, str]]:
    """(time, request id) of every logged abort, in time order."""
    return sorted((r.aborted_time, r.log_id) for r in facts.requests if r.aborted_time is not None)


def _apply_aborts(engine: Engine, aborts: list[tuple[float, str]], i: int, now: float) -> int:
    """Abort (between steps, A8) every request whose abort time has come; returns the
    index of the first abort still to come."""
    sched = engine.scheduler
    while i < len(aborts) and aborts[i][0] <= now:
        rid = aborts[i][1]
        if rid in sched.requests:
            sched.finish_requests([rid], RequestStatus.FINISHED_ABORTED)
            engine.summary.finished_step[rid] = engine.step_index
        i += 1
    return i


def response_starts(facts: LogFacts) -> str | None:
    """Why the access lines cannot be finishes, or None. A streaming response's access line
    is written when its headers go out, as it starts (spec: log formats, uvicorn access
    line). The JSON bodies say `stream`; without them the stats lines can: requests still
    running or waiting at a line have not finished, and the requests finished by a line
    produced at least their max_tokens each (ignore_eos; fewer if max_model_len stops them)
    or one token each, which must fit in the generated tokens the line counts."""
    said = [r.stream for r in facts.requests if r.stream is not None]
    if said and sum(said) * 2 > len(said):
        return f"{sum(said)} of {len(facts.requests)} requests stream (their JSON bodies say so)"
    if not facts.completions or not facts.stats:
        return None
    mml = facts.config.max_model_len if facts.config else None

    def least_output(r: LogRequest) -> int:
        # ignore_eos: max_tokens, unless max_model_len stops the request first (which takes
        # its prompt length to tell); else one token
        plen = len(r.prompt_token_ids) if r.prompt_token_ids is not None else r.prompt_len
        if not (r.ignore_eos and r.max_tokens) or mml is None or plen is None:
            return 1
        return max(1, min(r.max_tokens, mml - plen))

    least_all = [least_output(r) for r in facts.requests]
    for st, (g, _) in zip(facts.stats, stats_targets(facts)):
        c = st.completions_before
        if c == 0:
            continue
        received = facts.requests[: st.arrivals_before]
        if c > len(received):
            return (f"{c} access lines before the stats line at {st.file}:{st.line}, for "
                    f"{len(received)} requests received")
        # requests still in the engine cannot have finished
        present = (st.running or 0) + (st.waiting or 0)
        if present > len(received) - c:
            return (f"{c} access lines before the stats line at {st.file}:{st.line}, which "
                    f"shows {present} requests running or waiting of the {len(received)} "
                    "received")
        least = sorted(least_all[: st.arrivals_before])[:c]
        if sum(least) > g * 1.01 + 1:
            return (f"{c} access lines before the stats line at {st.file}:{st.line}, whose "
                    f"{g:,.0f} generated tokens cannot have finished that many requests "
                    f"(at least {sum(least):,} tokens)")
    return None


def without_access_lines(facts: LogFacts) -> LogFacts:
    """A copy of `facts` with no completion (access) lines: no ordering fact from them."""
    reqs = [replace(r, completions_before=0) for r in facts.requests]
    stats = [replace(st, completions_before=0) for st in facts.stats]
    return replace(facts, requests=reqs, stats=stats, completions=[], completion_times=None)


def arrival_pattern(facts: LogFacts) -> str:
    """How the client sent requests, read from the order of lines:
    "closed-loop" (each request follows a completion, as `vllm bench serve
    --max-concurrency` does), "burst" (everything within a couple of seconds), or
    "poisson" (spread over time)."""
    reqs = facts.requests
    if not reqs:
        return "poisson"
    seconds = {r.time for r in reqs if r.time is not None}
    later = [r for r in reqs if r.completions_before > 0]
    if len(later) >= 8:
        answering = _answering_completions(facts)
        if sum(1 for r in later if r.seq in answering) >= 0.9 * len(later):
            return "closed-loop"
    if len(seconds) <= 2:
        return "burst"
    return "poisson"


def _answering_completions(facts: LogFacts) -> set[int]:
    """The seq of every request line that answers a completion, as a closed-loop client
    sends its next request when one comes back: the j-th line of a run of request lines
    that comes right after a run of k >= j access lines (several requests can finish in one
    step, and their successors then come in a run too; stats lines do not count)."""
    lines = sorted([(r.seq, "R") for r in facts.requests] + [(c[3], "C") for c in facts.completions])
    out: set[int] = set()
    k = j = 0  # length of the last run of access lines; request lines since it
    for seq, kind in lines:
        if kind == "C":
            k = k + 1 if j == 0 else 1
            j = 0
        else:
            j += 1
            if j <= k:
                out.add(seq)
    return out


BURST_GAPS = (0.02, 0.05, 0.1, 0.15, 0.25, 1 / 3, 0.5, 1.0, 2.0)


def _burst_spacing(rebuilt: Rebuilt, facts: LogFacts, prof: SchedulerProfile,
                   anchored: Anchored, loss: float) -> tuple[Anchored, float]:
    """A burst is rarely one instant: a client sends its requests a step or two apart.
    Try a few spacings inside each group of requests placed at the same step and keep the
    one that agrees best with the stats lines (ties: the tightest)."""
    base = anchored.arrival_steps
    best = (loss, anchored)
    model = anchored.run.model
    for gap in BURST_GAPS:
        arr = []
        k = 0
        for i, a in enumerate(base):
            k = k + 1 if i > 0 and a == base[i - 1] else 0
            arr.append(a + int(k * gap))
        for i in range(1, len(arr)):
            arr[i] = max(arr[i], arr[i - 1])
        cand_loss, cand = _placed(rebuilt, facts, prof, arr, model, anchored)
        if cand_loss < best[0] - 1e-9:
            best = (cand_loss, cand)
    return best[1], best[0]


def _placed(rebuilt: Rebuilt, facts: LogFacts, prof: SchedulerProfile, arrival: list[int],
            model: StepTimeModel, like: Anchored) -> tuple[float, Anchored]:
    """Another placement for an anchored replay (same model, phase and iteration count):
    its replay, clocked by the stats lines, and its anchored loss."""
    run = step_replay(rebuilt, facts, prof, arrival, model, trace=False)
    anchors = _anchors(run, facts)
    clock = _clock(run, facts, anchors, like.phase)
    run.step_start = clock[: len(run.records)]
    loss = anchored_loss(run, facts, anchors, clock, like.phase)
    return loss, Anchored(list(arrival), clock, like.phase, run, like.iterations, 0)


EXACT_SEARCH_MOVES = 400  # replays a burst's exact-line search may spend
EXACT_SEARCH_MAX_REQUESTS = 64


def _exact_search(rebuilt: Rebuilt, facts: LogFacts, prof: SchedulerProfile,
                  anchored: Anchored, loss: float) -> tuple[Anchored, float]:
    """Inside a burst the log cannot say which step each request came in at: its lines all
    share a second, and the tolerant check (the loss) is often 0 for several spacings. The
    exact check can still tell them apart (_exact_agreement): move one arrival at a time by
    a few steps, keep file order and each arrival's window, walk on while no line is lost,
    and take the placement with the most stats lines matched exactly (then the lowest loss).
    Nothing changes unless that beats the placement found so far. Seeded: the same log gives
    the same search."""
    import random

    n = len(anchored.arrival_steps)
    if n < 2 or n > EXACT_SEARCH_MAX_REQUESTS or not facts.stats or any(rebuilt.prompt_estimated):
        return anchored, loss  # (estimated prompts: no line can be matched exactly)
    prompt_len = {s.id: len(s.prompt_token_ids) for s in rebuilt.workload.requests}
    model = anchored.run.model
    phase = anchored.phase

    def exact_lines(run: TimedRun) -> int:
        return verify(run, facts, phase=phase, prompt_len=prompt_len).get("exact_lines", 0)

    start_exact = exact_lines(anchored.run)  # (its run is clocked already)
    if start_exact >= len(facts.stats):
        return anchored, loss
    windows = _windows(anchored.run, facts, _anchors(anchored.run, facts), anchored.clock, phase)
    rng = random.Random(0)
    cur = list(anchored.arrival_steps)
    cur_key = (start_exact, -loss)
    best: tuple[int, float, Anchored] | None = None
    for _ in range(EXACT_SEARCH_MOVES):
        cand = list(cur)
        i = rng.randrange(1, n)
        lo, hi = windows[i]
        cand[i] = min(max(cand[i] + rng.choice((-3, -2, -1, 1, 2, 3)), lo), max(lo, hi))
        for j in range(1, n):
            cand[j] = max(cand[j], cand[j - 1])
        if cand == cur:
            continue
        cand_loss, a = _placed(rebuilt, facts, prof, cand, model, anchored)
        exact = exact_lines(a.run)
        if (exact, -cand_loss) >= cur_key:
            cur, cur_key = cand, (exact, -cand_loss)
            if best is None or (exact, -cand_loss) > (best[0], -best[1]):
                best = (exact, cand_loss, a)
            if exact == len(facts.stats) and cand_loss <= loss:
                break  # every line matched, no worse by the tolerant check
    if best is None or best[0] <= start_exact:
        return anchored, loss
    return best[2], best[1]


def _step_limit(wl: Workload) -> int:
    """A bound no faithful replay of this workload reaches: every request prefilled one
    token a step and decoded alone, with room for a preemption each. Stops a workload that
    could never finish (vLLM would spin forever) from running away."""
    return 1000 + sum(len(s.prompt_token_ids) + 2 * s.max_tokens for s in wl.requests) * 2
