#!/usr/bin/env python3
"""Time vLLM's own Scheduler.schedule() + update_from_output() on a workload.

Runs inside a release's oracle venv (tools/oracle/oracle_bench.py does that). The
workload is driven by the harness script (oracle_core.py's step loop, same fake
model); only vLLM's two scheduler entry points are wrapped with a timer, so
import, config setup, request creation, fake-model output building and the
harness's trace records are all excluded.

    python bench.py HARNESS.py WORKLOAD.json [--repeat N]

Prints one JSON line prefixed with "@@BENCH ".
"""
from __future__ import annotations

import functools
import importlib.util
import json
import os
import sys
import tempfile
import time

if os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable] + sys.argv)


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("harness")
    ap.add_argument("workload")
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()

    spec = importlib.util.spec_from_file_location("kvreplay_oracle_harness",
                                                  os.path.abspath(args.harness))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # sets the harness's environment variables

    # the release's platform selection, before anything below resolves vLLM's platform
    import oracle_core

    vllm, _ = oracle_core.import_vllm()
    version = vllm.__version__
    from vllm.v1.core.sched.scheduler import Scheduler

    acc = {"schedule_s": 0.0, "update_s": 0.0, "steps": 0, "request_steps": 0,
           "tokens": 0, "updates": 0}
    depth = [0]

    def timed(fn, key, count):
        @functools.wraps(fn)
        def wrapper(self, *a, **kw):
            if depth[0]:
                return fn(self, *a, **kw)
            depth[0] += 1
            t0 = time.perf_counter()
            try:
                out = fn(self, *a, **kw)
            finally:
                acc[key] += time.perf_counter() - t0
                depth[0] -= 1
            count(out)
            return out
        return wrapper

    def count_schedule(so):
        acc["steps"] += 1
        acc["request_steps"] += len(so.num_scheduled_tokens)
        acc["tokens"] += so.total_num_scheduled_tokens

    def count_update(_):
        acc["updates"] += 1

    Scheduler.schedule = timed(Scheduler.schedule, "schedule_s", count_schedule)
    Scheduler.update_from_output = timed(Scheduler.update_from_output, "update_s",
                                         count_update)

    runs = []
    with tempfile.TemporaryDirectory(prefix="kvr-bench-") as tmp:
        for i in range(args.repeat):
            for k in acc:
                acc[k] = 0 if isinstance(acc[k], int) else 0.0
            sys.argv = [args.harness, args.workload, "-o", os.path.join(tmp, "t.jsonl"),
                        "--summary", os.path.join(tmp, "s.json"),
                        "--meta", os.path.join(tmp, "m.json")]
            real_stdout = sys.stdout
            sys.stdout = sys.stderr
            code = 0
            try:
                mod.main()
            except SystemExit as e:
                code = e.code
            finally:
                sys.stdout = real_stdout
            with open(os.path.join(tmp, "s.json")) as f:
                summ = json.load(f)
            t = acc["schedule_s"] + acc["update_s"]
            runs.append(dict(acc, total_s=t, exit_code=code,
                             completed=summ["completed"],
                             preemptions=summ["total_preemptions"],
                             request_steps_per_s=acc["request_steps"] / t if t else None,
                             steps_per_s=acc["steps"] / t if t else None))
    best = min(runs, key=lambda r: r["total_s"])
    out = {"vllm": version, "workload": args.workload, "runs": len(runs), "best": best,
           "all_total_s": [round(r["total_s"], 4) for r in runs]}
    sys.stdout.write("@@BENCH " + json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
