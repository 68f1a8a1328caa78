"""`kvreplay simulate`: run a workload through the scheduler model, write the step trace."""

from __future__ import annotations

import argparse
import sys
from typing import IO, Any

from kvreplay.errors import UserError, write_output

SAMPLE_WORKLOAD = "fcfs_heavy.workload.json"


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
    import msgspec

    from kvreplay.replay.workload import load_workload

    path = args.workload or _sample_path()
    data = load_workload(path)
    if data.get("engine") == "v0":
        records, summary, completed, label = _run_v0(data, args.check_invariants)
    else:
        records, summary, completed, label = _run_v1(
            data, args.profile, args.check_invariants, not args.allow_unfinishable
        )

    encoder = msgspec.json.Encoder()
    if args.summary:
        _write(args.summary, lambda f: f.write(_json_pretty(summary)))
    if args.format == "trace":
        def emit(f: IO[str]) -> None:
            for rec in records:
                f.write(encoder.encode(rec).decode())
                f.write("\n")
        _write(args.output, emit)
    elif args.format == "summary":
        _write(args.output, lambda f: f.write(_json_pretty(summary)))
    else:
        _write(args.output, lambda f: f.write(render_report(path, label, summary, records)))
    if not completed:
        print(
            f"kvreplay simulate: not every request finished within max_steps "
            f"({len(records)} steps run)",
            file=sys.stderr,
        )
        return 1
    return 0


def _run_v1(data: dict[str, Any], profile_name: str, check: bool, check_capacity: bool):
    from kvreplay.replay.engine import simulate
    from kvreplay.replay.profile import get_profile
    from kvreplay.replay.workload import parse_workload

    workload = parse_workload(data, check_capacity=check_capacity)
    profile = get_profile(profile_name)
    records, run = simulate(workload, profile, check_invariants=check)
    summary = run.to_dict()
    summary["profile"] = profile.name
    return records, summary, run.completed, f"vLLM V1 scheduler, profile {profile.name} ({profile.releases})"


def _run_v0(data: dict[str, Any], check: bool):
    from kvreplay.replay import v0

    records = v0.run_workload(data, check_invariants=check)
    summary = v0.summarize(records, data)
    completed = bool(summary.get("completed", True))
    return records, summary, completed, "vLLM V0 scheduler (0.6.6.post1 rules)"


def _json_pretty(obj: Any) -> str:
    import json

    return json.dumps(obj, indent=1, sort_keys=True) + "\n"


_write = write_output


def render_report(path: str, label: str, summary: dict[str, Any], records: list[dict]) -> str:
    """A plain-text account of every preemption, for a person at a terminal (V1 and V0
    traces: both carry a `preemptions` list per step)."""
    events = [(r["step"], p) for r in records for p in r.get("preemptions", ())]
    lines = [f"kvreplay simulate: {path}", f"  {label}"]
    n_self = sum(1 for _, p in events if p.get("self_preempt"))
    victims = {p["req"] for _, p in events}
    lines.append(
        f"  {len(records)} engine steps, {len(events)} preemptions ({n_self} self-preemptions), "
        f"{len(victims)} requests preempted"
    )
    resumed_at: dict[str, list[int]] = {}
    for r in records:
        for rid in list(r.get("resumed", ())) + list(r.get("swapped_in", ())):
            resumed_at.setdefault(rid, []).append(r["step"])
    if events:
        lines.append("")
        lines.append(
            "  step  victim      trigger     rule                         lost  blocks freed  readmitted"
        )
    for step, p in events:
        before = p.get("free_blocks_before", p.get("free_gpu_before", 0))
        after = p.get("free_blocks_after", p.get("free_gpu_after", 0))
        rule = p.get("victim_rule") or (f"v0 {p.get('mode', '')}" if "mode" in p else "")
        rule = rule.split(":")[0] + (" (self)" if p.get("self_preempt") else "")
        back = next((s for s in resumed_at.get(p["req"], ()) if s > step), None)
        lines.append(
            f"  {step:>4}  {p['req']:<10}  {str(p.get('trigger')):<10}  {rule:<27}"
            f"  {p.get('num_computed_tokens_before', 0):>4}  {after - before:>12}  "
            + (f"step {back}" if back is not None else "-")
        )
    total_lost = sum(p.get("num_computed_tokens_before", 0) for _, p in events)
    lines.append("")
    lines.append(f"  computed tokens thrown away by preemption: {total_lost}")
    return "\n".join(lines) + "\n"
