#!/usr/bin/env python3
"""Fleet audit: N vLLM 0.33 logs of ~200 requests, local processes vs a Dask LocalCluster.

    python -m bench.bench_fleet [--logs 1000] [--distinct 50] [--workers 2] [--no-replay]

Renders `--distinct` different serving runs (tools.oracle.synth_log: 200 requests each,
Poisson arrivals at 8-20/s, prompts 200-1,200 tokens, outputs 50-400, 600-1,500 blocks:
some runs preempt, some do not) and writes each under N/distinct names on as many days,
so the fleet is N logs (a copy under another name is another log: each gets its row).
Then, each in a process of its own, with the same workers:

* `kvreplay audit DIR -o OUT/ --executor local -j W` (the baseline),
* `kvreplay audit DIR -o OUT/ --executor dask -j W` (LocalCluster, W single-thread workers),
* the dask command again on its dataset (every log skipped: the cost of a rerun),
* `kvreplay audit --summarize OUT/` on the dataset.

Prints per run the wall time, logs/s, its ratio to the baseline, the peak RSS of the
driver (this process tree's largest) and of each worker (the tasks report their own
ru_maxrss), and the --summarize time. `--no-replay` audits the stats lines only (~1% of
the replay's cost per log): what is left is the fleet machinery's own overhead.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

PEAK = ("import resource, subprocess, sys, time; t = time.perf_counter(); "
        "p = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
        "sys.stderr.write(p.stderr); sys.stdout.write(p.stdout); "
        "print('PEAK', time.perf_counter() - t, "
        "resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, p.returncode)")
LINE = re.compile(r"kvreplay audit: (\d+) logs \((.*?)\): (\d+) done, (\d+) failed, (\d+) skipped, "
                  r"[\d.]+ logs/s; ([\d.]+) s(?:, peak worker RSS (\d+) MiB)?")


def render(d: str, logs: int, distinct: int) -> None:
    from tools.oracle.synth_log import EPOCH, make_workload, render_log

    copies = -(-logs // distinct)
    n = 0
    for i in range(distinct):
        wl, arr = make_workload(200, seed=i, rate=8 + (i % 7) * 2,
                                num_gpu_blocks=600 + (i % 4) * 300)
        run = None
        for c in range(copies):
            if n == logs:
                return
            text, run = render_log(wl, arr, interval_s=10.0, start=EPOCH + 60 + c * 86400.0,
                                   run=run)
            with open(os.path.join(d, f"server-{i:03d}-day{c:02d}.log"), "w") as f:
                f.write(text)
            n += 1


def timed(cmd: list[str]) -> tuple[float, int, str]:
    p = subprocess.run([sys.executable, "-c", PEAK, *cmd], capture_output=True, text=True)
    last = p.stdout.strip().splitlines()[-1].split()
    if last[0] != "PEAK" or last[3] != "0":
        raise SystemExit(f"{' '.join(cmd)} failed:\n{p.stderr[-2000:]}")
    return float(last[1]), int(last[2]), p.stderr


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--logs", type=int, default=1000)
    ap.add_argument("--distinct", type=int, default=50)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--no-replay", action="store_true")
    args = ap.parse_args()
    audit = [sys.executable, "-m", "kvreplay", "audit"]
    extra = ["--year", "2026", "-j", str(args.workers)] + (["--no-replay"] if args.no_replay else [])
    with tempfile.TemporaryDirectory() as tmp:
        logs = os.path.join(tmp, "logs")
        os.mkdir(logs)
        t = time.perf_counter()
        render(logs, args.logs, args.distinct)
        size = sum(os.path.getsize(os.path.join(logs, n)) for n in os.listdir(logs))
        print(f"fleet: {args.logs} logs of 200 requests ({args.distinct} distinct runs), "
              f"{size / 2**20:.0f} MiB, rendered in {time.perf_counter() - t:.0f} s; "
              f"{args.workers} workers; replay {'off' if args.no_replay else 'on'}")
        base = None
        for name, executor, out in (("local", "local", "local"), ("dask", "dask", "dask"),
                                    ("dask rerun", "dask", "dask")):
            sec, kb, err = timed(audit + [logs, "-o", os.path.join(tmp, out) + "/",
                                          "--executor", executor] + extra)
            m = LINE.search(err)
            if m is None:
                raise SystemExit(f"no summary line in:\n{err[-2000:]}")
            n, where, done, failed, skipped, inner, worker_mib = m.groups()
            rate = (int(done) + int(failed)) / sec if sec else 0.0
            base = base or sec
            print(f"{name:10s} ({where}): {sec:7.1f} s wall ({float(inner):.1f} s auditing), "
                  f"{rate:6.2f} logs/s, {sec / base:.2f}x the local time; {done} done, "
                  f"{failed} failed, {skipped} skipped; peak RSS driver tree "
                  f"{kb / 1024:.0f} MiB, worker {worker_mib or '-'} MiB")
        sec, kb, err = timed(audit + ["--summarize", os.path.join(tmp, "dask") + "/"])
        print(f"--summarize on the dataset ({args.logs} files): {sec:.2f} s wall, "
              f"peak RSS {kb / 1024:.0f} MiB")
        a = subprocess.run([sys.executable, "-c", "import sys; from kvreplay.audit.fleet import dataset as ds; "
                            "a, b = (ds.scan_dataset(p).collect().sort('log') for p in sys.argv[1:]); "
                            "print(a.equals(b))", os.path.join(tmp, "local"), os.path.join(tmp, "dask")],
                           capture_output=True, text=True).stdout.strip()
        print(f"local and dask datasets equal: {a}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
