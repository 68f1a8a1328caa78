"""One server, one record: a vLLM log and the Prometheus scrapes (or exported series) of
the same server joined into one audit record.

Joined when the scrapes name the log's model (`model_name` label vs the log's served
model) and their time span overlaps the log's (the log's stats lines, on its own clock:
local time read as UTC, so a whole number of quarter hours apart is taken as a time zone
and said); a data-parallel log's engine N takes the series with `engine="N"`. When they
cannot be joined the two records stay apart and each says why.

The joined record is the log's record (its config, stats lines, replay) with what only
the scrapes give: the preemption counter's increase over the log's span (vLLM 0.33's
stats line never prints it), latency percentiles from the histograms (logged, where the
replay only estimates), and the counters' check of the replay (`counter_check`).
One status, classified on the joined fields.
"""

from __future__ import annotations

from typing import Any

from kvreplay.audit.status import classify

# fields a log record lacks and the scrapes' record gives, taken when the log's is null
_FILL = ("block_size", "num_gpu_blocks", "kv_cache_tokens", "model")
_LATENCY = ("ttft_p50_s", "ttft_p95_s", "itl_p50_s", "itl_p95_s")
TZ_STEP = 900.0  # time zones are whole quarter hours


def log_span(rec: dict[str, Any]) -> tuple[float, float] | None:
    """The log's stats-line span in epoch seconds on its own clock."""
    import calendar
    import time

    if not rec.get("log_start") or rec.get("duration_s") is None:
        return None
    t0 = calendar.timegm(time.strptime(rec["log_start"], "%Y-%m-%d %H:%M:%S"))
    return float(t0), float(t0) + float(rec["duration_s"])


def match(log_rec: dict[str, Any], scrapes: list, engine: str) -> tuple[float | None, str]:
    """(clock shift scrapes -> log, None when not joinable), and what was found."""
    return match_span(log_rec.get("model"), log_span(log_rec), scrapes, engine)


def match_span(log_model: str | None, span: tuple[float, float] | None, scrapes: list,
               engine: str) -> tuple[float | None, str]:
    model = next((s.model for s in scrapes if s.model), None)
    if log_model and model and model != log_model:
        return None, f"not joined: the scrapes serve {model!r}, the log {log_model!r}"
    if not any(engine in s.values for s in scrapes):
        return None, f"not joined: the scrapes have no series of engine {engine or '(none)'}"
    times = [s.time for s in scrapes if s.time is not None]
    if not times or span is None:
        return None, "not joined: the scrapes or the log carry no time to match them by"
    a, b = span
    lo, hi = min(times), max(times)
    if lo <= b and hi >= a:
        return 0.0, f"joined by model and time ({len(times)} scrapes over the log's span)"
    # the log's clock is local time: try a whole number of quarter hours
    mid = (a + b) / 2 - (lo + hi) / 2
    q = round(mid / TZ_STEP) * TZ_STEP
    if q and abs(q) <= 14 * 3600 and lo + q <= b and hi + q >= a:
        return q, (f"joined by model and time, the log's clock {q / 3600:+.2f} h from the scrapes' "
                   "(its time zone)")
    gap = a - hi if hi < a else lo - b  # > 0: how far apart the two spans are
    when = "end" if hi < a else "start"
    return None, (f"not joined: the scrapes' time span does not overlap the log's (they {when} "
                  f"{_duration(gap)} {'before the log starts' if hi < a else 'after it ends'}, "
                  "not a whole number of quarter hours off: another server, or a host clock "
                  "that far off)")


def _duration(s: float) -> str:
    s = abs(s)
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def window(scrapes: list, shift: float, span: tuple[float, float], slack: float) -> list:
    """The scrapes that bound the log's span: the last one before it through the first one
    after it (a counter's increase over them covers the whole log)."""
    a, b = span
    ts = [(s.time + shift) for s in scrapes]
    first = max([i for i, t in enumerate(ts) if t <= a + slack], default=0)
    last = min([i for i, t in enumerate(ts) if t >= b - slack], default=len(ts) - 1)
    return scrapes[first:last + 1]


def join(log_recs: list[dict[str, Any]], scrapes: list, label: str) -> list[dict[str, Any]] | None:
    """The log's records with the scrapes' evidence, or None when they cannot be joined
    (the reason is then in each record's `metrics_join`)."""
    from kvreplay.audit import prom
    from kvreplay.audit.scrape_record import audit_scrapes

    engines = prom.engines_of(scrapes)
    out = []
    for rec in log_recs:
        eng = "" if rec.get("engine") is None else str(rec["engine"])
        if eng not in engines:
            eng = "0" if eng == "" and "0" in engines and len(engines) == 1 else eng
        shift, how = match(rec, scrapes, eng)
        rec["metrics"] = label
        rec["metrics_join"] = how
        if shift is None:
            return None
        span = log_span(rec)
        assert span is not None
        inside = window(scrapes, shift, span, slack=rec.get("interval_s") or 0.0)
        p, = [r for r in audit_scrapes(inside, label) if (r["engine"] is None or str(r["engine"]) == eng)] or [None]
        if p is None:
            return None
        out.append(merge(rec, p, inside, eng, shift))
    return out


def merge(rec: dict[str, Any], p: dict[str, Any], scrapes: list, eng: str, shift: float) -> dict[str, Any]:
    rec["source"] = "vllm log + prometheus"
    rec["metrics_scrapes"] = len(scrapes)
    for k in _FILL:
        if rec.get(k) is None and p.get(k) is not None:
            rec[k] = p[k]
    if p.get("preemptions_logged") is not None:
        rec["preemptions_logged"] = p["preemptions_logged"]
        rec["preemptions_logged_source"] = p["preemptions_logged_source"] + " bounding the log's span"
        rec["null_reasons"] = [r for r in rec["null_reasons"] if not r.startswith("preemptions_logged")]
    if p.get("latency_source") and (rec.get("latency_source") or "").startswith("estimated"):
        for k in _LATENCY:
            rec[k] = p[k]
        rec["latency_source"] = p["latency_source"]
    elif rec.get("latency_source") is None and p.get("latency_source"):
        for k in _LATENCY:
            rec[k] = p[k]
        rec["latency_source"] = p["latency_source"]
    if rec.get("recompute_ratio") is None and p.get("recompute_ratio") is not None:
        for k in ("recomputed_tokens", "recompute_ratio", "recompute_source"):
            rec[k] = p[k]
    rec["status"], rec["status_evidence"] = classify(rec)
    return rec


def pair(paths: list[str], *, year: int | None = None
         ) -> tuple[list[str], tuple[tuple[str, tuple[str, ...]], ...]]:
    """CLI inputs -> (inputs to audit, log -> its Prometheus inputs). With one log, every
    Prometheus input goes with it (one server; `join` says if they do not fit). With
    several, each goes with the one log of its model whose span it overlaps; one that
    fits none or several logs is audited alone."""
    from kvreplay.audit import prom
    from kvreplay.audit.fleet.task import Skipped
    from kvreplay.errors import UserError

    # a Skipped input (a FIFO, a device, a link out of its folder) is never opened
    proms = [p for p in paths if p != "-" and not isinstance(p, Skipped)
             and prom.looks_like_prometheus(p)]
    logs = [p for p in paths if p not in proms]
    if not proms or not logs:
        return paths, ()
    if len(logs) == 1:
        return logs, ((logs[0], tuple(proms)),)
    from kvreplay.audit.record import audit_vllm_log

    heads = {}
    for lg in logs:
        try:
            heads[lg] = audit_vllm_log([lg], lg, profile=None, replay=False, year=year)[0]
        except (UserError, OSError):
            heads[lg] = None
    found: dict[str, list[str]] = {}
    alone = []
    for p in proms:
        try:
            scrapes = prom.read_scrapes(p)
        except (UserError, OSError):
            alone.append(p)
            continue
        eng = prom.engines_of(scrapes)[0]
        fits = [lg for lg, h in heads.items() if h is not None and match(h, scrapes, eng)[0] is not None]
        if len(fits) == 1:
            found.setdefault(fits[0], []).append(p)
        else:
            alone.append(p)
    return logs + alone, tuple((lg, tuple(ps)) for lg, ps in found.items())


def counter_points(scrapes: list, eng: str, shift: float) -> list:
    """Scrapes -> the inference's `CounterPoint`s of one engine, on the log's clock."""
    from kvreplay.inference.evidence_metrics import CounterPoint

    out = []
    for s in scrapes:
        v = s.values.get(eng)
        if s.time is None or v is None:
            continue
        h = s.hist.get(eng, {})
        out.append(CounterPoint(
            s.time + shift, v.get("preemptions"), v.get("prompt_tokens"), v.get("generation_tokens"),
            v.get("requests_finished"), v.get("running"), v.get("waiting"), v.get("kv_usage"),
            tuple(sorted(h.get("prompt_len", ()))), tuple(sorted(h.get("output_len", ()))),
            v.get("prefix_cache_queries"), v.get("prefix_cache_hits")))
    return out


def scrapes_for_facts(facts: Any, scrapes: list) -> tuple[list, str]:
    """The scrapes of a parsed log's server as `CounterPoint`s on the log's clock, and how
    they were joined (no points, and why, when they cannot be)."""
    from kvreplay.audit import prom

    times = [s.time for s in facts.stats if s.time is not None]
    interval = facts.interval_s or 10.0
    span = (min(times) - interval, max(times)) if times else None
    engines = prom.engines_of(scrapes)
    eng = "0" if "0" in engines else (engines[0] if engines else "")
    model = facts.config.model if facts.config is not None else None
    shift, how = match_span(model, span, scrapes, eng)
    if shift is None:
        return [], how
    return counter_points(scrapes, eng, shift), how


def scrape_check(rp: Any, points: list) -> dict[str, Any] | None:
    """A full replay against each scrape of the same server (`CounterPoint`s on the log's
    clock), like the stats lines: per window between scrapes, the preemption counter and
    the prompt / generation token counters, replayed against logged; and the verdict."""
    from kvreplay.inference import evidence_metrics as EM

    if rp.clock is None or not rp.steps:
        return None
    pts = [p for p in points if p.preemptions is not None]
    if len(pts) < 2:
        return None
    starts = list(rp.clock)
    model = rp.step_time_model
    ends = [s + (model.dt_record(r) if model is not None else 0.0) for s, r in zip(starts, rp.steps)]
    budget = rp.workload.config.max_num_batched_tokens
    rows = [{k: (v if k in ("t0", "t1") else int(round(v))) for k, v in r.items()}
            for r in EM.scrape_windows(rp.steps, ends, pts, EM.counted_preemptions(rp.steps, budget))]
    logged = sum(r["preemptions_logged"] for r in rows)
    replayed = sum(r["preemptions_replayed"] for r in rows)
    agree = sum(r["preemptions_logged"] == r["preemptions_replayed"] for r in rows)
    verdict = (f"the preemption counter agrees with the replay in {agree} of {len(rows)} scrape windows "
               f"({replayed} replayed, {logged} counted)")
    if replayed != logged:
        verdict = (f"the replay disagrees with vllm:num_preemptions_total: {replayed} preemptions "
                   f"replayed where the counter counted {logged} over the same {len(rows)} scrape "
                   f"windows ({agree} agree)")
    return {"windows": rows, "counted": logged, "replayed": replayed, "agreeing_windows": agree,
            "verdict": verdict}


def scrape_check_lines(chk: dict[str, Any]) -> str:
    """The check as report lines (kvreplay replay's table)."""
    import time

    out = [f"  scrapes: {chk['verdict']}"]
    for r in chk["windows"]:
        t = time.strftime("%H:%M:%S", time.gmtime(r["t1"]))
        tok = ""
        if "prompt_logged" in r:
            tok = (f", prompt tokens {r['prompt_replayed']:,} / {r['prompt_logged']:,}, generated "
                   f"{r.get('gen_replayed', 0):,} / {r.get('gen_logged', 0):,}")
        out.append(f"    scrape {t}: preemptions replayed {r['preemptions_replayed']} / counted "
                   f"{r['preemptions_logged']}{tok}")
    return "\n".join(out) + "\n"


def audit_server(logs: list[str], proms: list[str], *, profile: str | None,
                 replay: bool, year: int | None) -> list[dict[str, Any]]:
    """One server: its log and its scrapes, one joined record per engine (or both records
    apart, each saying why they could not be joined)."""
    from kvreplay.audit import prom
    from kvreplay.audit.record import audit_vllm_log
    from kvreplay.audit.scrape_record import audit_prometheus

    mlabel = "+".join(proms)
    groups = prom.by_instance(prom.read_scrapes(proms))
    if len(groups) > 1:  # an export of several servers: the one this log's record joins
        probe = audit_vllm_log(logs, "+".join(logs), profile=profile, replay=False, year=year)
        shifts = [(match(probe[0], g, "0" if "0" in prom.engines_of(g) else "")[0], i, g)
                  for i, g in groups]
        # the series on the log's own clock first, then a time zone away
        fits = [(i, g) for sh, i, g in sorted((x for x in shifts if x[0] is not None),
                                              key=lambda x: (abs(x[0]), x[1] or ""))]
        groups = fits[:1] or groups[:1]
        if fits:
            mlabel = f"{mlabel} instance={fits[0][0]}"
    scrapes = groups[0][1]
    recs = audit_vllm_log(logs, "+".join(logs), profile=profile, replay=replay, year=year,
                          scrapes=scrapes)
    joined = join(recs, scrapes, mlabel)
    if joined is not None:
        return joined
    apart = audit_prometheus(proms, mlabel)
    why = recs[0]["metrics_join"]
    for r in recs + apart:
        r["metrics_join"] = why
        r["null_reasons"].append(f"scrapes and log: {why}")
    return recs + apart


def counter_check(rec: dict[str, Any], rp: Any, facts: Any, scrapes: list) -> None:
    """The replay against the scrapes' counters (`counter_check`)."""
    points, _how = scrapes_for_facts(facts, scrapes)
    chk = scrape_check(rp, points) if points else None
    if chk is None:
        return
    rec["counter_check"] = chk["verdict"]
    # the count itself: the counter's over the log (exact when scrapes bound it), else a
    # lower bound that narrows the ensemble's interval
    from kvreplay.inference.default_log import evidence_of
    from kvreplay.inference.formats import log_format

    ev = evidence_of(facts, log_format(facts.vllm_version, facts.engine_version, None), points)
    if ev.counted is None:
        return
    low, high = rec.get("preemptions_replayed_low"), rec.get("preemptions_replayed_high")
    med = rec.get("preemptions_replayed_median")
    if ev.counted_exact:
        rec["preemptions_replayed_low"] = rec["preemptions_replayed_high"] = ev.counted
        rec["preemptions_replayed_median"] = ev.counted
        rec["preemptions_interval_source"] = "exact: vllm:num_preemptions_total over the log"
    elif getattr(rp.uncertainty, "counted_after", None) is not None:
        # the counter's count by its last scrape, and what the replays (weighted by the stats
        # lines and the counter) count after it
        tail = rp.uncertainty.counted_after
        rec["preemptions_replayed_low"] = ev.counted + tail["low"]
        rec["preemptions_replayed_median"] = ev.counted + tail["median"]
        rec["preemptions_replayed_high"] = ev.counted + tail["high"]
        rec["preemptions_interval_source"] = (
            f"the preemption counter's {ev.counted} up to its last scrape, and after it "
            f"{tail['low']}-{tail['high']} (90%, median {tail['median']}) in the "
            f"{rp.uncertainty.samples + 1} replays weighted by the stats lines and the counter")
    elif low is not None and high is not None:
        rec["preemptions_replayed_low"] = max(low, ev.counted)
        rec["preemptions_replayed_high"] = max(high, ev.counted)
        rec["preemptions_replayed_median"] = max(med if med is not None else ev.counted, ev.counted)
        rec["preemptions_interval_source"] = (
            (rec.get("preemptions_interval_source") or "ensemble") + f"; at least {ev.counted}: the "
            "preemption counter up to its last scrape")
    if getattr(rp.uncertainty, "counted_after", None) is not None:
        _counted_cost(rec, rp.uncertainty, ev)


def _counted_cost(rec: dict[str, Any], unc: Any, ev: Any) -> None:
    """The recomputed tokens and recompute ratio when the counter gives the count: each
    replay of the ensemble gives what a preemption cost (recomputed tokens per
    preemption), the counter's count scales it (default_log.intervals: the one
    definition, a default log's with scrapes)."""
    from kvreplay.inference.default_log import Member, intervals

    ms = [Member(m.weight, m.sse, m.count, m.recomputed,
                 m.recomputed / m.processed if m.processed else 0.0, m.processed,
                 m.counted_after, {}) for m in unc.members]
    pre, recomp, ratio = intervals(ms, ev.counted, ev.counted_exact)
    rec["recomputed_tokens_low"], rec["recomputed_tokens_high"] = int(recomp.low), int(recomp.high)
    rec["recompute_ratio_low"], rec["recompute_ratio_high"] = ratio.low, ratio.high
