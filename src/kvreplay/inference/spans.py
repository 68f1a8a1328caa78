"""Request spans beside the log: vLLM's `llm_request` spans (events.RequestSpan) joined to
the log's requests, and the replay checked against them.

Join: by request id (`gen_ai.request.id` is the id the `Received request` line shows; a
repeated id's later lines are `<id>#2`.. and take the later spans). A joined request gets
its span (`LogRequest.span`), its prompt length where the log has no prompt (prefix caching
off), its output length where the log has none; and, when every request has a span and
every prompt length is known, its arrival to the nanosecond (`LogRequest.precise_time`, the
span's start on the log's clock). An unjoined request keeps its whole second: never taken
as precise.

Placement: arrivals as given (placement.windows takes `precise_time`), and the step-time
regression fitted to the spans' engine-timed windows instead of the stats lines
(span_windows). Pinning the wall clock to the spans' first-token and finish times as well
was tried and made p1 worse (docs/accuracy.md): not done.

Clock offset: with none, every span start lies inside its Received line's second (the line
is written a few ms after the arrival). The offsets the spans allow form an interval
[max(start - second) - 1, min(start - second)]; when 0 lies in it (give or take the line's
delay) there is no offset, else its middle is the offset, subtracted and reported.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, TYPE_CHECKING

from kvreplay.events import RequestSpan
from kvreplay.inference.facts import LogFacts

if TYPE_CHECKING:
    from kvreplay.inference.runs import Run


LINE_DELAY_S = 0.05  # a Received line may be written this late after its arrival
TTFT_TOL_S = 0.05  # first-token check's slack (the replay's clock is fitted)
ALIGNED_S = 1e-4  # a run's step start this close to a span's S is that step (span_windows)
MIN_ALIGNED = 10  # aligned requests the step-time fit needs before it drops the others


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
    facts: LogFacts | None = None  # the log's facts with the spans joined (join_spans)

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
    """Join spans to the log's requests (see the module doc): `SpanJoin.facts` are the
    log's facts with each joined request's span (and what it gives), with notes saying what
    was joined, the coverage and any clock offset. `facts` itself is not changed."""
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
    # A span gives a prompt's length, not its tokens: with prefix caching on, which prompts
    # share what matters as much; the lengths are used all the same, and what they share is
    # estimated and drawn (span_prefix.py)
    use_lengths = True
    # Placing an arrival by its nanosecond needs the replay's clock as sharp, and every
    # arrival placed alike: with prompt lengths estimated the clock is not (f_prefix_caching's
    # plain log: 9 of 10 victims right placed by seconds, 5 by the spans' times), and half
    # the arrivals by spans, half by seconds misplace both (p1 with prompts, every other
    # span: 39 of 54 by seconds, 8 so). So the spans' arrivals are used only when every
    # request has a span and every prompt's length is known.
    lengths_known = all(r.prompt_token_ids is not None or r.prompt_len is not None or
                        (use_lengths and (s := pairs.get(r.index)) is not None and
                         s.prompt_tokens) for r in facts.requests)
    use_arrivals = len(pairs) == len(facts.requests) and lengths_known
    # the spans' engine stamps place the arrivals (span_clock.py) with every prompt length
    # known and over half the requests spanned (the others' entries estimated between them)
    place = lengths_known and 2 * len(pairs) >= len(facts.requests) > 0
    reqs = {i: replace(r) for i, r in reqs.items()}  # copies: the log's facts stay as read
    for i, s in pairs.items():
        r = reqs[i]
        t = s.start - offset
        if r.time is not None:  # its line's second bounds it (the line is a little late)
            t = min(max(t, r.time - LINE_DELAY_S), r.time + 0.999)
        if use_arrivals:
            r.precise_time = t
        r.span = s
        if use_lengths and r.prompt_token_ids is None and r.prompt_len is None and \
                s.prompt_tokens:
            r.prompt_len = s.prompt_tokens
        if r.output_len is None and s.completion_tokens is not None:
            r.output_len = s.completion_tokens
    notes: list[str] = []
    join = SpanJoin(spans=len(spans), requests=len(facts.requests), joined=len(pairs),
                    offset_s=offset, offset_interval=interval,
                    unjoined_spans=sum(1 for s in spans if id(s) not in used),
                    problems=list(problems or []), by_request=pairs)
    notes.append(
        f"request spans: {join.joined} of {join.requests} requests joined by request id "
        f"({100 * join.coverage:.0f}%)"
        + ("" if join.joined == join.requests else
           "; the others enter at times estimated between the spanned arrivals beside them"
           if place else "; the others are placed inside their logged seconds as without spans"))
    if not place:
        why = ("under half the requests have a span" if 2 * len(pairs) < len(facts.requests)
               else "with prompt lengths estimated the replay's clock is not sharp enough")
        notes.append(f"request spans: their arrival times are not used to place the "
                           f"arrivals ({why}); arrivals are placed by their seconds")
    if offset:
        notes.append(
            f"request spans: the span exporter's clock is {offset:+.3f} s off the log's "
            f"(span starts vs the Received lines' seconds allow {interval[0]:+.3f} .. "
            f"{interval[1]:+.3f} s); corrected")
    if join.unjoined_spans:
        notes.append(f"request spans: {join.unjoined_spans} span(s) name no request of "
                           "the log (another server, or outside the log's time range)")
    if join.problems:
        notes.append(f"request spans: {len(join.problems)} line(s) not read, e.g. "
                           f"{join.problems[0]}")
    join.facts = replace(facts, requests=[reqs[r.index] for r in facts.requests],
                         span_offset_s=offset, span_placement=place,
                         notes=facts.notes + tuple(notes))
    return join


def check_spans(rep: Any, join: SpanJoin) -> dict[str, Any]:
    """The spans the replay contradicts. The replay's wall clock is fitted, so a constant
    gap to the spans' clock says nothing about scheduling: it is measured (the median, over
    the joined requests, of replay minus span for the first admission and the first token)
    and reported as `clock_gap_s`; a request is flagged when, beyond that gap, the replay
    gives its first token more than TTFT_TOL_S after the span's (arrival +
    time_to_first_token), or first admits it more than TTFT_TOL_S before the span's queue
    time ended (arrival + time_in_queue). Reads the replay's steps and clock."""
    clock = rep.clock
    if not clock or not rep.steps:
        return {"checked": 0}
    last = clock[-1] - clock[-2] if len(clock) > 1 else 0.0
    ends = list(clock[1:]) + [clock[-1] + last]
    first_tok: dict[str, float] = {}
    admitted: dict[str, float] = {}
    for k, rec in enumerate(rep.steps):
        for rid in rec.first_tokens:
            first_tok.setdefault(rid, ends[k])
        for a in rec.admitted:
            admitted.setdefault(a.request, clock[k])
    ids = {r.index: r.log_id for r in rep.facts.requests} if rep.facts is not None else {}
    pairs = []  # (request id, replay - span for the first token, for the first admission)
    for i, s in sorted(join.by_request.items()):
        rid = ids.get(i)
        if rid is None:
            continue
        arrival = s.start - join.offset_s
        ft, ad = first_tok.get(rid), admitted.get(rid)
        pairs.append((rid,
                      None if ft is None or s.time_to_first_token is None
                      else ft - arrival - s.time_to_first_token,
                      None if ad is None or s.time_in_queue is None
                      else ad - arrival - s.time_in_queue))
    gaps = sorted(g for _, a, b in pairs for g in (a, b) if g is not None)
    gap = gaps[len(gaps) // 2] if gaps else 0.0
    late = [rid for rid, a, _ in pairs if a is not None and a - gap > TTFT_TOL_S]
    early = [rid for rid, _, b in pairs if b is not None and b - gap < -TTFT_TOL_S]
    return {"checked": len(pairs), "clock_gap_s": round(gap, 6),
            "first_token_late": len(late), "admitted_early": len(early),
            "first_token_late_ids": late[:5], "admitted_early_ids": early[:5]}


def span_windows(run: Run, facts: LogFacts) -> list[tuple[int, int, float]]:
    """(first step, last step, seconds) the spans time in the run, for the step-time
    regression (clock.regression): vLLM stamps a request on the engine's monotonic clock
    when first scheduled (the start of step a), at its first token and its last (the ends
    of steps s and f); time_in_model_prefill is steps a..s, time_in_model_decode s+1..f."""
    by_id = {r.log_id: r.span for r in facts.requests if r.span is not None}
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
    # With the spans placing the arrivals (span_clock.py), the run's clock is the spans'
    # where it agrees with them: a request first scheduled at a step starting at its span's
    # S is aligned with the real run there; the others' windows may be a step or more off,
    # and are left out while enough aligned ones remain (the fit then converges on them).
    aligned = set()
    clock = getattr(run, "clock", None)
    if facts.span_placement and clock:
        for rid, a in admit.items():
            s = by_id.get(rid)
            if s is not None and s.time_to_first_token is not None and \
                    s.time_in_model_prefill is not None and a < len(clock):
                start = s.start - facts.span_offset_s + s.time_to_first_token - \
                    s.time_in_model_prefill
                if abs(clock[a] - start) <= ALIGNED_S:
                    aligned.add(rid)
    use_aligned = len(aligned) >= max(MIN_ALIGNED, len(admit) // 4)
    out = []
    for rid, a in admit.items():
        s = by_id.get(rid)
        if s is None or use_aligned and rid not in aligned:
            continue
        f1, f2 = first.get(rid), fin.get(rid)
        if f1 is not None and s.time_in_model_prefill and f1 >= a:
            out.append((a, f1, s.time_in_model_prefill))
        if f1 is not None and f2 is not None and s.time_in_model_decode and f2 > f1:
            out.append((f1 + 1, f2, s.time_in_model_decode))
    return out
