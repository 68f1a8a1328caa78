"""`kvreplay replay LOG...`: which requests were preempted, when, why, and what it cost."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from kvreplay.errors import UserError, write_output


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("logs", nargs="*", metavar="LOG",
                   help="vLLM server log(s) ('-' = stdin, .gz ok; default: the embedded sample)")
    p.add_argument("--profile", default="auto",
                   help="vLLM release whose scheduler rules apply (default: from the log)")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.add_argument("-o", "--output", default="-", help="where to write the report (default stdout)")
    p.add_argument("--trace", metavar="TRACE.jsonl",
                   help="also write the replay's per-step trace (conformance format)")
    p.add_argument("--step-time-ms", type=float, metavar="MS",
                   help="take every engine step to last MS milliseconds instead of fitting a "
                        "step-time model to the stats lines")
    p.add_argument("--support", type=int, metavar="N",
                   help="replay N alternative arrival placements the log cannot rule out and "
                        "give each preemption the share that finds it too (default: 10 for "
                        "Poisson arrivals with known prompts, up to 2,000 requests; 0: off)")
    p.add_argument("--vllm-version", help="the release that wrote the log, if not detected")
    p.add_argument("--year", type=int, help="year of the log's time stamps (they have none)")


def run(args: argparse.Namespace) -> int:
    from kvreplay.replay.from_log import ReplayError, StepTimeModel, replay_facts
    from kvreplay.sources import read_facts

    paths = list(args.logs)
    # vLLM KV-cache event files (kvreplay record-kv-events) go beside a step-trace log
    from kvreplay.kvevents import is_kv_events_file, read_kv_events

    kv_paths = [p for p in paths if p != "-" and is_kv_events_file(p)]
    paths = [p for p in paths if p not in kv_paths]
    kv_events = [r for p in kv_paths for r in read_kv_events(p)] if kv_paths else None
    if kv_paths and not paths:
        raise UserError("a KV-event file is checked against a server log: give the log too")
    if not paths:
        from kvreplay.samples import DEFAULT_LOG, DEFAULT_LOG_YEAR, sample_path

        paths = [str(sample_path(DEFAULT_LOG))]
        if args.year is None:
            args.year = DEFAULT_LOG_YEAR
    t0 = time.perf_counter()
    facts = read_facts(paths, vllm_version=args.vllm_version, year=args.year)
    exact = _exact(paths, args, kv_events)
    if exact is not None:
        return exact
    if kv_paths:
        raise UserError(
            "KV-event files are checked against a log written with kvreplay's step-trace "
            "scheduler (--scheduler-cls kvreplay.vllm_plugin.StepTraceScheduler); this log "
            "has no kvtrace lines"
        )
    step_time = None
    if args.step_time_ms is not None:
        if args.step_time_ms <= 0:
            raise UserError("--step-time-ms must be positive")
        step_time = StepTimeModel(overhead_s=args.step_time_ms / 1000.0, per_token_s=0.0,
                                  per_request_s=0.0)
    try:
        if args.support is not None and args.support < 0:
            raise UserError("--support must be 0 or more")
        rep = replay_facts(facts, profile=None if args.profile == "auto" else args.profile,
                           step_time=step_time, support=args.support)
    except ReplayError as exc:
        raise UserError(_thin_log_message(facts, str(exc))) from None
    elapsed = time.perf_counter() - t0
    if args.trace:
        import msgspec

        enc = msgspec.json.Encoder()
        _write(args.trace, lambda f: [f.write(enc.encode(r).decode() + "\n") for r in rep.full_trace()])
    report = to_json(rep)
    if args.format == "json":
        text = json.dumps(report, indent=1, sort_keys=True) + "\n"
    else:
        text = render_table(rep, report, elapsed)
    _write(args.output, lambda f: f.write(text))
    return 0


def _exact(paths: list[str], args: argparse.Namespace, kv_events=None) -> int | None:
    """Logs written with kvreplay's step-trace scheduler replay exactly (if available)."""
    try:
        from kvreplay.replay import from_trace  # noqa: F401
    except ImportError:
        return None
    if not hasattr(from_trace, "has_step_trace") or not hasattr(from_trace, "exact_replay"):
        return None
    from kvreplay.parsers import parse_files

    events = list(parse_files(paths, year=args.year, vllm_version=args.vllm_version))
    if not from_trace.has_step_trace(events):
        return None
    result = from_trace.exact_replay(
        events, profile=None if args.profile == "auto" else args.profile, kv_events=kv_events
    )
    if args.trace and result.get("records") is not None:
        import msgspec

        enc = msgspec.json.Encoder()
        _write(args.trace, lambda f: [f.write(enc.encode(r).decode() + "\n") for r in result["records"]])
    out = {k: v for k, v in result.items() if k not in ("workload", "records")}
    if args.format == "json":
        text = json.dumps(out, indent=1, sort_keys=True, default=str) + "\n"
    else:
        lines = [f"kvreplay replay: {', '.join(paths)}  (exact: the log has kvreplay's step trace)",
                 f"  steps checked: {out.get('steps_checked')}"]
        if out.get("kv_events_checked") is not None:
            lines.append(f"  KV-cache block state checked against vLLM's events after "
                         f"{out['kv_events_checked']} steps")
        div = out.get("first_divergence")
        lines.append("  every step agrees with the log" if not div else
                     f"  FIRST DIVERGENCE at step {div.get('step')} ({div.get('file')}:{div.get('line')}): "
                     f"{div.get('field')}: logged {div.get('logged')} vs replayed {div.get('replayed')}")
        lines += _preemption_table(out.get("preemptions", []))
        text = "\n".join(lines) + "\n"
    _write(args.output, lambda f: f.write(text))
    return 1 if out.get("first_divergence") else 0


def _thin_log_message(facts, reason: str) -> str:
    parts = [reason]
    if facts.missing:
        parts.append("missing from this log: " + "; ".join(facts.missing))
    return " | ".join(parts)


def to_json(rep) -> dict[str, Any]:
    """The report as plain data: summary, preemptions, storms, verification, provenance."""
    facts = rep.facts
    return {
        "summary": rep.summary(),
        "preemptions": rep.preemptions,
        "storms": rep.storms,
        "verification": {k: v for k, v in rep.verification.items()},
        "estimate": rep.estimate,
        "config": {
            "values": _config_dict(rep.rebuilt.workload.config),
            "sources": rep.rebuilt.config_sources,
        },
        "notes": rep.rebuilt.notes + facts.notes,
        "missing": facts.missing,
        "inputs": {"files": facts.files, "lines": facts.num_events,
                   "unparsed": facts.num_unparsed, "requests": len(facts.requests),
                   "stats_lines": len(facts.stats)},
    }


def _config_dict(cfg) -> dict[str, Any]:
    from dataclasses import asdict

    return asdict(cfg)


def render_table(rep, report: dict[str, Any], elapsed: float) -> str:
    s = report["summary"]
    v = report["verification"]
    lines = [
        f"kvreplay replay: {', '.join(rep.facts.files)}",
        f"  vLLM {s['vllm_version'] or '?'} (profile {s['profile']}), {s['requests']} requests, "
        f"{s['steps']} engine steps replayed in {elapsed:.1f} s",
        f"  {s['step_time_model']}; arrivals: {s['arrival_pattern']}; prompts {s['prompts']}; "
        f"output lengths {s['output_lengths']}",
        f"  verification: {v['agreeing_lines']} of {v['stats_lines']} stats lines agree "
        "(running, waiting, KV usage)"
        + (f"; {v['exact_lines']} exactly, at the step each had seen (also generated and "
           "prompt tokens)" if "exact_lines" in v else ""),
    ]
    div = v.get("first_divergence")
    if div:
        lines.append(f"    first disagreement: {div['file']}:{div['line']} (step {div['step']}): "
                     + "; ".join(div["differences"]))
    inexact = v.get("first_inexact")
    if inexact and inexact != div:
        lines.append(f"    first line not matched exactly: {inexact['file']}:{inexact['line']}: "
                     + "; ".join(inexact["differences"]))
    lines.append(
        f"  preemptions: {s['preemptions']} ({s['self_preemptions']} self-preemptions), "
        f"{s['requests_preempted']} requests preempted, {s['computed_tokens_lost']:,} computed "
        f"tokens thrown away, {s['tokens_recomputed']:,} recomputed at readmission"
    )
    est = report.get("estimate")
    if est:
        lines.append(
            f"  ESTIMATE: {est['preemptions_low']}-{est['preemptions_high']} preemptions "
            f"(median {est.get('preemptions_median', '?')}): {est['why']}"
        )
        lines.append(f"  to make it exact: {est['make_it_exact']}")
    if s.get("cut_short"):
        lines.append(f"  the log ends while requests were still running (server killed?): "
                     f"{len(s['unfinished_requests'])} unfinished at the cut")
    k = s.get("support_replays") or 0
    if k:
        from kvreplay.replay.from_log import SUPPORT_JITTER

        lines.append(
            f"  support: {s['robust_preemptions']} of {s['preemptions']} preemptions are found "
            f"by all {k} replays with each arrival moved up to {SUPPORT_JITTER} steps within "
            "what the log allows; lower support = the log cannot pin that one down")
    lines += _preemption_table(report["preemptions"], k)
    if report["storms"] and len(report["preemptions"]) > 1:
        lines.append("")
        lines.append("  storms (preemptions <= 50 steps apart):")
        for st in sorted(report["storms"], key=lambda x: -x["tokens_lost"])[:5]:
            lines.append(f"    steps {st['first_step']}-{st['last_step']}: {st['preemptions']} "
                         f"preemptions, {st['tokens_lost']:,} tokens lost, "
                         f"{len(st['victims'])} victims")
    if report["notes"] or report["missing"]:
        lines.append("")
        for n in report["notes"]:
            lines.append(f"  note: {n}")
        for m in report["missing"]:
            lines.append(f"  missing: {m}")
    return "\n".join(lines) + "\n"


def _preemption_table(pre: list[dict[str, Any]], support_replays: int = 0) -> list[str]:
    if not pre:
        return ["  no preemption in the replay"]
    out = ["", "   step      time  victim                          trigger                         "
               "rule      lost  recompute   hit  back at  confidence"
               + ("  support" if support_replays else "")]
    for p in pre:
        t = p.get("time")
        ts = time.strftime("%H:%M:%S", time.gmtime(t)) + f".{int((t % 1) * 1000):03d}" if t else "-"
        rule = (p.get("victim_rule") or "").split(":")[0] + (" self" if p.get("self_preemption") else "")
        out.append(
            f"  {p['step']:>5}  {ts:>12}  {str(p['victim'])[:30]:<30}  {str(p['trigger'])[:30]:<30}  "
            f"{rule:<8} {p.get('computed_tokens_lost', 0):>5}  {str(p.get('tokens_recomputed') or '-'):>9}  "
            f"{str(p.get('prefix_hit_at_readmission') if p.get('prefix_hit_at_readmission') is not None else '-'):>4}  "
            f"{str(p.get('readmission_step') or '-'):>7}  {p.get('confidence', ''):<10}"
            + (f"  {round(p['support'] * support_replays)}/{support_replays}"
               if support_replays and p.get("support") is not None else "")
        )
    return out


_write = write_output
