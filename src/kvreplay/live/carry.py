"""The lines a window cut at a decided step keeps from before it (live/session.py
`Session._carry`): those of the requests the next window still has, the ones in the
engine (carried in its state: inference/start_state.py) and the ones not in it yet.

Each request keeps its own lines (its JSON body, `Received request`, `Added request`,
`Aborted request`, `Finished request`, `Generated response` lines), in their order; every
other line before the cut (the requests that finished, stats lines, access lines, the
Iteration lines) goes. The window's facts (inference/facts.py) then hold these requests
first, in the order they entered (one frontend: the order of their lines), as the carried
state numbers them. A JSON body line (0.31+) names another id than its request's and is
paired with the next `Received request` line, in order (facts.py pairs them so): it is kept
with the request it pairs with.
"""

from __future__ import annotations

import re
from typing import Any

_SAMPLE = re.compile(r"_parallel_sample_\d+$")


def log_id(spec_id: str) -> str:
    """The log's request id of a workload request (n > 1: its samples' ids name it)."""
    return _SAMPLE.sub("", spec_id)


def kept_lines(lines: list[str], keep: set[str], label: str) -> tuple[list[int], set[str]]:
    """Indices of `lines` that belong to the requests `keep` (log ids), in order, and the
    kept ids whose `Received request` line is among them."""
    from kvreplay import events as ev
    from kvreplay.parsers import parse_lines

    out: list[int] = []
    bodies: list[int] = []
    received: set[str] = set()

    def kept(rid: str) -> bool:
        # an `Added request` id is the log id and "-<8 hex>" (0.14+)
        return rid in keep or rid.rsplit("-", 1)[0] in keep

    for e in parse_lines(lines, file=label):
        i = e.line - 1
        if isinstance(e, ev.RequestBody):
            bodies.append(i)
        elif isinstance(e, ev.RequestReceived):
            body = bodies.pop(0) if bodies else None
            if e.request_id in keep:
                received.add(e.request_id)
                if body is not None:
                    out.append(body)
                out.append(i)
        elif isinstance(e, ev.RequestAborted):
            if any(kept(r) for r in e.request_ids):
                out.append(i)
        elif isinstance(e, (ev.RequestAdded, ev.RequestFinished, ev.GeneratedResponse,
                            ev.RequestDetails)):
            if kept(e.request_id):
                out.append(i)
    return sorted(set(out)), received


def carried_ids(rep: Any, carried_in: int) -> tuple[set[str], set[str]]:
    """(log ids of the requests in the carried engine, of those not in it yet) of a replay
    with a carried state (`Replay.carried`) that started with `carried_in` requests in its
    engine (its workload's first ones)."""
    st = rep.carried
    inside = {log_id(i) for i in st.ids}
    specs, arrivals = rep.workload.requests[carried_in:], rep.inputs.arrival_steps[carried_in:]
    later = {log_id(spec.id) for spec, a in zip(specs, arrivals)
             if not 0 <= a <= st.step} - inside
    return inside, later


_IT = re.compile(r"Iteration\((\d+)\)")


def iteration_n(line: str) -> int:
    m = _IT.search(line)
    return int(m.group(1)) if m else -1


def renumber(line: str, n0: int) -> str:
    """The line with its Iteration(N) as Iteration(N - n0): the window's numbering."""
    return _IT.sub(lambda m: f"Iteration({int(m.group(1)) - n0})", line, count=1)


def token_step(steps: list[Any], n: int) -> int | None:
    """The step of a replay that prints Iteration(n): its n-th step that scheduled a token
    (inference.iteration_lines.LineCheck numbers them so)."""
    k = 0
    for rec in steps:
        if rec.num_scheduled_tokens > 0:
            if k == n:
                return rec.step
            k += 1
    return None


def last_step(events: list[Any]) -> int:
    """The highest step a line of the log numbers (Iteration N, kvtrace step N); -1: none."""
    from kvreplay import events as ev

    last = -1
    for e in events:
        if isinstance(e, (ev.Iteration, ev.StepTrace)):
            last = max(last, e.step)
    return last
