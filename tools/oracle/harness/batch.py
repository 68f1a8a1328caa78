#!/usr/bin/env python3
"""Run many workloads through one oracle harness in a single process.

Importing vLLM costs ~6 s per process; scheduling a small workload costs
milliseconds. This driver imports a harness script (run_oracle.py, or
versions/run_oracle_0.19.0.py / versions/run_oracle_0.11.0.py, which also check
the installed vLLM's version) as a module and calls its main() once per
workload, with the same arguments the command line would get.

Usage (inside the release's oracle venv; tools/oracle/oracle.py does this for you):

    python batch.py HARNESS.py --list JOBS.json [--timeout S]

JOBS.json is a list of {"workload": path, "out": trace path,
"summary": path, "meta": path}. For each job one JSON line is printed to
stdout, prefixed with "@@BATCH ": {"workload", "status", "exit_code",
"error", "seconds"}; status is "ok", "incomplete" (harness exit 2: vLLM did
not finish every request within max_steps), "unsupported" (exit 3: a config
key this release lacks), "timeout" or "error" (exception, with traceback).
The harness's own per-case line goes to stderr.
"""
from __future__ import annotations

import importlib.util
import io
import json
import os
import signal
import sys
import time
import traceback

if os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable] + sys.argv)


class _Timeout(Exception):
    pass


def _alarm(signum, frame):  # pragma: no cover - only on runaway cases
    raise _Timeout()


def load_harness(path: str):
    spec = importlib.util.spec_from_file_location("kvreplay_oracle_harness", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("harness")
    ap.add_argument("--list", required=True)
    ap.add_argument("--timeout", type=float, default=300.0)
    args = ap.parse_args()
    with open(args.list) as f:
        jobs = json.load(f)
    mod = load_harness(os.path.abspath(args.harness))
    signal.signal(signal.SIGALRM, _alarm)
    real_stdout = sys.stdout
    for job in jobs:
        argv = [args.harness, job["workload"], "-o", job["out"],
                "--summary", job["summary"], "--meta", job["meta"]]
        t0 = time.perf_counter()
        status, code, err = "ok", 0, None
        old_argv = sys.argv
        sys.argv = argv
        sys.stdout = sys.stderr  # harness prints its one-line report
        signal.setitimer(signal.ITIMER_REAL, args.timeout)
        try:
            mod.main()
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if code == 2:
                status = "incomplete"
            elif code == 3:
                status = "unsupported"
            elif code != 0:
                status, err = "error", str(e.code)
        except _Timeout:
            status, code, err = "timeout", None, f"no result after {args.timeout}s"
        except BaseException:  # noqa: BLE001 - report and go on with the next case
            status, code, err = "error", None, traceback.format_exc()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            sys.argv = old_argv
            sys.stdout = real_stdout
        rec = {"workload": job["workload"], "status": status, "exit_code": code,
               "error": err, "seconds": round(time.perf_counter() - t0, 3)}
        real_stdout.write("@@BATCH " + json.dumps(rec) + "\n")
        real_stdout.flush()


if __name__ == "__main__":
    main()
