"""What a log's facts alone say about its run as a whole: how the client sent its requests
(the arrival pattern), whether the access lines mark response starts (streaming), the
cumulative tokens the stats lines show, the aborts, where the log was cut, whether it is a
large log. Consumes `LogFacts` (facts.py); no replay.
"""

from __future__ import annotations

from dataclasses import replace

from kvreplay.inference.facts import LogFacts

def stats_targets(facts: LogFacts, interval_s: float) -> list[tuple[float, float]]:
    """Cumulative generated and prompt tokens the log shows by each stats line (each
    line's throughputs are averages over `interval_s`)."""
    g = p = 0.0
    out = []
    for s in facts.stats:
        g += (s.generation_throughput or 0.0) * interval_s
        p += (s.prompt_throughput or 0.0) * interval_s
        out.append((g, p))
    return out


def response_starts(facts: LogFacts, interval_s: float) -> str | None:
    """Why the access lines cannot be finishes, or None. A streaming response's access line
    is written when its headers go out, as it starts (spec: log formats, uvicorn access
    line). The JSON bodies say `stream`; without them the stats lines can: requests still
    running or waiting at a line have not finished, and the requests finished by a line
    produced at least their max_tokens each (ignore_eos; fewer if max_model_len stops them)
    or one token each, which must fit in the generated tokens the line counts."""
    said = [r.stream for r in facts.requests if r.stream is not None]
    if said and sum(said) * 2 > len(said):
        return f"{sum(said)} of {len(facts.requests)} requests stream (their JSON bodies say so)"
    if not facts.completions or not facts.stats:
        return None
    mml = facts.config.max_model_len if facts.config else None

    def least_output(r: LogRequest) -> int:
        # ignore_eos: max_tokens, unless max_model_len stops the request first (which takes
        # its prompt length to tell); else one token
        plen = len(r.prompt_token_ids) if r.prompt_token_ids is not None else r.prompt_len
        if not (r.ignore_eos and r.max_tokens) or mml is None or plen is None:
            return 1
        return max(1, min(r.max_tokens, mml - plen))

    least_all = [least_output(r) for r in facts.requests]
    for st, (g, _) in zip(facts.stats, stats_targets(facts, interval_s)):
        c = st.completions_before
        if c == 0:
            continue
        received = facts.requests[: st.arrivals_before]
        if c > len(received):
            return (f"{c} access lines before the stats line at {st.file}:{st.line}, for "
                    f"{len(received)} requests received")
        # requests still in the engine cannot have finished
        present = (st.running or 0) + (st.waiting or 0)
        if present > len(received) - c:
            return (f"{c} access lines before the stats line at {st.file}:{st.line}, which "
                    f"shows {present} requests running or waiting of the {len(received)} "
                    "received")
        least = sorted(least_all[: st.arrivals_before])[:c]
        if sum(least) > g * 1.01 + 1:
            return (f"{c} access lines before the stats line at {st.file}:{st.line}, whose "
                    f"{g:,.0f} generated tokens cannot have finished that many requests "
                    f"(at least {sum(least):,} tokens)")
    return None


def without_access_lines(facts: LogFacts) -> LogFacts:
    """A copy of `facts` with no completion (access) lines: no ordering fact from them."""
    reqs = [replace(r, completions_before=0) for r in facts.requests]
    stats = [replace(st, completions_before=0) for st in facts.stats]
    return replace(facts, requests=reqs, stats=stats, completions=[], completion_times=None)


def arrival_pattern(facts: LogFacts) -> str:
    """How the client sent requests, read from the order of lines:
    "closed-loop" (each request follows a completion, as `vllm bench serve
    --max-concurrency` does), "burst" (everything within a couple of seconds), or
    "poisson" (spread over time)."""
    reqs = facts.requests
    if not reqs:
        return "poisson"
    seconds = {r.time for r in reqs if r.time is not None}
    later = [r for r in reqs if r.completions_before > 0]
    if len(later) >= 8:
        answering = answering_completions(facts)
        if sum(1 for r in later if r.seq in answering) >= 0.9 * len(later):
            return "closed-loop"
    if len(seconds) <= 2:
        return "burst"
    return "poisson"


def answering_completions(facts: LogFacts) -> set[int]:
    """The seq of every request line that answers a completion, as a closed-loop client
    sends its next request when one comes back: the j-th line of a run of request lines
    that comes right after a run of k >= j access lines (several requests can finish in one
    step, and their successors then come in a run too; stats lines do not count)."""
    lines = sorted([(r.seq, "R") for r in facts.requests] + [(c[3], "C") for c in facts.completions])
    out: set[int] = set()
    k = j = 0  # length of the last run of access lines; request lines since it
    for seq, kind in lines:
        if kind == "C":
            k = k + 1 if j == 0 else 1
            j = 0
        else:
            j += 1
            if j <= k:
                out.add(seq)
    return out


def aborts(facts: LogFacts) -> list[tuple[float, str]]:
    """(time, request id) of every logged abort, in time order."""
    return sorted((r.aborted_time, r.log_id) for r in facts.requests if r.aborted_time is not None)


# A log this large gets a budget of scheduler passes (a pass over a 100,000-request log
# takes half a minute): its anchoring runs one round after its first replay
# (placement.LARGE_LOG_ROUNDS); on large Poisson logs the later rounds only trade equally
# good placements (docs/accuracy.md, "Log replay of large logs").
LARGE_LOG_REQUESTS = 20_000


def large_log(facts: LogFacts) -> bool:
    return len(facts.requests) >= LARGE_LOG_REQUESTS


def cut_time(facts: LogFacts) -> float | None:
    """When the log stops before the run ended (server killed, log copied mid-run), the
    replay stops at its last line. The run ended cleanly when the last stats line shows
    nothing running, waiting or swapped after the last arrival; or every request has a
    `Finished request` line (V0 in-process engines) or an abort; or (non-streaming) a
    completion line for every request that was not aborted; or, with no access lines at
    all (uvicorn's access log off), when the last stats line shows nothing left."""
    if facts.last_time is None or not facts.requests:
        return None
    last_arrival = facts.requests[-1]
    if facts.stats:
        last = facts.stats[-1]
        if ((last.running or 0) + (last.waiting or 0) + (last.swapped or 0) == 0
                and last.seq > last_arrival.seq):
            return None
    ended = {rid for _, rid in facts.finished}
    ended |= {r.log_id for r in facts.requests if r.aborted_time is not None}
    if all(r.log_id in ended for r in facts.requests):
        return None
    streaming = any(r.stream for r in facts.requests)
    aborted = sum(1 for r in facts.requests if r.aborted_time is not None)
    if not streaming and facts.completions and len(facts.completions) + aborted >= len(facts.requests):
        return None
    if not streaming and not facts.completions and facts.stats:
        last = facts.stats[-1]
        if (last.running or 0) + (last.waiting or 0) + (last.swapped or 0) == 0:
            return None
    return facts.last_time + 1.0
