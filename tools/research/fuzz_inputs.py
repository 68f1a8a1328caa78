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
its events must count every physical line. Inputs run in batches (--batch, 500) in a forked
child under RLIMIT_AS (--max-rss-mb) and RLIMIT_CPU; each input has its own CPU limit
(--max-cpu, 5 s: an ITIMER_PROF timer stops it, a failure). A batch that dies (a pattern
stuck inside one C call, a crash) is run again input by input.
`commands`: each input is a small mutated log (a large seed is cut to its first 40-400
lines; some gzipped, some corrupt) or workload JSON, run through `replay` (mostly
`--samples 0`, some with the ensemble), `audit` or `export` by kvreplay's CLI `main()`,
--batch (20) inputs per forked child, each under its own CPU limit (--max-cpu, 60 s) and
the child under RLIMIT_AS; a share (--subprocess, 2%) runs as `python -m kvreplay` in a
process of its own (the real console path). The exit code must be 0 or 2 (1: a tripped
audit gate) and no traceback may reach stderr.

Every failure is saved under --keep (the input, and beside it `.why.txt`: the command and
the traceback or limit). The report (JSON) gives inputs run, failures, the largest CPU
seconds of any one input and the largest peak RSS of any child (a batch's peak bounds each
of its inputs'), the exit codes and what refused the inputs that exited 2. Two runs with
different --seed values use two cores.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import random
import resource
import signal
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
            b[i:i] = rng.choice(REPEATS) * rng.choices([10, 300, 3000, 30000], [4, 3, 2, 1])[0]
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
            k = rng.choices([100, 2000, 100000], [4, 2, 1])[0]
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


# ------------------------------------------------------------------ limits in a child


class CpuLimit(BaseException):
    """Raised in a fuzz child when one input has used its CPU seconds (ITIMER_PROF)."""


def _on_prof(signum, frame):  # noqa: ARG001
    raise CpuLimit


def _cpu_now() -> float:
    """CPU seconds of this process and its waited-for children (an ensemble's pool)."""
    a = resource.getrusage(resource.RUSAGE_SELF)
    b = resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def _limited(fn, limit: float, *args) -> tuple[object, str | None, float]:
    """fn(*args) with at most `limit` CPU seconds: (its value, why it failed or None, CPU s).
    The timer interrupts Python code; a pattern stuck inside one C call is caught by the
    child's RLIMIT_CPU instead (the batch dies and its inputs are run again one by one)."""
    import traceback

    value, why = None, None
    t0 = _cpu_now()
    try:
        signal.setitimer(signal.ITIMER_PROF, limit)
        try:
            value = fn(*args)
        finally:
            signal.setitimer(signal.ITIMER_PROF, 0)
    except CpuLimit:
        why = f"over {limit:g} s CPU"
    except BaseException as exc:  # noqa: BLE001
        why = "".join(traceback.format_exception(exc))[-2000:]
    cpu = _cpu_now() - t0
    if why is None and cpu > limit:
        why = f"over {limit:g} s CPU ({cpu:.1f} s)"
    return value, why, cpu


def _in_child(fn, *args, cpu_limit: int = 600, as_limit: int | None = None) -> tuple[object, float, int, int]:
    """fn(*args) in a forked child: (its JSON result or None, CPU s, peak RSS KiB, status)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.close(r)
        code = 0
        try:
            resource.setrlimit(resource.RLIMIT_CPU, (cpu_limit, cpu_limit + 5))
            if as_limit:
                resource.setrlimit(resource.RLIMIT_AS, (as_limit, as_limit))
            signal.signal(signal.SIGPROF, _on_prof)
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
    res = json.loads(data) if data and status == 0 else None
    return res, ru.ru_utime + ru.ru_stime, ru.ru_maxrss, status


def _keep(keep: Path | None, name: str, data: bytes, note: str = "") -> None:
    """Save a failing input (and, beside it, how it failed and how to run it again)."""
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        (keep / name.replace("/", "_")).write_bytes(data)
        if note:
            (keep / (name.replace("/", "_") + ".why.txt")).write_text(note)


# ------------------------------------------------------------------ parse


def parse_one(data: bytes) -> str | None:
    """Parse `data` as a log file: why it failed (a miscount of lines, an event that does
    not encode), or None. Exceptions propagate."""
    import msgspec

    from kvreplay.parsers import pipeline

    stream = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", errors="replace", newline="\n")
    evs = list(pipeline.parse_stream(stream, "fuzz", pipeline.Clock(year=2026)))
    phys = data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)
    if sum(e.lines for e in evs) != phys:
        return f"lines {sum(e.lines for e in evs)} != {phys}"
    enc = msgspec.json.Encoder()
    for e in evs:  # every event must encode (the JSON Lines output)
        enc.encode(e)
    return None


def _parse_batch(docs: list[bytes], max_cpu: float) -> dict:
    """Run in a child: parse each doc under its CPU limit; the worst CPU and the failures."""
    worst, fails = 0.0, []
    for k, data in enumerate(docs):
        bad, why, cpu = _limited(parse_one, max_cpu, data)
        worst = max(worst, cpu)
        if why or bad:
            fails.append((k, why or bad, cpu))
    return {"worst_cpu": worst, "fails": fails}


def run_parse(n: int, seed: int, seconds: float, batch: int, max_cpu: float, max_rss_mb: int, keep: Path | None,
              log=print) -> dict:
    lines = seed_lines()
    from kvreplay.parsers import grammar, pipeline  # noqa: F401  (imported once, shared by the forks)

    grammar.messages_parser()  # (built once here, not in every child: cut-line recovery uses it)

    rng = random.Random(seed)
    t0 = time.time()
    done = 0
    rep = {"mode": "parse", "seed": seed, "inputs": 0, "failures": 0, "slow": 0, "max_cpu_s_input": 0.0,
           "max_cpu_s_batch": 0.0, "max_rss_kb_batch": 0, "batches_rerun": 0, "batch": batch, "max_cpu": max_cpu,
           "max_rss_mb": max_rss_mb, "seed_lines": len(lines), "examples": []}

    def record(k: int, why: str, cpu: float, data: bytes) -> None:
        rep["failures"] += 1
        rep["slow"] += why.startswith("over ")
        if len(rep["examples"]) < 30:
            rep["examples"].append({"input": done + k, "why": why[-600:], "cpu": round(cpu, 2),
                                    "head": data[:300].decode("utf-8", "replace")})
        _keep(keep, f"parse-s{seed}-{done + k}.log", data, why)

    while done < n and time.time() - t0 < seconds and not _STOP:
        docs = [make_doc(rng, lines) for _ in range(min(batch, n - done))]
        res, cpu, rss, status = _in_child(_parse_batch, docs, max_cpu, as_limit=max_rss_mb << 20)
        rep["max_cpu_s_batch"] = max(rep["max_cpu_s_batch"], cpu)
        rep["max_rss_kb_batch"] = max(rep["max_rss_kb_batch"], rss)
        if res is None:  # the batch died (RLIMIT_CPU inside C code, a crash): each input alone
            rep["batches_rerun"] += 1
            for k, d in enumerate(docs):
                r1, c1, rss1, st1 = _in_child(_parse_batch, [d], max_cpu, cpu_limit=int(max_cpu) + 1,
                                              as_limit=max_rss_mb << 20)
                if r1 is None:
                    record(k, f"over {max_cpu:g} s CPU or died (status {st1}, {c1:.1f} s, {rss1 // 1024} MiB)", c1, d)
                elif r1["fails"]:
                    record(k, r1["fails"][0][1], r1["fails"][0][2], d)
                rep["max_cpu_s_input"] = max(rep["max_cpu_s_input"], c1)
        else:
            rep["max_cpu_s_input"] = max(rep["max_cpu_s_input"], res["worst_cpu"])
            for k, why, c in res["fails"]:
                record(k, why, c, docs[k])
        done += len(docs)
        rep["inputs"] = done
        if done % (batch * 20) == 0 or done >= n:
            log(f"parse: {done} inputs, {rep['failures']} failures, {rep['slow']} slow, max input CPU "
                f"{rep['max_cpu_s_input']:.2f} s, max batch RSS {rep['max_rss_kb_batch'] // 1024} MiB, {time.time() - t0:.0f} s")
    rep["seconds"] = round(time.time() - t0, 1)
    return rep


# ------------------------------------------------------------------ replay / audit / export


def _run_cli(argv: list[str]) -> dict:
    """kvreplay's CLI main(argv) in this process: its exit code, a traceback that escaped it
    or reached stderr, and the tail of stderr."""
    import contextlib

    from kvreplay.cli import main

    err = io.StringIO()
    out = io.StringIO()
    code = None
    tb = None
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 2
    text = err.getvalue()
    if "Traceback (most recent call last)" in text:
        tb = text[-2000:]
    return {"code": code, "traceback": tb, "stderr": text[-300:]}


def _commands_batch(argvs: list[list[str]], max_cpu: float) -> list[dict]:
    """Run in a child: each argv through main() under its CPU limit."""
    import gc

    out = []
    for argv in argvs:
        res, why, cpu = _limited(_run_cli, max_cpu, argv)
        res = dict(res or {"code": None, "traceback": None, "stderr": ""})
        res["cpu"] = cpu
        if why:
            res["traceback"] = why
        out.append(res)
        gc.collect()
    return out


def _subprocess_cli(argv: list[str], max_cpu: float, max_rss_mb: int) -> tuple[dict, float, int]:
    """The real console path: `python -m kvreplay ARGV` in its own process under RLIMIT_CPU and
    RLIMIT_AS: (result as _run_cli's, CPU s, peak RSS KiB)."""
    import subprocess
    import tempfile

    def limits() -> None:
        resource.setrlimit(resource.RLIMIT_CPU, (int(max_cpu), int(max_cpu) + 5))
        resource.setrlimit(resource.RLIMIT_AS, (max_rss_mb << 20, max_rss_mb << 20))

    with tempfile.TemporaryFile() as err:
        p = subprocess.Popen([sys.executable, "-m", "kvreplay", *argv], stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=err, preexec_fn=limits)
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        text = err.read().decode("utf-8", "replace")
    code = p.returncode if p.returncode >= 0 else None
    tb = text[-2000:] if "Traceback (most recent call last)" in text or code is None else None
    return {"code": code, "traceback": tb, "stderr": text[-300:]}, ru.ru_utime + ru.ru_stime, ru.ru_maxrss


# the commands a mutated input runs through, with their weights: mostly without the ensemble
# (`--samples 0`), some with it (replay's small ensemble, audit's default)
COMMANDS: list[tuple[int, list[str]]] = [
    (30, ["replay", "{p}", "--year", "2026", "--samples", "0"]),
    (8, ["replay", "{p}", "--year", "2026", "--samples", "4", "--format", "json", "-o", "{o}.json"]),
    (4, ["replay", "{p}", "--year", "2026"]),
    (12, ["audit", "{p}", "--year", "2026", "--format", "json", "-j", "1"]),
    (10, ["audit", "{p}", "--year", "2026", "--no-replay", "-j", "1"]),
    (8, ["audit", "{p}", "--year", "2026", "-j", "1", "--fail-on", "recompute_ratio > 0.5 or status == 'x'"]),
    (14, ["export", "{p}", "--year", "2026", "--chrome", "{o}.json"]),
    (8, ["export", "{p}", "--year", "2026", "--perfetto", "{o}.pftrace"]),
    (6, ["replay", "{p}", "--samples", "0", "--format", "json"]),  # the year from the file's mtime
]


def command_input(rng: random.Random, files: list[bytes], lines: list[bytes]) -> tuple[bytes, str]:
    """A mutated log (cut to a small size; some gzipped, some corrupt) or workload: (bytes, suffix)."""
    base = rng.choice(files)
    is_json = base.lstrip().startswith(b"{")
    if not is_json and len(base) > 60_000:  # small inputs: a slice of a large log, from its start
        ls = base.split(b"\n")
        base = b"\n".join(ls[:rng.choice([40, 150, 400])]) + b"\n"
    data = mutate(rng, base, lines, rounds=rng.randint(1, 3))
    if not is_json and rng.random() < 0.5:  # mutate some lines in place as well
        ls = data.split(b"\n")
        for _ in range(rng.randint(1, 10)):
            j = rng.randrange(len(ls))
            ls[j] = mutate(rng, ls[j], lines)
        data = b"\n".join(ls)
    suffix = ".workload.json" if is_json else ".log"
    if not is_json and rng.random() < 0.15:
        data = gzip.compress(data, compresslevel=1, mtime=0)
        if rng.random() < 0.5:
            data = mutate(rng, data, None, rounds=1)
        suffix += ".gz"
    return data, suffix


def _pick(rng: random.Random) -> list[str]:
    x = rng.randrange(sum(w for w, _ in COMMANDS))
    for w, argv in COMMANDS:
        if x < w:
            return argv
        x -= w
    raise AssertionError


def run_commands(n: int, seed: int, seconds: float, batch: int, max_cpu: float, max_rss_mb: int, share_subprocess: float,
                 keep: Path | None, tmp: Path, log=print) -> dict:
    files = seed_files()
    lines = seed_lines()
    os.environ["KVREPLAY_PROGRESS"] = "0"  # (no heartbeat thread: it may not start under RLIMIT_AS)
    import kvreplay.audit.record  # noqa: F401  (imported once, shared by the forks)
    import kvreplay.cli  # noqa: F401
    import kvreplay.inference.driver  # noqa: F401
    from kvreplay.parsers import grammar

    grammar.messages_parser()

    rng = random.Random(seed)
    t0 = time.time()
    rep = {"mode": "commands", "seed": seed, "inputs": 0, "in_process": 0, "subprocess": 0, "failures": 0,
           "max_cpu_s": 0.0, "max_rss_kb_batch": 0, "max_rss_kb_subprocess": 0, "batches_rerun": 0, "batch": batch,
           "max_cpu": max_cpu, "max_rss_mb": max_rss_mb, "exit_codes": {}, "commands": {}, "cpu_s_by_command": {}, "refusals": {}, "seed_files": len(files),
           "examples": []}
    tmp.mkdir(parents=True, exist_ok=True)
    i = 0

    def judge(k: int, argv: list[str], res: dict, cpu: float, data: bytes, suffix: str) -> None:
        rep["max_cpu_s"] = max(rep["max_cpu_s"], cpu)
        code = res.get("code")
        rep["exit_codes"][str(code)] = rep["exit_codes"].get(str(code), 0) + 1
        key = " ".join(a for a in argv[:1] + [a for a in argv if a in ("--samples", "--no-replay", "--fail-on",
                                                                          "--chrome", "--perfetto")])
        rep["commands"][key] = rep["commands"].get(key, 0) + 1
        rep["cpu_s_by_command"][key] = round(rep["cpu_s_by_command"].get(key, 0.0) + cpu, 2)
        if code == 2:  # what refused the input (the message's words, no paths or numbers)
            import re

            msg = re.sub(r"\S*/\S*|\d+", "#", (res.get("stderr") or "").strip().split(": error: ")[-1])[:60]
            rep["refusals"][msg] = rep["refusals"].get(msg, 0) + 1
        why = res.get("traceback")
        if not why and (code not in (0, 1, 2) or (code == 1 and argv[0] != "audit")):
            why = f"exit {code}: {res.get('stderr')}"
        if not why and cpu > max_cpu:
            why = f"over {max_cpu:g} s CPU ({cpu:.1f} s)"
        if why:
            rep["failures"] += 1
            if len(rep["examples"]) < 30:
                rep["examples"].append({"input": k, "argv": argv, "cpu": round(cpu, 2), "why": why[-800:]})
            _keep(keep, f"cmd-s{seed}-{k}-{argv[0]}{suffix}", data, " ".join(argv) + "\n\n" + why)

    while i < n and time.time() - t0 < seconds and not _STOP:
        items = []
        for k in range(i, min(n, i + batch)):
            data, suffix = command_input(rng, files, lines)
            p = tmp / f"in-{k}{suffix}"
            p.write_bytes(data)
            argv = [a.format(p=p, o=tmp / f"out-{k}") for a in _pick(rng)]
            items.append((k, argv, data, suffix, rng.random() < share_subprocess))
        inproc = [it for it in items if not it[4]]
        if inproc:
            res, cpu, rss, status = _in_child(_commands_batch, [it[1] for it in inproc], max_cpu,
                                              cpu_limit=int(max_cpu * len(inproc)) + 10, as_limit=max_rss_mb << 20)
            rep["max_rss_kb_batch"] = max(rep["max_rss_kb_batch"], rss)
            if res is None:  # the batch died: each input again in a child of its own
                rep["batches_rerun"] += 1
                res = []
                for it in inproc:
                    r1, c1, rss1, st1 = _in_child(_commands_batch, [it[1]], max_cpu, cpu_limit=int(max_cpu) + 1,
                                                  as_limit=max_rss_mb << 20)
                    rep["max_rss_kb_batch"] = max(rep["max_rss_kb_batch"], rss1)
                    res.append(r1[0] if r1 else {"code": None, "cpu": c1,
                                                 "traceback": f"child died: status {st1}, {c1:.1f} s, {rss1 // 1024} MiB"})
            for it, r in zip(inproc, res):
                judge(it[0], it[1], r, r["cpu"], it[2], it[3])
            rep["in_process"] += len(inproc)
        for it in items:
            if it[4]:
                r, cpu, rss = _subprocess_cli(it[1], max_cpu, max_rss_mb)
                rep["max_rss_kb_subprocess"] = max(rep["max_rss_kb_subprocess"], rss)
                judge(it[0], it[1], r, cpu, it[2], it[3])
                rep["subprocess"] += 1
        for f in tmp.iterdir():
            f.unlink() if f.is_file() else None
        i += len(items)
        rep["inputs"] = i
        if i % (batch * 5) == 0 or i >= n:
            log(f"commands: {i} inputs ({rep['subprocess']} as subprocesses), {rep['failures']} failures, max CPU "
                f"{rep['max_cpu_s']:.1f} s, max RSS {max(rep['max_rss_kb_batch'], rep['max_rss_kb_subprocess']) // 1024} MiB, "
                f"{time.time() - t0:.0f} s")
    rep["seconds"] = round(time.time() - t0, 1)
    return rep


_STOP: list[int] = []  # SIGTERM: stop after the batch running, and report


def _on_term(signum, frame):  # noqa: ARG001
    _STOP.append(signum)


PROFILES = {"ci": {"parse": 2000, "commands": 12}, "long": {"parse": 1_000_000, "commands": 10_000}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=("parse", "commands"))
    ap.add_argument("--profile", choices=sorted(PROFILES), default="ci")
    ap.add_argument("--n", type=int, help="inputs (default: the profile's)")
    ap.add_argument("--seconds", type=float, default=float("inf"), help="stop after this wall time")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--batch", type=int, default=None, help="inputs per child process (parse 500, commands 20)")
    ap.add_argument("--max-cpu", type=float, default=None,
                    help="CPU seconds one input may take (parse 5, commands 60): past it, a failure")
    ap.add_argument("--max-rss-mb", type=int, default=2048, help="address-space limit of each child (MiB)")
    ap.add_argument("--subprocess", type=float, default=0.02,
                    help="commands: the share of inputs run as `python -m kvreplay` in a process of their own")
    ap.add_argument("--keep", type=Path, default=Path("fuzz-failures"), help="save failing inputs here")
    ap.add_argument("--out", type=Path, help="write the report (JSON) here")
    a = ap.parse_args(argv)
    n = a.n or PROFILES[a.profile][a.mode]
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    signal.signal(signal.SIGTERM, _on_term)
    if a.mode == "parse":
        rep = run_parse(n, a.seed, a.seconds, a.batch or 500, a.max_cpu or 5.0, a.max_rss_mb, a.keep, log)
    else:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="kvreplay-fuzz-") as d:
            rep = run_commands(n, a.seed, a.seconds, a.batch or 20, a.max_cpu or 60.0, a.max_rss_mb, a.subprocess,
                               a.keep, Path(d), log)
    text = json.dumps(rep, indent=1)
    if a.out:
        a.out.write_text(text + "\n")
    print(text)
    return 1 if rep["failures"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
