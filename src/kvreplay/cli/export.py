"""`kvreplay export --perfetto OUT.pftrace | --chrome OUT.json LOG|WORKLOAD.json|TRACE-LOG`:
the replay as a timeline trace for the Perfetto UI or chrome://tracing."""

from __future__ import annotations

import argparse
import sys
import time

from kvreplay.cli.replay import add_replay_inputs, default_log_answer, input_paths, open_from_args
from kvreplay.errors import ReplayError, UserError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="*", metavar="LOG|WORKLOAD.json",
                   help="vLLM server log(s), a step-trace log with its KV-event files, or a "
                        "workload JSON (default: the embedded sample)")
    p.add_argument("--perfetto", metavar="OUT.pftrace",
                   help="write Perfetto's protobuf trace (needs: pip install 'kvreplay[perfetto]')")
    p.add_argument("--chrome", metavar="OUT.json",
                   help="write Chrome's JSON trace-event format (chrome://tracing, Perfetto UI)")
    p.add_argument("--steps", metavar="LO:HI",
                   help="only steps LO to HI (inclusive; either may be left out)")
    add_replay_inputs(p)


def parse_steps(text: str | None, num_steps: int) -> tuple[int, int] | None:
    """`LO:HI`, `LO:` or `:HI` -> (lo, hi) inclusive; None: every step."""
    if text is None:
        return None
    lo_s, sep, hi_s = text.partition(":")
    try:
        lo = int(lo_s) if lo_s.strip() else 0
        hi = int(hi_s) if hi_s.strip() else num_steps - 1
    except ValueError:
        raise UserError(f"--steps {text!r}: give LO:HI, e.g. 100:400") from None
    if not sep:
        raise UserError(f"--steps {text!r}: give LO:HI, e.g. 100:400")
    return lo, hi


def run(args: argparse.Namespace) -> int:
    from kvreplay.export import build_trace, write_trace
    from kvreplay.progress import stage

    outputs = {k: v for k, v in (("perfetto", args.perfetto), ("chrome", args.chrome)) if v}
    if not outputs:
        raise UserError("say where to write: --perfetto OUT.pftrace and/or --chrome OUT.json")
    if "perfetto" in outputs:
        from kvreplay.export.perfetto import protos

        protos()  # a missing package is said before the replay runs
    from kvreplay.audit.prom import looks_like_prometheus

    paths = input_paths(list(args.paths), args)
    metric_paths = [p for p in paths if p != "-" and looks_like_prometheus(p)]  # same server's
    paths = [p for p in paths if p not in metric_paths]
    if not paths:
        raise UserError("Prometheus scrapes are read beside their server's log: give the log too")
    t0 = time.perf_counter()
    try:
        rep = open_from_args(paths, args)
    except ReplayError as exc:
        log, ans, how, _missing = default_log_answer(paths, metric_paths, args)
        if ans is None:
            raise UserError(str(exc)) from None
        return _export_default(log, ans, how, outputs, args)
    t1 = time.perf_counter()
    with stage("export: trace", None):
        trace = build_trace(rep, parse_steps(args.steps, rep.num_steps))
        sizes = {path: write_trace(trace, path, fmt) for fmt, path in outputs.items()}
    t2 = time.perf_counter()
    m = trace.meta
    n_req = sum(1 for t in trace.tracks if t.kind == "request")
    for path, size in sizes.items():
        print(f"kvreplay export: {path}: {size:,} bytes; steps {m['first_step']}-{m['last_step']} "
              f"of {rep.num_steps}, {n_req} requests, {m['preemptions']} "
              f"preemptions; open it in https://ui.perfetto.dev"
              + (" or chrome://tracing" if path == args.chrome else ""), file=sys.stderr)
    print(f"kvreplay export: replay {t1 - t0:.2f} s, export {t2 - t1:.2f} s", file=sys.stderr)
    return 0


def _export_default(log, ans, how, outputs: dict[str, str], args: argparse.Namespace) -> int:
    """A default log (no request lines): no steps or requests to draw; the stats lines'
    counters as logged and the answer's intervals (export/default_log.py)."""
    from kvreplay.export import write_trace
    from kvreplay.export.default_log import default_trace

    if args.steps is not None:
        raise UserError(f"--steps {args.steps}: a default log (no request lines) has no steps "
                        "to pick; leave --steps out")
    trace = default_trace(log.facts, ans, how)
    for fmt, path in outputs.items():
        size = write_trace(trace, path, fmt)
        print(f"kvreplay export: {path}: {size:,} bytes; a default log (no request lines): its "
              f"{trace.meta['stats_lines']} stats lines' counters as logged and the preemptions "
              "per interval as 90% intervals, no steps or requests; open it in "
              "https://ui.perfetto.dev" + (" or chrome://tracing" if path == args.chrome else ""),
              file=sys.stderr)
    return 0
