"""Fuzz kvreplay with mutated real inputs: no traceback, bounded CPU and memory.

    python -m tools.research.fuzz_inputs parse    --n 1000000 [--seconds S] [--seed 1] [--out report.json]
    python -m tools.research.fuzz_inputs commands --n 10000   [--seconds S] [--seed 1] [--out report.json]
    python -m tools.research.fuzz_inputs ... --profile ci      # a quick run (what tests/unit/parsers/test_hardening_fuzz.py runs)

Seeds: the lines of the real corpus (tests/data/corpus), the
samples and the log cases' logs (whatever of these exists). Byte mutators (`mutate`):
bit flips, inserted / deleted / repeated bytes and chunks, spliced lines, numbers replaced
by extremes (0, -1, 2**63, 5,000 digits, 1e309, nan, inf), tokens repeated thousands of
times ('1%|', '(', '[', '"a", '), cuts, CR / ESC / NUL / invalid UTF-8, JSON wrappers, and
for whole files gzip (some corrupted).

`parse`: each input is a document of mutated lines parsed from bytes; it must not raise and
its events must count every physical line. Inputs run in batches in a child process (its
CPU and peak RSS are read from wait4); an input over --max-cpu seconds is reported.
`commands`: each input is a whole mutated log (or workload JSON) run through `replay`,
`audit` and `export` by kvreplay's CLI `main` in a forked child (RLIMIT_CPU 60 s,
RLIMIT_AS --max-rss); the exit code must be 0 or 2 and no traceback may reach stderr.

The report (JSON) gives inputs run, failures (with the input saved under --keep), max CPU
seconds and max RSS of any one input (commands) or batch (parse).
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import random
import resource
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SEED_DIRS = [REPO / "tests" / "data" / "corpus", REPO / "src" / "kvreplay" / "samples"]
SEED_FILES = [REPO / "tests" / "data" / "logcases" / c / f for c in ("b_fcfs_heavy", "f_prefix_caching", "p1_poisson_fcfs_200")
              for f in ("server.log", "server.iter.log", "server.reqbody.log", "server.default.log")]
EXTREMES = [b"0", b"-1", b"9223372036854775808", b"18446744073709551616", b"9" * 5000, b"1e309", b"-1e309", b"nan", b"inf",
            b"-inf", b"1e-400", b"0.0", b"99999999999999999999", b"-0", b"0x10", b"1_000"]
REPEATS = [b"1%|", b"(", b"[", b"{", b'"a", ', b"'", b"\\", b"Engine 000: ", b"] ", b"pid=1) ", b", ", b"a", b"%", b" "]
SPECIAL = [b"\r", b"\x1b[31m", b"\x00", b"\xff\xfe", b"\xc3", b"\t", "\u2028".encode(), b"\n", b"\x85"]


def seed_lines() -> list[bytes]:
    out: list[bytes] = []
    for d in SEED_DIRS:
        if d.is_dir():
            for p in sorted(d.glob("*.log")):
                out += p.read_bytes().splitlines()
    for p in SEED_FILES:
        if p.exists():
            out += p.read_bytes().splitlines()[:400]
    return sorted({s for s in out if s.strip() and len(s) < 20000})


def seed_files() -> list[bytes]:
    out = []
    for d in SEED_DIRS:
        if d.is_dir():
            out += [p.read_bytes() for p in sorted(d.glob("*.log"))]
            out += [p.read_bytes() for p in sorted(d.glob("*.workload.json"))]
    out += [p.read_bytes() for p in SEED_FILES if p.exists()]
    return out


def _number_spans(data: bytes) -> list[tuple[int, int]]:
    import re

    return [m.span() for m in re.finditer(rb"-?\d+(?:\.\d+)?", data)]


def mutate(rng: random.Random, data: bytes, lines: list[bytes] | None = None, rounds: int | None = None) -> bytes:
    """`data` with 1-4 random mutations (see the module docstring)."""
    b = bytearray(data)
    for _ in range(rounds or rng.randint(1, 4)):
        op = rng.randrange(14)
        n = len(b)
        i = rng.randrange(n + 1) if n else 0
        if op == 0 and n:  # bit flip
            j = rng.randrange(n)
            b[j] ^= 1 << rng.randrange(8)
        elif op == 1:  # insert random bytes
            b[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif op == 2 and n:  # delete a chunk
            b[i:i + rng.randint(1, 64)] = b""
        elif op == 3 and n:  # repeat a chunk
            j = min(n, i + rng.randint(1, 40))
            b[i:i] = bytes(b[i:j]) * rng.randint(2, 200)
        elif op == 4:  # a number -> an extreme
            spans = _number_spans(bytes(b))
            if spans:
                s, e = rng.choice(spans)
                b[s:e] = rng.choice(EXTREMES)
        elif op == 5:  # a token many times (backtracking, nesting, int parsing)
            b[i:i] = rng.choice(REPEATS) * rng.choice([10, 300, 3000, 30000])
        elif op == 6 and n:  # cut
            del b[rng.randrange(n):]
        elif op == 7:  # special characters
            b[i:i] = rng.choice(SPECIAL)
        elif op == 8 and lines:  # splice another line in
            b[i:i] = rng.choice(lines)
        elif op == 9 and lines:  # glue another line's tail on
            other = rng.choice(lines)
            b[i:] = other[rng.randrange(len(other) + 1):]
        elif op == 10:  # a JSON-format record around the text
            rec = {"asctime": rng.choice(["2026-05-07 10:00:05,101", 1e300, "0000-01-01 00:00:00", "2026-13-45 99:99:99,1e999", None]),
                   "levelname": rng.choice(["INFO", "WARNING", 3]), "message": bytes(b).decode("utf-8", "replace"),
                   "process": rng.choice([1, 2**70, "x"]), "processName": "EngineCore_DP0"}
            b = bytearray(json.dumps(rec).encode())
        elif op == 11:  # deep nesting
            k = rng.choice([100, 2000, 100000])
            b[i:i] = b"[" * k + b"]" * rng.choice([0, k])
        elif op == 12 and n:  # a date / time field to something odd
            b = bytearray(bytes(b).replace(b"05-07", rng.choice([b"00-00", b"12-31", b"02-30", b"99-99"]), 1))
        elif op == 13 and n:  # swap two halves
            b = b[i:] + b[:i]
    return bytes(b)


def make_doc(rng: random.Random, lines: list[bytes]) -> bytes:
    k = rng.choice([1, 1, 2, 3, 5, 8, 20])
    start = rng.randrange(len(lines))
    picked = [lines[(start + j) % len(lines)] if rng.random() < 0.7 else rng.choice(lines) for j in range(k)]
    picked = [mutate(rng, s, lines) if rng.random() < 0.8 else s for s in picked]
    end = rng.choice([b"\n", b"\n", b"", b"\r\n"])
    return b"\n".join(picked) + end


# ------------------------------------------------------------------ parse


def _parse_batch(docs: list[bytes], max_cpu: float) -> dict:
    """Run in a child: parse each doc; per-input CPU and failures."""
    from kvreplay.parsers import pipeline

    worst, fails, slow = 0.0, [], []
    for k, data in enumerate(docs):
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        try:
            stream = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", errors="replace", newline="\n")
            evs = list(pipeline.parse_stream(stream, "fuzz", pipeline.Clock(year=2026)))
            phys = data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)
            if sum(e.lines for e in evs) != phys:
                fails.append((k, f"lines {sum(e.lines for e in evs)} != {phys}"))
            for e in evs:  # every event must encode (the JSON Lines output)
                import msgspec

                msgspec.json.encode(e)
        except BaseException as exc:  # noqa: BLE001
            import traceback

            fails.append((k, "".join(traceback.format_exception(exc))[-1500:]))
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
        worst = max(worst, cpu)
        if cpu > max_cpu:
            slow.append((k, cpu))
    return {"worst_cpu": worst, "fails": fails, "slow": slow}


def _in_child(fn, *args, cpu_limit: int = 600, as_limit: int | None = None) -> tuple[dict | None, float, int, int]:
    """fn(*args) in a forked child: (its JSON result or None, CPU s, peak RSS KiB, status)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(r)
        code = 0
        try:
            resource.setrlimit(resource.RLIMIT_CPU, (cpu_limit, cpu_limit + 5))
            if as_limit:
                resource.setrlimit(resource.RLIMIT_AS, (as_limit, as_limit))
            out = json.dumps(fn(*args)).encode()
            with os.fdopen(w, "wb") as f:
                f.write(out)
        except BaseException:  # noqa: BLE001
            code = 3
        os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    _, status, ru = os.wait4(pid, 0)
    res = json.loads(data) if data else None
    return res, ru.ru_utime + ru.ru_stime, ru.ru_maxrss, status


def run_parse(n: int, seed: int, seconds: float, batch: int, max_cpu: float, keep: Path | None, log=print) -> dict:
    lines = seed_lines()
    from kvreplay.parsers import grammar, pipeline  # noqa: F401  (imported once, shared by the forks)

    grammar.messages_parser()  # (built once here, not in every child: cut-line recovery uses it)

    rng = random.Random(seed)
    t0 = time.time()
    done = 0
    rep = {"mode": "parse", "seed": seed, "inputs": 0, "failures": 0, "slow": 0, "max_cpu_s_input": 0.0,
           "max_cpu_s_batch": 0.0, "max_rss_kb_batch": 0, "batch": batch, "seed_lines": len(lines), "examples": []}
    while done < n and time.time() - t0 < seconds:
        docs = [make_doc(rng, lines) for _ in range(min(batch, n - done))]
        res, cpu, rss, status = _in_child(_parse_batch, docs, max_cpu)
        rep["max_cpu_s_batch"] = max(rep["max_cpu_s_batch"], cpu)
        rep["max_rss_kb_batch"] = max(rep["max_rss_kb_batch"], rss)
        if res is None:
            rep["failures"] += 1
            rep["examples"].append({"batch_status": status})
            _keep(keep, f"batch-{done}", b"\n\0\n".join(docs))
        else:
            rep["max_cpu_s_input"] = max(rep["max_cpu_s_input"], res["worst_cpu"])
            rep["failures"] += len(res["fails"])
            rep["slow"] += len(res["slow"])
            for k, why in res["fails"][:3] + [(k, f"slow: {c:.2f} s") for k, c in res["slow"][:3]]:
                if len(rep["examples"]) < 30:
                    rep["examples"].append({"why": why[-600:], "input": docs[k][:300].decode("utf-8", "replace")})
                    _keep(keep, f"parse-{done + k}", docs[k])
        done += len(docs)
        rep["inputs"] = done
        if done % (batch * 4) == 0:
            log(f"parse: {done} inputs, {rep['failures']} failures, {rep['slow']} slow, max input CPU "
                f"{rep['max_cpu_s_input']:.2f} s, max batch RSS {rep['max_rss_kb_batch'] // 1024} MiB, {time.time() - t0:.0f} s")
    rep["seconds"] = round(time.time() - t0, 1)
    return rep


# ------------------------------------------------------------------ replay / audit / export


def _run_cli(argv: list[str]) -> dict:
    import contextlib

    from kvreplay.cli import main

    os.environ["KVREPLAY_PROGRESS"] = "0"  # (no heartbeat thread: it may not start under RLIMIT_AS)
    err = io.StringIO()
    out = io.StringIO()
    code = None
    tb = None
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 2
        except BaseException as exc:  # noqa: BLE001
            import traceback

            tb = "".join(traceback.format_exception(exc))[-2000:]
    text = err.getvalue()
    if tb is None and "Traceback (most recent call last)" in text:
        tb = text[-2000:]
    return {"code": code, "traceback": tb, "stderr": text[-300:]}


def run_commands(n: int, seed: int, seconds: float, max_rss_mb: int, keep: Path | None, tmp: Path, log=print) -> dict:
    files = seed_files()
    lines = seed_lines()
    import kvreplay.cli  # noqa: F401  (imported once, shared by the forks)
    import kvreplay.inference.driver  # noqa: F401
    import kvreplay.audit.record  # noqa: F401
    from kvreplay.parsers import grammar

    grammar.messages_parser()

    rng = random.Random(seed)
    t0 = time.time()
    rep = {"mode": "commands", "seed": seed, "inputs": 0, "runs": 0, "failures": 0, "max_cpu_s": 0.0, "max_rss_kb": 0,
           "exit_codes": {}, "seed_files": len(files), "examples": []}
    tmp.mkdir(parents=True, exist_ok=True)
    i = 0
    while i < n and time.time() - t0 < seconds:
        base = rng.choice(files)
        is_json = base.lstrip().startswith(b"{")
        data = mutate(rng, base, lines, rounds=rng.randint(1, 6))
        if not is_json and rng.random() < 0.5:  # mutate some lines in place as well
            ls = data.split(b"\n")
            for _ in range(rng.randint(1, 10)):
                j = rng.randrange(len(ls))
                ls[j] = mutate(rng, ls[j], lines)
            data = b"\n".join(ls)
        suffix = ".workload.json" if is_json else ".log"
        if not is_json and rng.random() < 0.15:
            data = gzip.compress(data, mtime=0)
            if rng.random() < 0.5:
                data = mutate(rng, data, None, rounds=1)
            suffix += ".gz"
        p = tmp / f"in{suffix}"
        p.write_bytes(data)
        cmd = rng.choice([["replay", str(p), "--year", "2026"], ["audit", str(p), "--year", "2026", "--format", "json"],
                          ["export", str(p), "--year", "2026", "--chrome", str(tmp / "o.json")],
                          ["audit", str(p), "--year", "2026", "--fail-on", "recompute_ratio > 0.5 or status == 'x'"]])
        res, cpu, rss, status = _in_child(_run_cli, cmd, cpu_limit=60, as_limit=max_rss_mb << 20)
        rep["runs"] += 1
        rep["max_cpu_s"] = max(rep["max_cpu_s"], cpu)
        rep["max_rss_kb"] = max(rep["max_rss_kb"], rss)
        code = None if res is None else res["code"]
        rep["exit_codes"][str(code)] = rep["exit_codes"].get(str(code), 0) + 1
        bad = res is None or res["traceback"] or code not in (0, 1, 2) or (code == 1 and cmd[0] != "audit")
        if bad:
            rep["failures"] += 1
            if len(rep["examples"]) < 30:
                rep["examples"].append({"cmd": cmd[0], "status": status, "cpu": cpu, "rss_kb": rss,
                                        "why": (res or {}).get("traceback") or (res or {}).get("stderr") or f"child status {status}"})
            _keep(keep, f"cmd-{i}-{cmd[0]}{suffix}", data)
        i += 1
        rep["inputs"] = i
        if i % 50 == 0:
            log(f"commands: {i} inputs, {rep['failures']} failures, max CPU {rep['max_cpu_s']:.1f} s, "
                f"max RSS {rep['max_rss_kb'] // 1024} MiB, {time.time() - t0:.0f} s")
    rep["seconds"] = round(time.time() - t0, 1)
    return rep


def _keep(keep: Path | None, name: str, data: bytes) -> None:
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        (keep / name.replace("/", "_")).write_bytes(data)


PROFILES = {"ci": {"parse": 2000, "commands": 12}, "long": {"parse": 1_000_000, "commands": 10_000}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=("parse", "commands"))
    ap.add_argument("--profile", choices=sorted(PROFILES), default="ci")
    ap.add_argument("--n", type=int, help="inputs (default: the profile's)")
    ap.add_argument("--seconds", type=float, default=float("inf"), help="stop after this wall time")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--batch", type=int, default=500, help="parse inputs per child process")
    ap.add_argument("--max-cpu", type=float, default=5.0, help="parse: an input over this many CPU seconds is reported")
    ap.add_argument("--max-rss-mb", type=int, default=2048, help="commands: address-space limit per run")
    ap.add_argument("--keep", type=Path, help="save failing inputs here")
    ap.add_argument("--out", type=Path, help="write the report (JSON) here")
    a = ap.parse_args(argv)
    n = a.n or PROFILES[a.profile][a.mode]
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    if a.mode == "parse":
        rep = run_parse(n, a.seed, a.seconds, a.batch, a.max_cpu, a.keep, log)
    else:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="kvreplay-fuzz-") as d:
            rep = run_commands(n, a.seed, a.seconds, a.max_rss_mb, a.keep, Path(d), log)
    text = json.dumps(rep, indent=1)
    if a.out:
        a.out.write_text(text + "\n")
    print(text)
    return 1 if rep["failures"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
