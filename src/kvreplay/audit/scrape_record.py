"""The audit record of Prometheus scrapes without their log: one record per (instance,
engine) of a scrape series or an HTTP API export, in record.py's schema (`COLUMNS`): the
counters' preemptions, tokens and recompute ratio, the gauges' timeline, the status.
"""

from __future__ import annotations

from typing import Any

from kvreplay.audit import metrics as M
from kvreplay.audit.record import empty_record, stamp, tput_by_running
from kvreplay.audit.status import KV_FULL, classify


def audit_prometheus(path: str | list[str], label: str) -> list[dict[str, Any]]:
    """One record per (instance, engine) of a scrape series or an HTTP API export."""
    from kvreplay.audit import prom

    out = []
    for inst, scrapes in prom.by_instance(prom.read_scrapes(path)):
        out.extend(audit_scrapes(scrapes, label if inst is None else f"{label} instance={inst}"))
    return out


def audit_scrapes(scrapes, label: str) -> list[dict[str, Any]]:
    from kvreplay.audit import prom

    out = []
    engines = prom.engines_of(scrapes)
    dp = len(engines) > 1
    timed = all(s.time is not None for s in scrapes)
    t0 = scrapes[0].time if timed else 0.0
    start = stamp(t0) if timed else None
    for eng in engines:
        rec = empty_record(label)
        rec["source"] = "prometheus"
        rec["log_start"] = start
        rec["engine"] = int(eng) if dp and eng.isdigit() else None
        rec["model"] = next((s.model for s in scrapes if s.model), None)
        rec["block_size"] = next((s.block_size for s in scrapes if s.block_size), None)
        rec["num_gpu_blocks"] = next((s.num_gpu_blocks for s in scrapes if s.num_gpu_blocks), None)
        if rec["block_size"] and rec["num_gpu_blocks"]:
            rec["kv_cache_tokens"] = rec["block_size"] * rec["num_gpu_blocks"]
        rows = [(s.time, s.values.get(eng, {})) for s in scrapes if eng in s.values]
        rec["samples"] = len(rows)
        times = [t for t, _ in rows]
        if timed and len(rows) > 1:
            gaps = sorted(b - a for a, b in zip(times, times[1:]))
            rec["interval_s"] = float(gaps[len(gaps) // 2])
            rec["duration_s"] = float(times[-1] - times[0])
        else:
            rec["null_reasons"].append("rates and durations: scrapes carry no time (add '# SCRAPE "
                                       "<epoch>' markers or sample timestamps)")

        def col(key):
            return [v.get(key) for _, v in rows]

        run = [int(x) for x in col("running") if x is not None]
        wait = [int(x) for x in col("waiting") if x is not None]
        kv = [x for x in col("kv_usage") if x is not None]
        rec["running_mean"] = M.rnd(M.mean(run))
        rec["running_max"] = max(run) if run else None
        busy = [r for r in run if r > 0]
        rec["running_typical"] = int(round(M.quantile(busy, 0.5))) if busy else None
        rec["waiting_mean"] = M.rnd(M.mean(wait))
        rec["waiting_max"] = max(wait) if wait else None
        if any(x is not None for x in col("waiting_deferred")) or any(x is not None for x in col("waiting_capacity")):
            d = [x or 0 for x in col("waiting_deferred")]
            rec["deferred_mean"] = M.rnd(M.mean(d))
            rec["deferred_max"] = int(max(d)) if d else None
            rec["waiting_capacity_mean"] = M.rnd(M.mean([x for x in col("waiting_capacity") if x is not None]))
        rec["kv_usage_mean"] = M.rnd(M.mean(kv))
        rec["kv_usage_p95"] = M.rnd(M.quantile(kv, 0.95))
        rec["kv_time_ge95"] = M.rnd(sum(1 for x in kv if x >= KV_FULL) / len(kv)) if kv else None
        conc = [r + w for r, w in zip(col("running"), col("waiting")) if r is not None and w is not None]
        rec["concurrency_mean"] = M.rnd(M.mean(conc), 2)
        rec["concurrency_max"] = int(max(conc)) if conc else None

        def series(key):
            return [(t, v[key]) for t, v in rows if v.get(key) is not None]

        pre = series("preemptions")
        if len(pre) > 1:
            total, resets = M.counter_increase([v for _, v in pre])
            rec["preemptions_logged"] = int(round(total))
            rec["preemptions_logged_source"] = ("prometheus vllm:num_preemptions_total, increase over "
                                                f"{len(pre)} scrapes" + (f" ({resets} counter reset"
                                                f"{'s' if resets > 1 else ''})" if resets else ""))
            deltas = M.counter_deltas([v for _, v in pre])
            if timed:
                ev_ = [(pre[i][0] - t0, int(round(d)), -1) for i, d in enumerate(deltas) if d > 0]
                rec["storms"] = M.storm_windows(ev_, rec["interval_s"] or 10.0)
        elif len(pre) == 1:
            rec["null_reasons"].append("preemptions_logged: one scrape only (a counter needs two)")
        else:
            rec["null_reasons"].append("preemptions_logged: vllm:num_preemptions_total not scraped")
        pt, gt, rt = series("prompt_tokens"), series("generation_tokens"), series("recomputed_tokens")
        if len(pt) > 1 and len(gt) > 1:
            p_inc = M.counter_increase([v for _, v in pt])[0]
            g_inc = M.counter_increase([v for _, v in gt])[0]
            rec["processed_tokens"] = int(round(p_inc + g_inc))
            if timed and rec["duration_s"]:
                rec["prompt_tput_mean"] = M.rnd(p_inc / rec["duration_s"], 2)
                rec["gen_tput_mean"] = M.rnd(g_inc / rec["duration_s"], 2)
                gdel = M.counter_deltas([v for _, v in gt])
                rates = [d / (gt[i + 1][0] - gt[i][0]) for i, d in enumerate(gdel) if gt[i + 1][0] > gt[i][0]]
                rec["gen_tput_p95"] = M.rnd(M.quantile(rates, 0.95), 2)
                rec["gen_tput_max"] = M.rnd(max(rates) if rates else None, 2)
                rr = [int(v.get("running") or 0) for _, v in rows]
                rec["tput_by_concurrency"] = tput_by_running(list(zip(rr[1:], rates)))
            if len(rt) > 1:
                r_inc = M.counter_increase([v for _, v in rt])[0]
                rec["recomputed_tokens"] = int(round(r_inc))
                tot = p_inc + g_inc
                rec["recompute_ratio"] = M.rnd(r_inc / tot, 6) if tot else None
                rec["recompute_source"] = "prometheus vllm:prompt_tokens_recomputed"
        if rec["recompute_ratio"] is None:
            rec["null_reasons"].append("recompute_ratio: scrapes give no recomputed-token counter "
                                       "(vllm:prompt_tokens_recomputed, 0.16-0.19); replay the log "
                                       "instead")
        # latency from histograms: last scrape minus first
        hs = [s.hist.get(eng, {}) for s in scrapes if eng in s.hist]
        for key, p50, p95 in (("ttft", "ttft_p50_s", "ttft_p95_s"), ("itl", "itl_p50_s", "itl_p95_s")):
            series_h = [h[key] for h in hs if key in h]
            if not series_h:
                continue
            last = dict(series_h[-1])
            first = dict(series_h[0]) if len(series_h) > 1 else {}
            if first and all(last.get(le, 0) >= c for le, c in first.items()):
                b = [(le, last[le] - first.get(le, 0.0)) for le in last]
            else:
                b = list(last.items())
            rec[p50] = M.rnd(M.histogram_quantile(0.5, b), 5)
            rec[p95] = M.rnd(M.histogram_quantile(0.95, b), 5)
            rec["latency_source"] = "logged: prometheus histograms (bucket interpolation)"
        tl = []
        prev = None
        for i, (t, v) in enumerate(rows):
            p = v.get("preemptions")
            d = None
            if prev is not None and p is not None:
                d = int(round(p - prev if p >= prev else p))
            prev = p if p is not None else prev
            tl.append({"t": round((t - t0) if timed else float(i), 3),
                       "running": None if v.get("running") is None else int(v["running"]),
                       "waiting": None if v.get("waiting") is None else int(v["waiting"]),
                       "kv_usage": M.rnd(v.get("kv_usage")), "prompt_tput": None, "gen_tput": None,
                       "preemptions": d})
        rec["timeline"] = tl
        rec["replay"] = "skipped"
        rec["null_reasons"].append("replay fields: Prometheus scrapes carry no per-request data; "
                                   "audit the server log to replay")
        rec["status"], rec["status_evidence"] = classify(rec)
        out.append(rec)
    return out
