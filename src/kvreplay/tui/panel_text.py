"""Text of each panel, from the timeline's records (Rich Text; no widgets here).

Every number shown comes from the replay (replay/timeline.py); nothing is recomputed.
"""

from __future__ import annotations

import linecache
from datetime import datetime, timezone
from typing import Any

from rich.text import Text

from kvreplay.replay.timeline import (
    CACHED, FREE, NULL, SHARED, EngineState, Preemption, StateDiff, StepView, Timeline,
)

PALETTE = ("#5fafff", "#87d75f", "#ffaf5f", "#d787ff", "#5fd7d7", "#ff875f", "#afaf00",
           "#ff5fd7", "#00af87", "#d7af87", "#8787ff", "#d7d75f")
KIND_STYLE = {"prefill": "cyan", "decode": "green", "recompute": "bold red"}


def request_colour(tl: Timeline, rid: str) -> str:
    try:
        return PALETTE[tl.order[rid] % len(PALETTE)]
    except KeyError:
        return "white"


def ids_text(tl: Timeline, ids: list[str], selected: str | None, limit: int = 60) -> Text:
    t = Text()
    for i, rid in enumerate(ids[:limit]):
        if i:
            t.append(" ")
        style = request_colour(tl, rid)
        if rid == selected:
            style += " reverse"
        t.append(rid, style=style)
    if len(ids) > limit:
        t.append(f" … +{len(ids) - limit}", style="dim")
    return t


def _clock(t: float, with_date: bool = False) -> str:
    """A log time stamp (server-local time, kept as UTC epoch seconds): 10:01:02.350."""
    d = datetime.fromtimestamp(t, timezone.utc)
    return d.strftime("%m-%d %H:%M:%S.%f" if with_date else "%H:%M:%S.%f")[:-3]


def spans_days(tl: Timeline) -> bool:
    times = tl.step_times
    return bool(times) and int(times[0] // 86400) != int(times[-1] // 86400)


def clock(tl: Timeline, step: int) -> str | None:
    """The wall-clock start of `step` (log sources), or None."""
    t = tl.step_time(step)
    return None if t is None else _clock(t, spans_days(tl))


def clock_of(tl: Timeline, t: float) -> str:
    return _clock(t, spans_days(tl))


def step_text(tl: Timeline, v: StepView, selected: str | None) -> Text:
    rec = v.record
    cfg = tl.config
    t = Text()
    t.append(f"Step {v.step}", style="bold")
    total = "" if tl.done else " loaded"
    t.append(f" / {tl.num_steps - 1}{total}", style="dim")
    at = tl.step_time(v.step)
    if at is not None:
        t.append(f"  at {clock(tl, v.step)}", style="bold")
        t.append(f" (+{at - tl.step_times[0]:.3f} s)", style="dim")
    t.append("\n")
    if rec.idle:
        t.append("idle: nothing to schedule\n", style="dim")
    used = rec.num_scheduled_tokens
    left = "" if v.token_budget_left is None else f", {v.token_budget_left} left"
    t.append(f"budget {cfg.max_num_batched_tokens} tokens: {used} scheduled{left}\n")
    t.append(f"seqs {len(v.after.running)}/{cfg.max_num_seqs}  ")
    t.append(f"free blocks {v.before.free_blocks} → {rec.free_blocks}  ")
    t.append(f"KV {rec.kv_usage * 100:.1f}%")
    if cfg.enable_prefix_caching:
        t.append(f"  cached {v.after.cached_blocks}")
    t.append("\n")
    if rec.arrivals:
        t.append("Arrived: ").append_text(ids_text(tl, rec.arrivals, selected)).append("\n")
    t.append(f"\nScheduled ({len(v.scheduled)})\n", style="bold")
    for s in v.scheduled:
        mark = "▶ " if s.rid == selected else "  "
        t.append(mark)
        t.append(f"{s.rid:<8}", style=request_colour(tl, s.rid))
        t.append(f"{s.tokens:>6}  ")
        t.append(f"{s.kind:<9}", style=KIND_STYLE.get(s.kind, ""))
        if s.detail:
            t.append(f" {s.detail}", style="dim")
        t.append("\n")
    for label, adm, hit in (("Admitted", v.admitted, True), ("Resumed", v.resumed, True),
                            ("Swapped in", v.swapped_in, False)):
        if adm:
            t.append(f"{label}: ", style="bold")
            for i, a in enumerate(adm):
                if i:
                    t.append(", ")
                t.append(a.request, style=request_colour(tl, a.request))
                if hit:
                    t.append(f" (hit {a.prefix_hit})", style="dim")
            t.append("\n")
    for p in v.preemptions:
        t.append("Preempted: ", style="bold red")
        t.append(p.victim, style=request_colour(tl, p.victim))
        t.append(f" by {p.trigger}, {p.computed_tokens_lost} tokens lost\n")
    if rec.finished:
        t.append("Finished: ", style="bold").append_text(ids_text(tl, rec.finished, selected))
        t.append("\n")
    blocked = rec.blocked
    if blocked is not None:
        t.append("Blocked: ", style="bold yellow")
        t.append(f"{blocked.request} ({blocked.reason}")
        if blocked.blocks_needed is not None:
            t.append(f", needs {blocked.blocks_needed} blocks, {blocked.free_blocks} free")
        t.append(")\n")
    t.append(f"\nRunning ({len(v.after.running)})\n", style="bold")
    t.append_text(ids_text(tl, v.after.running, selected)).append("\n")
    t.append(f"Waiting ({len(v.after.waiting)})\n", style="bold")
    t.append_text(ids_text(tl, v.after.waiting, selected)).append("\n")
    return t


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def why_text(tl: Timeline, v: StepView) -> Text:
    t = Text()
    if tl.headline:
        t.append("This log: ", style="bold yellow").append(tl.headline + "\n\n", style="yellow")
    if not v.preemptions:
        t.append(f"No preemption at step {v.step}.\n", style="bold")
        nxt = tl.next_event("preemption", v.step)
        prv = tl.next_event("preemption", v.step, forward=False)
        t.append(f"previous: {'step ' + str(prv) if prv is not None else 'none'}   ")
        t.append(f"next: {'step ' + str(nxt) if nxt is not None else 'none'}   (N / n)\n")
        blocked = v.record.blocked
        if blocked is not None:
            t.append("\nWhy the head of waiting was not admitted\n", style="bold yellow")
            t.append(f"{blocked.request}: {blocked.reason}; {blocked.num_new_tokens} new "
                     f"tokens, budget {blocked.token_budget}")
            if blocked.blocks_needed is not None:
                t.append(f", needs {blocked.blocks_needed} blocks, {blocked.free_blocks} free")
                if blocked.watermark_blocks:
                    t.append(f", watermark {blocked.watermark_blocks}")
            t.append("\n")
        return t
    for p in v.preemptions:
        r = v.before.requests.get(p.victim)
        why_one(t, tl, p, tl.preemption_confidence(p),
                r.blocks if r is not None and len(r.blocks) == p.blocks_held else ())
        t.append("\n")
    return t


CONFIDENCE_MEANING = {
    "exact-by-log": "(the log pins it: its Iteration lines, or a V0 preemption warning)",
    "consistent": "(not in the log; the stats lines either side agree exactly with the replay)",
    "inferred": "(reconstructed: the stats lines around it disagree with the replay, or "
                "prompt lengths were estimated)",
}


def _est(tl: Timeline) -> str:
    """"~" before a prompt length the replay estimated (the log gives none)."""
    return "~" if tl.source.info.prompts == "estimated" else ""


def preemption_count(src, n: int) -> str:
    """The preemption count as the report gives it: the ensemble's 90% interval (or the
    rough range of a log no replay fits) where there is one, this replay's count beside."""
    unc = getattr(src, "uncertainty", None)
    est = getattr(src, "estimate", None)
    if unc is not None and unc.preemptions.get("low") != unc.preemptions.get("high"):
        return (f"{unc.preemptions['low']}-{unc.preemptions['high']} preemptions "
                f"(90%; this replay {n})")
    if est is not None and est.preemptions_low != est.preemptions_high:
        return (f"{est.preemptions_low}-{est.preemptions_high} preemptions "
                f"(rough range; this replay {n})")
    return f"{n} preemption{'' if n == 1 else 's'}"


def _n(n: int | None, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def why_one(t: Text, tl: Timeline, p: Preemption, confidence: str,
            held_blocks: tuple[int, ...] = ()) -> None:
    total = len(tl.preemptions)
    t.append(f"Preemption {p.index + 1} of {total}{'' if tl.done else '+'} at step {p.step}",
             style="bold")
    conf_style = {"exact": "green", "exact-by-log": "green",
                  "consistent": "yellow"}.get(confidence, "red")
    t.append("   confidence: ").append(confidence, style=conf_style).append("\n")
    if getattr(p, "basis", None):
        t.append(f"({p.basis})\n", style="dim")
    elif confidence in CONFIDENCE_MEANING:
        t.append(CONFIDENCE_MEANING[confidence] + "\n", style="dim")
    prob = tl.preemption_probability(p)
    if prob is not None:
        share, k = prob
        t.append("   probability: ").append(
            f"{share:.2f}", style="green" if share >= 0.8 else "yellow" if share >= 0.5 else "red")
        t.append(f" of {k} weighted replays the log allows preempt {p.victim} within 5 steps "
                 "of here" + ("; a lead, not a fact" if share < 0.5 else "") + "\n", style="dim")
    t.append("Victim   ").append(p.victim, style=f"bold {request_colour(tl, p.victim)}")
    t.append(f"  ({_ordinal(p.nth_of_victim)} preemption of it)\n")
    t.append("Trigger  ").append(p.trigger, style=f"bold {request_colour(tl, p.trigger)}")
    if p.self_preemption:
        t.append("  (self-preemption: nothing else left to preempt)", style="yellow")
    t.append("\n")
    if p.blocks_needed is not None:
        t.append(f"{p.trigger} needed {_n(p.blocks_needed, 'block')}; "
                 f"{p.free_blocks_at_failure} free at that moment\n")
    t.append("Rule     ").append(p.victim_rule or "?", style="bold")
    t.append("\n")
    t.append(f"Victim held {_n(p.blocks_held, 'block')}")
    if held_blocks:
        t.append(f" {_ranges(held_blocks)}")
    if p.mode == "swap":
        t.append(f"; swapped out to CPU memory ({_n(p.blocks_swapped_out, 'block')})\n")
    else:
        t.append(f"; free {p.free_blocks_before} → {p.free_blocks_after} after freeing them\n")
    prompt = tl.prompt_len.get(p.victim, 0)
    t.append("Thrown away: ", style="bold red")
    t.append(f"{p.computed_tokens_lost} computed tokens", style="bold red")
    t.append(f" (sequence {p.num_tokens} = prompt {_est(tl)}{prompt} + {p.num_output_tokens} "
             "output)\n")
    if p.was_scheduled_this_step:
        t.append(f"It was already scheduled this step: {p.rolled_back_tokens} tokens rolled back\n")
    if p.readmission_step is None:
        t.append("Not readmitted before the end of the run\n", style="yellow")
    elif p.mode == "swap":
        t.append(f"Swapped back in at step {p.readmission_step} ({p.waited_steps} steps "
                 "later): nothing to recompute\n")
    else:
        t.append(f"Readmitted at step {p.readmission_step} ({p.waited_steps} steps later); "
                 f"prefix hit {p.prefix_hit_at_readmission} tokens\n")
        t.append("Recompute cost: ", style="bold")
        t.append(f"{p.tokens_recomputed} tokens prefilled again", style="bold")
        t.append(f" (its tokens at readmission less the {p.prefix_hit_at_readmission} still "
                 "cached, or as many as it got before it was preempted again)\n")


def block_cells(state: EngineState) -> list[tuple[int, int, list[str]]]:
    return [(i, s, state.owners.get(i, [])) for i, s in enumerate(state.block_states)]


def block_map_text(tl: Timeline, state: EngineState, selected: str | None, width: int,
                   label: str) -> Text:
    t = Text()
    counts = state.counts()
    t.append(f"{label}  ", style="bold")
    t.append(f"free {counts['free']}  ").append("cached ", style="cyan").append(f"{counts['cached']}  ")
    t.append(f"held {counts['held']}  ").append("shared ", style="bold magenta")
    t.append(f"{counts['shared']}  of {len(state.block_states)}\n")
    per_row = max(4, (width - 6) // 3)
    sel_blocks = set(state.requests[selected].blocks) if selected in state.requests else set()
    for i, s, owners in block_cells(state):
        if i % per_row == 0:
            if i:
                t.append("\n")
            t.append(f"{i:>5} ", style="dim")
        if s == NULL:
            t.append("×× ", style="dim")
        elif s == FREE:
            t.append("·· ", style="dim")
        elif s == CACHED:
            t.append("○○ ", style="cyan")
        else:
            glyph = "▓▓ " if s == SHARED else "██ "
            colour = request_colour(tl, owners[0]) if owners else "white"
            if i in sel_blocks:
                t.append(glyph[:2], style=f"bold {colour} on white")
                t.append(" ")
            elif selected is not None and sel_blocks:
                t.append(glyph, style=f"{colour} dim")
            else:
                t.append(glyph, style=colour)
    t.append("\n\n")
    t.append("×× null  ·· free  ", style="dim").append("○○ free, cached (evictable)  ", style="cyan")
    t.append("██ held  ▓▓ shared (ref>1)\n")
    if selected is not None:
        r = state.requests.get(selected)
        t.append("Selected ").append(selected, style=f"bold {request_colour(tl, selected)}")
        if r is None:
            t.append(": not live at this step\n")
        else:
            t.append(f": {len(r.blocks)} blocks {_ranges(r.blocks)}\n")
    holders = [(rid, r) for rid, r in state.requests.items() if r.blocks]
    for rid, r in holders[:40]:
        t.append(f"{rid:<8}", style=request_colour(tl, rid))
        t.append(f" {len(r.blocks):>4} blocks {_ranges(r.blocks)}\n", style="dim")
    return t


def _ranges(ids: tuple[int, ...] | list[int]) -> str:
    out = []
    start = prev = None
    for i in ids:
        if start is None:
            start = prev = i
        elif i == prev + 1:  # type: ignore[operator]
            prev = i
        else:
            out.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = prev = i
    if start is not None:
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
    s = ",".join(out)
    return f"[{s[:60]}{'…' if len(s) > 60 else ''}]"


LIFE_STYLE = {"preempted": "bold red", "resumed": "yellow", "finished": "green",
              "admitted": "cyan", "triggered": "magenta"}


def request_header(tl: Timeline, rid: str, v: StepView | None) -> Text:
    spec = tl.workload.requests[tl.order[rid]]
    arrives = tl.arrival_step(rid)
    t = Text()
    t.append("Request ").append(rid, style=f"bold {request_colour(tl, rid)}")
    t.append(f"  prompt {_est(tl)}{len(spec.prompt_token_ids)}"
             + (" (estimated: the log does not give prompt lengths)" if _est(tl) else "")
             + f", max_tokens {spec.max_tokens}, "
             f"priority {spec.priority}, "
             + (f"arrives at step {arrives}\n" if arrives is not None else "never arrives\n"))
    if v is not None:
        r = v.after.requests.get(rid)
        if r is None:
            done = tl.finished_step.get(rid)
            state = "finished" if done is not None and done <= v.step else "not arrived"
            t.append(f"at step {v.step}: {state}\n")
        else:
            t.append(f"at step {v.step}: {r.status}, computed {r.num_computed_tokens}/{r.num_tokens}, "
                     f"{_n(len(r.blocks), 'block')}, {_n(r.num_preemptions, 'preemption')}\n")
    n = sum(1 for e in tl.life.get(rid, []) if e.kind == "preempted")
    lost = sum(tl.preemptions[e.preemption].computed_tokens_lost for e in tl.life.get(rid, [])
               if e.kind == "preempted" and e.preemption is not None)
    t.append(f"preempted {_n(n, 'time')}, {lost} computed tokens thrown away in all\n")
    return t


def life_line(tl: Timeline, e: Any, current: int) -> Text:
    t = Text()
    t.append("▶ " if e.step == current else "  ")
    t.append(f"step {e.step:>7}  ")
    t.append(f"{e.kind:<10}", style=LIFE_STYLE.get(e.kind, ""))
    if e.detail:
        t.append(f" {e.detail}")
    if e.kind == "preempted" and e.preemption is not None:
        p = tl.preemptions[e.preemption]
        t.append(f"  [{p.computed_tokens_lost} tokens lost]", style="red")
    return t


def diff_text(d: StateDiff, title: str) -> Text:
    t = Text()
    t.append(f"{title}: state after step {d.a} → after step {d.b}\n", style="bold")
    if d.counters:
        for name, a, b in d.counters:
            t.append(f"{name}: {a} → {b}\n")
    if d.running[0] != d.running[1]:
        t.append("running: ", style="bold").append(" ".join(d.running[0]) or "-")
        t.append(" → ").append(" ".join(d.running[1]) or "-").append("\n")
    if d.waiting[0] != d.waiting[1]:
        t.append("waiting: ", style="bold").append(" ".join(d.waiting[0][:20]) or "-")
        t.append(" → ").append(" ".join(d.waiting[1][:20]) or "-").append("\n")
    if d.added:
        t.append(f"new live requests: {' '.join(d.added)}\n", style="green")
    if d.removed:
        t.append(f"gone (finished): {' '.join(d.removed)}\n", style="yellow")
    # routine progress (computed and sequence both +k) on one line; the rest first
    by_rid: dict[str, dict[str, tuple[Any, Any]]] = {}
    for rid, f, a, b in d.changed:
        by_rid.setdefault(rid, {})[f] = (a, b)
    routine: list[str] = []
    other: list[tuple[str, str, Any, Any]] = []
    for rid, fields in by_rid.items():
        c, n = fields.get("num_computed_tokens"), fields.get("num_tokens")
        if set(fields) <= {"num_computed_tokens", "num_tokens", "blocks"} and c and c[1] > c[0]:
            routine.append(f"{rid}+{c[1] - c[0]}")
            if "blocks" in fields:
                other.append((rid, "blocks", *fields["blocks"]))
            continue
        other.extend((rid, f, a, b) for f, (a, b) in fields.items())
    for rid, f, a, b in other[:60]:
        t.append(f"{rid} {f}: {a} → {b}\n", style="bold" if f in ("status", "num_preemptions") else "")
    if routine:
        t.append("computed tokens: ", style="bold").append(" ".join(routine[:80]) + "\n", style="dim")
    t.append(f"\nblocks changed: {len(d.blocks)}\n", style="bold")
    for bid, a, b in d.blocks[:80]:
        t.append(f"  block {bid:>5}: {a} → {b}\n")
    if len(d.blocks) > 80:
        t.append(f"  … {len(d.blocks) - 80} more\n", style="dim")
    if not (d.counters or d.added or d.removed or d.changed or d.blocks
            or d.running[0] != d.running[1] or d.waiting[0] != d.waiting[1]):
        t.append("no change\n", style="dim")
    return t


LOG_CONTEXT = 12  # lines shown from each neighbouring step when the step has none
LOG_LINE_CHARS = 400  # longer lines (prompts, token ids) are cut


def _log_lines(t: Text, refs: list[tuple[str, int]], kept: Any = None) -> None:
    """The lines `refs` (file, line): read back from the file, or from `kept` (a followed
    log's lines, Timeline.lines)."""
    for path, lineno in refs:
        if kept is not None:
            text = kept[lineno - 1].rstrip("\n") if 0 < lineno <= len(kept) else ""
        else:
            text = linecache.getline(path, lineno).rstrip("\n")
        if len(text) > LOG_LINE_CHARS:
            text = f"{text[:LOG_LINE_CHARS]} … (+{len(text) - LOG_LINE_CHARS} chars)"
        t.append(f"{path.rsplit('/', 1)[-1]}:{lineno}: ", style="dim").append(text + "\n")


def _at(tl: Timeline, step: int) -> str:
    c = clock(tl, step)
    return f" ({c})" if c else ""


def log_text(tl: Timeline, step: int) -> Text:
    t = Text()
    lines = getattr(tl.source, "log_lines", {}) or {}
    refs = lines.get(step)
    if not lines:
        t.append(f"This replay came from {tl.source.label}: no log lines behind its steps.\n",
                 style="dim")
        return t
    if refs:
        t.append(f"Log lines behind step {step}{_at(tl, step)}\n", style="bold")
        _log_lines(t, refs[:200], tl.lines)
        if len(refs) > 200:
            t.append(f"… {len(refs) - 200} more lines\n", style="dim")
        return t
    before, after = tl.nearest_log_steps(step)
    t.append(f"No log line was written at step {step}{_at(tl, step)}; the nearest ones:\n",
             style="dim")
    if before is None:
        t.append("\n(nothing logged before this step)\n", style="dim")
    else:
        prev = lines[before]
        t.append(f"\nstep {before}{_at(tl, before)}, {_n(step - before, 'step')} earlier\n",
                 style="bold")
        if len(prev) > LOG_CONTEXT:
            t.append(f"… {len(prev) - LOG_CONTEXT} earlier lines of step {before}\n", style="dim")
        _log_lines(t, prev[-LOG_CONTEXT:], tl.lines)
    t.append(f"\n▶ step {step}: no log line\n", style="bold reverse")
    if after is None:
        t.append("\n(nothing logged after this step)\n", style="dim")
    else:
        nxt = lines[after]
        t.append(f"\nstep {after}{_at(tl, after)}, {_n(after - step, 'step')} later\n",
                 style="bold")
        _log_lines(t, nxt[:LOG_CONTEXT], tl.lines)
        if len(nxt) > LOG_CONTEXT:
            t.append(f"… {len(nxt) - LOG_CONTEXT} more lines of step {after}\n", style="dim")
    return t
