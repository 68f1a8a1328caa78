#!/usr/bin/env python3
"""Peak memory per log line: a log of N identical stats lines (a default log, no request
line) through each stage, each in its own process.

    python -m bench.bench_parse_memory [--lines 200000] [--stages parse,facts,replay,audit] [--src DIR]

The log: the startup lines of the embedded vLLM 0.33 sample, then one of its stats lines N
times (one time stamp). Stages: `kvreplay parse --format summary` (streams), the events and
facts held in memory (`read_log(...).facts`), `kvreplay replay --format json -o FILE` (the
default-log answer) and `kvreplay audit`. Each runs on N and on N/4 lines; the memory per
line is the difference over the 3N/4 lines between them. Baseline, in the same run: a
process that imports kvreplay and parses the startup lines only; each peak is printed with
its ratio to it, with its wall and CPU (user + system) seconds. `--src DIR`: run another source tree (e.g. `git archive` of an older
commit, extracted) on the same inputs, for a before/after.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "src" / "kvreplay" / "samples" / "vllm033_fcfs_heavy.log"
PEAK = ("import resource, subprocess, sys, time; t = time.perf_counter(); "
        "rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode; "
        "u = resource.getrusage(resource.RUSAGE_CHILDREN); "
        "print(time.perf_counter() - t, u.ru_maxrss, rc, u.ru_utime + u.ru_stime)")
FACTS = "import sys; from kvreplay.sources import read_log; read_log([sys.argv[1]]).facts"


def write_log(path: str, n: int) -> None:
    lines = SAMPLE.read_text(encoding="utf-8").splitlines()
    head = lines[:20]  # startup: banner, config, KV cache size
    stats = next(s for s in lines if "Avg prompt throughput" in s)
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(head) + "\n")
        block = (stats + "\n") * 1000
        for _ in range(n // 1000):
            f.write(block)
        f.write((stats + "\n") * (n % 1000))


def peak(cmd: list[str], env: dict[str, str]) -> tuple[float, int, float]:
    """(seconds, peak RSS in KiB, CPU seconds: user + system) of one command, in a process
    of its own."""
    out = subprocess.run([sys.executable, "-c", PEAK, *cmd], capture_output=True, text=True,
                         check=True, env=env).stdout.split()
    if out[2] != "0":
        raise SystemExit(f"{' '.join(cmd)} exited {out[2]}")
    return float(out[0]), int(out[1]), float(out[3])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=200_000)
    ap.add_argument("--stages", default="parse,facts,replay")
    ap.add_argument("--src", help="source tree to run (its src/ goes first on PYTHONPATH)")
    args = ap.parse_args()
    env = dict(os.environ, KVREPLAY_PROGRESS="0")
    if args.src:
        env["PYTHONPATH"] = str(Path(args.src).resolve() / "src")
    py = sys.executable
    stages = {
        "parse": lambda p, d: [py, "-m", "kvreplay", "parse", p, "--format", "summary"],
        "facts": lambda p, d: [py, "-c", FACTS, p],
        "replay": lambda p, d: [py, "-m", "kvreplay", "replay", p, "--format", "json",
                                "-o", os.path.join(d, "replay.json")],
        "audit": lambda p, d: [py, "-m", "kvreplay", "audit", p, "-j", "1",
                               "-o", os.path.join(d, "audit.txt")],
    }
    with tempfile.TemporaryDirectory() as d:
        big, small, head = (os.path.join(d, f) for f in ("big.log", "small.log", "head.log"))
        write_log(big, args.lines)
        write_log(small, args.lines // 4)
        write_log(head, 0)
        _, base_kb, _ = peak(stages["facts"](head, d), env)
        print(f"{args.lines:,} identical stats lines ({os.path.getsize(big) / 2**20:.0f} MiB)"
              f"{' from ' + args.src if args.src else ''}")
        print(f"baseline (import, parse the startup lines): {base_kb / 1024:.0f} MiB")
        for name in args.stages.split(","):
            s_small, kb_small, c_small = peak(stages[name](small, d), env)
            s_big, kb_big, c_big = peak(stages[name](big, d), env)
            per = (kb_big - kb_small) * 1024 / (args.lines - args.lines // 4)
            print(f"{name:7s} {kb_big / 1024:7.0f} MiB peak ({kb_big / base_kb:5.1f}x the baseline), "
                  f"{per:6.0f} B per line; {s_big:6.1f} s, {c_big:6.1f} s CPU (N/4 lines: "
                  f"{kb_small / 1024:.0f} MiB, {s_small:.1f} s, {c_small:.1f} s CPU)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
