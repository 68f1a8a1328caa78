"""Default logs and Prometheus scrapes with known answers, and the evaluation of what
kvreplay answers on them (docs/accuracy.md, default logs).

A case: a workload of our own (Poisson, bursts with idle gaps, or a ramp; uniform or
heavy-tailed lognormal lengths) run through the scheduler model on a wall clock
(tools.oracle.synth_log.run_on_clock); the log vLLM 0.33 would write with its defaults
(synth.render_log without the request-logger lines: startup, stats and access lines); and
what a Prometheus server scraping `/metrics` every 15 s would have kept, rendered from the
run's per-step records by kvreplay.inference.evidence_metrics.render (PrometheusStatLogger's
semantics). The truth is the run's own totals.

    python -m tools.oracle.render_default_log eval --cases 0:24 [--samples 32]     # coverage, widths
    python -m tools.oracle.render_default_log write --case 3 -o /tmp/case3/         # the files
    python -m tools.oracle.render_default_log eval --cases 0:24 --samples 24 --dump d.jsonl
    python -m tools.oracle.render_default_log calib --dump d.jsonl --grid 1,1.2,1.5  # widenings
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time

from tools.oracle import synth_log as synth
from kvreplay.inference import evidence_metrics as EM
from kvreplay.inference.clock import StepTimeModel
from kvreplay.replay.scheduler import SchedulerConfig
from kvreplay.replay.workload import RequestSpec, Workload

KINDS = ("poisson", "bursts", "ramp")


def case(i: int, prefix: bool = False):
    """Workload, arrival times, step-time model and stats interval of case i; with
    `prefix` the same case served with prefix caching, its prompts opening with one of 2-6
    shared system prompts (200-1500 tokens each; a request's own part after it)."""
    rng = random.Random(1000 + i)
    kind = KINDS[i % 3]
    heavy = (i // 3) % 2 == 1
    n = rng.randint(80, 220)
    blocks = rng.choice((800, 1200, 2000))
    cfg = SchedulerConfig(num_gpu_blocks=blocks, block_size=16, max_num_seqs=rng.choice((32, 64, 128)),
                          max_num_batched_tokens=rng.choice((2048, 4096, 8192)), max_model_len=4096,
                          enable_chunked_prefill=True, enable_prefix_caching=prefix)
    rate = rng.uniform(4.0, 14.0)
    times, t = [], 0.0
    for k in range(n):
        if kind == "poisson":
            t += rng.expovariate(rate)
        elif kind == "bursts":  # bursts of 10-30 requests, idle gaps of 5-20 s
            t += rng.uniform(5.0, 20.0) if k and rng.random() < 1 / 20 else rng.expovariate(rate * 3)
        else:  # the rate climbs from rate/4 to 2 rate
            t += rng.expovariate(rate * (0.25 + 1.75 * k / n))
        times.append(t)
    specs = []
    prng = random.Random(5000 + i)  # the shared prompts (their own stream: the case is unchanged)
    systems = [[20000 + (g * 7919 + j * 104729) % 9000 for j in range(prng.randint(200, 1500))]
               for g in range(prng.randint(2, 6))] if prefix else []
    for k in range(n):
        if heavy:
            p = int(min(3500, max(16, rng.lognormvariate(math.log(500), 1.0))))
            o = int(min(4095 - p, max(4, rng.lognormvariate(math.log(150), 0.9))))
        else:
            p = rng.randint(100, 2000)
            o = rng.randint(30, 500)
        toks = [10 + (k * 7919 + j * 104729) % 30000 for j in range(p)]
        if prefix:
            toks = systems[prng.randrange(len(systems))] + toks[:max(16, p // 2)]
            o = min(o, 4095 - len(toks))
        specs.append(RequestSpec(f"r{k}", 0, toks, max(1, o)))
    wl = Workload(f"default-{i}", f"{kind} {'heavy' if heavy else 'uniform'}", cfg, specs, max_steps=10**9)
    model = StepTimeModel(overhead_s=rng.uniform(0.004, 0.009), per_token_s=rng.uniform(2e-5, 5e-5),
                          per_request_s=rng.uniform(0.0, 6e-5))
    interval = rng.choice((2.0, 5.0, 10.0))
    return wl, times, model, interval, f"{kind}, {'heavy-tailed' if heavy else 'uniform'} lengths"


_REQUEST_LINES = ("Received request ", "Added request ", "JSON body")


def render(i: int, request_lines: bool = False, prefix: bool = False):
    """(log text, scrape text, truth) of case i: a default log, or with `request_lines`
    the log of `--enable-log-requests` (no prompts); `prefix`: served with prefix caching
    (`case`)."""
    wl, times, model, interval, what = case(i, prefix)
    text, run = synth.render_log(wl, times, step_time=model, interval_s=interval,
                                 request_bodies=False)
    if not request_lines:
        text = "".join(l for l in text.splitlines(True) if not any(k in l for k in _REQUEST_LINES))
        text = text.replace("'enable_log_requests': True", "'enable_log_requests': False")
    start = synth.EPOCH + 60.0
    rng = random.Random(i)
    first = start + times[0] - rng.uniform(1.0, 14.0)
    end = start + (run.step_end[-1] if run.step_end else 0.0)
    stimes = []
    t = first
    while t < end + 15.0:
        stimes.append(t)
        t += 15.0
    lens = {s.id: len(s.prompt_token_ids) for s in wl.requests}
    pts = EM.render(run.records, run.step_end, [x - start for x in stimes], lens,
                    budget=wl.config.max_num_batched_tokens)
    prom = scrape_text(pts, stimes)
    truth = dict(run.truth, case=i, what=what, interval_s=interval)
    return text, prom, truth


def scrape_text(pts, stimes) -> str:
    lab = 'engine="0",model_name="%s"' % synth.MODEL
    out = []
    for p, t in zip(pts, stimes):
        out.append(f"# SCRAPE {t:.3f}")
        for name, kind, v in (("vllm:num_requests_running", "gauge", p.running),
                              ("vllm:num_requests_waiting", "gauge", p.waiting),
                              ("vllm:kv_cache_usage_perc", "gauge", p.kv_usage),
                              ("vllm:num_preemptions_total", "counter", p.preemptions),
                              ("vllm:prompt_tokens_total", "counter", p.prompt_tokens),
                              ("vllm:generation_tokens_total", "counter", p.generation_tokens),
                              ("vllm:request_success_total", "counter", p.finished),
                              ("vllm:prefix_cache_queries_total", "counter", p.cache_queries),
                              ("vllm:prefix_cache_hits_total", "counter", p.cache_hits)):
            out.append(f"# TYPE {name.removesuffix('_total')} {kind}")
            out.append(f"{name}{{{lab}}} {float(v)}")
        for name, h in (("vllm:request_prompt_tokens", p.prompt_len),
                        ("vllm:request_generation_tokens", p.output_len)):
            out.append(f"# TYPE {name} histogram")
            for le, c in h:
                les = "+Inf" if math.isinf(le) else f"{le}"
                out.append(f'{name}_bucket{{{lab},le="{les}"}} {float(c)}')
            out.append(f"{name}_count{{{lab}}} {float(h[-1][1]) if h else 0.0}")
    return "\n".join(out) + "\n"


def evaluate(cases, samples: int, dump: str | None = None,
             inputs: tuple[str, ...] = ("log", "log+scrapes"), prefix: bool = False,
             cache_evidence: bool = True) -> list[dict]:
    """Each case's answer against its truth; `prefix`: the prefix-caching variant,
    `cache_evidence`: False drops the prefix-cache counters from the scrapes (before/after)."""
    from kvreplay.audit import join, prom
    from kvreplay.inference.default_log import answer_log
    from kvreplay.parsers import parse_lines
    from kvreplay.sources import read_facts
    import tempfile

    rows = []
    for i in cases:
        text, ptext, truth = render(i, prefix=prefix)
        if not cache_evidence:
            ptext = "".join(l for l in ptext.splitlines(True) if "prefix_cache" not in l)
        with tempfile.TemporaryDirectory() as d:
            lp, pp = os.path.join(d, "server.log"), os.path.join(d, "metrics.prom")
            open(lp, "w").write(text)
            open(pp, "w").write(ptext)
            facts = read_facts([lp], year=2026)
            scr = join.counter_points(prom.read_scrapes(pp), "0", 0.0)
        for label, sc in (("log", ()), ("log+scrapes", scr)):
            if label not in inputs:
                continue
            t0 = time.perf_counter()
            kept: list = []
            a = answer_log(facts, sc, samples=samples, seed=0, keep=kept)
            row = {"case": i, "what": truth["what"] + (", prefix caching" if prefix else ""), "input": label, "seconds": round(time.perf_counter() - t0, 1),
                   "requests": truth["requests"], "requests_found": a.requests}
            for k, iv in (("preemptions", a.preemptions), ("recomputed_tokens", a.recomputed_tokens),
                          ("recompute_ratio", a.recompute_ratio)):
                tv = truth[k] or 0.0
                row[k] = tv
                row[k + "_iv"] = [iv.low, iv.median, iv.high]
                tol = 1e-6 if k == "recompute_ratio" else 0.5
                row[k + "_in"] = iv.low - tol <= tv <= iv.high + tol
                row[k + "_width"] = iv.high - iv.low
            row["exact"] = a.counted_exact
            rows.append(row)
            if dump:
                import msgspec

                with open(dump, "a") as f:
                    f.write(json.dumps({**row, "counted": a.counted, "counted_exact": a.counted_exact,
                                        "members": msgspec.to_builtins(kept)}) + "\n")
            print(json.dumps(row), flush=True)
    return rows


def evaluate_full(cases) -> list[dict]:
    """Logs with request lines (no prompts): the audit's count interval without and with
    the scrapes of the same server."""
    from kvreplay.audit.record import audit_records
    import tempfile

    rows = []
    for i in cases:
        text, ptext, truth = render(i, request_lines=True)
        with tempfile.TemporaryDirectory() as d:
            lp, pp = os.path.join(d, "server.log"), os.path.join(d, "metrics.prom")
            open(lp, "w").write(text)
            open(pp, "w").write(ptext)
            for label, paths in (("log", [lp]), ("log+scrapes", [lp, pp])):
                r = audit_records(paths, year=2026)[0]
                lo, hi = r["preemptions_replayed_low"], r["preemptions_replayed_high"]
                row = {"case": i, "what": truth["what"], "input": label, "preemptions": truth["preemptions"],
                       "iv": [lo, r["preemptions_replayed_median"], hi],
                       "in": lo is not None and lo <= truth["preemptions"] <= hi,
                       "width": None if lo is None else hi - lo, "source": r["preemptions_interval_source"]}
                rlo, rhi, rt = r["recomputed_tokens_low"], r["recomputed_tokens_high"], truth["recomputed_tokens"] or 0
                row.update(recomputed_tokens=rt, recomputed_iv=[rlo, r["recomputed_tokens"], rhi],
                           recomputed_in=rlo is not None and rlo <= rt <= rhi,
                           recomputed_width=None if rlo is None else rhi - rlo)
                rows.append(row)
                print(json.dumps(row), flush=True)
    for label in ("log", "log+scrapes"):
        rs = [r for r in rows if r["input"] == label]
        print(f"{label}: {len(rs)} logs, truth inside {sum(r['in'] for r in rs)}, mean width "
              f"{sum(r['width'] or 0 for r in rs) / max(1, len(rs)):.1f}; recomputed tokens: truth inside "
              f"{sum(r['recomputed_in'] for r in rs)}, mean width "
              f"{sum(r['recomputed_width'] or 0 for r in rs) / max(1, len(rs)):,.0f}")
    return rows


def summary(rows: list[dict]) -> None:
    for label in ("log", "log+scrapes"):
        rs = [r for r in rows if r["input"] == label]
        if not rs:
            continue
        print(f"{label}: {len(rs)} logs")
        for k in ("preemptions", "recomputed_tokens", "recompute_ratio"):
            cov = sum(r[k + "_in"] for r in rs) / len(rs)
            width = sum(r[k + "_width"] for r in rs) / len(rs)
            print(f"  {k}: truth inside the interval {cov:.0%}, mean width {width:.4g}")
        ex = [r for r in rs if r["exact"]]
        if ex:
            print(f"  count exact by the counter in {len(ex)}: right in "
                  f"{sum(r['preemptions_iv'][1] == r['preemptions'] for r in ex)}")


def calibrate(dumps: list[str], grid: list[float]) -> None:
    """Coverage and mean width of each interval at each widening in `grid`, over the
    members `eval --dump` kept (the intervals as the product makes them:
    default_log.intervals): the factors are chosen on the calibration cases' dump."""
    import msgspec

    from kvreplay.inference.default_log import Member, intervals

    rows = [json.loads(l) for d in dumps for l in open(d)]
    for label in ("log", "log+scrapes"):
        rs = [r for r in rows if r["input"] == label]
        if not rs:
            continue
        print(f"{label}: {len(rs)} logs (cases {min(r['case'] for r in rs)}-{max(r['case'] for r in rs)})")
        for k, slot in (("preemptions", 0), ("recomputed_tokens", 1), ("recompute_ratio", 2)):
            cells = []
            for f in grid:
                inside = width = 0.0
                for r in rs:
                    ms = [msgspec.convert(m, Member, strict=False) for m in r["members"]]
                    iv = intervals(ms, r["counted"], r["counted_exact"], (f, f, f))[slot]
                    tol = 1e-6 if k == "recompute_ratio" else 0.5
                    inside += iv.low - tol <= r[k] <= iv.high + tol
                    width += iv.high - iv.low
                cells.append(f"{f:g}: {inside / len(rs):.0%} {width / len(rs):.4g}")
            print(f"  {k}: " + ", ".join(cells))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd", choices=("eval", "eval-full", "write", "calib"))
    ap.add_argument("--cases", default="0:12")
    ap.add_argument("--case", type=int, default=0)
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("-o", "--out", default=".")
    ap.add_argument("--dump", help="eval: append each case's weighted members here (JSON lines); "
                    "calib: the dumps to read")
    ap.add_argument("--inputs", default="log,log+scrapes", help="eval: which inputs of each case")
    ap.add_argument("--prefix", action="store_true", help="eval/write: the prefix-caching variant of each case")
    ap.add_argument("--no-cache-evidence", action="store_true",
                    help="eval: drop the prefix-cache counters from the scrapes")
    ap.add_argument("--grid", default="1,1.2,1.4,1.55,1.75,2", help="calib: the widenings tried")
    a = ap.parse_args(argv)
    if a.cmd == "write":
        text, ptext, truth = render(a.case, prefix=a.prefix)
        os.makedirs(a.out, exist_ok=True)
        open(os.path.join(a.out, "server.default.log"), "w").write(text)
        open(os.path.join(a.out, "metrics.prom"), "w").write(ptext)
        json.dump(truth, open(os.path.join(a.out, "truth.json"), "w"), indent=1)
        return 0
    if a.cmd == "calib":  # --dump A.jsonl[,B.jsonl] --grid 1,1.2,1.5
        calibrate(a.dump.split(","), [float(x) for x in a.grid.split(",")])
        return 0
    lo, hi = (int(x) for x in a.cases.split(":"))
    if a.cmd == "eval-full":
        evaluate_full(range(lo, hi))
        return 0
    summary(evaluate(range(lo, hi), a.samples, a.dump, tuple(a.inputs.split(",")), a.prefix,
                     not a.no_cache_evidence))
    return 0


if __name__ == "__main__":
    sys.exit(main())
