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

Two mixes of 1,000,000 lines each: "bench" (the lines above: 1/6 are 1.4 kB JSON-body lines
with 200 token ids, 1/5 are 600-byte Received lines; 438 bytes a line) and "typical" (the
serving phase of a real 0.33 log, tests/data/logcases/p1_poisson_fcfs_200/server.log:
Received / Added / access / stats lines; 256 bytes a line) and "iter" (the same log written
with --enable-logging-iteration-details, server.iter.log: three lines in four are
`Iteration(N)` lines). Per-kind figures use 200,000 lines of one kind each. Each kvreplay
figure is the best of --repeat runs, with the range; `grep -c` runs on the same file in the
same run, its output written to a file (GNU grep stops at the first match when its output is
/dev/null).

    python -m bench.bench_parse [--lines 1000000] [--lark-lines 20000] [--repeat 3] [--mixes bench,typical,iter,kinds]
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
SAMPLE = ROOT / "src" / "kvreplay" / "samples" / "vllm033_fcfs_heavy.reqbody.log"
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


TYPICAL = ROOT / "tests" / "data" / "logcases" / "p1_poisson_fcfs_200" / "server.log"
_TYP_RID = re.compile(r"cmpl-([0-9a-f]+)-(\d+)")
KINDS = {  # per-kind logs: template lines of one kind
    "stats": lambda ln: "Avg prompt throughput" in ln,
    "added": lambda ln: "Added request" in ln,
    "received": lambda ln: "Received request" in ln,
    "json_body": lambda ln: "JSON body" in ln,
    "http_access": lambda ln: ln.startswith("INFO:  "),
    "iteration": lambda ln: "Iteration(" in ln,  # --enable-logging-iteration-details
}
# the per-step lines come from the log case written with --enable-logging-iteration-details
ITER_LOG = ROOT / "tests" / "data" / "logcases" / "p1_poisson_fcfs_200" / "server.iter.log"
NOISE = ["", "INFO:     Started server process [2801]", "Processed prompts:  45%|####5     | 45/100 [00:03<00:04, 12.5it/s]",
         "(APIServer pid=2801) INFO 05-07 10:00:05 [launcher.py:46] Route: /v1/models, Methods: GET"]


def _write_repeated(path: Path, tpl: list[str], n_lines: int, step: int = 1, rid: re.Pattern | None = None) -> None:
    """`tpl` repeated to n_lines, each repetition `step` seconds later (ids made unique by `rid`)."""
    t0 = 1778148000
    written = rep = 0
    with open(path, "w", encoding="utf-8") as f:
        while written < n_lines:
            ts = time.strftime("%m-%d %H:%M:%S", time.gmtime(t0 + rep * step))
            chunk = [_TS.sub(ts, ln) for ln in tpl]
            if rid is not None:
                chunk = [rid.sub(lambda m: f"cmpl-{m.group(1)}-{rep}x{m.group(2)}", ln) for ln in chunk]
            take = min(len(chunk), n_lines - written)
            f.write("\n".join(chunk[:take]) + "\n")
            written += take
            rep += 1


def build_typical(path: Path, n_lines: int, source: Path = TYPICAL) -> None:
    src = source.read_text(encoding="utf-8").splitlines()
    first = next(i for i, ln in enumerate(src) if "Received request" in ln)
    _write_repeated(path, src[first:], n_lines, step=60, rid=_TYP_RID)


def bench_kvreplay(path: Path, repeat: int = 1) -> tuple[float, int, list[float]]:
    """(best seconds, lines, all timings)"""
    from kvreplay.parsers import parse_files

    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        n = 0
        for e in parse_files([str(path)], year=2026):
            n += e.lines
        times.append(time.perf_counter() - t)
    return min(times), n, times


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


def bench_grep(path: Path, repeat: int = 3) -> tuple[float, int]:
    """`grep -c` over the whole file. Its output goes to a regular file: GNU grep stops at the
    first match when its standard output is /dev/null, which would time nothing."""
    el = float("inf")
    out = path.with_suffix(".grep")
    for _ in range(repeat):
        with open(out, "w") as f:
            t = time.perf_counter()
            subprocess.run(["grep", "-c", "Engine 000:", str(path)], stdout=f, check=False)
            el = min(el, time.perf_counter() - t)
        assert int(out.read_text().split()[0]) > 0  # grep read the file (and found the lines)
    out.unlink()
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
try:  # peak RSS of this process image (ru_maxrss would include the parent's pages at fork)
    hwm = next(int(ln.split()[1]) for ln in open("/proc/self/status") if ln.startswith("VmHWM:"))
except (OSError, StopIteration):
    hwm = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(time.perf_counter() - t, hwm)
"""


def bench_jsonl(path: Path, out: Path) -> tuple[float, int]:
    r = subprocess.run([sys.executable, "-c", _CHILD, str(path), str(out)], capture_output=True, text=True, check=True)
    el, rss = r.stdout.split()
    return float(el), int(rss)


def _rng(times: list[float], n: int) -> str:
    return f"{n / max(times):,.0f}-{n / min(times):,.0f}"


def _serving_mix(td: str, name: str, source: Path, what: str, lines: int, repeat: int, jsonl: bool = True) -> None:
    """A serving-phase log repeated to `lines` lines: grep -c and kvreplay in the same run."""
    path = Path(td) / f"{name}.log"
    build_typical(path, lines, source)
    size = path.stat().st_size
    g_el, g_n = bench_grep(path)
    k_el, k_n, k_times = bench_kvreplay(path, repeat)
    assert k_n == g_n == lines, (k_n, g_n)
    k_rate, g_rate = k_n / k_el, g_n / g_el
    print(f"{name} mix: {lines:,} lines, {size / 1e6:.1f} MB, {size / lines:.0f} bytes a line ({what}):")
    print(f"  grep -c            : {g_rate:12,.0f} lines/s  ({g_el:.3f} s)")
    print(f"  kvreplay (events)  : {k_rate:12,.0f} lines/s  ({k_el:.2f} s best of {repeat}; range {_rng(k_times, k_n)} lines/s)")
    if jsonl:
        j_el, j_rss = bench_jsonl(path, Path(td) / f"{name}.jsonl")
        print(f"  kvreplay -> JSONL  : {lines / j_el:12,.0f} lines/s  ({j_el:.2f} s; max RSS {j_rss / 1024:.0f} MiB)")
    print(f"  grep -c / kvreplay : {g_rate / k_rate:8.1f}x   (target <= 30x)")
    path.unlink()


MIXES = ("bench", "typical", "iter", "kinds")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--lark-lines", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-kinds", action="store_true", help="skip the per-kind figures")
    ap.add_argument("--mixes", default=",".join(MIXES), help=f"comma-separated subset of {','.join(MIXES)}")
    args = ap.parse_args()
    mixes = set(args.mixes.split(","))
    if args.no_kinds:
        mixes.discard("kinds")
    if not mixes <= set(MIXES):
        ap.error(f"--mixes: choose from {','.join(MIXES)}")
    with tempfile.TemporaryDirectory() as td:
        if "bench" in mixes:
            log = Path(td) / "big.log"
            build_log(log, args.lines)
            quarter = Path(td) / "quarter.log"
            build_log(quarter, args.lines // 4)
            size = log.stat().st_size
            g_el, g_n = bench_grep(log)
            k_el, k_n, k_times = bench_kvreplay(log, args.repeat)
            assert k_n == g_n == args.lines, (k_n, g_n)
            l_el, l_n = bench_lark(log, args.lark_lines)
            j_el, j_rss = bench_jsonl(log, Path(td) / "out.jsonl")
            jq_el, jq_rss = bench_jsonl(quarter, Path(td) / "q.jsonl")
            jsonl_mb = (Path(td) / "out.jsonl").stat().st_size / 1e6
            k_rate, l_rate, g_rate = k_n / k_el, l_n / l_el, g_n / g_el
            print(f"bench mix: {args.lines:,} lines, {size / 1e6:.1f} MB, {size / args.lines:.0f} bytes a line (repeated real lines, rising times and ids):")
            print(f"  grep -c            : {g_rate:12,.0f} lines/s  ({g_el:.3f} s)")
            print(f"  kvreplay (events)  : {k_rate:12,.0f} lines/s  ({k_el:.2f} s best of {args.repeat}; range {_rng(k_times, k_n)} lines/s)")
            print(f"  kvreplay -> JSONL  : {args.lines / j_el:12,.0f} lines/s  ({j_el:.2f} s, {jsonl_mb:.0f} MB written)")
            print(f"  plain Lark per line: {l_rate:12,.0f} lines/s  (first {l_n:,} lines, {l_el:.2f} s)")
            print(f"  kvreplay / Lark    : {k_rate / l_rate:8.1f}x   (target >= 10x)")
            print(f"  grep -c / kvreplay : {g_rate / k_rate:8.1f}x   (target <= 30x)")
            print(f"  max RSS streaming to JSONL: {j_rss / 1024:.0f} MiB for {args.lines:,} lines, {jq_rss / 1024:.0f} MiB for {args.lines // 4:,} lines")
            for p in (log, quarter):
                p.unlink()
        if "typical" in mixes:
            _serving_mix(td, "typical", TYPICAL, "serving phase of a real 0.33 log, repeated", args.lines, args.repeat)
        if "iter" in mixes:
            _serving_mix(td, "iter", ITER_LOG, "the same log written with --enable-logging-iteration-details, repeated",
                         args.lines, args.repeat)
        if "kinds" in mixes:
            print("per kind (200,000 lines each):")
            tpl = template_lines() + [ln for ln in ITER_LOG.read_text().splitlines() if "Iteration(" in ln][:500]
            for name, pred in [*KINDS.items(), ("noise", None)]:
                kp = Path(td) / f"{name}.log"
                _write_repeated(kp, NOISE if pred is None else [ln for ln in tpl if pred(ln)], 200_000)
                kg_el, _kg_n = bench_grep(kp) if name != "noise" else (float("nan"), 0)
                el, n, times = bench_kvreplay(kp, args.repeat)
                bpl = kp.stat().st_size / n
                print(f"  {name:12s}: {n / el:10,.0f} lines/s (range {_rng(times, n)}), {bpl:5.0f} bytes a line, grep -c {n / kg_el:12,.0f} lines/s, ratio {el / kg_el:6.1f}x")
                kp.unlink()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
