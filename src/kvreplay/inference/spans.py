"""Request spans beside the log: vLLM's `llm_request` spans (events.RequestSpan) joined to
the log's requests, and the replay checked against them.

Join: by request id (`gen_ai.request.id` is the id the `Received request` line shows; a
repeated id's later lines are `<id>#2`.. and take the later spans). A joined request gets
its arrival to the nanosecond (`LogRequest.precise_time`, the span's start on the log's
clock), its prompt length where the log has no prompt, its output length where the log has
none. An unjoined request keeps its whole second: never taken as precise.

Clock offset: with none, every span start lies inside its Received line's second (the line
is written a few ms after the arrival). The offsets the spans allow form an interval
[max(start - second) - 1, min(start - second)]; when 0 lies in it (give or take the line's
delay) there is no offset, else its middle is the offset, subtracted and reported.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvreplay.events import RequestSpan
from kvreplay.inference.facts import LogFacts

LINE_DELAY_S = 0.05  # a Received line may be written this late after its arrival
TTFT_TOL_S = 0.05
# The admission pin (clock[a] = arrival + queue time) is circular with the arrival's own
# placement (a is where the clock says the arrival came in): off.
PIN_ADMISSIONS = False  # first-token check's slack (the replay's clock is fitted)


@dataclass(slots=True)
class SpanJoin:
    spans: int  # llm_request spans read
    requests: int  # requests in the log
    joined: int  # requests with a span
    offset_s: float  # subtracted from every span time (0.0: none found)
    offset_interval: tuple[float, float]  # the offsets the spans allow
    unjoined_spans: int  # spans whose id no Received line shows
    problems: list[str] = field(default_factory=list)  # unparsed span lines (file:line: why)
    by_request: dict[int, RequestSpan] = field(default_factory=dict)  # request index -> span

    @property
    def coverage(self) -> float:
        return self.joined / self.requests if self.requests else 0.0

    def summary(self) -> dict[str, Any]:
        return {"spans": self.spans, "requests": self.requests, "joined": self.joined,
                "coverage": round(self.coverage, 4), "clock_offset_s": round(self.offset_s, 6),
                "unjoined_spans": self.unjoined_spans, "unparsed_span_lines": len(self.problems)}


def clock_offset(pairs: list[tuple[float, float]]) -> tuple[float, tuple[float, float]]:
    """The span clock minus the log's clock, from (span start, logged whole second) pairs;
    0.0 when the spans agree with the seconds. Also the interval of offsets they allow."""
    xs = [s - sec for s, sec in pairs]
    if not xs:
        return 0.0, (0.0, 0.0)
    lo, hi = max(xs) - 1.0, min(xs)
    if lo - LINE_DELAY_S <= 0.0 <= hi + LINE_DELAY_S:
        return 0.0, (lo, hi)
    if lo > hi:  # the spans disagree among themselves by more than a second: the middle
        mid = sorted(xs)[len(xs) // 2] - 0.5
        return mid, (lo, hi)
    return (lo + hi) / 2.0, (lo, hi)


def join_spans(facts: LogFacts, spans: list[RequestSpan],
               problems: list[str] | None = None) -> SpanJoin:
    """Join spans to the log's requests (mutates the requests; see the module doc) and
    add notes saying what was joined, the coverage and any clock offset."""
    by_id: dict[str, list[RequestSpan]] = {}
    for s in sorted(spans, key=lambda s: s.start):
        by_id.setdefault(s.request_id, []).append(s)
    pairs: dict[int, RequestSpan] = {}
    for r in facts.requests:
        base, _, rep = r.log_id.partition("#")
        k = int(rep) - 1 if rep.isdigit() else 0
        cands = by_id.get(base) or by_id.get(r.log_id) or []
        if k < len(cands):
            pairs[r.index] = cands[k]
    used = {id(s) for s in pairs.values()}
    reqs = {r.index: r for r in facts.requests}
    offset, interval = clock_offset(
        [(s.start, reqs[i].time) for i, s in pairs.items() if reqs[i].time is not None])
    for i, s in pairs.items():
        r = reqs[i]
        t = s.start - offset
        if r.time is not None:  # its line's second bounds it (the line is a little late)
            t = min(max(t, r.time - LINE_DELAY_S), r.time + 0.999)
        r.precise_time = t
        r.span_times = (
            None if s.time_in_queue is None else t + s.time_in_queue,
            None if s.time_to_first_token is None else t + s.time_to_first_token,
            None if s.e2e is None else t + s.e2e)
        if r.prompt_token_ids is None and r.prompt_len is None and s.prompt_tokens:
            r.prompt_len = s.prompt_tokens
        if r.output_len is None and s.completion_tokens is not None:
            r.output_len = s.completion_tokens
    join = SpanJoin(spans=len(spans), requests=len(facts.requests), joined=len(pairs),
                    offset_s=offset, offset_interval=interval,
                    unjoined_spans=sum(1 for s in spans if id(s) not in used),
                    problems=list(problems or []), by_request=pairs)
    facts.notes.append(
        f"request spans: {join.joined} of {join.requests} requests joined by request id "
        f"({100 * join.coverage:.0f}%); their arrivals are the spans' start times"
        + ("" if join.joined == join.requests else
           "; the others are placed inside their logged seconds as without spans"))
    if offset:
        facts.notes.append(
            f"request spans: the span exporter's clock is {offset:+.3f} s off the log's "
            f"(span starts vs the Received lines' seconds allow {interval[0]:+.3f} .. "
            f"{interval[1]:+.3f} s); corrected")
    if join.unjoined_spans:
        facts.notes.append(f"request spans: {join.unjoined_spans} span(s) name no request of "
                           "the log (another server, or outside the log's time range)")
    if join.problems:
        facts.notes.append(f"request spans: {len(join.problems)} line(s) not read, e.g. "
                           f"{join.problems[0]}")
    return join


def check_spans(rep: Any, join: SpanJoin, step_s: float | None = None) -> dict[str, Any]:
    """The spans the replay contradicts: its first token for a request more than
    TTFT_TOL_S after the span's (arrival + time_to_first_token), or its first admission
    more than a step before the span's (arrival + time_in_queue). Reads the replay's steps
    and clock; returns counts and the first few request ids."""
    clock = rep.clock
    if not clock or not rep.steps:
        return {"checked": 0}
    ends = list(clock[1:]) + [clock[-1] + (clock[-1] - clock[-2] if len(clock) > 1 else 0.0)]
    first_tok: dict[str, float] = {}
    admitted: dict[str, float] = {}
    for k, rec in enumerate(rep.steps):
        for rid in rec.first_tokens:
            first_tok.setdefault(rid, ends[k])
        for a in rec.admitted:
            admitted.setdefault(a.request, clock[k])
    ids = {r.index: r.log_id for r in rep.facts.requests} if rep.facts is not None else {}
    late, early, checked = [], [], 0
    for i, s in sorted(join.by_request.items()):
        rid = ids.get(i)
        if rid is None:
            continue
        arrival = s.start - join.offset_s
        checked += 1
        ft = first_tok.get(rid)
        if ft is not None and s.time_to_first_token is not None and \
                ft > arrival + s.time_to_first_token + TTFT_TOL_S:
            late.append(rid)
        ad = admitted.get(rid)
        slack = step_s if step_s is not None else 0.0
        if ad is not None and s.time_in_queue is not None and \
                ad < arrival + s.time_in_queue - slack - LINE_DELAY_S:
            early.append(rid)
    return {"checked": checked, "first_token_late": len(late), "admitted_early": len(early),
            "first_token_late_ids": late[:5], "admitted_early_ids": early[:5]}


def with_span_pins(pts: list[tuple[int, float]], run: Any,
                   facts: LogFacts) -> list[tuple[int, float]]:
    """The wall-clock pins the spans add to the stats lines' (clock.wall_clock): a request
    first scheduled at step a was so at that step's start (clock[a] = arrival + queue
    time); its first token and its last output came out as steps s and f ended
    (clock[s+1], clock[f+1]). The replay's own steps are pinned, so a replay that
    disagrees with the spans gets a clock that stretches. Pins that would run the clock
    backwards are left out (the earlier pin of a step wins: the stats lines' first)."""
    times = {r.log_id: r.span_times for r in facts.requests if r.span_times is not None}
    n = len(run.steps)
    merged = dict(pts)
    seen_admit: set[str] = set()
    seen_first: set[str] = set()
    for rec in run.steps:
        k = rec.step
        for a in rec.admitted:
            rid = a.request.split("_parallel_sample_")[0]
            if rid in seen_admit:
                continue
            seen_admit.add(rid)
            st = times.get(rid)
            if st is not None and st[0] is not None and k < n and PIN_ADMISSIONS:
                merged[k] = st[0]
        for rid in rec.first_tokens:
            rid = rid.split("_parallel_sample_")[0]
            if rid in seen_first:
                continue
            seen_first.add(rid)
            st = times.get(rid)
            if st is not None and st[1] is not None and k + 1 <= n:
                merged[k + 1] = st[1]
        for rid in rec.finished:
            st = times.get(rid.split("_parallel_sample_")[0])
            if st is not None and st[2] is not None and k + 1 <= n:
                merged[k + 1] = st[2]
    out: list[tuple[int, float]] = []
    for step, t in sorted(merged.items()):
        if out and t <= out[-1][1]:
            continue
        out.append((step, t))
    return out


def span_windows(run: Any, facts: LogFacts) -> list[tuple[int, int, float]]:
    """(first step, last step, seconds) the spans time in the run: from a request's first
    admission (the start of step a) to its first token (the end of step s) and to its last
    output (the end of step f), for the step-time regression (clock.regression)."""
    times = {r.log_id: r.span_times for r in facts.requests if r.span_times is not None}
    admit: dict[str, int] = {}
    first: dict[str, int] = {}
    fin: dict[str, int] = {}
    for rec in run.steps:
        for a in rec.admitted:
            admit.setdefault(a.request, rec.step)
        for rid in rec.first_tokens:
            first.setdefault(rid, rec.step)
        for rid in rec.finished:
            fin.setdefault(rid, rec.step)
    out = []
    for rid, a in admit.items():
        st = times.get(rid)
        if st is None or st[0] is None:
            continue
        for end, t in ((first.get(rid), st[1]), (fin.get(rid), st[2])):
            if end is not None and t is not None and end >= a and t > st[0]:
                out.append((a, end, t - st[0]))
    return out
