#!/usr/bin/env python3
"""Throughput of vLLM's own scheduler on a workload (request-steps per second).

    python -m tools.oracle.oracle_bench WORKLOAD.json [--release 0.33] [--repeat 3] [--json]

Only vLLM's Scheduler.schedule() and update_from_output() calls are timed
(import, config setup, request creation, the fake model and the harness's
trace building are excluded). request-steps = sum over steps of the number of
requests scheduled in that step. With --repeat N the fastest run is reported.

Python:

    from tools.oracle.oracle_bench import bench_oracle
    r = bench_oracle("samples/heavy.json", release="0.33", repeat=1)
    r["request_steps_per_s"], r["request_steps"], r["total_s"], r["steps"]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
from tools.oracle import oracle  # noqa: E402


def bench_oracle(workload_path: str | Path, release: str = "0.33", repeat: int = 1) -> dict:
    release = oracle.canon_release(release)
    if not oracle.oracle_available(release):
        raise oracle.OracleError(f"oracle for vLLM {release} not installed")
    cmd = [str(oracle.venv_python(release)), str(oracle.HARNESS_DIR / "bench.py"),
           str(oracle.harness_script(release)), str(Path(workload_path).resolve()),
           "--repeat", str(repeat)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=oracle._env())
    for line in proc.stdout.splitlines():
        if line.startswith("@@BENCH "):
            out = json.loads(line[len("@@BENCH "):])
            res = dict(out["best"])
            res.update(vllm=out["vllm"], runs=out["runs"], all_total_s=out["all_total_s"])
            return res
    raise oracle.OracleError(f"bench failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workload")
    ap.add_argument("--release", default="0.33")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--json", action="store_true", help="print the full result as JSON")
    args = ap.parse_args(argv)
    r = bench_oracle(args.workload, args.release, args.repeat)
    if args.json:
        print(json.dumps(r, indent=1))
    else:
        print(f"vLLM {r['vllm']}: {r['steps']} steps, {r['request_steps']} request-steps, "
              f"{r['preemptions']} preemptions in {r['total_s']:.3f}s "
              f"(schedule {r['schedule_s']:.3f}s + update {r['update_s']:.3f}s) -> "
              f"{r['request_steps_per_s']:,.0f} request-steps/s, "
              f"{r['steps_per_s']:,.0f} steps/s"
              + ("" if r["completed"] else "  [INCOMPLETE]"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
