"""The Check tab: what the replay was checked against, as `kvreplay replay` reports it (the
stats lines, the Iteration lines, a V0 log's warnings, a step trace's steps) and, with the
server's Prometheus scrapes given beside its log, each scrape window's counters replayed
against counted (audit/join.py's `scrape_check`, the same check `kvreplay replay LOG
metrics.prom` prints). The line or window around the shown step is marked.

Every figure is the replay's or the log's; nothing is recomputed here.
"""

from __future__ import annotations

import bisect
import time
from typing import Any

import msgspec
from rich.text import Text

WINDOWS_SHOWN = 40  # scrape windows listed around the shown step


class ScrapeWindow(msgspec.Struct, kw_only=True):
    """Between two scrapes: the counters' increase, replayed and counted (audit/join.py)."""

    t0: float
    t1: float
    preemptions_logged: int
    preemptions_replayed: int
    prompt_logged: int | None = None  # None: the scrapes have no prompt token counter
    prompt_replayed: int | None = None
    gen_logged: int | None = None
    gen_replayed: int | None = None


class ScrapeCheck(msgspec.Struct, kw_only=True):
    """The replay against its server's scrapes (`join.scrape_check`, typed), or only the
    verdict saying why it could not be checked (no windows)."""

    verdict: str
    windows: list[ScrapeWindow] = []
    counted: int | None = None
    replayed: int | None = None
    agreeing_windows: int | None = None


def check_text(tl: Any, step: int, scrapes: ScrapeCheck | None) -> Text:
    rep = tl.source
    t = Text()
    v = rep.verification
    if v is not None:
        t.append("Stats lines\n", style="bold")
        t.append(f"{v.agreeing_lines} of {v.stats_lines} agree with the replay (running, "
                 "waiting, KV usage)")
        if v.exact_lines is not None:
            t.append(f"; {v.exact_lines} exactly, at the step each had seen")
        t.append("\n")
        if v.first_divergence is not None:
            d = v.first_divergence
            t.append(f"first disagreement: {_where(d.file, d.line)} (step {d.step}): "
                     + "; ".join(d.differences) + "\n", style="yellow")
        near = _line_at(v.lines, step)
        if near is not None:
            t.append(f"the line at step {step}: ", style="bold")
            t.append(f"{_where(near.file, near.line)} (step {near.step}) ")
            if near.agrees:
                t.append("agrees\n", style="green")
            else:
                t.append("disagrees: " + "; ".join(near.differences or ()) + "\n", style="red")
        it = v.iterations
        if it:
            t.append("\nIteration lines\n", style="bold")
            t.append(f"{it.matched} of {it.lines} match the replay step by step "
                     "(context and generation requests and tokens, KV usage)\n")
            mm = it.first_mismatch
            if mm:
                t.append(f"first mismatch: {_where(mm.file, mm.line)} (Iteration("
                         f"{mm.iteration}), step {mm.step}): " + "; ".join(mm.differences)
                         + "\n", style="yellow")
    w = rep.warnings
    if w is not None:
        t.append("\nV0 preemption warnings (every 50th)\n", style="bold")
        t.append(f"{w.warnings_matched} of {w.warnings_logged} match the replay (victim, mode, "
                 "cumulative count, time)\n")
        if w.first_divergence is not None:
            d = w.first_divergence
            t.append(f"first mismatch: {_where(d.file, d.line)}: " + "; ".join(d.differences)
                     + "\n", style="yellow")
    c = rep.step_check
    if c is not None:
        t.append("\nStep trace\n", style="bold")
        t.append(f"{c.steps_checked} of {c.steps_logged} logged steps checked\n")
        d = c.first_divergence
        if d is None:
            t.append("every step agrees with the log\n", style="green")
        else:
            t.append(f"first divergence at step {d.step} ({_where(d.file, d.line)}): {d.field}: "
                     f"logged {d.logged} vs replayed {d.replayed}\n", style="red")
    if scrapes is not None:
        t.append("\nPrometheus scrapes\n", style="bold")
        t.append(f"{scrapes.verdict}\n")
        _windows(t, tl, step, scrapes.windows)
    if len(t) == 0:
        t.append(f"{rep.label}: nothing to check this replay against (a workload runs the "
                 "model only).\n", style="dim")
    return t


def _where(file: str | None, line: int | None) -> str:
    return f"{(file or '?').rsplit('/', 1)[-1]}:{line}"


def _line_at(lines: list[Any], step: int) -> Any:
    """The last checked stats line read at or before `step` (None: none yet)."""
    read = [r for r in lines if r.step is not None and r.judged]
    i = bisect.bisect_right([r.step for r in read], step)
    return read[i - 1] if i else None


def _windows(t: Text, tl: Any, step: int, rows: list[ScrapeWindow]) -> None:
    if not rows:
        return
    at = tl.step_time(step)
    here = next((i for i, r in enumerate(rows) if at is not None and r.t0 <= at < r.t1),
                None)
    lo = 0 if here is None else max(0, here - WINDOWS_SHOWN // 2)
    hi = min(len(rows), lo + WINDOWS_SHOWN)
    if lo:
        t.append(f"… {lo} earlier windows\n", style="dim")
    for i in range(lo, hi):
        r = rows[i]
        ok = r.preemptions_replayed == r.preemptions_logged
        t.append("▶ " if i == here else "  ", style="bold")
        t.append(f"{_hms(r.t0)}-{_hms(r.t1)}  preemptions ")
        t.append(f"{r.preemptions_replayed} replayed / {r.preemptions_logged} counted",
                 style="green" if ok else "bold red")
        if r.prompt_logged is not None:
            t.append(f"  prompt tokens {r.prompt_replayed or 0:,} / {r.prompt_logged:,}"
                     f"  generated {r.gen_replayed or 0:,} / {r.gen_logged or 0:,}", style="dim")
        t.append("\n")
    if hi < len(rows):
        t.append(f"… {len(rows) - hi} later windows\n", style="dim")


def _hms(x: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(x))


def scrape_check(rep: Any, metric_paths: list[str]) -> ScrapeCheck:
    """The replay against the scrapes in `metric_paths` (its server's), as `kvreplay replay
    LOG metrics.prom` checks it: the check, or only a verdict saying why there is none."""
    from kvreplay.audit import join, prom

    points, how = join.scrapes_for_facts(rep.facts, prom.read_scrapes(metric_paths))
    chk = join.scrape_check(rep, points) if points else None
    if chk is None:
        return ScrapeCheck(verdict=how if not points else "too few scrapes with "
                           "vllm:num_preemptions_total within the log's time to check")
    return msgspec.convert(chk, ScrapeCheck)
