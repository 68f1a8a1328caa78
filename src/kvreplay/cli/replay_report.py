"""A `Replay` as the `kvreplay replay` report: a table for people, JSON for programs.

Every figure comes from the Replay (its records and totals: kvreplay.replay.records);
nothing is recomputed here.
"""

from __future__ import annotations

import time
from dataclasses import asdict, is_dataclass
from typing import Any, Sequence

import msgspec

from kvreplay.inference.uncertainty import LEAD_BELOW, TOL_STEPS
from kvreplay.replay.checks import StepCheck

from kvreplay.replay.result import Replay
from kvreplay.words import count


def preemption_json(p: Any) -> dict[str, Any]:
    d = msgspec.to_builtins(p)
    d["blocks_freed"] = p.blocks_freed
    return d


def _request_ids(rep: Replay) -> list[str]:
    parent = getattr(rep.workload, "parent", {})
    return list(dict.fromkeys(parent.get(s.id, s.id) for s in rep.workload.requests))


def to_json(rep: Replay) -> dict[str, Any]:
    """The report as plain data: summary, preemptions, storms, verification, provenance."""
    facts = rep.facts
    cfg = rep.workload.config
    out: dict[str, Any] = {
        "kind": rep.kind,
        "summary": rep.summary(),
        "preemptions": [preemption_json(p) for p in rep.preemptions],
        "storms": rep.storms(),
        "verification": rep.verification.to_json() if rep.verification is not None else None,
        "estimate": rep.estimate.to_json() if rep.estimate is not None else None,
        # what the log leaves open: an ensemble of replays it allows (inference/ensemble.py)
        "uncertainty": rep.uncertainty.to_json() if rep.uncertainty is not None else None,
        "config": {"values": asdict(cfg) if is_dataclass(cfg) else dict(cfg),
                   "sources": rep.info.config_sources},
        "notes": rep.notes,
        "missing": rep.missing,
        # what the run is made of (re-run these to get every step again)
        "run": {"arrival_steps": dict(zip(_request_ids(rep), rep.inputs.arrival_steps)),
                "prompt_tokens": {s.id: len(s.prompt_token_ids) for s in rep.workload.requests},
                "aborts": [list(a) for a in rep.inputs.aborts],
                "cut_after_steps": rep.inputs.max_steps},
    }
    if rep.warnings is not None:
        out["warnings"] = rep.warnings.to_json()
    if rep.step_check is not None:
        out["step_check"] = rep.step_check.to_json()
    if facts is not None:
        out["inputs"] = {"files": facts.files, "lines": facts.num_events,
                         "unparsed": facts.num_unparsed, "requests": len(facts.requests),
                         "stats_lines": len(facts.stats)}
    else:
        out["inputs"] = {"files": rep.paths}
    return out


def render_table(rep: Replay, report: dict[str, Any], elapsed: float) -> str:
    s = report["summary"]
    lines = [f"kvreplay replay: {', '.join(rep.paths) or rep.label}"]
    unc = report.get("uncertainty")
    if unc:
        lines.append(f"  HEADLINE: {unc['headline']}")
    if rep.kind == "step-trace":
        lines.append(f"  (exact: the log has kvreplay's step trace) {s['requests']} requests, "
                     f"{s['steps']} engine steps replayed in {elapsed:.1f} s")
        lines += _step_check_lines(rep.step_check)
    else:
        lines.append(f"  vLLM {s['vllm_version'] or '?'} (profile {s['profile']}), "
                     f"{s['requests']} requests, {s['steps']} engine steps replayed in "
                     f"{elapsed:.1f} s")
        if "step_time_model" in s:
            lines.append(f"  {s['step_time_model']}; arrivals: {s['arrival_pattern']}; prompts "
                         f"{s['prompts']}; output lengths {s['output_lengths']}")
    v = report.get("verification")
    if v:
        lines.append(
            f"  verification: {v['agreeing_lines']} of {v['stats_lines']} stats lines agree "
            "(running, waiting, KV usage)"
            + (f"; {v['exact_lines']} exactly, at the step each had seen (also generated and "
               "prompt tokens)" if "exact_lines" in v else ""))
        div = v.get("first_divergence")
        if div:
            lines.append(f"    first disagreement: {div['file']}:{div['line']} (step {div['step']}): "
                         + "; ".join(div["differences"]))
        inexact = v.get("first_inexact")
        if inexact and inexact != div:
            lines.append(f"    first line not matched exactly: {inexact['file']}:{inexact['line']}: "
                         + "; ".join(inexact["differences"]))
        it = v.get("iterations")
        if it:
            lines.append(f"  iteration lines: {it['matched']} of {it['lines']} match the replay "
                         "step by step (context and generation requests and tokens, KV usage)")
            mm = it.get("first_mismatch")
            if mm:
                lines.append(f"    FIRST MISMATCH {mm['file']}:{mm['line']} (Iteration("
                             f"{mm['iteration']}), step {mm['step']}): "
                             + "; ".join(mm["differences"])
                             + "; preemptions from there on are not pinned by the log")
    lines.append(
        f"  preemptions{' in this replay' if unc else ''}: {s['preemptions']} "
        f"({count(s['self_preemptions'], 'self-preemption')}), "
        f"{count(s['requests_preempted'], 'request')} preempted, {s['computed_tokens_lost']:,} computed "
        f"tokens thrown away, {s['tokens_recomputed']:,} recomputed at readmission"
        + (f" ({rep.confidence})" if rep.kind == "log" else ""))
    if unc:
        lines += uncertainty_lines(unc, rep.preemptions)
    est = report.get("estimate")
    if est:
        lines.append(
            f"  ESTIMATE: {est['preemptions_low']}-{est['preemptions_high']} preemptions "
            f"(median {est.get('preemptions_median', '?')}): {est['why']}")
        lines.append(f"  to make it exact: {est['make_it_exact']}")
    if s.get("cut_short"):
        lines.append(f"  the log ends while requests were still running (server killed?): "
                     f"{len(s['unfinished_requests'])} unfinished at the cut")
    lines += preemption_table(rep.preemptions, bool(unc))
    # a storm is two or more preemptions; the costliest five, shown in time order
    storms = [st for st in report["storms"] if st["preemptions"] > 1]
    if storms:
        worst = sorted(storms, key=lambda x: (-x["tokens_lost"], x["first_step"]))[:5]
        lines.append("")
        lines.append("  storms (2+ preemptions <= 50 steps apart"
                     + (f"; the {len(worst)} costliest of {len(storms)}" if len(storms) > 5 else "")
                     + "):")
        for st in sorted(worst, key=lambda x: x["first_step"]):
            lines.append(f"    steps {st['first_step']}-{st['last_step']}: "
                         f"{count(st['preemptions'], 'preemption')}, {st['tokens_lost']:,} tokens "
                         f"lost, {count(len(st['victims']), 'victim')}")
    if report["notes"] or report["missing"]:
        lines.append("")
        for n in report["notes"]:
            lines.append(f"  note: {n}")
        for m in report["missing"]:
            lines.append(f"  missing: {m}")
    return "\n".join(lines) + "\n"


def _step_check_lines(c: StepCheck | None) -> list[str]:
    if c is None:
        return ["  steps checked: None", "  every step agrees with the log"]
    out = [f"  steps checked: {c.steps_checked}"]
    if c.kv_events_checked is not None:
        out.append(f"  KV-cache block state checked against vLLM's events after "
                   f"{c.kv_events_checked} steps")
    div = c.first_divergence
    out.append("  every step agrees with the log" if not div else
               f"  FIRST DIVERGENCE at step {div.step} ({div.file}:{div.line}): "
               f"{div.field}: logged {div.logged} vs replayed {div.replayed}")
    return out


def uncertainty_lines(u: dict[str, Any], rows: Sequence[Any] = ()) -> list[str]:
    """The ensemble's figures: each an interval over the replays the log allows."""
    c, r, q = u["preemptions"], u["recomputed_tokens"], u["recompute_ratio"]
    out = [f"  uncertainty: {u['samples'] + 1} replays the log allows (seed {u['seed']}), "
           f"weighted by how well each reproduces {u.get('weighted_by', 'the stats lines')} "
           f"(effective {u['effective_samples']}); 90% intervals:",
           f"    preemptions: median {c['median']}, {c['low']}-{c['high']} (interval)",
           f"    tokens recomputed: median {r['median']:,}, {r['low']:,}-{r['high']:,} (interval)",
           f"    recompute ratio: median {q['median']:.2%}, {q['low']:.2%}-{q['high']:.2%} "
           "(interval)"]
    wins = [w for w in u["windows"] if w["high"] > 0]
    if wins:
        out.append("    preemptions per stats interval (median, 90%):")
        for w in wins:
            span = _hms(w["start"]) + "-" + _hms(w["end"])
            out.append(f"      {span}  {w['median']:>3}  [{w['low']}-{w['high']}]")
    out.append("    " + probability_line(u, rows))
    return out


def probability_line(u: dict[str, Any], rows: Sequence[Any] = ()) -> str:
    """The two probabilities, each named for what it is about, so they never read as a
    contradiction: a *request's* p is that it was preempted at least once, at any step; a
    *row's* p is that this victim was preempted within TOL_STEPS steps of this row's step
    (under LEAD_BELOW the row is a lead). A request can be surely preempted while every row
    naming it is a lead: the log pins that it happened, not when."""
    reqs = u["requests"]
    hi = sum(1 for x in reqs if x["p_preempted"] >= 0.8)
    mid = sum(1 for x in reqs if x["p_preempted"] >= LEAD_BELOW)
    line = (f"requests preempted at least once (at any step): {count(hi, 'request')} with "
            f"p >= 0.8, {mid} with p >= {LEAD_BELOW}, {len(reqs)} with p > 0")
    with_p = [p for p in rows if p.probability is not None]
    if with_p:
        leads = sum(1 for p in with_p if p.probability < LEAD_BELOW)
        line += (f"; table rows (that victim within {TOL_STEPS} steps of that step): "
                 f"{leads} of {count(len(with_p), 'row')} "
                 f"{'is a lead' if leads == 1 else 'are leads'} (p < {LEAD_BELOW})")
    return line + " (per request: --format json)"


def preemption_table(pre: list[Any], probabilities: bool = False) -> list[str]:
    """One line per preemption: step (and wall time, for a log), victim, trigger, rule,
    (V0: recompute or swap), tokens lost and recomputed, prefix hit and step at
    readmission, confidence (and, with an ensemble, the probability that this victim was
    preempted within 5 steps of this step; under 0.5 the row is a lead)."""
    if not pre:
        return ["  no preemption in the replay"]
    timed = any(p.time is not None for p in pre)
    v0 = any(p.mode != "recompute" or p.cumulative is not None for p in pre)
    w = min(30, max(7, *(len(str(p.victim)) for p in pre), *(len(str(p.trigger)) for p in pre)))
    rw = max(4, *(len(_rule(p)) for p in pre))
    head = f"   step{'          time' if timed else ''}  {'victim':<{w}}  {'trigger':<{w}}  {'rule':<{rw}}"
    head += ("  mode     " if v0 else "") + "   lost  recompute    hit  back at  confidence"
    out = ["", head + ("      p" if probabilities else "")]
    for p in pre:
        row = f"  {p.step:>5}"
        if timed:
            t = p.time
            row += "  " + (time.strftime("%H:%M:%S", time.gmtime(t)) + f".{int((t % 1) * 1000):03d}"
                           if t is not None else "-").rjust(12)
        row += f"  {str(p.victim)[:w]:<{w}}  {str(p.trigger)[:w]:<{w}}  {_rule(p):<{rw}}"
        if v0:
            row += f"  {p.mode:<9}"
        hit = p.prefix_hit_at_readmission
        row += (f"  {p.computed_tokens_lost:>5}  {_dash(p.tokens_recomputed):>9}  {_dash(hit):>5}  "
                f"{_dash(p.readmission_step):>7}  {p.confidence:<10}")
        if probabilities and p.probability is not None:
            row += f"  {p.probability:.2f}" + ("  lead" if p.probability < LEAD_BELOW else "")
        out.append(row.rstrip())
    return out


def _hms(t: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(t)) + f".{int((t % 1) * 10)}"


def _rule(p: Any) -> str:
    return (p.victim_rule or "").split(":")[0] + (" self" if p.self_preemption and
                                                  p.victim_rule != "self" else "")


def _dash(x: Any) -> str:
    return "-" if x is None else str(x)
