#!/usr/bin/env python3
"""The step-trace variant of a rendered vLLM 0.33 log (dev tool): the same run with the
lines kvreplay's plugin (src/kvreplay/vllm_plugin) writes, stamped with the run's clock.

    python -m tools.oracle.render_step_trace --root /tmp/whatif_corpus [--name server.trace.log]
    python -m tools.oracle.render_step_trace --workload W.json --out LOG [--stats-interval 2] [--no-prompts]

--root: every case folder of tools/oracle/whatif_corpus.py (its workload, its step times, the
stats-line phase of its server.log) gets LOG beside server.log. --workload: one workload
JSON, timed by the log cases' formula (p1's truth.json `step_time_model`).

Our scheduler is vLLM 0.33's step for step (tests/conformance/test_oracle_bank.py), so the run is the
one vLLM with the plugin would log. Lines as the plugin writes them (lineformat.py; the
`%`-formats of _scheduler.py): `kvtrace config` at engine start, `kvtrace req` as the
engine core adds a request (the start of its step), `kvtrace step` as each iteration ends
(update_from_output), in vLLM's envelope with the engine core's pid and whole-second time
stamp; plus every line of the plain render (tools/oracle/render_log.py timed_lines: startup, request
and access lines, stats lines). Idle iterations (nothing to schedule) get no line and no
number, as EngineCore does not step then. Sync scheduling only; no aborts. Each file is
parsed back and replayed (inference/step_trace.py): every step must check.
Deterministic: the same inputs give the same bytes.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time as _time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))

from tools.oracle.calib_corpus import LOGCASES, START  # noqa: E402
from tools.oracle.whatif_corpus import FILES, case_setup, step_dt  # noqa: E402

from kvreplay.replay import parse_workload  # noqa: E402
from kvreplay.replay.engine import Engine  # noqa: E402
from tools.oracle.render_log import CORE, step_starts, timed_lines  # noqa: E402
from kvreplay.replay.trace import conformance_record  # noqa: E402
from kvreplay.vllm_plugin.lineformat import short_hash  # noqa: E402

SRC = "_scheduler.py"  # the plugin's module, as vLLM's formatter names the caller


def _log_lines() -> tuple[int, int, int, int]:
    """The line numbers of the plugin's _kvt_log calls (config, req with hashes, req, step),
    read from its source: vLLM's formatter prints the caller's line."""
    from pathlib import Path

    import kvreplay.vllm_plugin as vp

    src = (Path(vp.__file__).parent / SRC).read_text(encoding="utf-8").splitlines()
    found: dict[str, int] = {}
    for i, line in enumerate(src):
        if "self._kvt_log(" in line:
            text = line + (src[i + 1] if i + 1 < len(src) else "")
            for key in ("kvtrace config", "bh=%s", "kvtrace req", "kvtrace step"):
                if key in text:
                    found.setdefault("req_bh" if key == "bh=%s" else key, i + 1)
                    break
    return found["kvtrace config"], found["req_bh"], found["kvtrace req"], found["kvtrace step"]


LINE_CONFIG, LINE_REQ_BH, LINE_REQ, LINE_STEP = _log_lines()  # its _kvt_log calls
MIX = 0x9E3779B97F4A7C15  # odd: a bijection of 64-bit ids (equal blocks, equal hashes)


class _Keeping(Engine):
    """The engine, keeping every request it made (a finished one leaves the scheduler)
    and how many block hashes it had when added (the prompt's full blocks)."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.made: dict = {}
        self.reported: dict[str, int] = {}

    def _make_request(self, idx):
        r = super()._make_request(idx)
        self.made[r.request_id] = r
        self.reported[r.request_id] = len(r.block_hashes)
        return r


def _hx(h: int) -> str:
    return short_hash((h * MIX) & 0xFFFFFFFFFFFFFFFF)


def run_traced(wl) -> tuple[list[dict], dict]:
    """The run's conformance records (as `simulate` gives them), each with `_bh`: the block
    hashes that became full in its update, by request (update_from_output's `bh=`)."""
    eng = _Keeping(wl)
    recs = []
    while not eng.done:
        rec = conformance_record(eng, eng.step())
        bh = []
        if wl.config.enable_prefix_caching and rec.get("updated_batch") is not None:
            gone = set(rec.get("finished", ()))
            for rid, _ in rec.get("scheduled", ()):  # the updated batch (sync: this step's)
                r = eng.made[rid]
                k = eng.reported[rid]
                if rid not in gone and len(r.block_hashes) > k:
                    bh.append((rid, list(r.block_hashes[k:])))
                    eng.reported[rid] = len(r.block_hashes)
        rec["_bh"] = bh
        recs.append(rec)
    return recs, eng.made


def _env(t: float, lineno: int, msg: str) -> str:
    return f"{CORE} INFO {_time.strftime('%m-%d %H:%M:%S', _time.gmtime(t))} [{SRC}:{lineno}] {msg}"


def trace_lines(wl, recs: list[dict], made: dict, starts: list[float],
                version: str = "0.33.0") -> list[tuple[float, str]]:
    """(time, line) of every kvtrace line of the run (starts: each step's start, and the
    last one's end)."""
    cfg = wl.config
    if cfg.async_scheduling:
        raise SystemExit("render_step_trace: sync scheduling only")
    if any(r.get("aborted") for r in recs):
        raise SystemExit("render_step_trace: aborts are not rendered")
    caching = cfg.enable_prefix_caching
    bs = cfg.block_size
    t0 = starts[0] - 29.0  # engine start, after the KV-cache lines of the plain render
    out = [(t0, _env(t0, LINE_CONFIG, (
        f"kvtrace config v={version} sched=Scheduler blocks={cfg.num_gpu_blocks} bs={bs} "
        f"hbs={bs} seqs={cfg.max_num_seqs} tokens={cfg.max_num_batched_tokens} "
        f"len={cfg.max_model_len} chunked={int(bool(cfg.enable_chunked_prefill))} "
        f"prefix={int(bool(caching))} policy={cfg.policy} "
        f"lpt={int(cfg.long_prefill_token_threshold or 0)} "
        f"isl={int(bool(cfg.scheduler_reserve_full_isl))} wm={cfg.watermark or 0.0} "
        f"async=0 interval=1 spec=0")))]
    handle: dict[str, str] = {}
    n = 0  # the step line's number: EngineCore's iterations, idle ones not counted
    for k, rec in enumerate(recs):
        if rec.get("idle"):
            assert not rec.get("arrivals"), rec
            continue
        for rid in rec.get("arrivals", ()):
            r = made[rid]
            h = handle[rid] = str(len(handle))
            msg = (f"kvtrace req {h} at={n} p={len(r.prompt_token_ids)} max={r.max_tokens} "
                   f"prio={r.priority} id={rid}")
            chain = r.block_hashes[: len(r.prompt_token_ids) // bs]
            if caching and chain:
                msg += " bh=" + ",".join(map(_hx, chain))
            out.append((starts[k], _env(starts[k], LINE_REQ_BH if caching and chain else LINE_REQ, msg)))
        parts = []
        sched = rec.get("scheduled")
        if sched is not None:
            if sched:
                parts.append("s=" + ",".join(handle[rid] if m == 1 else f"{handle[rid]}:{m}"
                                             for rid, m in sched))
                hits = rec.get("prefix_hit_tokens", {})
                new, res = set(rec.get("new", ())), set(rec.get("resumed", ()))
                for key, ids in (("new", new), ("res", res)):
                    items = [f"{handle[rid]}:{hits.get(rid, 0)}" for rid, _ in sched if rid in ids]
                    if items:
                        parts.append(f"{key}=" + ",".join(items))
            else:
                parts.append("s=-")
            pre = [f"{handle[p['req']]}/{handle[p['trigger']] if p['trigger'] is not None else '-'}"
                   f"/{p['num_computed_tokens_before']}" for p in rec.get("preemptions", ())]
            if pre:
                parts.append("pre=" + ",".join(pre))
        if rec.get("updated_batch") is None:
            parts.append("u=-")
        elif rec["updated_batch"] != rec["step"]:
            raise SystemExit("render_step_trace: an update of another step's batch (async?)")
        fin = [f"{handle[rid]}:{made[rid].num_output_tokens}" for rid in rec.get("finished", ())]
        if fin:
            parts.append("f=" + ",".join(fin))
        if rec["_bh"]:
            parts.append("bh=" + ",".join(handle[rid] + ":" + ".".join(map(_hx, hs))
                                          for rid, hs in rec["_bh"]))
        t = starts[k + 1]  # the iteration's end: update_from_output writes the line
        msg = (f"kvtrace step {n} {' '.join(parts)} free={rec['free_blocks']} "
               f"kv={rec['kv_usage']:.4f} q={len(rec['running'])}/{len(rec['waiting'])}")
        out.append((t, _env(t, LINE_STEP, msg)))
        n += 1
    return out


def render(wl, model: dict, *, stats_interval_s: float, stats_phase_s: float,
           with_prompts: bool, start: float = START) -> tuple[list[str], list[dict]]:
    """The step-trace log's lines (plain render + kvtrace lines, in time order) and the
    run's records."""
    recs, made = run_traced(wl)
    f = step_dt(model)  # stateful: called on the records in order
    dts = [f(r) for r in recs]
    starts = step_starts(recs, lambda r: dts[r["step"]], start)
    plain = timed_lines(wl, recs, step_time_s=lambda r: dts[r["step"]], start=start,
                        stats_interval_s=stats_interval_s, stats_phase_s=stats_phase_s,
                        with_prompts=with_prompts)
    trace = trace_lines(wl, recs, made, starts)
    # in time order; at one time the plain render's line first (the API server's arrival
    # lines come before the engine adds the request)
    merged = sorted([(t, 0, i, s) for i, (t, s) in enumerate(plain)]
                    + [(t, 1, i, s) for i, (t, s) in enumerate(trace)])
    return [s for *_, s in merged], recs


def check(path: str, recs: list[dict]) -> Any:
    """Parse the file back and replay it: every step must check."""
    from kvreplay.parsers import parse_files
    from kvreplay.inference.step_trace import replay_step_trace

    rp = replay_step_trace(list(parse_files([path], year=2026)))
    c = rp.step_check
    busy = sum(1 for r in recs if not r.get("idle"))
    if c.first_divergence is not None or c.steps_checked != busy:
        raise SystemExit(f"{path}: the step-trace replay does not check: {c}")
    return c


def _write(path: str, lines: list[str]) -> None:
    data = ("\n".join(lines) + "\n").encode()
    if path.endswith(".gz"):  # no name, no time in the header: the same bytes every run
        import gzip

        with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw,
                                                      mtime=0, compresslevel=9) as fh:
            fh.write(data)
    else:
        with open(path, "wb") as fh:
            fh.write(data)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", help="a tools/oracle/whatif_corpus.py folder: every case in it")
    ap.add_argument("--name", default="server.trace.log")
    ap.add_argument("--workload", help="one workload JSON")
    ap.add_argument("--out", help="the log to write (with --workload)")
    ap.add_argument("--stats-interval", type=float, default=2.0)
    ap.add_argument("--stats-phase", type=float, default=0.5)
    ap.add_argument("--no-prompts", action="store_true", help="no JSON-body lines")
    args = ap.parse_args()
    model = json.load(open(os.path.join(LOGCASES, "p1_poisson_fcfs_200", "truth.json")))["step_time_model"]
    if args.workload:
        if not args.out:
            ap.error("--workload needs --out")
        wl = parse_workload(json.load(open(args.workload)))
        lines, recs = render(wl, model, stats_interval_s=args.stats_interval,
                             stats_phase_s=args.stats_phase, with_prompts=not args.no_prompts)
        _write(args.out, lines)
        c = check(args.out, recs)
        print(f"{args.out}: {c.steps_checked} steps checked", flush=True)
        return 0
    if not args.root:
        ap.error("give --root or --workload")
    cases = sorted(d for d in os.listdir(args.root) if os.path.isdir(os.path.join(args.root, d)))
    for name in cases:
        i = int(name[1:3])
        case, wl_d, _, phases = case_setup(i)
        assert case == name, (case, name)
        truth = json.load(open(os.path.join(args.root, name, "truth.json")))
        wl = parse_workload(wl_d)
        lines, recs = render(wl, truth["step_time_model"], stats_interval_s=2.0,
                             stats_phase_s=phases[FILES[0][0]], with_prompts=FILES[0][2])
        # the same run and clock as the case's truth
        assert len(recs) == truth["num_steps"], name
        path = os.path.join(args.root, name, args.name)
        _write(path, lines)
        c = check(path, recs)
        print(f"{path}: {c.steps_checked} steps checked", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
