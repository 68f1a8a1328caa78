"""`kvreplay simulate`: run a workload through the scheduler model, write the step trace."""

from __future__ import annotations

import argparse
import sys
from typing import IO, Any

from kvreplay.errors import UserError, write_output

SAMPLE_WORKLOAD = "fcfs_heavy.workload.json"
HASH_GC_STEPS = 2000  # steps between two collections of unreachable block-hash ids


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "workload",
        nargs="?",
        help="workload JSON in the conformance format ('-' = stdin; default: the embedded "
        f"sample {SAMPLE_WORKLOAD})",
    )
    p.add_argument("-o", "--output", default="-", help="trace file (JSON Lines; default stdout)")
    p.add_argument(
        "--profile",
        default="0.33",
        help="vLLM release whose scheduler rules apply (e.g. 0.33, 0.19.0, 0.11); V0 "
        'workloads ("engine": "v0") use the V0 engine',
    )
    p.add_argument(
        "--format",
        choices=("trace", "report", "summary"),
        default="trace",
        help="trace: one JSON object per engine iteration; report: the preemptions, for "
        "people; summary: totals as JSON",
    )
    p.add_argument("--summary", metavar="PATH", help="also write the summary JSON here")
    p.add_argument(
        "--allow-unfinishable",
        action="store_true",
        help="run requests that need more KV blocks than the pool has (vLLM preempts them "
        "forever) up to max_steps instead of rejecting the workload",
    )
    p.add_argument(
        "--check-invariants",
        action="store_true",
        help="check block-pool and queue invariants after every step (slower)",
    )


def _sample_path() -> str:
    from importlib.resources import files

    return str(files("kvreplay.samples").joinpath(SAMPLE_WORKLOAD))


def run(args: argparse.Namespace) -> int:
    from kvreplay.replay.engine import without_cyclic_gc

    # a collection walks every live object: the streamed run makes no cycles worth it
    return without_cyclic_gc(_run)(args)


def _run(args: argparse.Namespace) -> int:
    import msgspec

    from kvreplay.replay.workload import load_workload

    path = args.workload or _sample_path()
    data = load_workload(path)
    # records: the trace (a generator for V1: nothing is kept); finish(): the summary and
    # whether every request finished, once the records are consumed
    v1 = data.get("engine") != "v0"
    if not v1:
        records, finish, label = _run_v0(data, args.check_invariants)
    else:
        records, finish, label = _run_v1(
            data, args.profile, args.check_invariants, not args.allow_unfinishable,
            trace=args.format == "trace")

    if args.format == "trace":
        def emit(f: IO[str]) -> None:
            # V1: JSON lines made as the engine runs; V0: records, encoded here
            lines = records if v1 else (encoder.encode(rec) + b"\n" for rec in records)
            buf = getattr(f, "buffer", None)
            if buf is None:  # a text-only stream (a test's StringIO)
                for line in lines:
                    f.write(line.decode())
                return
            f.flush()
            for line in lines:
                buf.write(line)
            buf.flush()
        encoder = msgspec.json.Encoder()
        _write(args.output, emit)
    elif args.format == "report":
        from kvreplay.replay.result import replay_workload

        rep = replay_workload(data, profile=args.profile, label=label,
                              check_capacity=not args.allow_unfinishable)
        _write(args.output, lambda f: f.write(render_report(path, label, rep)))
    for _ in records:  # run to the end (summary, report), keeping nothing
        pass
    summary, completed, steps = finish()
    if args.format == "summary":
        _write(args.output, lambda f: f.write(_json_pretty(summary)))
    if args.summary:
        _write(args.summary, lambda f: f.write(_json_pretty(summary)))
    terminal = summary.get("terminal_error")
    if terminal:  # vLLM itself stops in that step (V0): the run ends there, as vLLM's does
        print(f"kvreplay simulate: {terminal_line(steps - 1, terminal)}", file=sys.stderr)
        return 0
    if not completed:
        print(
            f"kvreplay simulate: not every request finished within max_steps "
            f"({steps} steps run)",
            file=sys.stderr,
        )
        return 1
    return 0


def _run_v1(data: dict[str, Any], profile_name: str, check: bool, check_capacity: bool,
            trace: bool = True):
    from kvreplay.replay.engine import Engine, iter_trace_lines
    from kvreplay.replay.profile import get_profile
    from kvreplay.replay.workload import parse_workload

    workload = parse_workload(data, check_capacity=check_capacity)
    profile = get_profile(profile_name)
    # the block-hash table bounded by what is live (nothing here snapshots the engine)
    engine = Engine(workload, profile, check_invariants=check, collect_hashes_every=HASH_GC_STEPS)

    def finish() -> tuple[dict[str, Any], bool, int]:
        summary = engine.summary.to_dict()
        summary["profile"] = profile.name
        return summary, engine.summary.completed, engine.summary.num_steps

    # (no trace asked for: the engine's own step records, each dropped as it comes)
    return (iter_trace_lines(engine) if trace else engine.run(), finish,
            f"vLLM V1 scheduler, profile {profile.name} ({profile.releases})")


def _run_v0(data: dict[str, Any], check: bool):
    from kvreplay.replay import v0

    records = v0.run_workload(data, check_invariants=check)
    summary = v0.summarize(records, data)
    completed = bool(summary.get("completed", True))
    return (records, lambda: (summary, completed, len(records)),
            "vLLM V0 scheduler (0.6.6.post1 rules)")


def _json_pretty(obj: Any) -> str:
    import json

    return json.dumps(obj, indent=1, sort_keys=True) + "\n"


_write = write_output


def render_report(path: str, label: str, rep: Any) -> str:
    """A plain-text account of every preemption of the workload's replay (the table and
    totals of `kvreplay replay`: kvreplay.cli.replay_report)."""
    from kvreplay.cli.replay_report import preemption_table
    from kvreplay.words import count

    t = rep.totals()
    lines = [f"kvreplay simulate: {path}", f"  {label}",
             f"  {rep.num_steps} engine steps, {t.preemptions} preemptions "
             f"({count(t.self_preemptions, 'self-preemption')}), "
             f"{count(t.requests_preempted, 'request')} preempted, "
             f"{t.computed_tokens_lost:,} computed tokens thrown away, "
             f"{t.tokens_recomputed:,} recomputed at readmission"]
    lines += preemption_table(rep.preemptions)
    if rep.terminal is not None:
        lines.append("  " + terminal_line(rep.terminal.step, rep.terminal.terminal_error))
    return "\n".join(lines) + "\n"


def terminal_line(step: int, err: dict[str, Any]) -> str:
    """The one-line account of the step in which vLLM stops (its own exception)."""
    victim = f" (swap-out of {err['victim']})" if err.get("victim") and err["type"] == "RuntimeError" else ""
    return f"vLLM stops at step {step}: {err['type']}: {err['message']}{victim}; the run ends there, as vLLM's does"
