"""Replay a V0-engine vLLM log (<= 0.10, default engine <= 0.7) through the V0 engine.

What a V0 log says, and how each fact is used:

* config: `args: Namespace(...)` (block_size, max_num_seqs, max_num_batched_tokens,
  enable_chunked_prefill, enable_prefix_caching, preemption_mode, scheduling_policy),
  `Initializing an LLM engine` (max_seq_len, chunked_prefill_enabled), `# GPU blocks: N,
  # CPU blocks: M`; anything missing takes the 0.6.x default and is reported.
* requests: `Received request` with `prompt_token_ids` (V0 logs them at INFO), n,
  max_tokens, ignore_eos; output lengths are exact with ignore_eos, else taken from the
  `Finished request` lines (in-process engines) or estimated from the logged generation
  throughput, and marked so.
* a time-driven replay (replay/v0 `V0Engine`): a request enters when the replay's clock
  passes its logged second; a step-time model (fixed + per token + per request) advances
  the clock. It is fitted to the stats lines (every ~5 s: each line is printed at the end
  of the first step more than 5 s after the previous one, with the interval's prompt and
  generation tokens / elapsed time): the steps between two lines must take that long.
* verification: per stats line, replayed vs logged Running / Swapped / Pending / GPU and
  CPU KV usage (and the throughputs, reported); every every-50th warning (1st, 51st,
  101st ... preemption) must name the replay's preemption with that cumulative count, in
  the same mode, in about the same second; the Prometheus-style count (`so_preempted`,
  running-phase victims only) is summed.

Only events reach this module, through `LogFacts` (replay never imports the parsers): the
`# CPU blocks` count, the V0 stats fields Swapped / CPU KV usage and the `Finished request`
lines are collected there.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from kvreplay.replay.engine import without_cyclic_gc
from kvreplay.replay.from_log import (Fit, LogReplay, Rebuilt, ReplayError, StepTimeModel,
                                      TimedRun, _nnls, arrival_pattern, initial_model,
                                      response_starts, storms, verification_report,
                                      without_access_lines)
from kvreplay.replay.logfacts import LogFacts
from kvreplay.replay.v0 import V0_PROFILES, V0Engine, summarize
from kvreplay.replay.v0.engine import DEFAULTS as V0_ENGINE_DEFAULTS
from kvreplay.replay.workload import RequestSpec

V0_PROFILE = "0.6.6.post1"
STATS_INTERVAL_S = 5.0
# vLLM 0.6.x defaults for what a V0 log may not state (EngineArgs / SchedulerConfig).
V0_DEFAULTS = {
    "block_size": 16,
    "max_num_seqs": 256,
    "enable_chunked_prefill": False,
    "enable_prefix_caching": False,
    "policy": "fcfs",
    "preemption_mode": None,
}


@dataclass(slots=True)
class V0LogConfig:
    """The V0 engine's configuration, as rebuilt from the log."""

    num_gpu_blocks: int
    num_cpu_blocks: int
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    enable_chunked_prefill: bool
    enable_prefix_caching: bool
    policy: str
    preemption_mode: str | None
    watermark: float = 0.01

    def engine_dict(self) -> dict[str, Any]:
        d = dict(V0_ENGINE_DEFAULTS)
        for k in ("num_gpu_blocks", "num_cpu_blocks", "block_size", "max_num_seqs",
                  "max_num_batched_tokens", "max_model_len", "enable_chunked_prefill",
                  "enable_prefix_caching", "policy", "preemption_mode", "watermark"):
            d[k] = getattr(self, k)
        return d


@dataclass(slots=True)
class V0LogWorkload:
    """Same shape as `Workload` (name, description, config, requests, max_steps); one
    request spec per sequence group (n > 1 is split as 0.6.6 does)."""

    name: str
    description: str
    config: V0LogConfig
    requests: list[RequestSpec]
    max_steps: int
    parent: dict[str, str] = field(default_factory=dict)  # group id -> logged request id


@dataclass(frozen=True, slots=True)
class V0ProfileRef:
    name: str = f"v0-{V0_PROFILE}"
    version: str = V0_PROFILE


@dataclass(slots=True)
class V0Extras:
    num_cpu_blocks: int | None = None
    swapped: dict[tuple[str, int], tuple[int | None, float | None]] = field(default_factory=dict)
    finished: list[tuple[float | None, str]] = field(default_factory=list)


# ---------------------------------------------------------------- facts LogFacts lacks
def _v0_extras(facts: LogFacts) -> V0Extras:
    """The V0-only facts: swap space, Swapped / CPU usage per stats line, Finished lines."""
    out = V0Extras(num_cpu_blocks=facts.num_cpu_blocks, finished=list(facts.finished))
    for s in facts.stats:
        out.swapped[(s.file, s.line)] = (s.swapped, s.cpu_kv_usage)
    return out


# ---------------------------------------------------------------- 1. workload
def _missing_message(facts: LogFacts, extras: V0Extras, missing: list[str]) -> str:
    have = []
    if facts.stats:
        have.append(f"{len(facts.stats)} stats line(s)")
    if facts.v0_preemptions:
        ks = ", ".join(str(p.cumulative) for p in facts.v0_preemptions if p.cumulative)
        have.append(f"{len(facts.v0_preemptions)} preemption warning(s)"
                    + (f" (total_num_cumulative_preemption={ks})" if ks else ""))
    if facts.requests:
        have.append(f"{len(facts.requests)} request line(s)")
    text = ("cannot replay this V0-engine log: it lacks " + "; ".join(missing))
    if have:
        text += " (it has only " + ", ".join(have) + ")"
    return text


def v0_config_from(facts: LogFacts, extras: V0Extras) -> tuple[V0LogConfig, dict[str, str], list[str]]:
    c = facts.config
    src: dict[str, str] = {}
    notes: list[str] = []

    def pick(name: str, logged: Any, default: Any) -> Any:
        if logged is not None:
            src[name] = "log"
            return logged
        src[name] = "default"
        notes.append(f"{name} not in the log: vLLM 0.6's default {default!r} assumed")
        return default

    block_size = pick("block_size", c.block_size if c else None, V0_DEFAULTS["block_size"])
    ngpu = c.num_gpu_blocks if c else None
    src["num_gpu_blocks"] = "log"
    max_model_len = c.max_model_len if c else None
    src["max_model_len"] = "log"
    chunked = pick("enable_chunked_prefill", c.enable_chunked_prefill if c else None, False)
    caching = pick("enable_prefix_caching", c.enable_prefix_caching if c else None, False)
    max_seqs = pick("max_num_seqs", c.max_num_seqs if c else None, V0_DEFAULTS["max_num_seqs"])
    if c is not None and c.max_num_batched_tokens is not None:
        budget = c.max_num_batched_tokens
        src["max_num_batched_tokens"] = "log"
    else:
        # SchedulerConfig (0.6.x): 512 with chunked prefill, else max(max_model_len, 2048)
        budget = 512 if chunked else max(int(max_model_len or 0), 2048)
        src["max_num_batched_tokens"] = "default"
        notes.append(f"max_num_batched_tokens not in the log: vLLM 0.6's default {budget} assumed")
    policy = str(pick("policy", c.scheduling_policy if c else None, "fcfs")).lower()
    mode = c.preemption_mode if c else None
    src["preemption_mode"] = "log" if mode is not None else "default"
    mode = None if mode in (None, "None") else str(mode).lower()
    ncpu = extras.num_cpu_blocks
    if ncpu is None:
        ncpu = 0
        src["num_cpu_blocks"] = "default"
        notes.append("# CPU blocks not in the log: no swap space assumed")
    else:
        src["num_cpu_blocks"] = "log"
    if chunked and caching and budget % int(block_size):
        raise ReplayError("chunked prefill with prefix caching needs max_num_batched_tokens a "
                          f"multiple of block_size ({budget} vs {block_size}): check the log's args")
    if not chunked and budget < (max_model_len or 0):
        raise ReplayError(f"max_num_batched_tokens ({budget}) < max_model_len ({max_model_len}) "
                          "with chunked prefill off: vLLM refuses this; the log's config is "
                          "incomplete (pass the real values)")
    cfg = V0LogConfig(
        num_gpu_blocks=int(ngpu), num_cpu_blocks=int(ncpu), block_size=int(block_size),
        max_num_seqs=int(max_seqs), max_num_batched_tokens=int(budget),
        max_model_len=int(max_model_len), enable_chunked_prefill=bool(chunked),
        enable_prefix_caching=bool(caching), policy=policy if policy in ("fcfs", "priority") else "fcfs",
        preemption_mode=mode if mode in ("swap", "recompute") else None)
    return cfg, src, notes


def check_replayable(facts: LogFacts, extras: V0Extras) -> None:
    """Raise `ReplayError` naming everything the log lacks for a V0 replay."""
    missing = []
    c = facts.config
    if c is None or c.num_gpu_blocks is None:
        missing.append("the KV cache size (the startup line `# GPU blocks: N, # CPU blocks: M`)")
    if c is None or c.max_model_len is None:
        missing.append("max_model_len (the startup line `Initializing an LLM engine (v...) with "
                       "config: ... max_seq_len=N` or `args: Namespace(... max_model_len=N)`)")
    if not facts.requests:
        missing.append("request lines (`Received request X: ... prompt_token_ids: [...]`, logged "
                       "by default by V0 servers unless --disable-log-requests)")
    if missing:
        raise ReplayError(_missing_message(facts, extras, missing))


def rebuild_v0_workload(facts: LogFacts, extras: V0Extras,
                        out_lens: dict[str, int] | None = None) -> Rebuilt:
    check_replayable(facts, extras)
    cfg, src, notes = v0_config_from(facts, extras)
    specs: list[RequestSpec] = []
    parent: dict[str, str] = {}
    p_est: list[bool] = []
    o_est: list[bool] = []
    known = [len(r.prompt_token_ids) for r in facts.requests if r.prompt_token_ids]
    known += [r.prompt_len for r in facts.requests if not r.prompt_token_ids and r.prompt_len]
    mean_len = round(sum(known) / len(known)) if known else _prompt_len_from_stats(facts)
    for i, r in enumerate(facts.requests):
        if r.prompt_token_ids:
            prompt = list(r.prompt_token_ids)
            est = False
        else:
            n = r.prompt_len or mean_len
            prompt = [1_000_000 + i * 100_003 + j for j in range(max(1, int(n)))]
            est = r.prompt_len is None
        mt = r.max_tokens if r.max_tokens is not None else cfg.max_model_len - len(prompt)
        out_est = False
        if out_lens is not None and r.log_id in out_lens and not r.ignore_eos:
            mt = min(mt, out_lens[r.log_id])
            out_est = True
        elif not r.ignore_eos:
            out_est = True
        mt = max(1, int(mt))
        n_seq = max(1, int(r.n or 1))
        ids = [r.log_id] if n_seq == 1 else [f"{r.log_id}_parallel_sample_{j}" for j in range(n_seq)]
        for gid in ids:
            specs.append(RequestSpec(gid, 0, prompt, mt, int(r.priority or 0)))
            parent[gid] = r.log_id
        p_est.append(est)
        o_est.append(out_est)
    if any(p_est):
        notes.append(f"{sum(p_est)} prompt lengths estimated (mean {mean_len} tokens): the "
                     "Received lines carry no prompt_token_ids (chat requests 0.6.4+)")
    if any(o_est):
        how = ("from the Finished request lines" if extras.finished else
               "from the logged generation throughput" if out_lens else "max_tokens taken as the length")
        notes.append(f"{sum(o_est)} output lengths estimated ({how}; no ignore_eos)")
    if cfg.policy == "priority":
        notes.append("priority policy: request priorities are not logged by V0 servers; all taken as 0")
    wl = V0LogWorkload("V0 log replay", "rebuilt from " + ", ".join(facts.files), cfg, specs,
                       10**9, parent)
    return Rebuilt(wl, facts.requests, p_est, o_est, src, notes)  # type: ignore[arg-type]


def _prompt_len_from_stats(facts: LogFacts) -> int:
    total = sum((s.prompt_throughput or 0.0) * STATS_INTERVAL_S for s in facts.stats)
    if total > 0 and facts.requests:
        return max(1, round(total / len(facts.requests)))
    return 512


# ---------------------------------------------------------------- 2. timed replay
# Where inside its logged second a request arrived: (phase u, spread s): the j-th of m
# arrivals logged in second S is put at S + u + (1 - u) * s * (j + 1) / (m + 1). Evenly
# spread (Poisson-like), or a burst early, mid or late in the second; the fit keeps the
# placement that agrees best with the stats lines and the warnings.
PLACEMENTS = ((0.0, 1.0), (0.0, 0.0), (0.5, 0.0), (0.999, 0.0))


def arrival_times_v0(facts: LogFacts, phase: float, spread: float) -> list[float]:
    out: list[float] = []
    reqs = facts.requests
    base = facts.first_time or 0.0
    i = 0
    while i < len(reqs):
        sec = reqs[i].time if reqs[i].time is not None else (math.floor(out[-1]) if out else base)
        j = i
        while j < len(reqs) and (reqs[j].time if reqs[j].time is not None else sec) == sec:
            j += 1
        m = j - i
        for k in range(m):
            out.append(sec + phase + (1.0 - phase) * spread * (k + 1) / (m + 1))
        i = j
    for k in range(1, len(out)):
        out[k] = max(out[k], out[k - 1])
    return out


def step_features(rec: dict[str, Any]) -> tuple[int, int]:
    return rec.get("num_scheduled_tokens", 0), len(rec.get("scheduled", ()))


def step_dt(model: StepTimeModel, rec: dict[str, Any]) -> float:
    tok, req = step_features(rec)
    return model.dt(tok, req, 0)


def _augment(rec: dict[str, Any]) -> None:
    """V1-style aliases so the audit, the TUI-free consumers and the step-time model read a
    V0 record like a V1 one (the oracle fields stay as they are)."""
    cached = rec.get("cached_tokens", {})
    rec["num_scheduled_tokens"] = sum(n for _, n in rec.get("scheduled", ())) - sum(cached.values())
    rec["prefix_hit_tokens"] = cached
    rec["kv_usage"] = rec.get("gpu_cache_usage", 0.0)
    rec["free_blocks"] = rec.get("free_gpu_blocks")


COMPACT_DROP = ("num_computed_tokens", "status", "blocks_held", "blocks_to_swap_out",
                "blocks_to_swap_in", "blocks_to_copy", "will_sample")


@without_cyclic_gc
def timed_replay_v0(rebuilt: Rebuilt, facts: LogFacts, model: StepTimeModel,
                    placement: tuple[float, float] = (0.0, 1.0), *, compact: bool = True,
                    stop_at: float | None = None) -> TimedRun:
    wl: V0LogWorkload = rebuilt.workload  # type: ignore[assignment]
    eng = V0Engine(wl.config.engine_dict(), V0_PROFILES[V0_PROFILE])
    times = arrival_times_v0(facts, *placement)
    by_parent: dict[str, list[RequestSpec]] = {}
    for s in wl.requests:
        by_parent.setdefault(wl.parent.get(s.id, s.id), []).append(s)
    reqs = facts.requests
    pending = deque(range(len(reqs)))
    aborts = sorted((r.aborted_time, r.log_id) for r in reqs if r.aborted_time is not None)
    ai = 0
    clock = times[0] if times else 0.0
    records: list[dict[str, Any]] = []
    starts: list[float] = []
    arrival: dict[str, int] = {}
    limit = 2000 + 3 * sum(len(s.prompt_token_ids) + 2 * s.max_tokens for s in wl.requests)
    cut = None
    step = 0
    idx = 0
    finished = 0
    while step < limit:
        if not eng.has_unfinished():
            if not pending:
                break
            clock = max(clock, times[pending[0]])
        if stop_at is not None and clock > stop_at:
            cut = stop_at
            break
        while ai < len(aborts) and aborts[ai][0] <= clock:
            eng.abort_request(aborts[ai][1])
            ai += 1
        arrivals: list[str] = []
        imminent = None
        while pending:
            k = pending[0]
            need = reqs[k].completions_before
            if finished < need and clock < times[k] + 2.0:
                break  # the log shows more completions before this arrival
            due = times[k] <= clock + 1e-6
            if not due and finished == need and clock >= times[k] - 1.0:
                # the log shows this arrival before the next completion, and one is
                # about to happen: let the request in first
                if imminent is None:
                    imminent = _finish_imminent(eng)
                due = imminent
            if not due:
                break
            pending.popleft()
            for s in by_parent.get(reqs[k].log_id, ()):
                r = {"id": s.id, "prompt_token_ids": s.prompt_token_ids,
                     "max_tokens": s.max_tokens, "priority": s.priority}
                arrivals.extend(eng.add_request(r, idx, arrival_time=times[k] + idx * 1e-9))
                idx += 1
                arrival[s.id] = step
        rec = eng.step(step, arrivals)
        if rec.get("idle"):
            continue  # (only when everything pending was aborted)
        _augment(rec)
        starts.append(clock)
        clock += step_dt(model, rec)
        if compact:
            for k in COMPACT_DROP:
                rec.pop(k, None)
        records.append(rec)
        finished += len(rec.get("finished", ()))
        step += 1
        if eng.terminated:
            break
    summary = summarize(records)
    unfinished = list(summary["unfinished"])
    run = TimedRun(records, starts, arrival, summary, model, placement[1], cut, unfinished)
    run.step_start.append(clock)  # end of the last step (popped by callers that need it)
    return run


def _finish_imminent(eng: V0Engine) -> bool:
    """Will a running group sample its last token in the coming step?"""
    mml = eng.cfg["max_model_len"]
    for g in eng.sched.running:
        if not g.is_prefill() and (g.num_output_tokens + 1 >= g.max_tokens or g.get_len() + 1 > mml):
            return True
    return False


def _ends(run: TimedRun) -> list[float]:
    """End time of every step: the start of the next; the last one from the sentinel the
    fitting runs keep, else from the step-time model."""
    n = len(run.records)
    out = run.step_start[1: n + 1]
    if n and len(out) < n:
        out.append(run.step_start[n - 1] + step_dt(run.model, run.records[n - 1]))
    return out


def _finish(run: TimedRun) -> TimedRun:
    del run.step_start[len(run.records):]
    return run


def _cut_time_v0(facts: LogFacts, extras: V0Extras) -> float | None:
    """The log stops before the run ended (server killed, log copied mid-run) unless its
    last stats line shows nothing running, swapped or pending after the last arrival, or
    every request has a completion (Finished / access line) or an abort."""
    if facts.last_time is None or not facts.requests:
        return None
    last_arrival = facts.requests[-1]
    if facts.stats:
        last = facts.stats[-1]
        sw = extras.swapped.get((last.file, last.line), (None, None))[0] or 0
        if (last.running or 0) + (last.waiting or 0) + sw == 0 and last.seq > last_arrival.seq:
            return None
    ended = {rid for _, rid in extras.finished}
    ended |= {r.log_id for r in facts.requests if r.aborted_time is not None}
    if all(r.log_id in ended for r in facts.requests):
        return None
    aborted = sum(1 for r in facts.requests if r.aborted_time is not None)
    if len(facts.completions) + aborted >= len(facts.requests):
        return None
    return facts.last_time + 1.0


# ---------------------------------------------------------------- 3. stats lines
def _elapsed(facts: LogFacts) -> list[float]:
    """Seconds each stats line's throughputs were averaged over: the first step end more
    than 5 s after the previous line, so a little over 5 s (the mean over the log's
    regular gaps); after a longer gap (idle engine) the gap itself."""
    st = facts.stats
    gaps = [b.time - a.time for a, b in zip(st, st[1:])]
    regular = [g for g in gaps if g <= 6.0]
    mean = min(6.0, max(5.0, sum(regular) / len(regular))) if regular else 5.0
    out = [mean]
    for g in gaps:
        out.append(float(g) if g > 6.0 else mean)
    return out


def stats_steps(run: TimedRun, facts: LogFacts) -> list[int | None]:
    """The replay step at whose end each stats line was printed: a line stamped second S
    came at the end of a step ending in [S, S+1), the first one more than 5 s after the
    previous line; none there: the step running at S + 0.5."""
    ends = _ends(run)
    out: list[int | None] = []
    prev_end = -math.inf
    for s in facts.stats:
        lo = bisect.bisect_left(ends, s.time)
        hi = bisect.bisect_left(ends, s.time + 1.0)
        choice = None
        for k in range(lo, hi):
            if ends[k] - prev_end > STATS_INTERVAL_S:
                choice = k
                break
        if choice is None and hi > lo:
            choice = hi - 1
        if choice is None:
            k = bisect.bisect_left(ends, s.time + 0.5)
            choice = k if k < len(ends) else None
            if choice is not None and ends[choice] - (s.time + 0.5) > 30.0:
                choice = None
        if choice is not None and run.step_start[choice] > s.time + 1.0:
            choice = None  # the replay had not started yet
        out.append(choice)
        if choice is not None:
            prev_end = ends[choice]
    return out


def _window_tokens(run: TimedRun, a: int, b: int) -> tuple[int, int]:
    from kvreplay.replay.render_v0 import step_tokens

    p = g = 0
    for rec in run.records[a + 1: b + 1]:
        x, y = step_tokens(rec)
        p += x
        g += y
    return p, g


def regress(run: TimedRun, facts: LogFacts) -> StepTimeModel | None:
    """Least squares (non-negative) over the stats intervals: the steps between two lines
    must take the logged interval, and produce its generated tokens. The line's step is
    found by the generated tokens, counted from the first line the replay places."""
    steps = stats_steps(run, facts)
    elapsed = _elapsed(facts)
    cum = []
    c = 0
    from kvreplay.replay.render_v0 import step_tokens

    for rec in run.records:
        c += step_tokens(rec)[1]
        cum.append(c)
    base = next((i for i, k in enumerate(steps) if k is not None), None)
    if base is None:
        return None
    anchors = [(base, steps[base])]
    target = cum[steps[base]]
    for i in range(base + 1, len(facts.stats)):
        target += (facts.stats[i].generation_throughput or 0.0) * elapsed[i]
        j = bisect.bisect_left(cum, target - 0.5)
        if j >= len(cum):
            break
        anchors.append((i, j))
    rows = []
    for (i0, a), (i1, b) in zip(anchors, anchors[1:]):
        if b <= a:
            continue
        row = [0.0, 0.0, 0.0]
        for rec in run.records[a + 1: b + 1]:
            tok, req = step_features(rec)
            row[0] += 1
            row[1] += tok
            row[2] += req
        rows.append(row + [sum(elapsed[i0 + 1: i1 + 1])])
    if len(rows) < 2:
        return None
    fit_ = _nnls(rows, 3)
    if fit_ is None:
        return None
    _, coef = fit_
    if coef[0] <= 0 and coef[1] <= 0 and coef[2] <= 0:
        return None
    return StepTimeModel(overhead_s=max(coef[0], 1e-4), per_token_s=coef[1],
                         per_request_s=coef[2], per_context_token_s=0.0)


# ---------------------------------------------------------------- 4. verification
def _nth_preemption(run: TimedRun) -> list[tuple[int, dict[str, Any]]]:
    out = []
    for rec in run.records:
        for p in rec.get("preemptions", ()):
            out.append((rec["step"], p))
    return out


def check_warnings(run: TimedRun, facts: LogFacts, tol_s: float = 2.0) -> dict[str, Any]:
    """Each logged warning against the replay's preemption with the same cumulative count."""
    pre = _nth_preemption(run)
    by_k = {p["cumulative_before"] + 1: (step, p) for step, p in pre}
    rows = []
    first_bad = None
    covered_until = facts.last_time
    for w in facts.v0_preemptions:
        k = w.cumulative
        row: dict[str, Any] = {"file": w.file, "line": w.line, "time": w.time,
                               "request_id": w.request_id, "mode": (w.mode or "").lower() or None,
                               "cumulative": k}
        got = by_k.get(k) if k is not None else None
        if got is None:
            row.update(replayed=None, matched=False,
                       differences=[f"the replay has only {len(pre)} preemptions"
                                    if k is not None else "no cumulative count on the line"])
        else:
            step, p = got
            t = run.step_start[step] if step < len(run.step_start) else None
            diffs = []
            if p["req"] != w.request_id:
                diffs.append(f"victim {p['req']} vs logged {w.request_id}")
            if row["mode"] and p["mode"] != row["mode"]:
                diffs.append(f"mode {p['mode']} vs logged {row['mode']}")
            dt = None
            if t is not None and w.time is not None:
                dt = round(t - (w.time + 0.5), 3)
                if abs(dt) > tol_s + 0.5:
                    diffs.append(f"at {dt:+.1f} s from the logged second")
            row.update(replayed={"victim": p["req"], "mode": p["mode"], "step": step,
                                 "time": None if t is None else round(t, 3)},
                       time_diff_s=dt, victim_matches=p["req"] == w.request_id,
                       matched=not diffs, differences=diffs)
        if not row["matched"] and first_bad is None:
            first_bad = row
        rows.append(row)
    # warnings the replay printed inside the log's time span but the log does not show
    logged_k = {w.cumulative for w in facts.v0_preemptions}
    extra = []
    for step, p in pre:
        if p.get("warning_logged") and p["cumulative_before"] + 1 not in logged_k:
            t = run.step_start[step] if step < len(run.step_start) else None
            if covered_until is None or t is None or t <= covered_until:
                extra.append({"cumulative": p["cumulative_before"] + 1, "victim": p["req"],
                              "step": step, "time": None if t is None else round(t, 3)})
    return {
        "warnings_logged": len(rows),
        "warnings_matched": sum(1 for r in rows if r["matched"]),
        "victims_matched": sum(1 for r in rows if r.get("victim_matches")),
        "first_divergence": first_bad,
        "replay_warnings_not_in_log": extra,
        "lines": rows,
    }


def verify_v0(run: TimedRun, facts: LogFacts, extras: V0Extras) -> dict[str, Any]:
    steps = stats_steps(run, facts)
    elapsed = _elapsed(facts)
    ends = _ends(run)
    rows = []
    prev = -1
    for s, k, el in zip(facts.stats, steps, elapsed):
        sw_logged, cpu_logged = extras.swapped.get((s.file, s.line), (None, None))
        if k is None:
            rows.append({"file": s.file, "line": s.line, "time": s.time, "step": None,
                         "replayed": None, "agrees": False,
                         "differences": ["the replay has no step at this time"]})
            continue
        rec = run.records[k]
        span = ends[k] - ends[prev] if prev >= 0 else el
        p_tok, g_tok = _window_tokens(run, prev, k)
        n_pre = sum(len(r.get("preempted", ())) for r in run.records[prev + 1: k + 1])
        prev = k
        span = span if span > 0 else el
        row = {
            "file": s.file, "line": s.line, "time": s.time, "step": k,
            "running": [len(rec["running"]), s.running],
            "waiting": [len(rec["waiting"]), s.waiting],
            "swapped": [len(rec["swapped"]), sw_logged],
            "kv_usage": [round(rec["gpu_cache_usage"], 4), s.kv_usage],
            "cpu_kv_usage": [round(rec["cpu_cache_usage"], 4), cpu_logged],
            "prompt_throughput": [round(p_tok / span, 1), s.prompt_throughput],
            "generation_throughput": [round(g_tok / span, 1), s.generation_throughput],
            "preemptions": [n_pre, None],  # V0 stats lines carry no preemption count
        }
        diffs = []
        for key, label in (("running", "running"), ("waiting", "pending"), ("swapped", "swapped")):
            a, b = row[key]
            if b is not None and a != b:
                diffs.append(f"{label} {a} vs logged {b}")
        for key, label in (("kv_usage", "GPU KV usage"), ("cpu_kv_usage", "CPU KV usage")):
            a, b = row[key]
            if b is not None and abs(a - b) > 0.02:
                diffs.append(f"{label} {100 * a:.1f}% vs logged {100 * b:.1f}%")
        row["differences"] = diffs
        rows.append(row)
    return verification_report(rows)


def loss_v0(run: TimedRun, facts: LogFacts, extras: V0Extras) -> float:
    """How far the replay is from the log: stats counters (usage in points of 5%) and the
    warnings (a wrong victim or mode weighs as much as 5 requests off)."""
    total = 0.0
    n = 0
    for row in verify_v0(run, facts, extras)["lines"]:
        n += 1
        if row.get("step") is None:
            total += 25.0
            continue
        for key in ("running", "waiting", "swapped"):
            a, b = row[key]
            if b is not None:
                total += (a - b) ** 2
        for key in ("kv_usage", "cpu_kv_usage"):
            a, b = row[key]
            if b is not None:
                total += (100 * (a - b) / 5.0) ** 2
        for key in ("prompt_throughput", "generation_throughput"):
            a, b = row[key]
            if b is not None:
                total += 4.0 * ((a - b) / max(10.0, b)) ** 2
    for w in check_warnings(run, facts)["lines"]:
        n += 1
        rep = w.get("replayed")
        if rep is None:
            total += 25.0
            continue
        if not w.get("victim_matches"):
            total += 25.0
        if w["mode"] and rep["mode"] != w["mode"]:
            total += 25.0
        if w.get("time_diff_s") is not None:
            total += min(25.0, max(0.0, abs(w["time_diff_s"]) - 0.5) ** 2)
    return total / max(1, n)


# ---------------------------------------------------------------- 5. results
def preemption_records_v0(run: TimedRun, confidence_of, exact: set[int]) -> list[dict[str, Any]]:
    back: dict[str, list[tuple[int, int, str]]] = {}
    for rec in run.records:
        for rid in rec.get("resumed", ()):
            back.setdefault(rid, []).append((rec["step"], rec.get("cached_tokens", {}).get(rid, 0), "recompute"))
        for rid in rec.get("swapped_in", ()):
            back.setdefault(rid, []).append((rec["step"], 0, "swap"))
    out = []
    for rec in run.records:
        step = rec["step"]
        for p in rec.get("preemptions", ()):
            failed = "free_gpu_after" not in p  # the swap-out that stopped vLLM
            victim = p["req"]
            b = next((x for x in back.get(victim, ()) if x[0] > step), None)
            swap = p["mode"] == "swap"
            k = p["cumulative_before"] + 1
            t0 = run.step_start[step]
            item = {
                "step": step,
                "time": round(t0, 3),
                "victim": victim,
                "victim_internal_id": None,
                "trigger": p["trigger"],
                "self_preemption": p["self_preempt"],
                "victim_rule": ("priority" if p["called_from"] == "_schedule_priority_preemption"
                                else "self" if p["self_preempt"] else "last running"),
                "mode": p["mode"],
                "cumulative": k,
                "warning_logged": p["warning_logged"],
                "counted_in_prometheus": p["called_from"] == "_schedule_running",
                "rolled_back_tokens": 0,
                "blocks_needed": None,
                "free_blocks": p["free_gpu_before"],
                "blocks_freed": None if failed else p["free_gpu_after"] - p["free_gpu_before"],
                "blocks_swapped_out": (None if failed else p["free_cpu_before"] - p["free_cpu_after"])
                if swap else 0,
                "error": p.get("error"),
                "computed_tokens_lost": 0 if swap else p["num_computed_tokens_before"],
                "num_tokens": p["num_tokens"],
                "num_output_tokens": p["num_output_tokens"],
                "readmission_step": b[0] if b else None,
                "readmission_time": round(run.step_start[b[0]], 3) if b else None,
                "prefix_hit_at_readmission": (b[1] if b and not swap else None),
                "tokens_recomputed": (0 if swap else p["num_tokens"] - b[1]) if b else None,
                "time_lost_s": round(run.step_start[b[0]] - t0, 3) if b else None,
                "confidence": "exact" if k in exact else confidence_of(step),
            }
            out.append(item)
    return out


def _confidence(check: dict[str, Any]):
    rows = [r for r in check["lines"] if r.get("step") is not None]
    steps = [r["step"] for r in rows]

    def conf(step: int) -> str:
        i = bisect.bisect_left(steps, step)
        near = ([rows[i - 1]] if i > 0 else []) + ([rows[i]] if i < len(rows) else [])
        if near and all(r.get("agrees") for r in near):
            return "consistent"
        return "inferred"

    return conf


@dataclass(slots=True)
class V0LogReplay(LogReplay):
    """`LogReplay` of a V0 log: the same fields (so `kvreplay replay`, the audit and the
    pytest plugin read it unchanged) plus the warnings check and the counters."""

    warnings: dict[str, Any] = field(default_factory=dict)
    counters: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        s = LogReplay.summary(self)
        s["engine"] = "V0"
        s["swap_preemptions"] = sum(1 for p in self.preemptions if p["mode"] == "swap")
        s["warnings_logged"] = self.warnings.get("warnings_logged", 0)
        s["warnings_matched"] = self.warnings.get("warnings_matched", 0)
        s["prometheus_num_preemptions_total"] = self.counters.get("prometheus_num_preemptions_total")
        s["num_cumulative_preemption"] = self.counters.get("num_cumulative_preemption")
        s["terminal_error"] = self.counters.get("terminal_error")
        return s


# ---------------------------------------------------------------- output lengths
def _estimate_out_lens(facts: LogFacts, extras: V0Extras, run: TimedRun,
                       current: dict[str, int] | None) -> dict[str, int] | None:
    """Requests without ignore_eos: the length the replay had reached when the log shows
    them finished (`Finished request` lines), else one cap L for all of them so that the
    replay generates the tokens the stats lines logged."""
    open_ = [r for r in facts.requests if not r.ignore_eos]
    if not open_:
        return None
    out = dict(current or {})
    fin = {rid: t for t, rid in extras.finished if t is not None}
    if fin:
        ends = _ends(run)
        produced: dict[str, list[tuple[float, int]]] = {}
        for rec, e in zip(run.records, ends):
            for rid in rec.get("sampled", ()):
                lst = produced.setdefault(rid, [])
                lst.append((e, (lst[-1][1] if lst else 0) + 1))
        for r in open_:
            t = fin.get(r.log_id)
            if t is None:
                continue
            got = produced.get(r.log_id, [])
            if not got:
                continue
            i = bisect.bisect_right([e for e, _ in got], t + 0.5)
            n_at = got[i - 1][1] if i > 0 else 1
            if got[-1][0] > t + 1.0 or r.log_id not in out:
                out[r.log_id] = max(1, n_at)
        return out
    if len(facts.stats) < 2:
        return None
    elapsed = _elapsed(facts)
    want = sum((s.generation_throughput or 0.0) * e for s, e in zip(facts.stats, elapsed))
    fixed = sum(r.max_tokens or 0 for r in facts.requests if r.ignore_eos)
    caps = [r.max_tokens or 10**6 for r in open_]
    budget = want - fixed
    if budget <= 0:
        return None
    lo, hi = 1, max(caps)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if sum(min(c, mid) for c in caps) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return {r.log_id: min(r.max_tokens or lo, lo) for r in open_}


def _duration_model(rebuilt: Rebuilt, facts: LogFacts, extras: V0Extras,
                    stop_at: float | None) -> StepTimeModel:
    """A first step-time model: the replay's number of steps must fill the time the log
    shows the engine busy (first arrival to the last stats line or finish showing work)."""
    m = initial_model(facts)
    run = timed_replay_v0(rebuilt, facts, m, (0.0, 1.0), stop_at=None)
    t0 = facts.requests[0].time if facts.requests and facts.requests[0].time is not None else None
    busy = [s.time for s in facts.stats
            if (s.running or 0) + (s.waiting or 0)
            + (extras.swapped.get((s.file, s.line), (0, 0))[0] or 0) > 0]
    busy += [t for t, _ in extras.finished if t is not None]
    if t0 is None or not busy or not run.records:
        return m
    span = max(busy) + 0.5 - t0
    # steps the replay ran up to the last busy stats line: all of them if the log shows
    # the run ending, else the share of generated tokens the log reached
    n = len(run.records)
    if facts.stats and max(busy) >= (facts.stats[-1].time if facts.stats else 0) and stop_at is not None:
        want = sum((st.generation_throughput or 0.0) * e for st, e in zip(facts.stats, _elapsed(facts)))
        from kvreplay.replay.render_v0 import step_tokens

        c = 0
        for i, rec in enumerate(run.records):
            c += step_tokens(rec)[1]
            if c >= want:
                n = i + 1
                break
    if span <= 0 or n <= 0:
        return m
    return StepTimeModel(overhead_s=span / n, per_token_s=0.0, per_request_s=0.0)


# ---------------------------------------------------------------- driver
@without_cyclic_gc
def replay_v0_facts(facts: LogFacts, *, profile: str | None = None,
                    step_time: StepTimeModel | None = None) -> V0LogReplay:
    """Rebuild, fit and replay a V0 log; verify against its stats lines and warnings."""
    if facts.engine_version == "V1":
        raise ReplayError(f"this vLLM {facts.vllm_version} log comes from the V1 engine, which "
                          "has no profile before 0.8.5: pass --profile 0.8.5 to replay it with "
                          "the oldest V1 rules")
    if profile not in (None, "auto", "v0", "0.6.6", "0.6.6.post1", V0ProfileRef().name):
        raise ReplayError(f"profile {profile!r} is a V1 release, but this log comes from the V0 "
                          f"engine: the V0 replay follows vLLM {V0_PROFILE} (omit --profile)")
    starts = response_starts(facts)
    if starts is not None:
        facts = without_access_lines(facts)  # streaming: access lines at starts (from_log)
    extras = _v0_extras(facts)
    check_replayable(facts, extras)
    rebuilt = rebuild_v0_workload(facts, extras)
    if starts is not None:
        rebuilt.notes.append(
            f"the access lines are not used: {starts}; a streaming response's access line is "
            "written as it starts, not when it ends")
    stop_at = _cut_time_v0(facts, extras)
    pattern = arrival_pattern(facts)
    tried: list[dict[str, Any]] = []
    best: tuple[float, StepTimeModel, tuple[float, float], Rebuilt] | None = None
    out_lens = None
    m0 = step_time or _duration_model(rebuilt, facts, extras, stop_at)
    for placement in PLACEMENTS:
        m = m0
        rb = rebuilt
        for rnd in range(4 if step_time is None else 2):
            run = timed_replay_v0(rb, facts, m, placement, stop_at=stop_at)
            loss = loss_v0(run, facts, extras)
            tried.append({"phase": placement[0], "spread": placement[1], "model": m.describe(),
                          "loss": round(loss, 4)})
            if best is None or loss < best[0] - 1e-12:
                best = (loss, m, placement, rb)
            new_lens = _estimate_out_lens(facts, extras, run, out_lens)
            if new_lens is not None and new_lens != out_lens:
                out_lens = new_lens
                rb = rebuild_v0_workload(facts, extras, out_lens)
            elif step_time is not None:
                break
            if step_time is None and facts.stats:
                nm = regress(run, facts)
                if nm is not None:
                    m = nm
    assert best is not None
    loss, model, placement, rebuilt = best
    run = _finish(timed_replay_v0(rebuilt, facts, model, placement, compact=False, stop_at=stop_at))
    check = verify_v0(run, facts, extras)
    warn = check_warnings(run, facts)
    exact = {w["cumulative"] for w in warn["lines"] if w["matched"]}
    pre = preemption_records_v0(run, _confidence(check), exact)
    summ = run.summary
    counters = {
        "prometheus_num_preemptions_total": summ["prometheus_num_preemptions_total"],
        "num_cumulative_preemption": summ["num_cumulative_preemption"],
        "preemptions_by_mode": summ["preemptions_by_mode"],
        "swap_ins": summ["swap_ins"],
        "warnings_replayed": summ["preemption_warnings_logged"],
        "terminal_error": summ["terminal_error"],
        "ignored": summ["ignored"],
    }
    notes = rebuilt.notes
    notes.append(f"V0 engine replay (vLLM {V0_PROFILE} rules)")
    if warn["warnings_logged"]:
        notes.append(f"every-50th preemption warnings: {warn['warnings_matched']} of "
                     f"{warn['warnings_logged']} match the replay (victim, mode, cumulative "
                     f"count, time)" + ("" if not warn["first_divergence"] else
                                        "; first mismatch: line "
                                        f"{warn['first_divergence']['line']}: "
                                        + "; ".join(warn["first_divergence"]["differences"])))
    if warn["replay_warnings_not_in_log"]:
        notes.append(f"{len(warn['replay_warnings_not_in_log'])} warning(s) the replay would "
                     "have printed are not in the log")
    notes.append(f"Prometheus vllm:num_preemptions_total (replayed): "
                 f"{counters['prometheus_num_preemptions_total']}; scheduler cumulative count: "
                 f"{counters['num_cumulative_preemption']}")
    if counters["terminal_error"]:
        notes.append("the replay ends with vLLM's own error: "
                     f"{counters['terminal_error']['type']}: {counters['terminal_error']['message']}")
    notes.append(f"arrivals placed {'evenly over' if placement[1] else 'at a burst in'} their "
                 f"logged second" + (f" (from +{placement[0]:.2f} s)" if placement[0] else ""))
    f = Fit(model, placement[1], loss, run, tried)
    rep = V0LogReplay(facts, rebuilt, V0ProfileRef(), f, run, pre, storms(pre), check,  # type: ignore[arg-type]
                      None, arrival_pattern=pattern, warnings=warn, counters=counters)
    return rep
