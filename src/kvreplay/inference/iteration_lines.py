"""Iteration lines against a replay: one `Iteration(N)` line checked against the step that
printed it, and what a placement by the lines yields.

Consumes: `LogFacts` (the first engine's iteration lines), the `LogFormat` (whether the
lines print KV usage), the replay's step records. Produces: `LineCheck` (the steps against
their lines, in order: N advances with each step that scheduled a token), `IterationMismatch` (a
line the replay does not match, and how), `IterationMatch` (the placed run, the lines
checked and matched, the first mismatch); `checked_run` (a run's steps against them);
`unusable` (why a log's lines cannot place its arrivals), `kv_within_split` (a KV-usage
difference a sum of prompts' split explains; `kv_split_explains` the same on a step's
running requests kept from when it ran); `recomputes_shown` (the preemptions the lines
show at least).
What a line says: iterations.py's docstring (spec: vllm-log-formats.md 4.3).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, TYPE_CHECKING

from kvreplay.inference.facts import LogFacts
from kvreplay.inference.formats import LogFormat
from kvreplay.inference.runs import Run
from kvreplay.replay.checks import IterationCheck, IterationMismatch
from kvreplay.replay.records import StepRecord

if TYPE_CHECKING:
    from kvreplay.inference.line_lengths import LineLengths


def unusable(facts: LogFacts, fmt: LogFormat) -> str | None:
    """Why the iteration lines cannot place the arrivals (None: they can)."""
    its = facts.iterations
    if not its:
        return "no Iteration lines"
    if fmt.engine != "V1":
        return "a V0 log"
    if len(facts.iteration_engines) > 1:
        return (f"the lines come from {len(facts.iteration_engines)} engines (data parallel): "
                "which engine ran which request is not logged")
    back = next((b for a, b in zip(its, its[1:]) if b.step <= a.step), None)
    if back is not None:
        return (f"Iteration({back.step}) at {back.file}:{back.line} comes after a higher "
                "number: the log holds more than one run of the engine")
    if its[0].step != 0:
        return (f"the first Iteration line is Iteration({its[0].step}): the log does not "
                "start with the engine's first step")
    if not facts.requests or facts.requests[0].iterations_before > 0:
        return "Iteration lines before the first request line: the log starts mid-run"
    return None


@dataclass(slots=True)
class IterationMatch:
    run: Run
    lines: int  # iteration lines in the log
    checked: int  # lines the replay had a step for
    matched: int  # ... that it matched in every field
    first_mismatch: IterationMismatch | None
    exact_until_step: int  # steps before this one are pinned by the log (all, if no mismatch)
    line_of_step: dict[int, int] = field(default_factory=dict)  # step -> N
    lag: dict[int, int] = field(default_factory=dict)  # arrival line - lower bound: count
    backtracks: int = 0
    overhead_s: float = 0.0  # the clock's fixed cost between steps
    prompt_lengths: dict[str, int] = field(default_factory=dict)  # status -> requests
    kv_unsure: int = 0  # lines whose KV usage may differ by how a sum of prompts splits
    # what the lines said of each estimated prompt (request index -> LineLengths status),
    # and the requests whose prompts they showed only as one sum
    length_status: dict[int, str] = field(default_factory=dict)
    sum_groups: list[list[int]] = field(default_factory=list)
    exhausted: bool = False  # the search ran out of its allowance (SEARCH_STEPS_PER_LINE)
    carried: Any = None  # start_state.StartState after the step Window.carry_n asked for

    def report(self) -> IterationCheck:
        return IterationCheck(
            lines=self.lines, checked=self.checked, matched=self.matched,
            first_mismatch=self.first_mismatch, exact_until_step=self.exact_until_step,
            arrival_lag={str(k): v for k, v in sorted(self.lag.items())},
            backtracks=self.backtracks, prompt_lengths=self.prompt_lengths,
            kv_unsure_lines=self.kv_unsure, search_allowance_spent=self.exhausted)


class LineCheck:
    """Steps against their lines, in order: N advances with each step that scheduled a
    token; the KV usage of a step's line is compared once its output was applied (the
    next step, with async scheduling)."""

    def __init__(self, facts: LogFacts, fmt: LogFormat, cut: bool) -> None:
        self.by_n = {it.step: it for it in facts.iterations}
        self.last_n = facts.iterations[-1].step
        self.check_kv = fmt.iteration_kv
        self.cut = cut
        self.n = 0  # N of the next line a token step prints
        self.kv_due: dict[int, int] = {}  # step -> its N, KV usage not compared yet
        self.line_of_step: dict[int, int] = {}

    def state(self) -> tuple[int, dict[int, int]]:
        return self.n, dict(self.kv_due)

    def reset(self, state: tuple[int, dict[int, int]], step: int) -> None:
        self.n, self.kv_due = state[0], dict(state[1])
        for s in [s for s in self.line_of_step if s >= step]:
            del self.line_of_step[s]

    def check(self, rec: StepRecord) -> list[str]:
        diffs: list[str] = []
        if rec.num_scheduled_tokens > 0:
            n = self.n
            self.n += 1
            self.line_of_step[rec.step] = n
            it = self.by_n.get(n)
            if it is None:
                if n > self.last_n and not self.cut:
                    diffs.append(f"the replay runs a step the log has no Iteration({n}) line for")
            else:
                ours = (rec.num_ctx_requests, rec.num_ctx_tokens,
                        rec.num_scheduled - rec.num_ctx_requests,
                        rec.num_scheduled_tokens - rec.num_ctx_tokens)
                logged = (it.context_requests, it.context_tokens, it.generation_requests,
                          it.generation_tokens)
                for name, a, b in zip(("context requests", "context tokens",
                                       "generation requests", "generation tokens"), ours, logged):
                    if a != b:
                        diffs.append(f"{name} {a} vs logged {b}")
                if self.check_kv and it.kv_usage is not None:
                    self.kv_due[rec.step] = n
        if self.kv_due and rec.updated_batch in self.kv_due:
            it = self.by_n[self.kv_due.pop(rec.updated_batch)]  # type: ignore[index]
            ours_kv = f"{rec.kv_usage * 100:.1f}"  # as the line prints it
            if ours_kv != f"{it.kv_usage:.1f}":
                diffs.append(f"KV usage {ours_kv}% vs logged {it.kv_usage:.1f}%"
                             + (f" (after Iteration({it.step}))" if rec.updated_batch != rec.step
                                else ""))
        return diffs

    def mismatch(self, rec: StepRecord, diffs: list[str]) -> IterationMismatch:
        n = self.line_of_step.get(rec.step, self.n - 1)
        if rec.updated_batch is not None and any("after Iteration" in d for d in diffs):
            n = self.line_of_step.get(rec.updated_batch, n)
        it = self.by_n.get(n) or self.by_n[self.last_n]
        return IterationMismatch(iteration=n, file=it.file, line=it.line, step=rec.step,
                                 differences=diffs)


def checked_run(run: Iterable[tuple[StepRecord, Callable[[], list[tuple[str, int]]]]],
                lc: LineCheck, lengths: LineLengths, blocks: int
                ) -> tuple[list[StepRecord], IterationMismatch | None, set[int], int]:
    """A run's steps, each with how to read its running requests after it (`running_state`,
    read before the next step), against their lines: the steps, the first mismatch, the
    lines mismatched, and the lines whose only difference is a KV usage a sum's split
    explains (`kv_split_explains`: not mismatches)."""
    steps: list[StepRecord] = []
    first: IterationMismatch | None = None
    bad: set[int] = set()
    kv_unsure = 0
    for rec, running in run:
        steps.append(rec)
        diffs = lc.check(rec)
        if diffs and lengths and all(d.startswith("KV usage") for d in diffs):
            if kv_split_explains(rec, lc, running(), blocks, lengths):
                kv_unsure += 1
                continue
        if diffs:
            m = lc.mismatch(rec, diffs)
            bad.add(m.iteration)
            first = first or m
    return steps, first, bad, kv_unsure


def kv_within_split(rec: StepRecord, diffs: list[str], lc: LineCheck, sched: Any,
                    lengths: LineLengths) -> bool:
    """A KV usage off by no more blocks than the running prompts known only as a sum may
    hold (`kv_split_explains` on the scheduler's running requests after the step)."""
    if not lengths or not all(d.startswith("KV usage") for d in diffs):
        return False
    return kv_split_explains(rec, lc, running_state(sched), sched.pool.num_usable_blocks,
                             lengths)


def running_state(sched: Any) -> list[tuple[str, int]]:
    """What `kv_split_explains` reads of the running requests: (id, computed tokens)."""
    return [(r.request_id, r.num_computed_tokens) for r in sched.running]


def kv_split_explains(rec: StepRecord, lc: LineCheck, running: list[tuple[str, int]],
                      blocks: int, lengths: LineLengths) -> bool:
    n = lc.line_of_step.get(rec.updated_batch if rec.updated_batch is not None else rec.step)
    it = lc.by_n.get(n) if n is not None else None
    if it is None or it.kv_usage is None:
        return False
    # a prompt known only as a sum holds any share of its group's blocks until a line
    # splits it: the blocks its group holds in all (a wrong split is not a wrong step:
    # the context counts and tokens, exact, place the arrivals)
    unsure = sum(lengths.group_blocks(rid, computed) for rid, computed in running
                 if lengths.uncertain(rid))
    if not unsure:
        return False
    ours = round(rec.kv_usage * blocks)  # blocks in use
    lo = (it.kv_usage - 0.05) / 100.0 * blocks  # the blocks the printed 0.1 % allows
    hi = (it.kv_usage + 0.05) / 100.0 * blocks
    return lo - unsure - 1e-6 <= ours <= hi + unsure + 1e-6


def recomputes_shown(facts: LogFacts, budget: int) -> int:
    """The least number of preemptions the lines alone show: the recomputes they count.

    A request with an output token is a "generation" request, and one scheduled after its
    first token takes 1 token a step, except a preempted one being recomputed (its prompt
    and outputs computed again: vllm-log-formats.md 4.3; scheduler spec A1.4). So a line
    with more generation tokens than generation requests has a recompute in its step, and
    each run of such lines at least one preemption before it. A recompute may pause a step
    without ending: when the token budget ran out before its turn (a line at the budget) or
    in a step whose line is missing; such lines do not end a run. Counted only for sync
    scheduling without speculative decoding (a drafted token also makes a generation
    request take more than 1 token), and for profiles where a running request is skipped
    only by the budget (FCFS; under the priority policy, 0.33's scan going on past a
    request that preempted itself: profile.priority_self_preempt_continues).
    A preemption whose victim is not recomputed within the log (or, with prefix caching,
    recomputes 1 token), or before its first token, shows nothing: a lower bound."""
    runs = 0
    open_ = False
    for it in facts.iterations:
        if it.generation_tokens > it.generation_requests:
            runs += not open_
            open_ = True
        elif it.context_tokens + it.generation_tokens < budget:
            open_ = False  # budget to spare and no recompute: none is in flight
    return runs


def recomputes_count(facts: LogFacts, workload: Any, profile: Any) -> int | None:
    """`recomputes_shown`, where it is a lower bound (None where the log's run may make a
    generation request take more than 1 token otherwise, or skip a recompute's turn with
    budget to spare)."""
    cfg = workload.config
    if cfg.async_scheduling or (facts.config is not None and facts.config.speculative):
        return None
    if cfg.policy != "fcfs" and not getattr(profile, "priority_self_preempt_continues", False):
        return None
    return recomputes_shown(facts, cfg.max_num_batched_tokens)
