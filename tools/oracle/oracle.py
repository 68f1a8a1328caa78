#!/usr/bin/env python3
"""Run vLLM's own V1 scheduler (the "oracle") on a workload: a dev tool.

The oracle harness under tools/oracle/harness/ (one step loop, oracle_core.py, with one
class per vLLM release, oracle_releases.py; our own code, not vLLM's: harness/PROVENANCE.md)
drives the real vLLM Scheduler / KVCacheManager on CPU with a fake model and writes the
conformance trace format. Each release needs its own venv with vLLM
installed --no-deps (see tests/data/oracle/README.md, or run
`python -m tools.oracle.oracle --install RELEASE`).

Command line:

    python -m tools.oracle.oracle --release 0.33 WORKLOAD.json -o TRACE.jsonl [--summary S.json]
    python -m tools.oracle.oracle --release 0.19.0 --batch DIR [--out-dir OUT]
        # every DIR/**/workload.json in ONE process (vLLM import paid once);
        # writes OUT/<rel>/{trace.jsonl,summary.json,meta.json} (default OUT=DIR)
    python -m tools.oracle.oracle --check
        # which oracles are installed

Python:

    from tools.oracle.oracle import run_oracle, run_oracle_many, oracle_available
    if oracle_available("0.33"):
        trace = run_oracle("0.33", workload_dict)        # list of step records
        res = run_oracle_many("0.33", {"a": wl1, "b": wl2})  # one process
        res["a"].trace, res["a"].summary, res["a"].status

Venv locations: $KVREPLAY_ORACLE_VENV_<REL> (e.g. KVREPLAY_ORACLE_VENV_0_33)
or ${XDG_CACHE_HOME:-~/.cache}/kvreplay/oracle-<rel> (0.33 -> oracle-0.33,
0.19.0 -> oracle-0.19.0, 0.11.0 -> oracle-0.11.0); the cache root can be moved
with $KVREPLAY_ORACLE_ROOT.
"""
from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
HARNESS_DIR = HERE / "harness"

# release -> (venv dir name, harness script, requirements file, vllm version)
RELEASES = {
    "0.33": ("oracle-0.33", "run_oracle.py", "requirements-oracle.txt", "0.33.0"),
    "0.19.0": ("oracle-0.19.0", "versions/run_oracle_0.19.0.py",
               "versions/requirements-0.19.0.txt", "0.19.0"),
    "0.11.0": ("oracle-0.11.0", "versions/run_oracle_0.11.0.py",
               "versions/requirements-0.11.0.txt", "0.11.0"),
}
ALIASES = {"0.33.0": "0.33", "0.19": "0.19.0", "0.11": "0.11.0"}

# Config keys each release accepts at a non-default value.
UNSUPPORTED_KEYS = {
    "0.33": {},
    "0.19.0": {"watermark": 0.0},
    "0.11.0": {"watermark": 0.0, "scheduler_reserve_full_isl": True},
}


def canon_release(release: str) -> str:
    release = str(release)
    release = ALIASES.get(release, release)
    if release not in RELEASES:
        raise ValueError(f"unknown release {release!r}; one of {sorted(RELEASES)}")
    return release


def oracle_root() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return Path(os.environ.get("KVREPLAY_ORACLE_ROOT") or cache / "kvreplay")


def venv_dir(release: str) -> Path:
    release = canon_release(release)
    env = os.environ.get("KVREPLAY_ORACLE_VENV_" + release.replace(".", "_"))
    if env:
        return Path(env)
    return oracle_root() / RELEASES[release][0]


def venv_python(release: str) -> Path:
    return venv_dir(release) / "bin" / "python"


def harness_script(release: str) -> Path:
    return HARNESS_DIR / RELEASES[canon_release(release)][1]


def oracle_available(release: str) -> bool:
    """True when the release's venv exists and has the right vLLM installed
    (checked from the installed dist-info, without importing vLLM)."""
    try:
        release = canon_release(release)
    except ValueError:
        return False
    py = venv_python(release)
    if not py.exists():
        return False
    want = RELEASES[release][3]
    lib = venv_dir(release) / "lib"
    return any(lib.glob(f"python3*/site-packages/vllm-{want}.dist-info"))


def workload_supported(release: str, workload: dict) -> bool:
    """False if the workload sets a key this release lacks to a non-default value."""
    cfg = workload.get("config", {})
    for k, default in UNSUPPORTED_KEYS[canon_release(release)].items():
        if k in cfg and cfg[k] != default:
            return False
    return True


@dataclasses.dataclass
class OracleResult:
    status: str  # ok | incomplete | unsupported | timeout | error
    trace: list | None
    summary: dict | None
    meta: dict | None
    error: str | None
    seconds: float


class OracleError(RuntimeError):
    pass


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONHASHSEED"] = "0"
    env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _read_jsonl(path: Path) -> list:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def _run_batch_jobs(release: str, jobs: list[dict], timeout: float = 300.0,
                    verbose: bool = False) -> list[dict]:
    """Run jobs [{workload,out,summary,meta}] in one oracle process; returns
    one status record per job (order kept)."""
    release = canon_release(release)
    if not oracle_available(release):
        raise OracleError(f"oracle for vLLM {release} not installed at {venv_dir(release)}")
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(jobs, f)
        list_path = f.name
    try:
        cmd = [str(venv_python(release)), str(HARNESS_DIR / "batch.py"),
               str(harness_script(release)), "--list", list_path,
               "--timeout", str(timeout)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                stderr=None if verbose else subprocess.PIPE,
                                text=True, env=_env())
        recs = []
        stderr_chunks = []
        if not verbose:
            # drain stderr in a thread so a chatty vLLM cannot block us
            import threading

            def _drain():
                for line in proc.stderr:
                    stderr_chunks.append(line)
            th = threading.Thread(target=_drain, daemon=True)
            th.start()
        for line in proc.stdout:
            if line.startswith("@@BATCH "):
                recs.append(json.loads(line[len("@@BATCH "):]))
        proc.wait()
        if not verbose:
            th.join(timeout=5)
        if len(recs) != len(jobs):
            tail = "".join(stderr_chunks[-40:])
            raise OracleError(f"oracle process died after {len(recs)}/{len(jobs)} jobs "
                              f"(exit {proc.returncode}):\n{tail}")
        return recs
    finally:
        os.unlink(list_path)


def run_oracle_many(release: str, workloads: dict[str, dict], timeout: float = 300.0,
                    keep_dir: str | os.PathLike | None = None) -> dict[str, OracleResult]:
    """Run several workloads (name -> workload dict) through one oracle process."""
    release = canon_release(release)
    tmp = None
    if keep_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="kvr-oracle-")
        base = Path(tmp.name)
    else:
        base = Path(keep_dir)
    try:
        jobs, names = [], []
        for name, wl in workloads.items():
            d = base / name
            d.mkdir(parents=True, exist_ok=True)
            (d / "workload.json").write_text(json.dumps(wl))
            jobs.append({"workload": str(d / "workload.json"), "out": str(d / "trace.jsonl"),
                         "summary": str(d / "summary.json"), "meta": str(d / "meta.json")})
            names.append(name)
        recs = _run_batch_jobs(release, jobs, timeout=timeout)
        out = {}
        for name, job, rec in zip(names, jobs, recs):
            trace = summary = meta = None
            if rec["status"] in ("ok", "incomplete"):
                trace = _read_jsonl(Path(job["out"]))
                summary = json.loads(Path(job["summary"]).read_text())
                meta = json.loads(Path(job["meta"]).read_text())
            out[name] = OracleResult(rec["status"], trace, summary, meta, rec["error"],
                                     rec["seconds"])
        return out
    finally:
        if tmp is not None:
            tmp.cleanup()


def run_oracle(release: str, workload: dict, timeout: float = 300.0) -> list[dict]:
    """Trace records vLLM `release` produces for `workload` (one dict per step).

    Raises OracleError if the oracle is missing, errors, or the release lacks a
    config key the workload sets. An incomplete run (not every request
    finished within max_steps) still returns its trace."""
    res = run_oracle_many(release, {"case": workload}, timeout=timeout)["case"]
    if res.trace is None:
        raise OracleError(f"vLLM {release}: {res.status}: {res.error}")
    return res.trace


def _cli_single(args) -> int:
    wl = Path(args.workload).resolve()
    out = Path(args.out).resolve() if args.out else wl.with_name("trace.jsonl")
    summary = Path(args.summary).resolve() if args.summary else None
    with tempfile.TemporaryDirectory(prefix="kvr-oracle-") as tmp:
        job = {"workload": str(wl), "out": str(out),
               "summary": str(summary or Path(tmp) / "summary.json"),
               "meta": str(Path(args.meta).resolve() if args.meta else Path(tmp) / "meta.json")}
        rec = _run_batch_jobs(args.release, [job], timeout=args.timeout, verbose=True)[0]
    print(f"{wl}: {rec['status']} ({rec['seconds']:.2f}s)")
    if rec["error"]:
        print(rec["error"], file=sys.stderr)
    return {"ok": 0, "incomplete": 2, "unsupported": 3}.get(rec["status"], 1)


def _cli_batch(args) -> int:
    root = Path(args.batch).resolve()
    out_root = Path(args.out_dir).resolve() if args.out_dir else root
    wls = sorted(root.rglob("workload.json"))
    jobs = []
    for wl in wls:
        d = out_root / wl.parent.relative_to(root)
        d.mkdir(parents=True, exist_ok=True)
        jobs.append({"workload": str(wl), "out": str(d / "trace.jsonl"),
                     "summary": str(d / "summary.json"), "meta": str(d / "meta.json")})
    t0 = time.perf_counter()
    recs = _run_batch_jobs(args.release, jobs, timeout=args.timeout, verbose=args.verbose)
    counts: dict[str, int] = {}
    for rec in recs:
        counts[rec["status"]] = counts.get(rec["status"], 0) + 1
        if rec["status"] != "ok" or args.verbose:
            print(f"{rec['status']:11s} {rec['seconds']:7.2f}s  {rec['workload']}")
    status_path = out_root / "batch_status.json"
    status_path.write_text(json.dumps(recs, indent=1) + "\n")
    print(f"{len(recs)} workloads in {time.perf_counter() - t0:.1f}s: {counts}; "
          f"statuses in {status_path}")
    return 0 if counts.get("ok", 0) == len(recs) else 1


def install(release: str) -> int:
    """Create the release's venv as the harness README says (CPU torch only)."""
    release = canon_release(release)
    vdir, _, req, ver = RELEASES[release]
    v = venv_dir(release)
    wheels = oracle_root() / "wheels" / ver
    py = str(v / "bin" / "python")
    steps = [
        ["python3.11", "-m", "venv", str(v)],
        [py, "-m", "pip", "install", "torch==2.13.0"],  # CPU wheel from local disk
        [py, "-m", "pip", "install", "--no-deps", "-r", str(HARNESS_DIR / req)],
        [py, "-m", "pip", "download", "--no-deps", f"vllm=={ver}", "-d", str(wheels)],
    ]
    for cmd in steps:
        print("+", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
    whl = sorted(wheels.glob(f"vllm-{ver}-*.whl"))
    subprocess.run([py, "-m", "pip", "install", "--no-deps", str(whl[-1])], check=True)
    out = subprocess.run([py, "-c", "import torch; print(torch.__version__)"],
                         capture_output=True, text=True, check=True).stdout.strip()
    if "+cpu" not in out:
        print(f"WARNING: torch is {out}, expected a +cpu build", file=sys.stderr)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Run vLLM's own scheduler (oracle) on workloads.")
    ap.add_argument("workload", nargs="?")
    ap.add_argument("--release", default="0.33", help="0.33 | 0.19.0 | 0.11.0")
    ap.add_argument("-o", "--out")
    ap.add_argument("--summary")
    ap.add_argument("--meta")
    ap.add_argument("--batch", metavar="DIR", help="run every DIR/**/workload.json")
    ap.add_argument("--out-dir", help="batch output root (default: DIR itself)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per workload")
    ap.add_argument("--check", action="store_true", help="list installed oracles")
    ap.add_argument("--install", action="store_true", help="create the release's venv")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    if args.check:
        for rel in RELEASES:
            print(f"{rel:7s} {'yes' if oracle_available(rel) else 'no ':3s} {venv_dir(rel)}")
        return 0
    args.release = canon_release(args.release)
    if args.install:
        return install(args.release)
    if args.batch:
        return _cli_batch(args)
    if not args.workload:
        ap.error("give a WORKLOAD.json, --batch DIR, --check or --install")
    return _cli_single(args)


if __name__ == "__main__":
    sys.exit(main())
