#!/usr/bin/env python3
"""Memory and row latency of `kvreplay watch` over a long run of a busy server, appended fast.

    python -m bench.bench_watch_memory [--hours 0.1] [--speed 100] [--kind busy|bursty]
    python -m bench.bench_watch_memory --stream --hours 24 --rate 0.07   # a day (see below)

The log: a synthetic vLLM 0.33 server rendered by the repo's own renderer
(tools.oracle.render_log, Iteration lines and the JSON bodies' prompts), one engine step
every --step-ms (30 ms: a decode step of an 8B model at 64-256 running). `busy`: Poisson
arrivals at --rate a step, prompts 64-1,023 tokens, 500-2,999 output tokens, 256 seqs and
12,000 blocks of 16, so 64-256 requests run and the engine is never idle after its first
minute (the bench prints the running range and the longest idle stretch it rendered);
`bursty`: tools.oracle.bursty_log's bursts with the engine idle between them (quiet
points), for comparison. A writer appends it line by line at the pace its time stamps give,
--speed times faster, while `kvreplay watch FILE --format jsonl --exit-idle 3` follows it.

Measured: the watch process's resident memory (VmRSS from /proc, every 0.25 s) at each
tenth of the time it ran, its peak (VmHWM, read while it runs), its CPU; for each preemption row,
the time from the write of the line that decides it (the Iteration line of its step + 1)
to the row on stdout, median and p99 over the rows of the log's first fifth and of its last
fifth; and whether the rows standing at the end are the offline replay's (run first, in
this process: the baseline).

--stream renders the busy log as the engine runs, a chunk of steps at a time (the same log
for any chunk), prompts of one length sharing one token list, and takes the run's true
preemptions as the baseline instead of an offline replay: a day (`--stream --hours 24`,
2.9M steps) fits in memory that way, where the plain render holds every step (2 h: 7 GB)
and the offline replay of a day would need about 55 GiB.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.bench_watch import IT, ROOT, STARTUP_S, _rss_mb, schedule


def busy_workload(steps: int, rate: float, seed: int = 0, shared_prompts: bool = False) -> dict:
    """Poisson arrivals over `steps` engine steps; long decodes keep 64-256 running.
    `shared_prompts`: prompts of one length are one list object (the same draws; no prefix
    caching, so only lengths count: a day's prompts fit in memory)."""
    rng = random.Random(seed)
    by_len: dict[int, list[int]] = {}
    reqs, t, i = [], 0.0, 0
    while True:
        t += rng.expovariate(rate)
        if t >= steps:
            break
        prompt = [rng.randrange(10, 30000) for _ in range(rng.randrange(64, 1024))]
        if shared_prompts:
            prompt = by_len.setdefault(len(prompt), prompt)
        reqs.append({"id": f"cmpl-busy-{i}-0", "arrival_step": int(t),
                     "prompt_token_ids": prompt, "max_tokens": rng.randrange(500, 3000)})
        i += 1
    return {"name": "busy-day", "config": {
        "num_gpu_blocks": 12000, "block_size": 16, "max_num_seqs": 256,
        "max_num_batched_tokens": 8192, "max_model_len": 4096, "enable_prefix_caching": False,
        "max_steps": 10**8}, "requests": reqs}


def render_busy(hours: float, step_s: float, rate: float, dest: Path) -> str:
    from kvreplay.replay import parse_workload, simulate
    from tools.oracle.render_log import render_log

    wl = parse_workload(busy_workload(int(hours * 3600 / step_s), rate))
    records, summary = simulate(wl)
    last_arrival = max(spec.arrival_step for spec in wl.requests)
    # the running set between the ramp up (the first tenth) and the last arrival (the drain)
    settled = [len(r["running"]) for r in records[last_arrival // 10:last_arrival]]
    waiting = [len(r["waiting"]) for r in records[last_arrival // 10:last_arrival]]
    idle = longest = 0
    for r in records:  # nothing running or waiting: a quiet point (watch's window cut)
        idle = idle + 1 if not r["running"] and not r["waiting"] else 0
        longest = max(longest, idle)
    lines = render_log(wl, records, step_time_s=step_s, stats_interval_s=10.0,
                       iteration_lines=True, with_prompts=True)
    dest.write_text("\n".join(lines) + "\n")
    return (f"busy: {len(wl.requests):,} requests, {summary.num_steps:,} steps of {step_s * 1e3:g} "
            f"ms ({summary.num_steps * step_s / 3600:.2f} h), running {min(settled)}-"
            f"{max(settled)} and waiting {min(waiting)}-{max(waiting)} from the ramp up to the last arrival "
            f"(step {last_arrival:,}), longest idle stretch {longest} steps, "
            f"{summary.total_preemptions:,} preemptions, {len(lines):,} lines")


def _tokens(r: dict) -> int:
    return sum(t for _, t in r.get("scheduled", ()))


def render_busy_stream(hours: float, step_s: float, rate: float, dest: Path,
                       chunk: int = 20_000) -> tuple[str, dict[int, int], list[tuple[int, str]]]:
    """`render_busy`'s log written as the engine runs, `chunk` steps at a time (a day's steps
    are too many to hold), prompts of one length sharing one token list (no prefix caching:
    only lengths count). Returns the summary, each true preemption step's deciding Iteration
    N (the line after its step's own), and the true (step, victim) rows: the baseline, instead
    of an offline replay of the whole day."""
    import re

    from kvreplay.replay import parse_workload
    from kvreplay.replay.engine import Engine, iter_trace
    from tools.oracle.log_lines import stamp
    from tools.oracle.render_log import API, iteration_lines_of, timed_lines

    steps = int(hours * 3600 / step_s)
    wl = parse_workload(busy_workload(steps, rate, shared_prompts=True))
    specs = {s.id: s for s in wl.requests}
    start = 1778148060.0
    step_start = lambda k: start + k * step_s  # noqa: E731
    it_re = re.compile(r"Iteration\((\d+)\)")
    deciding: dict[int, int] = {}
    truth: list[tuple[int, str]] = []
    n_tok = 0  # Iteration lines so far (steps that scheduled a token)
    idle = 0  # idle steps so far
    n_out = 0  # Iteration lines written so far
    tick = start - (start % 1) + 0.5
    gen = prompt = 0
    seen: set[str] = set()
    held: list[tuple[float, int, str]] = []  # lines not written yet (time, order, line)
    order = 0
    running = lo = hi = nlines = 0
    lo = 1 << 30
    prev = None
    tail: list[dict] = []
    eng = Engine(wl)
    records = iter_trace(eng)
    with dest.open("w") as f:
        while True:
            recs = [r for _, r in zip(range(chunk), records)]
            if not recs:
                break
            out = timed_lines(wl, recs, step_time_s=step_s, start=start,
                              stats_interval_s=1e12, iteration_lines=False)
            first = recs[0]["step"]
            pairs = [(tm, x) for tm, x in out if "Avg prompt throughput" not in x
                     and (first == 0 or tm > start - 1)]  # (the banner: the first chunk's)
            # each step's line reads the record after it (the KV usage once its output was
            # applied): the chunk's last step is written with the next chunk
            # (and reads the one before it: who had an output token); tail: the chunk
            # before's last two, the first written already
            its = iteration_lines_of(tail + recs, step_start, wl.config.num_gpu_blocks)
            d = int(bool(tail) and _tokens(tail[0]) > 0)
            its = its[d:-1] if _tokens(recs[-1]) > 0 else its[d:]
            for tm, x in its:
                pairs.append((tm, it_re.sub(lambda m: f"Iteration({int(m[1]) - d + n_out})",
                                            x, count=1)))
            n_out += len(its)
            for r in recs:
                k = r["step"]
                # the replay steps no idle engine (nothing running or waiting): its step
                idle += not r.get("scheduled") and not r.get("running") and not r.get("waiting")
                for p in r.get("preemptions") or ():
                    truth.append((k - idle, str(p["req"])))
                    deciding[k - idle] = n_tok + 1
                n_tok += _tokens(r) > 0
                gen += len(r.get("sampled", ()))
                for rid in r.get("sampled", ()):
                    if rid not in seen:
                        seen.add(rid)
                        prompt += len(specs[rid].prompt_token_ids)
                if k * 10 > steps and "running" in r:
                    lo, hi = min(lo, len(r["running"])), max(hi, len(r["running"]))
                while int((tick - start) / step_s) - 1 <= k:  # the stats line of each tick
                    pairs.append((tick, f"{API} INFO {stamp(tick)} [loggers.py:335] Engine 000: "
                                        f"Avg prompt throughput: {prompt / 10.0:.1f} tokens/s, "
                                        f"Avg generation throughput: {gen / 10.0:.1f} tokens/s, "
                                        f"Running: {len(r['running'])} reqs, Waiting: "
                                        f"{len(r['waiting'])} reqs, GPU KV cache usage: "
                                        f"{100 * r['kv_usage']:.1f}%"))
                    gen = prompt = 0
                    tick += 10.0
            prev = recs[-1]
            tail = (tail + recs)[-2:]
            for tm, x in pairs:
                held.append((tm, order, x))
                order += 1
            held.sort()
            edge = step_start(prev["step"]) - 0.01  # the next chunk writes nothing before it
            cut = next((j for j, h in enumerate(held) if h[0] >= edge), len(held))
            f.writelines(x + "\n" for _, _, x in held[:cut])
            nlines += cut
            held = held[cut:]
        its = iteration_lines_of(tail, step_start, wl.config.num_gpu_blocks)
        d = int(len(tail) == 2 and _tokens(tail[0]) > 0)
        for tm, x in its[d:]:
            held.append((tm, order, it_re.sub(lambda m: f"Iteration({int(m[1]) - d + n_out})",
                                              x, count=1)))
        held.sort()
        f.writelines(x + "\n" for _, _, x in held)
        nlines += len(held)
    summary = eng.summary
    return (f"busy (streamed): {len(wl.requests):,} requests, {summary.num_steps:,} steps of "
            f"{step_s * 1e3:g} ms ({summary.num_steps * step_s / 3600:.2f} h), running {lo}-{hi} "
            f"after the first tenth, {summary.total_preemptions:,} preemptions, "
            f"{nlines:,} lines"), deciding, sorted(truth)


def render_bursts(bursts: int, dest: Path) -> str:
    from tools.oracle.bursty_log import render_bursty

    lines = render_bursty(bursts)
    dest.write_text("\n".join(lines) + "\n")
    return f"bursty: {bursts} bursts of 8 requests, idle between them, {len(lines):,} lines"


def run(path: Path, speed: float, deciding: dict[int, int]) -> dict:
    """`deciding`: a row's step -> N of the Iteration line that decides it."""
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines(True)
    when = schedule(lines)
    n_of_line = {k: int(m[1]) for k, s in enumerate(lines) if (m := IT.search(s))}
    written: dict[int, tuple[float, int]] = {}  # Iteration N -> (its write time, its line)
    printed: list[tuple[int, float]] = []
    standing: list[tuple] = []
    samples: list[tuple[float, float, float]] = []  # (s since start, share written, RSS MB)
    share = [0.0]
    peak = [0.0]  # the last VmHWM read (watch's peak, from /proc while it runs)
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "server.log"
        log.write_text("")
        p = subprocess.Popen([sys.executable, "-m", "kvreplay", "watch", str(log), "--format",
                              "jsonl", "--exit-idle", "3"], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True, cwd=ROOT)
        done = threading.Event()

        def read() -> None:
            for s in p.stdout:  # type: ignore[union-attr]
                t = time.monotonic()
                o = json.loads(s)
                if o["event"] in ("preemption", "withdrawn") and "step" in o:
                    key = (o["step"], o["victim"], o["trigger"], o["tokens_lost"],
                           o["confidence"], o["rule"])
                    if o["event"] == "withdrawn":
                        standing.remove(key)
                    else:
                        standing.append(key)
                        printed.append((o["step"], t))

        def sample() -> None:
            while not done.wait(0.25):
                m = _rss_mb(p.pid)
                if m is not None:
                    samples.append((time.monotonic() - t0, share[0], m[0]))
                    peak[0] = max(peak[0], m[1])

        reader = threading.Thread(target=read)
        reader.start()
        time.sleep(STARTUP_S)  # watch is up (imports done), following the empty file
        t0 = time.monotonic()
        sampler = threading.Thread(target=sample)
        sampler.start()
        with log.open("a") as f:
            for k, s in enumerate(lines):
                delay = t0 + when[k] / speed - time.monotonic()
                if delay > 0:
                    f.flush()
                    time.sleep(delay)
                f.write(s)
                if k in n_of_line:
                    f.flush()
                    written[n_of_line[k]] = (time.monotonic(), k)
                    share[0] = (k + 1) / len(lines)
        share[0] = 1.0
        t_written = time.monotonic() - t0
        _, status, ru = os.wait4(p.pid, 0)
        done.set()
        sampler.join()
        reader.join()
    if status:
        print(f"  (watch ended with status {status})")
    lat = [(written[n][1] / len(lines), t - written[n][0])
           for step, t in printed if (n := deciding.get(step)) is not None and n in written]
    return {"rows": len(printed), "lat": lat, "samples": samples, "standing": sorted(standing),
            "peak_mb": peak[0], "cpu_s": ru.ru_utime + ru.ru_stime,
            "log_s": when[-1] / speed, "written_s": t_written,
            "end_s": time.monotonic() - t0}


def _q(xs: list[float]) -> str:
    if not xs:
        return "no rows"
    xs = sorted(xs)
    return (f"median {statistics.median(xs):.2f} s, p99 {xs[min(len(xs) - 1, int(0.99 * len(xs)))]:.2f} s "
            f"({len(xs)} rows)")


def report(r: dict) -> None:
    print(f"  appended in {r['written_s']:.0f} s (the log's pace: {r['log_s']:.0f} s); watch "
          f"ended {r['end_s']:.0f} s after the first line: {r['rows']} rows, {r['cpu_s']:.0f} s "
          f"CPU, peak RSS {r['peak_mb']:.0f} MB (VmHWM)")
    smp = r["samples"]
    if smp:
        end = smp[-1][0]
        out = []
        for i in range(1, 11):
            t, share, mb = next(x for x in smp if x[0] >= end * i / 10 - 1e-9)
            out.append(f"{t:.0f} s {mb:.0f} MB ({share:.0%})")
        print("  RSS over time (the log written by then): " + ", ".join(out))
    lat = r["lat"]  # (where the deciding line is in the log, latency), in the rows' order
    k = max(1, len(lat) // 5)
    head, tail = lat[:k], lat[-k:]
    if lat:
        print(f"  row latency from the deciding line: the first fifth of the rows (deciding lines "
              f"at {head[0][0]:.0%}-{head[-1][0]:.0%} of the log) {_q([x for _, x in head])}; the "
              f"last fifth ({tail[0][0]:.0%}-{tail[-1][0]:.0%}) {_q([x for _, x in tail])}")


def offline(path: Path) -> tuple[list[tuple], dict[int, int]]:
    """The offline replay's rows (in watch's words), and for each of their steps the N of
    the Iteration line that decides it: the line after its step's own (Iteration lines
    number the steps that scheduled a token, inference.iteration_lines.LineCheck; a step
    that scheduled nothing, idle or not, has none, so a step and its N part over a run)."""
    from kvreplay.sources import open_replay

    rep = open_replay([str(path)])
    rule = lambda p: (p.victim_rule or "").split(":")[0] + (  # noqa: E731  (watch's words)
        " self" if p.self_preemption and p.victim_rule != "self" else "")
    rows = sorted((p.step, str(p.victim), p.trigger, p.computed_tokens_lost, p.confidence,
                   rule(p)) for p in rep.preemptions)
    n_before, n = {}, 0
    for rec in rep.steps:
        n_before[rec.step] = n
        n += rec.num_scheduled_tokens > 0
    return rows, {p.step: n_before[p.step] + 1 for p in rep.preemptions}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kind", choices=("busy", "bursty"), default="busy")
    ap.add_argument("--hours", type=float, default=0.1, help="busy: hours of log")
    ap.add_argument("--step-ms", type=float, default=30.0, help="busy: one engine step")
    ap.add_argument("--rate", type=float, default=0.09, help="busy: arrivals per step")
    ap.add_argument("--bursts", type=int, default=40, help="bursty: bursts")
    ap.add_argument("--speed", type=float, default=100.0)
    ap.add_argument("--stream", action="store_true",
                    help="busy, rendered as the engine runs (a day: --hours 24); the baseline "
                    "is the true run's preemptions, not an offline replay")
    ap.add_argument("--keep", type=Path, help="write the rendered log here (else a temp file)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = args.keep or Path(tmp) / "server.log"
        t0 = time.perf_counter()
        if args.stream:
            what, deciding, truth = render_busy_stream(args.hours, args.step_ms / 1e3,
                                                       args.rate, path)
        elif args.kind == "busy":
            what = render_busy(args.hours, args.step_ms / 1e3, args.rate, path)
        else:
            what = render_bursts(args.bursts, path)
        print(f"{what} (rendered in {time.perf_counter() - t0:.0f} s); appended at {args.speed:g}x",
              flush=True)
        if not args.stream:
            t0 = time.perf_counter()
            rows, deciding = offline(path)
            print(f"  offline replay (baseline): {len(rows)} rows in "
                  f"{time.perf_counter() - t0:.1f} s")
        r = run(path, args.speed, deciding)
        report(r)
        if args.stream:
            got = sorted((k[0], k[1]) for k in r["standing"])
            print(f"  rows standing at the end name the true preemptions (step, victim): "
                  f"{got == truth} ({len(got)} rows, {len(truth)} true)")
        else:
            print(f"  rows standing at the end equal the offline replay's: {r['standing'] == rows}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
