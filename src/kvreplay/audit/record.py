"""The per-log audit: one record per log (per engine for data-parallel logs).

`audit_records(path)` is a pure function of the input file(s): same bytes in, same
records out. A record is a flat dict of scalars plus four nested lists (`storms`,
`worst_requests`, `tput_by_concurrency`, `timeline`, `replay_timeline`); `SCHEMA` gives
every column's polars type so the records of many logs concatenate into one table and
round-trip through Parquet.

A field that the input cannot give is null, and `null_reasons` says why (e.g. the
replay needs the startup lines; vLLM 0.33 never prints the stats line's Preemptions).
"""

from __future__ import annotations

import math
import os
from typing import Any, Sequence

from kvreplay.audit import metrics as M
from kvreplay.audit.status import KV_FULL, classify

_STORM = {"start_s": float, "end_s": float, "preemptions": int, "recomputed_tokens": int,
          "kv_usage": float}
_WORST = {"request": str, "preemptions": int, "recomputed_tokens": int, "time_lost_s": float}
_TBC = {"running": int, "gen_tput": float, "samples": int}
_TL = {"t": float, "running": int, "waiting": int, "kv_usage": float, "prompt_tput": float,
       "gen_tput": float, "preemptions": int}
_RTL = {"t": float, "kv_usage": float, "running": int, "waiting": int, "preemptions": int}

# column -> python type (int, float, str, bool, list[str]) or nested struct list
COLUMNS: dict[str, Any] = {
    "log": str, "engine": int, "source": str,
    "status": str, "status_evidence": str,
    "replay": str, "null_reasons": [str],
    # why the input could not be audited (null for an audited log): the message, and its
    # kind: "input" (unreadable, empty, not a vLLM log), "bug" (kvreplay raised) or "worker"
    # (the process auditing it died every time it was tried)
    "error": str, "error_kind": str,
    "log_start": str,  # first request / stats line, "YYYY-MM-DD HH:MM:SS" (the log's clock)
    # scheduler
    "vllm_version": str, "engine_version": str, "profile": str, "model": str,
    "policy": str, "preemption_mode": str,
    "max_num_seqs": int, "max_num_seqs_source": str, "running_max": int, "running_typical": int,
    "max_num_batched_tokens": int, "max_model_len": int, "gpu_memory_utilization": float,
    "block_size": int, "num_gpu_blocks": int, "kv_cache_tokens": int, "max_concurrency_x": float,
    "chunked_prefill": bool, "prefix_caching": bool,
    # counters
    "samples": int, "interval_s": float, "duration_s": float,
    "running_mean": float, "waiting_mean": float, "waiting_max": int,
    "waiting_capacity_mean": float, "deferred_mean": float, "deferred_max": int,
    "kv_usage_mean": float, "kv_usage_p95": float, "kv_time_ge95": float,
    "preemptions_logged": int, "preemptions_logged_source": str,
    "preemptions_replayed": int, "preemptions_replayed_low": int, "preemptions_replayed_high": int,
    "preemptions_replayed_median": int, "recomputed_tokens_low": int, "recomputed_tokens_high": int,
    "preemptions_interval_source": str,
    "self_preemptions": int, "requests_preempted": int,
    "computed_tokens_lost": int, "recomputed_tokens": int, "processed_tokens": int,
    "recompute_ratio": float, "recompute_source": str,
    "recompute_ratio_low": float, "recompute_ratio_high": float,  # when it is an interval
    "replay_agreement": float, "replay_exact": float, "step_time_model": str,
    # request spans read beside the log (`kvreplay audit LOG SPANS`; null without): requests
    # joined, coverage, the exporter's clock offset found, spans the replay contradicts
    "spans_joined": int, "spans_coverage": float, "spans_clock_offset_s": float,
    "spans_contradicted": int,
    # Prometheus scrapes of the same server joined to the log (`kvreplay audit LOG SCRAPES`):
    # their path, how they were joined (or why not), how many bound the log's span, and the
    # replay checked against their counters
    "metrics": str, "metrics_join": str, "metrics_scrapes": int, "counter_check": str,
    # workload
    "requests": int, "arrival_rate_rps": float, "concurrency_mean": float, "concurrency_max": int,
    "input_len_mean": float, "input_len_p50": float, "input_len_p95": float, "input_len_max": int,
    "output_len_mean": float, "output_len_p50": float, "output_len_p95": float, "output_len_max": int,
    "lengths_source": str, "longest_seq_pool_share": float,
    # perf
    "prompt_tput_mean": float, "gen_tput_mean": float, "gen_tput_p95": float, "gen_tput_max": float,
    "ttft_p50_s": float, "ttft_p95_s": float, "itl_p50_s": float, "itl_p95_s": float,
    "latency_source": str,
    "step_spike_ratio": float, "step_spike_share": float, "step_spike_prefill_share": float,
    "step_time_source": str,
    # detail
    "storms": [_STORM], "worst_requests": [_WORST], "tput_by_concurrency": [_TBC],
    "timeline": [_TL], "replay_timeline": [_RTL],
}
NESTED = [k for k, v in COLUMNS.items() if isinstance(v, list)]
SCALARS = [k for k, v in COLUMNS.items() if not isinstance(v, list)]


def polars_schema():
    import polars as pl

    conv = {int: pl.Int64, float: pl.Float64, str: pl.String, bool: pl.Boolean}

    def dt(t):
        if isinstance(t, list):
            inner = t[0]
            if isinstance(inner, dict):
                return pl.List(pl.Struct({k: conv[v] for k, v in inner.items()}))
            return pl.List(conv[inner])
        return conv[t]

    return {k: dt(v) for k, v in COLUMNS.items()}


def empty_record(log: str) -> dict[str, Any]:
    rec: dict[str, Any] = {k: None for k in COLUMNS}
    rec["log"] = log
    for k in NESTED:
        rec[k] = []
    return rec


def error_record(log: str, message: str, kind: str = "input") -> dict[str, Any]:
    """The row of an input that could not be audited: every field null, the reason kept."""
    rec = empty_record(log)
    rec["status"] = "not established"
    rec["status_evidence"] = f"could not audit: {message}"
    rec["replay"] = "skipped"
    rec["null_reasons"] = [f"all fields: {message}"]
    rec["error"], rec["error_kind"] = message, kind
    return rec


def stamp(t: float | None) -> str | None:
    import time

    return None if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t))


def _version(v: str | None) -> tuple[int, int, int] | None:
    if not v:
        return None
    nums = []
    for part in v.lstrip("v").split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        nums.append(int(digits) if digits else 0)
    while len(nums) < 3:
        nums.append(0)
    return tuple(nums)  # type: ignore[return-value]


# ---------------------------------------------------------------- entry points
def audit_records(path: str | Sequence[str], *, profile: str | None = None,
                  replay: bool = True, year: int | None = None) -> list[dict[str, Any]]:
    """Audit one log (a path, or several files of one server merged by time) or one series
    of Prometheus scrapes. Returns one record per engine."""
    paths = [path] if isinstance(path, str) else list(path)
    label = "+".join(paths)
    from kvreplay.audit import prom

    proms = [p for p in paths if p != "-" and prom.looks_like_prometheus(p)]
    if len(proms) == len(paths):
        from kvreplay.audit.scrape_record import audit_prometheus

        return audit_prometheus(proms, label)
    logs = [p for p in paths if p not in proms]
    if not proms:
        return audit_vllm_log(paths, label, profile=profile, replay=replay, year=year)
    from kvreplay.audit import join

    return join.audit_server(logs, proms, profile=profile, replay=replay, year=year)


def audit_vllm_log(paths: list[str], label: str, *, profile: str | None, replay: bool,
                   year: int | None, scrapes: list | None = None) -> list[dict[str, Any]]:
    from kvreplay import events as ev
    from kvreplay.errors import UserError
    from kvreplay.sources import open_replay, read_log

    from kvreplay.parsers.span_files import spans_format

    # request-span files go to the replay (joined there), not to the log's parse
    log = read_log([p for p in paths if p == "-" or spans_format(p) is None], year=year)
    events, dialect, config = log.events, log.dialect, log.config
    _check_readable(events, label, paths)
    by_engine: dict[int | None, list[ev.Stats]] = {}
    for e in events:
        if isinstance(e, ev.Stats) and e.time is not None:
            by_engine.setdefault(e.engine, []).append(e)
    engines = sorted(by_engine, key=lambda k: (-1 if k is None else k))
    dp = len([k for k in engines if k is not None]) > 1
    if not dp and len(engines) > 1:  # one engine, its lines with and without "Engine 000:": one record
        by_engine = {None: sorted((e for k in engines for e in by_engine[k]), key=lambda e: e.time)}
        engines = [None]
    if not engines:
        engines = [None]
    v0_pre = [e for e in events if isinstance(e, ev.Preemption)]
    iterations = [e for e in events if isinstance(e, ev.Iteration) and not e.dummy]

    rp = None
    replay_reason = None
    if replay:  # (a data-parallel log is refused by the replay, with its reason)
        try:
            # with its uncertainty ensemble: the audit reports counts and their intervals
            rp = open_replay(paths, profile=profile, year=year, log=log,
                             scrapes=scrapes if not dp else None)
        except UserError as exc:
            replay_reason = str(exc)
        except KeyError as exc:  # an unknown release in get_profile
            replay_reason = f"no scheduler profile for this release: {exc}"
    else:
        replay_reason = "replay not requested (--no-replay)"

    out = []
    for eng in engines:
        rec = empty_record(label)
        rec["source"] = "vllm log"
        rec["engine"] = eng if dp else None
        _fill_config(rec, config, dialect)
        stats = by_engine.get(eng, [])
        origin = _origin(events, stats)
        rec["log_start"] = stamp(origin) if origin else None
        _fill_stats(rec, stats, origin, dialect.vllm_version, dialect.engine_version, v0_pre)
        warned = [e for e in events if isinstance(e, ev.PreemptionWarning) and e.engine in (None, eng)]
        if warned:  # vLLM PR #42827: one WARNING per victim, each preemption named by vLLM
            rec["preemptions_logged"] = len(warned)
            rec["preemptions_logged_source"] = "per-victim preemption WARNING lines (vLLM PR #42827)"
            rec["null_reasons"] = [r for r in rec["null_reasons"] if not r.startswith("preemptions_logged")]
        if rp is not None:
            rec["replay"] = "ok"
            from kvreplay.audit.replay_fields import fill_replay

            fill_replay(rec, rp, origin)
            if scrapes and not dp:
                from kvreplay.audit.join import counter_check

                counter_check(rec, rp, log.facts, scrapes)
            sp = rp.info.spans
            if sp:
                rec["spans_joined"], rec["spans_coverage"] = sp["joined"], sp["coverage"]
                rec["spans_clock_offset_s"] = sp["clock_offset_s"]
                rec["spans_contradicted"] = (sp.get("first_token_late", 0)
                                             + sp.get("admitted_early", 0))
        else:
            rec["replay"] = "skipped"
            rec["null_reasons"].append("replay fields (preemptions_replayed, recomputed_tokens, "
                                       f"recompute_ratio, latency): {replay_reason}")
            if not dp:
                _fill_workload_from_facts(rec, log.facts)
            if replay and not dp:
                from kvreplay.audit.default_report import fill_default

                fill_default(rec, log.facts, scrapes, profile, origin)
            elif replay and not log.facts.requests:
                from kvreplay.inference.default_log import DP_REFUSAL

                rec["null_reasons"].append(f"default log not inferred: {DP_REFUSAL}")
        if iterations and (eng in (None, 0) or not dp):
            _fill_iterations(rec, [i for i in iterations if i.engine in (None, eng)] or iterations)
        if rec["step_spike_ratio"] is None and rp is None:
            rec["null_reasons"].append("step_spike_*: no Iteration lines (--enable-logging-"
                                       "iteration-details) and no replay to estimate step times")
        rec["status"], rec["status_evidence"] = classify(rec)
        out.append(rec)
    return out


# ---------------------------------------------------------------- pieces
def _check_readable(events, label: str, paths: list[str]) -> None:
    """Input that is not a vLLM log is an error row (sources.check_vllm_log)."""
    from kvreplay.sources import check_vllm_log

    check_vllm_log(events, paths)


def _origin(events, stats) -> float:
    from kvreplay import events as ev

    times = [e.time for e in events if isinstance(e, (ev.RequestReceived, ev.Stats)) and e.time is not None]
    return min(times) if times else 0.0


def _fill_config(rec: dict[str, Any], c, dialect) -> None:
    rec["vllm_version"] = dialect.vllm_version
    rec["engine_version"] = dialect.engine_version
    rec["model"] = c.model
    rec["policy"] = c.scheduling_policy or ("fcfs" if dialect.engine_version == "V1" else None)
    if c.preemption_mode:
        rec["preemption_mode"] = c.preemption_mode.lower().replace("preemptionmode.", "")
    elif dialect.engine_version == "V1":
        rec["preemption_mode"] = "recompute"
    if c.max_num_seqs is not None:
        rec["max_num_seqs"], rec["max_num_seqs_source"] = c.max_num_seqs, "log"
    elif dialect.engine_version == "V1":
        rec["max_num_seqs"], rec["max_num_seqs_source"] = 256, "vLLM default (not in the log)"
    rec["max_num_batched_tokens"] = c.max_num_batched_tokens
    rec["max_model_len"] = c.max_model_len
    rec["gpu_memory_utilization"] = c.gpu_memory_utilization
    rec["block_size"] = c.block_size
    rec["num_gpu_blocks"] = c.num_gpu_blocks
    kv = c.kv_cache_tokens
    if kv is None and c.num_gpu_blocks and c.block_size:
        kv = c.num_gpu_blocks * c.block_size
    rec["kv_cache_tokens"] = kv
    if kv and c.max_model_len:
        rec["max_concurrency_x"] = round(kv / c.max_model_len, 4)
    rec["chunked_prefill"] = c.enable_chunked_prefill
    rec["prefix_caching"] = c.enable_prefix_caching
    if kv is None:
        rec["null_reasons"].append("KV cache size: the startup lines (GPU KV cache size / # GPU "
                                   "blocks) are not in the log")


def _fill_stats(rec, stats, origin, version, engine_version, v0_pre) -> None:
    rec["samples"] = len(stats)
    if not stats:
        rec["null_reasons"].append("running/waiting/KV usage: no periodic stats lines "
                                   "(--disable-log-stats, or a log without them)")
    times = [s.time for s in stats]
    gaps = sorted(b - a for a, b in zip(times, times[1:]) if b > a)
    interval = float(gaps[len(gaps) // 2]) if gaps else None
    rec["interval_s"] = interval
    if len(times) > 1:
        rec["duration_s"] = float(times[-1] - times[0] + (interval or 0))
    run = [s.running for s in stats if s.running is not None]
    wait = [s.waiting for s in stats if s.waiting is not None]
    kv = [s.gpu_kv_usage / 100.0 for s in stats if s.gpu_kv_usage is not None]
    defer = [s.deferred or 0 for s in stats] if any(s.deferred is not None for s in stats) else []
    rec["running_mean"] = M.rnd(M.mean(run))
    rec["running_max"] = max(run) if run else None
    busy = [s.running for s in stats if s.running and ((s.waiting or 0) > 0 or s.running > 0)]
    rec["running_typical"] = int(round(M.quantile(busy, 0.5))) if busy else None
    rec["waiting_mean"] = M.rnd(M.mean(wait))
    rec["waiting_max"] = max(wait) if wait else None
    v = _version(version)
    if defer or (v is not None and v >= (0, 20, 0) and engine_version == "V1" and wait):
        # 0.20+: Waiting includes deferred requests; Deferred printed only when > 0.
        d = [s.deferred or 0 for s in stats]
        rec["deferred_mean"] = M.rnd(M.mean(d))
        rec["deferred_max"] = max(d) if d else None
        rec["waiting_capacity_mean"] = M.rnd(M.mean([(s.waiting or 0) - (s.deferred or 0) for s in stats]))
    rec["kv_usage_mean"] = M.rnd(M.mean(kv))
    rec["kv_usage_p95"] = M.rnd(M.quantile(kv, 0.95))
    rec["kv_time_ge95"] = M.rnd(sum(1 for x in kv if x >= KV_FULL) / len(kv)) if kv else None
    pt = [s.prompt_throughput for s in stats if s.prompt_throughput is not None]
    gt = [s.generation_throughput for s in stats if s.generation_throughput is not None]
    rec["prompt_tput_mean"] = M.rnd(M.mean(pt), 2)
    rec["gen_tput_mean"] = M.rnd(M.mean(gt), 2)
    rec["gen_tput_p95"] = M.rnd(M.quantile(gt, 0.95), 2)
    rec["gen_tput_max"] = M.rnd(max(gt) if gt else None, 2)
    conc = [(s.running or 0) + (s.waiting or 0) for s in stats if s.running is not None]
    rec["concurrency_mean"] = M.rnd(M.mean(conc), 2)
    rec["concurrency_max"] = max(conc) if conc else None

    # preemptions as logged
    if engine_version == "V0" or (v0_pre and engine_version != "V1"):
        if v0_pre:
            rec["preemptions_logged"] = max(p.cumulative or 1 for p in v0_pre)
            modes = sorted({p.mode.lower() for p in v0_pre if p.mode})
            if modes:
                rec["preemption_mode"] = "/".join(modes)
            rec["preemptions_logged_source"] = ("V0 warning's cumulative counter (printed for the "
                                                "1st, 51st, 101st ... preemption): a lower bound")
        else:
            rec["preemptions_logged"] = 0 if stats else None
            rec["preemptions_logged_source"] = ("V0 warnings (none printed: fewer than 1 "
                                                "preemption, as the 1st is always printed)")
    elif v is not None and (0, 11, 1) <= v < (0, 33, 0):
        rec["preemptions_logged"] = sum(s.preemptions or 0 for s in stats)
        rec["preemptions_logged_source"] = "stats line 'Preemptions' (printed when > 0)"
    elif any(s.preemptions is not None for s in stats):
        rec["preemptions_logged"] = sum(s.preemptions or 0 for s in stats)
        rec["preemptions_logged_source"] = "stats line 'Preemptions'"
    else:
        why = ("vLLM 0.33's stats line never prints Preemptions (its counter is reset before "
               "the check)" if v is not None and v >= (0, 33, 0) else
               "the V1 stats line has no Preemptions field before 0.11.1")
        rec["preemptions_logged_source"] = "not logged: " + why
        rec["null_reasons"].append("preemptions_logged: " + why)

    # throughput by concurrency (running count buckets of the logged lines)
    rec["tput_by_concurrency"] = tput_by_running(
        [(s.running, s.generation_throughput) for s in stats])
    tl = []
    for s in stats:
        tl.append({"t": round(s.time - origin, 3), "running": s.running, "waiting": s.waiting,
                   "kv_usage": None if s.gpu_kv_usage is None else round(s.gpu_kv_usage / 100.0, 4),
                   "prompt_tput": s.prompt_throughput, "gen_tput": s.generation_throughput,
                   "preemptions": s.preemptions})
    rec["timeline"] = tl
    if rec["preemptions_logged"] and any(s.preemptions for s in stats):
        ev_ = [(s.time - origin - (interval or 10.0), s.preemptions, -1) for s in stats if s.preemptions]
        rec["storms"] = M.storm_windows(ev_, interval or 10.0)


def tput_by_running(pairs) -> list[dict[str, Any]]:
    """Mean generation throughput per bucket of running requests (8 buckets)."""
    rows = [(r, g) for r, g in pairs if r and g is not None]
    if not rows:
        return []
    top = max(r for r, _ in rows)
    width = max(1, math.ceil(top / 8))
    acc: dict[int, list[float]] = {}
    for r, g in rows:
        b = ((r - 1) // width + 1) * width
        acc.setdefault(b, []).append(g)
    return [{"running": b, "gen_tput": round(sum(v) / len(v), 2), "samples": len(v)}
            for b, v in sorted(acc.items())]


def _fill_workload_from_facts(rec, facts) -> None:
    reqs = facts.requests
    rec["requests"] = len(reqs)
    times = [r.time for r in reqs if r.time is not None]
    if len(times) > 1 and times[-1] > times[0]:
        rec["arrival_rate_rps"] = round((len(times) - 1) / (times[-1] - times[0]), 4)
    ins = [len(r.prompt_token_ids) if r.prompt_token_ids is not None else r.prompt_len for r in reqs]
    ins = [x for x in ins if x]
    outs = [r.output_len if r.output_len is not None else (r.max_tokens if r.ignore_eos else None)
            for r in reqs]
    outs = [x for x in outs if x]
    fill_lengths(rec, ins, outs)
    if reqs:
        src = []
        src.append("input lengths logged" if len(ins) == len(reqs) else
                   f"input lengths logged for {len(ins)} of {len(reqs)} requests")
        src.append("output lengths logged" if len(outs) == len(reqs) else
                   f"output lengths known for {len(outs)} of {len(reqs)} (ignore_eos / "
                   "--enable-log-outputs)")
        rec["lengths_source"] = "; ".join(src)
    else:
        rec["null_reasons"].append("workload: no request lines (--enable-log-requests)")


def fill_lengths(rec, ins, outs) -> None:
    if ins:
        rec["input_len_mean"] = M.rnd(M.mean(ins), 2)
        rec["input_len_p50"] = M.quantile(ins, 0.5)
        rec["input_len_p95"] = M.rnd(M.quantile(ins, 0.95), 2)
        rec["input_len_max"] = max(ins)
    if outs:
        rec["output_len_mean"] = M.rnd(M.mean(outs), 2)
        rec["output_len_p50"] = M.quantile(outs, 0.5)
        rec["output_len_p95"] = M.rnd(M.quantile(outs, 0.95), 2)
        rec["output_len_max"] = max(outs)


def _fill_iterations(rec, its) -> None:
    """Logged per-step lines (--enable-logging-iteration-details): decode spikes from real
    step times."""
    budget = rec.get("max_num_batched_tokens") or 8192
    rows = [(i.elapsed_ms / 1000.0, i.context_tokens, i.generation_requests > 0) for i in its]
    st = M.decode_stalls(rows, budget)
    if st["spike_ratio"] is not None:
        rec["step_spike_ratio"] = M.rnd(st["spike_ratio"])
        rec["step_spike_share"] = M.rnd(st["spike_share"])
        rec["step_spike_prefill_share"] = M.rnd(st["spike_prefill_share"])
        rec["step_time_source"] = "logged (Iteration lines)"


def path_label(p: str) -> str:
    return os.path.basename(p.rstrip("/")) or p
