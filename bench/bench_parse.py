"""Benchmark `kvreplay parse` on a >= 1,000,000-line vLLM log.

Builds the log in a temp dir by repeating real lines (the serving phase of the embedded
vLLM 0.33 sample plus stats / request / preemption lines of the real corpus) with rising
time stamps and request ids, then prints lines/s for:

  * kvreplay (fast matchers + builders -> typed events), and streaming to JSON Lines
  * plain Lark LALR per line (envelope.lark + messages.lark, every line through Lark),
    timed on the first --lark-lines lines of the same file (it is ~100x slower)
  * `grep -c` over the same file, in the same run

and the ratios. Peak memory (max RSS) of a child process streaming the whole file to JSONL
is printed for the full file and for a quarter of it: flat memory means equal figures.

    python bench/bench_parse.py [--lines 1000000] [--lark-lines 20000]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "samples" / "vllm033_fcfs_heavy.reqbody.log"
CORPUS = ROOT / "tests" / "data" / "corpus"
EXTRA = [  # real lines from the corpus (verbatim), one of each interesting kind
    ("05-v050-tqdm-interleaved-swap-preemption.log", 2),
    ("09-v063-swap-preemption-chat-ids.log", 1),
    ("11-v064-received-request-chatcmpl-health.log", 1),
    ("27-v014-dp8-waiting-skew.log", 1),
    ("33-v02x-specdecode-uvicorn-interleaved.log", 3),
]
_TS = re.compile(r"\b\d\d-\d\d \d\d:\d\d:\d\d\b")
_RID = re.compile(r"cmpl-bench-78064ebc-(\d+)-0")


def template_lines() -> list[str]:
    lines = SAMPLE.read_text(encoding="utf-8").splitlines()
    serve = [ln for ln in lines if "Route:" not in ln][40:]  # the serving phase
    for name, n in EXTRA:
        serve.append((CORPUS / name).read_text(encoding="utf-8").splitlines()[n - 1])
    return serve


def build_log(path: Path, n_lines: int) -> None:
    tpl = template_lines()
    t0 = 1778148000  # 2026-05-07 10:00:00
    written = 0
    rep = 0
    with open(path, "w", encoding="utf-8") as f:
        while written < n_lines:
            ts = time.strftime("%m-%d %H:%M:%S", time.gmtime(t0 + rep))
            base = rep * 100
            chunk = []
            for ln in tpl:
                ln = _TS.sub(ts, ln)
                ln = _RID.sub(lambda m: f"cmpl-bench-{base + int(m.group(1))}-0", ln)
                chunk.append(ln)
            take = min(len(chunk), n_lines - written)
            f.write("\n".join(chunk[:take]) + "\n")
            written += take
            rep += 1


def bench_kvreplay(path: Path) -> tuple[float, int]:
    from kvreplay.parsers import parse_files

    t = time.perf_counter()
    n = 0
    for e in parse_files([str(path)], year=2026):
        n += e.lines
    return time.perf_counter() - t, n


def bench_lark(path: Path, limit: int) -> tuple[float, int]:
    import io
    from itertools import islice

    from kvreplay.parsers import grammar, pipeline

    grammar.envelope_parser(), grammar.messages_parser()  # build outside the timing
    with open(path, encoding="utf-8") as f:
        head = "".join(islice(f, limit))
    t = time.perf_counter()
    n = sum(e.lines for e in pipeline.parse_stream(io.StringIO(head, newline="\n"), "x", pipeline.Clock(year=2026), lark=True))
    return time.perf_counter() - t, n


def bench_grep(path: Path) -> tuple[float, int]:
    t = time.perf_counter()
    r = subprocess.run(["grep", "-c", "Engine 000:", str(path)], capture_output=True, text=True)
    el = time.perf_counter() - t
    lines = int(subprocess.run(["wc", "-l", str(path)], capture_output=True, text=True).stdout.split()[0])
    return el, lines


_CHILD = """
import resource, sys, time
from kvreplay.events import iter_encode_jsonl
from kvreplay.parsers import parse_files
t = time.perf_counter()
with open(sys.argv[2], "wb") as out:
    for chunk in iter_encode_jsonl(parse_files([sys.argv[1]], year=2026)):
        out.write(chunk)
print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def bench_jsonl(path: Path, out: Path) -> tuple[float, int]:
    r = subprocess.run([sys.executable, "-c", _CHILD, str(path), str(out)], capture_output=True, text=True, check=True)
    el, rss = r.stdout.split()
    return float(el), int(rss)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--lark-lines", type=int, default=20_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as td:
        log = Path(td) / "big.log"
        build_log(log, args.lines)
        quarter = Path(td) / "quarter.log"
        build_log(quarter, args.lines // 4)
        size = log.stat().st_size
        print(f"log: {args.lines:,} lines, {size / 1e6:.1f} MB (repeated real lines, rising times and ids)")

        g_el, g_n = bench_grep(log)
        k_el, k_n = bench_kvreplay(log)
        assert k_n == g_n == args.lines, (k_n, g_n)
        l_el, l_n = bench_lark(log, args.lark_lines)
        j_el, j_rss = bench_jsonl(log, Path(td) / "out.jsonl")
        jq_el, jq_rss = bench_jsonl(quarter, Path(td) / "q.jsonl")
        jsonl_mb = (Path(td) / "out.jsonl").stat().st_size / 1e6

    k_rate, l_rate, g_rate = k_n / k_el, l_n / l_el, g_n / g_el
    print(f"grep -c            : {g_rate:12,.0f} lines/s  ({g_el:.3f} s)")
    print(f"kvreplay (events)  : {k_rate:12,.0f} lines/s  ({k_el:.2f} s)")
    print(f"kvreplay -> JSONL  : {args.lines / j_el:12,.0f} lines/s  ({j_el:.2f} s, {jsonl_mb:.0f} MB written)")
    print(f"plain Lark per line: {l_rate:12,.0f} lines/s  (first {l_n:,} lines, {l_el:.2f} s)")
    print(f"kvreplay / Lark    : {k_rate / l_rate:8.1f}x   (target >= 10x)")
    print(f"grep -c / kvreplay : {g_rate / k_rate:8.1f}x   (target <= 30x)")
    print(f"max RSS streaming to JSONL: {j_rss / 1024:.0f} MiB for {args.lines:,} lines, {jq_rss / 1024:.0f} MiB for {args.lines // 4:,} lines")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
