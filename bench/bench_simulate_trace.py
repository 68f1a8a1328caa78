#!/usr/bin/env python3
"""`kvreplay simulate W -o TRACE.jsonl` (whole process) against vLLM 0.33's own loop writing
the same trace, at production batch sizes.

    python -m bench.bench_simulate_trace [--seqs 64 128 256] [--requests-per-seq 6] [--repeat 2]

For each max_num_seqs, a workload whose running set reaches it (tools/oracle/heavy_workload.py
scaled: the pool and the arrival rate grow with the batch) is run through

* vLLM 0.33.0's Scheduler in the oracle harness (tools/oracle/harness/run_oracle.py): the
  baseline is the harness's own step loop, `timing_s.run` in its meta file (schedule,
  update_from_output and the trace record of every step; vLLM's import and setup excluded);
* `kvreplay simulate W -o T.jsonl`, the whole process (interpreter start, import, parse,
  run, write), timed from outside.

The two traces are compared step by step (every field the conformance cases compare, and
the state fields); the ratio printed is vLLM's loop over kvreplay's process, best of
`--repeat`. Needs the 0.33 oracle venv (`python -m tools.oracle.oracle --install --release 0.33`).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
from tools.oracle import oracle  # noqa: E402
from tools.oracle.heavy_workload import make  # noqa: E402

# every key of vLLM's record that kvreplay's trace carries with the same meaning
COMPARED = ("step", "arrivals", "scheduled", "num_scheduled_tokens", "new", "resumed",
            "preempted", "sampled", "finished", "num_computed_tokens", "num_output_tokens",
            "status", "blocks_held", "running", "waiting", "free_blocks", "kv_usage",
            "cached_blocks", "prefix_hit_tokens")


def workload(seqs: int, per_seq: int) -> dict:
    return make(seed=0, n_requests=per_seq * seqs, rate=2.0 * seqs / 64,
                num_gpu_blocks=2000 * seqs // 64, max_num_seqs=seqs)


def run_vllm(wl_path: Path, out: Path) -> float:
    meta = out.with_suffix(".meta.json")
    cmd = [str(oracle.venv_python("0.33")), str(oracle.harness_script("0.33")), str(wl_path),
           "-o", str(out), "--summary", str(out.with_suffix(".summary.json")),
           "--meta", str(meta)]
    subprocess.run(cmd, check=True, env=oracle._env(), capture_output=True, text=True)
    return json.loads(meta.read_text())["timing_s"]["run"]


def run_kvreplay(wl_path: Path, out: Path) -> float:
    exe = shutil.which("kvreplay") or sys.executable
    cmd = [exe] if exe != sys.executable else [sys.executable, "-m", "kvreplay"]
    t0 = time.perf_counter()
    subprocess.run(cmd + ["simulate", str(wl_path), "-o", str(out)], check=True,
                   capture_output=True, text=True)
    return time.perf_counter() - t0


def compare(a: Path, b: Path) -> tuple[int, int | None, int]:
    """(steps, first differing step or None, max running)."""
    steps, peak = 0, 0
    with a.open() as fa, b.open() as fb:
        for la, lb in zip(fa, fb, strict=True):
            ra, rb = json.loads(la), json.loads(lb)
            for k in COMPARED:
                if ra.get(k) != rb.get(k):
                    return steps, ra["step"], peak
            peak = max(peak, len(ra["running"]))
            steps += 1
    return steps, None, peak


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqs", type=int, nargs="+", default=[64, 128, 256])
    ap.add_argument("--requests-per-seq", type=int, default=6)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    if not oracle.oracle_available("0.33"):
        print("vLLM 0.33 oracle venv missing: python -m tools.oracle.oracle --install --release 0.33")
        return 1
    print(f"{'running':>8} {'requests':>8} {'steps':>6} {'peak run':>8} {'vLLM loop s':>11} "
          f"{'kvreplay s':>10} {'ratio':>6}  trace")
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        for seqs in args.seqs:
            wl = workload(seqs, args.requests_per_seq)
            wl_path = d / f"w{seqs}.json"
            wl_path.write_text(json.dumps(wl))
            tv = min(run_vllm(wl_path, d / f"v{seqs}.jsonl") for _ in range(args.repeat))
            tk = min(run_kvreplay(wl_path, d / f"k{seqs}.jsonl") for _ in range(args.repeat))
            steps, diff, peak = compare(d / f"v{seqs}.jsonl", d / f"k{seqs}.jsonl")
            verdict = "step-equal" if diff is None else f"DIFFERS at step {diff}"
            print(f"{seqs:>8} {len(wl['requests']):>8} {steps:>6} {peak:>8} {tv:>11.2f} "
                  f"{tk:>10.2f} {tv / tk:>5.1f}x  {verdict}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
