#!/usr/bin/env python3
"""What the step trace costs: vLLM 0.33.0's own schedule() + update_from_output() with and
without kvreplay.vllm_plugin, on the conformance workloads and the heavy workload
(tools/oracle/heavy_workload.py: 2,000 requests, prefix caching, up to 128 running).

    python -m bench.bench_plugin_overhead [--repeat 5] [--json] [--workload W.json ...]

Runs vLLM in its venv ($KVREPLAY_VLLM_PYTHON, or .ci/install_vllm.sh's default path, or
the oracle venv). Only the scheduler's two entry points are timed (the outermost call:
vLLM's method for the plain run, the plugin's wrapper, which calls vLLM's method, for
the traced run); the fake model and the harness are not. The trace lines go through
vLLM's logger and formatter into a file, as in production (formatting and the write are
in the traced time). Plain and traced runs alternate; the fastest of `--repeat` is kept,
and `overhead_pct_ci95` is the 95% t-interval of the mean of the per-repeat overheads
(each repeat's traced run against the plain run just before it; needs --repeat >= 2).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TESTS = REPO / "tests"


def _vllm_python() -> Path:
    from tests.helpers.vllm_venv import vllm_python

    py = vllm_python()
    if py is None:
        raise SystemExit("vLLM 0.33.0 venv not found: run .ci/install_vllm.sh or set KVREPLAY_VLLM_PYTHON")
    return py


# ------------------------------------------------------------------ inside the vLLM venv


def _inside(jobs: list[dict], repeat: int) -> None:
    import logging

    sys.path.insert(0, str(REPO))  # run by path in vLLM's venv (below), not as a module
    from tests.helpers.vllm_driver import HARNESS, _load_harness, install_kvreplay_shim

    install_kvreplay_shim()
    harness = _load_harness()
    import vllm.v1.core.sched.async_scheduler as am
    import vllm.v1.core.sched.scheduler as sm
    from vllm.config.logging import LoggingConfig
    from vllm.logger import configure_logging

    from kvreplay.vllm_plugin import StepTraceAsyncScheduler, StepTraceScheduler, StepTraceMixin

    configure_logging(LoggingConfig())
    vlog = logging.getLogger("vllm")
    fmt = vlog.handlers[0].formatter
    for h in vlog.handlers:
        h.setLevel(logging.WARNING)
    vlog.setLevel(logging.INFO)

    acc = {"t": 0.0, "steps": 0, "req_steps": 0}
    depth = [0]

    def timed(fn, is_schedule):
        @functools.wraps(fn)
        def wrapper(self, *a, **kw):
            if depth[0]:
                return fn(self, *a, **kw)
            depth[0] += 1
            t0 = time.perf_counter()
            try:
                out = fn(self, *a, **kw)
            finally:
                acc["t"] += time.perf_counter() - t0
                depth[0] -= 1
            if is_schedule:
                acc["steps"] += 1
                acc["req_steps"] += len(out.num_scheduled_tokens)
            return out
        return wrapper

    for cls in (sm.Scheduler, StepTraceMixin):
        cls.schedule = timed(cls.schedule, True)
        cls.update_from_output = timed(cls.update_from_output, False)
    real = (sm.Scheduler, am.AsyncScheduler)
    traced = (StepTraceScheduler, StepTraceAsyncScheduler)
    results = []
    with tempfile.TemporaryDirectory(prefix="kvr-ovh-") as tmp:
        for job in jobs:
            best = {"plain": None, "traced": None}
            paired: list[float] = []  # per repeat: 100 * (traced - plain) / plain
            log_bytes = lines = 0
            for _ in range(repeat):
                for mode in ("plain", "traced"):
                    log = os.path.join(tmp, "vllm.log")
                    handler = logging.FileHandler(log, mode="w", encoding="utf-8")
                    handler.setFormatter(fmt)
                    vlog.addHandler(handler)
                    sm.Scheduler, am.AsyncScheduler = traced if mode == "traced" else real
                    acc.update(t=0.0, steps=0, req_steps=0)
                    sys.argv = [HARNESS, job["workload"], "-o", os.path.join(tmp, "t.jsonl"),
                                "--summary", os.path.join(tmp, "s.json"), "--meta", os.path.join(tmp, "m.json")]
                    out, sys.stdout = sys.stdout, sys.stderr
                    try:
                        harness.main()
                    except SystemExit:
                        pass
                    finally:
                        sys.stdout = out
                        sm.Scheduler, am.AsyncScheduler = real
                        vlog.removeHandler(handler)
                        handler.close()
                    if mode == "traced":
                        with open(log, encoding="utf-8") as f:
                            text = [s for s in f if "kvtrace " in s]
                        log_bytes, lines = sum(len(s) for s in text), len(text)
                    run = dict(acc)
                    if mode == "plain":
                        last_plain = run["t"]
                    else:
                        paired.append(100.0 * (run["t"] - last_plain) / last_plain)
                    if best[mode] is None or run["t"] < best[mode]["t"]:
                        best[mode] = run
            p, t = best["plain"], best["traced"]
            results.append({
                "workload": job["name"], "steps": p["steps"], "request_steps": p["req_steps"],
                "plain_us_per_step": 1e6 * p["t"] / p["steps"],
                "traced_us_per_step": 1e6 * t["t"] / t["steps"],
                "overhead_us_per_step": 1e6 * (t["t"] - p["t"]) / p["steps"],
                "overhead_pct": 100.0 * (t["t"] - p["t"]) / p["t"],
                "trace_lines": lines, "trace_bytes_per_step": log_bytes / max(1, p["steps"]),
                "overhead_pct_ci95": _t_interval(paired), "repeats": len(paired),
            })
    print("@@OVH " + json.dumps(results), flush=True)


def _t_interval(xs: list[float]) -> list[float] | None:
    """95% t-interval of the mean of xs (None below 2 values)."""
    import math
    import statistics

    n = len(xs)
    if n < 2:
        return None
    t = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
         10: 2.228, 15: 2.131, 20: 2.086, 30: 2.042}.get(n - 1) or (2.0 if n > 31 else 2.1)
    m, h = statistics.fmean(xs), t * statistics.stdev(xs) / math.sqrt(n)
    return [round(m - h, 2), round(m + h, 2)]


# ------------------------------------------------------------------ outside


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--workload", action="append", help="workload JSON (default: conformance cases + heavy)")
    ap.add_argument("--no-heavy", action="store_true")
    ap.add_argument("--_inside", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._inside:
        _inside(json.loads(Path(args._inside).read_text()), args.repeat)
        return
    with tempfile.TemporaryDirectory(prefix="kvr-ovh-") as tmp:
        jobs = []
        if args.workload:
            jobs = [{"name": Path(w).stem, "workload": str(Path(w).resolve())} for w in args.workload]
        else:
            for d in sorted((TESTS / "data" / "conformance" / "cases").iterdir()):
                if (d / "workload.json").exists():
                    jobs.append({"name": d.name, "workload": str(d / "workload.json")})
            if not args.no_heavy:
                from tools.oracle.heavy_workload import make

                p = Path(tmp) / "heavy.json"
                p.write_text(json.dumps(make()))
                jobs.append({"name": "heavy (2000 req, prefix caching)", "workload": str(p)})
        jp = Path(tmp) / "jobs.json"
        jp.write_text(json.dumps(jobs))
        env = dict(os.environ, PYTHONHASHSEED="0", OMP_NUM_THREADS="1", VLLM_LOGGING_COLOR="0",
                   VLLM_TARGET_DEVICE="cpu", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                   VLLM_LOGGING_LEVEL="WARNING", VLLM_NO_USAGE_STATS="1")
        proc = subprocess.run([str(_vllm_python()), __file__, "--_inside", str(jp), "--repeat", str(args.repeat)],
                              capture_output=True, text=True, env=env)
    rows = None
    for line in proc.stdout.splitlines():
        if line.startswith("@@OVH "):
            rows = json.loads(line[6:])
    if rows is None:
        raise SystemExit(proc.stderr[-4000:])
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"{'workload':34} {'steps':>6} {'req/step':>8} {'vLLM µs/step':>12} {'+trace µs':>10} {'%':>6} {'% 95% CI':>15} {'B/step':>7}")
    for r in rows:
        ci = r["overhead_pct_ci95"]
        ci_text = f"[{ci[0]:.1f}, {ci[1]:.1f}]" if ci else "-"
        print(f"{r['workload'][:34]:34} {r['steps']:6d} {r['request_steps'] / r['steps']:8.1f} "
              f"{r['plain_us_per_step']:12.1f} {r['overhead_us_per_step']:10.1f} {r['overhead_pct']:6.1f} "
              f"{ci_text:>15} {r['trace_bytes_per_step']:7.0f}")


if __name__ == "__main__":
    main()
