"""Stage 6, verification: the replay against every counter the log did record.

Consumes: a clocked `Run`, `LogFacts`, the `LogFormat`. Produces, per stats line, the
replayed and logged running / waiting (/ swapped) counts, KV usage and throughputs, with
what disagrees; the exact check (V1: the line matched without tolerance at the step whose
output it had seen); the V0 every-50th warnings against the replay's preemptions; and the
losses the fitting and placement stages minimise. Where a line is read is the format's
rule (`LogFormat.stats_read`); how it is compared is the same for every format.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvreplay.inference.facts import LogFacts, StatsPoint
from kvreplay.inference.formats import LogFormat, interval_of
from kvreplay.inference.lines import (cum_generated, ends, line_time, spans, step_end_lines,
                                      targets, token_anchors)
from kvreplay.replay.checks import (LineDifference, StatsLineCheck, UnloggedWarning, Verification,
                                    WarningLineCheck, WarningReplayed, WarningsCheck)
from kvreplay.replay.records import StepRecord, cumulative

if TYPE_CHECKING:
    from kvreplay.inference.runs import Run


KV_PRINT_TOL = 0.0005 + 1e-9  # a stats line prints KV usage to 0.1%
KV_TOL = 0.02  # the tolerant check: KV usage within 2 points
_NOTHING_SEEN = StepRecord(step=-1)  # the engine before its first step's output


@dataclass(slots=True)
class LineRead:
    """Where a stats line was read: the step whose state it shows, the steps its
    throughputs cover (lo..step), and over how many seconds."""

    step: int | None
    rec: StepRecord | None
    lo: int
    seconds: float
    read_at: str


def _state_at(run: Run, t: float) -> StepRecord | None:
    """The record of the last step that started before wall time t."""
    i = bisect.bisect_right(run.clock, t) - 1
    return run.steps[i] if i >= 0 else None


def _before_output(run: Run, cum: list[int], st: StatsPoint, by_clock: StepRecord | None):
    """The state a line shows that had seen no generated token: the engine before its
    first step's output (all zero: no scheduler stats yet) or after a step that produced
    none (a partial prefill chunk). Its token count cannot say which, so the one that
    matches the line is taken, else the clock's."""
    cands = [_NOTHING_SEEN] + [r for r, c in zip(run.steps, cum) if c == 0]
    for rec in cands:
        if ((st.running is None or rec.num_running == st.running)
                and (st.waiting is None or rec.num_waiting == st.waiting)
                and (st.kv_usage is None or abs(rec.kv_usage - st.kv_usage) <= KV_PRINT_TOL)):
            return rec
    return by_clock


def read_lines(run: Run, facts: LogFacts, fmt: LogFormat, phase: float) -> list[LineRead]:
    """V1 ("anchor"): a line shows the state after the step whose output it had seen
    (where the replay's generated tokens reach the logged count); by the clock only when it
    has none. V0 ("step_end"): a line was printed at the end of the first step more than 5
    s after the previous one; its throughputs cover the replay's own time since then."""
    out: list[LineRead] = []
    prev = -1
    if fmt.stats_read == "anchor":
        cum = cum_generated(run)
        interval = interval_of(facts, fmt)
        anchors = token_anchors(run, facts, fmt, cum)
        for s, a, (g, _) in zip(facts.stats, anchors, targets(facts, fmt)):
            if a is not None:
                rec, how = run.steps[a], "anchor"
            elif g <= 0:
                rec = _before_output(run, cum, s, _state_at(run, line_time(s, phase)))
                how = "before output"
            else:
                rec, how = _state_at(run, line_time(s, phase)), "clock"
            if rec is None:
                out.append(LineRead(None, None, prev + 1, interval, how))
                continue
            out.append(LineRead(rec.step, rec, prev + 1, interval, how))
            prev = rec.step
        return out
    e = ends(run)
    for k, el in zip(step_end_lines(run, facts), spans(facts, fmt)):
        if k is None:
            out.append(LineRead(None, None, prev + 1, el, "step end"))
            continue
        span = e[k] - e[prev] if prev >= 0 else el
        out.append(LineRead(k, run.steps[k], prev + 1, span if span > 0 else el, "step end"))
        prev = k
    return out


def verify(run: Run, facts: LogFacts, fmt: LogFormat, phase: float = 0.5, *,
           prompts_known: bool = False) -> Verification:
    """Replayed vs logged, per stats line, and the first line that disagrees. Prompt
    throughput is counted as vLLM's stat logger counts it; it is reported, not judged (one
    arrival a step earlier or later moves a whole prompt across a line), and checked in the
    exact check only when the prompts are logged."""
    rows = []
    excl = fmt.prompt_excludes_cached
    for s, rd in zip(facts.stats, read_lines(run, facts, fmt, phase)):
        if rd.rec is None:
            row = StatsLineCheck(file=s.file, line=s.line, time=s.time)
            if fmt.unread_line_disagrees:
                row.agrees, row.differences = False, ["the replay has no step at this time"]
            rows.append(row)
            continue
        rec = rd.rec
        window = run.steps[rd.lo: rd.step + 1]  # type: ignore[operator]
        gen = sum(r.generated_tokens for r in window)
        prompt = sum(r.stats_prompt_tokens - (r.stats_prompt_cached if excl else 0) for r in window)
        pre = sum(len(r.preemptions) for r in window)
        sec = rd.seconds
        row = StatsLineCheck(
            file=s.file, line=s.line, time=s.time, step=rd.step, read_at=rd.read_at,
            running=[rec.num_running, s.running], waiting=[rec.num_waiting, s.waiting],
            kv_usage=[round(rec.kv_usage, 4), s.kv_usage],
            generation_throughput=[round(gen / sec, 1), s.generation_throughput],
            prompt_throughput=[round(prompt / sec, 1), s.prompt_throughput],
            preemptions=[pre, s.preemptions])
        if fmt.stats_has_swap:
            row.swapped = [rec.num_swapped, s.swapped]
            row.cpu_kv_usage = [round(rec.cpu_kv_usage, 4), s.cpu_kv_usage]
        row.differences = _differences(row, rec, fmt)
        rows.append(row)
    if fmt.stats_read == "anchor":
        _exact_agreement(rows, run, facts, fmt, prompts_known)
    return verification_report(rows)


def _differences(row: StatsLineCheck, rec: StepRecord, fmt: LogFormat) -> list[str]:
    diffs = []
    counts = [("running", "running"), ("waiting", fmt.waiting_label)]
    if fmt.stats_has_swap:
        counts.append(("swapped", "swapped"))
    for key, label in counts:
        a, b = getattr(row, key)
        if b is not None and a != b:
            diffs.append(f"{label} {a} vs logged {b}")
    usages = [("kv_usage", fmt.kv_label, rec.kv_usage)]
    if fmt.stats_has_swap:
        usages.append(("cpu_kv_usage", "CPU KV usage", rec.cpu_kv_usage))
    for key, label, a in usages:
        b = getattr(row, key)[1]
        if b is not None and abs(a - b) > KV_TOL:
            diffs.append(f"{label} {100 * a:.1f}% vs logged {100 * b:.1f}%")
    a, b = row.preemptions  # type: ignore[misc]
    if b is not None and a != b:
        diffs.append(f"preemptions {a} vs logged {b}")
    return diffs


def _exact_agreement(rows: list[StatsLineCheck], run: Run, facts: LogFacts, fmt: LogFormat,
                     prompts_known: bool) -> None:
    """Mark each row `exact`: the replay is, at that line, the run the log describes.

    A 0.33 stats line shows the state after the last step whose output it had seen: the
    step where the cumulative generated tokens reach the logged count (its anchor). On
    vLLM's own runs of the log cases every line agrees there without tolerance: the count
    is hit, running and waiting are equal, KV usage equal to its printed 0.1%, the
    cumulative prompt tokens equal (tests/logs/test_replay_logs.py). A replay one step off
    somewhere usually misses one of these. The slack is for real logs: an interval is not
    exactly the nominal one, so counts may drift by a fraction of a per mille."""
    interval_rows = [r for r in rows if r.judged]
    if len(interval_rows) != len(facts.stats):
        return
    cum = cum_generated(run)
    anchors = token_anchors(run, facts, fmt, cum)
    excl = fmt.prompt_excludes_cached
    cum_prompt = cumulative([r.stats_prompt_tokens - (r.stats_prompt_cached if excl else 0)
                             for r in run.steps]) if prompts_known else None
    prev_g = prev_p = 0.0
    for row, st, a, (g, p) in zip(interval_rows, facts.stats, anchors, targets(facts, fmt)):
        why: list[str] = []
        if a is None:
            if g > 0:
                why.append(f"the replay never generates the {g:,.0f} tokens logged by then")
            elif row.read_at == "before output" and row.differences:
                why = list(row.differences)
        else:
            rec = run.steps[a]
            tol = 0.5 + 0.002 * max(0.0, g - prev_g)
            if abs(cum[a] - g) > tol:
                why.append(f"generated tokens jump from {cum[a - 1] if a else 0:,} to "
                           f"{cum[a]:,} at step {a}, the log says {g:,.0f}")
            if st.running is not None and rec.num_running != st.running:
                why.append(f"running {rec.num_running} vs {st.running} at step {a}")
            if st.waiting is not None and rec.num_waiting != st.waiting:
                why.append(f"waiting {rec.num_waiting} vs {st.waiting} at step {a}")
            if st.kv_usage is not None and abs(rec.kv_usage - st.kv_usage) > KV_PRINT_TOL:
                why.append(f"KV usage {100 * rec.kv_usage:.2f}% vs {100 * st.kv_usage:.1f}% "
                           f"at step {a}")
            if cum_prompt is not None and st.prompt_throughput is not None:
                ptol = 0.5 + 0.002 * max(0.0, p - prev_p)
                if abs(cum_prompt[a] - p) > ptol:
                    why.append(f"prompt tokens {cum_prompt[a]:,} vs {p:,.0f} by step {a}")
        row.exact = not why
        row.exact_differences = why
        prev_g, prev_p = g, p


def verification_report(rows: list[StatsLineCheck]) -> Verification:
    """Rows of replayed-vs-logged counters (each with its `differences`) -> the report:
    how many stats lines agree, and the first one that does not."""
    first_bad = first_inexact = None
    for row in rows:
        if not row.judged:
            continue
        row.agrees = not row.differences
        if row.differences and first_bad is None:
            first_bad = row
        if row.exact is False and first_inexact is None:
            first_inexact = row
    return Verification(
        stats_lines=len(rows), agreeing_lines=sum(1 for r in rows if r.agrees),
        first_divergence=None if first_bad is None else LineDifference(
            first_bad.file, first_bad.line, first_bad.step, first_bad.differences or []),
        # the first line the replay does not match exactly at the step it saw
        first_inexact=None if first_inexact is None else LineDifference(
            first_inexact.file, first_inexact.line, first_inexact.step,
            first_inexact.exact_differences or []),
        lines=rows,
        # lines matched without tolerance at their anchor step (V1 logs only)
        exact_lines=sum(1 for r in rows if r.exact) if any(r.exact is not None for r in rows)
        else None)


# ---------------------------------------------------------------- V0 warnings
def check_warnings(run: Run, facts: LogFacts, tol_s: float = 2.0) -> WarningsCheck:
    """Each logged every-50th warning against the replay's preemption with the same
    cumulative count: victim, mode, and about the same second."""
    pre = [(rec.step, p) for rec in run.steps for p in rec.preemptions]
    by_k = {p.cumulative: (step, p) for step, p in pre}
    rows = []
    first_bad = None
    for w in facts.v0_preemptions:
        k = w.cumulative
        row = WarningLineCheck(file=w.file, line=w.line, time=w.time, request_id=w.request_id,
                               mode=(w.mode or "").lower() or None, cumulative=k)
        got = by_k.get(k) if k is not None else None
        if got is None:
            row.differences = [f"the replay has only {len(pre)} preemptions"
                               if k is not None else "no cumulative count on the line"]
        else:
            step, p = got
            t = run.clock[step] if step < len(run.clock) else None
            diffs = []
            if p.victim != w.request_id:
                diffs.append(f"victim {p.victim} vs logged {w.request_id}")
            if row.mode and p.mode != row.mode:
                diffs.append(f"mode {p.mode} vs logged {row.mode}")
            dt = None
            if t is not None and w.time is not None:
                dt = round(t - (w.time + 0.5), 3)
                if abs(dt) > tol_s + 0.5:
                    diffs.append(f"at {dt:+.1f} s from the logged second")
            row.replayed = WarningReplayed(victim=p.victim, mode=p.mode, step=step,
                                           time=None if t is None else round(t, 3))
            row.time_diff_s = dt
            row.victim_matches = p.victim == w.request_id
            row.matched = not diffs
            row.differences = diffs
        if not row.matched and first_bad is None:
            first_bad = row
        rows.append(row)
    # warnings the replay printed inside the log's time span but the log does not show
    logged_k = {w.cumulative for w in facts.v0_preemptions}
    extra = []
    for step, p in pre:
        if p.warning_logged and p.cumulative not in logged_k:
            t = run.clock[step] if step < len(run.clock) else None
            if facts.last_time is None or t is None or t <= facts.last_time:
                extra.append(UnloggedWarning(cumulative=p.cumulative, victim=p.victim,
                                             step=step, time=None if t is None else round(t, 3)))
    return WarningsCheck(
        warnings_logged=len(rows),
        warnings_matched=sum(1 for r in rows if r.matched),
        victims_matched=sum(1 for r in rows if r.victim_matches),
        first_divergence=first_bad,
        replay_warnings_not_in_log=extra,
        lines=rows,
    )


# ---------------------------------------------------------------- losses
def fit_loss(run: Run, facts: LogFacts, fmt: LogFormat) -> float:
    """What the step-time fit minimises: the replay read by the clock at each line (V1:
    counts, KV usage, generated tokens so far), or at each line's step end with the
    throughputs and the warnings (V0)."""
    if fmt.stats_read == "anchor":
        return _clock_loss(run, facts, fmt)
    return _rows_loss(run, facts, fmt)


def _clock_loss(run: Run, facts: LogFacts, fmt: LogFormat, phase: float = 0.5) -> float:
    cum = cum_generated(run)
    total = 0.0
    for s, (g, _) in zip(facts.stats, targets(facts, fmt)):
        rec = _state_at(run, line_time(s, phase))
        if rec is None:
            continue
        if s.running is not None:
            total += (rec.num_running - s.running) ** 2
        if s.waiting is not None:
            total += (rec.num_waiting - s.waiting) ** 2
        if s.kv_usage is not None:
            total += (100 * (rec.kv_usage - s.kv_usage)) ** 2 / 25.0
        # generated tokens so far, in units of one stats interval's average
        scale = max(1.0, g / max(1, s.index + 1))
        total += ((cum[rec.step] - g) / scale) ** 2
    return total / max(1, len(facts.stats))


def _rows_loss(run: Run, facts: LogFacts, fmt: LogFormat) -> float:
    """Stats counters (usage in points of 5%), throughputs, and the warnings (a wrong
    victim or mode weighs as much as 5 requests off)."""
    total = 0.0
    n = 0
    for row in verify(run, facts, fmt).lines:
        n += 1
        if row.step is None:
            total += 25.0
            continue
        for key in ("running", "waiting", "swapped"):
            pair = getattr(row, key)
            if pair is not None and pair[1] is not None:
                total += (pair[0] - pair[1]) ** 2
        for key in ("kv_usage", "cpu_kv_usage"):
            pair = getattr(row, key)
            if pair is not None and pair[1] is not None:
                total += (100 * (pair[0] - pair[1]) / 5.0) ** 2
        for key in ("prompt_throughput", "generation_throughput"):
            a, b = getattr(row, key)
            if b is not None:
                total += 4.0 * ((a - b) / max(10.0, b)) ** 2
    if fmt.preemption_warnings:
        for w in check_warnings(run, facts).lines:
            n += 1
            rep = w.replayed
            if rep is None:
                total += 25.0
                continue
            if not w.victim_matches:
                total += 25.0
            if w.mode and rep.mode != w.mode:
                total += 25.0
            if w.time_diff_s is not None:
                total += min(25.0, max(0.0, abs(w.time_diff_s) - 0.5) ** 2)
    return total / max(1, n)


def anchored_loss(run: Run, facts: LogFacts, fmt: LogFormat, anchors: list[int | None],
                  phase: float = 0.5) -> float:
    """Disagreement with the stats lines, read at the step each one closes (its anchor):
    running and waiting counts, KV usage (in points of 5%). A line that had seen no output
    yet must not come after the end of a step that produced some (read with the clock)."""
    total = 0.0
    n = 0
    clock = run.clock + [run.end]
    cum = cum_generated(run)
    for a, st, (g, _) in zip(anchors, facts.stats, targets(facts, fmt)):
        if a is None and g <= 0:
            ended = bisect.bisect_right(clock, line_time(st, phase)) - 2  # last step ended by then
            if 0 <= ended < len(cum) and cum[ended] > 0:
                total += 25.0
            n += 1
            continue
        if a is None or a >= len(run.steps):
            total += 25.0
            n += 1
            continue
        rec = run.steps[a]
        if st.running is not None:
            total += (rec.num_running - st.running) ** 2
        if st.waiting is not None:
            total += (rec.num_waiting - st.waiting) ** 2
        if st.kv_usage is not None:
            total += (100 * (rec.kv_usage - st.kv_usage) / 5.0) ** 2
        n += 1
    return total / max(1, n)
