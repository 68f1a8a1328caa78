"""Prompt lengths from the iteration lines, for a log that does not show the prompts.

Consumes: the step just replayed (its `SchedulerOutput`), its `Iteration(N)` line, which
requests have an estimated prompt (stage 3). Produces: a correction (the lengths to give,
and the step to replay again from) when an estimated prompt explains the line's
disagreement, and in the end how sure each length is.

A line's context tokens are the prompt tokens its step computed (vLLM 0.33
compute_iteration_details; a prefix-cache hit is not computed): a request that ran its
whole prefill alone in a step shows its length exactly; one cut by the token budget shows
the rest at its next step; requests admitted in the same step show only their sum, which
is split evenly ("sum"). What a wrong length looks like, at step t (ours vs the line):

* the same context requests, other context tokens: an estimated request scheduled as
  context at t gets the difference (t replayed);
* fewer context requests: an estimated request finished its prefill at t-1 in ours but
  still prefills at t (longer by the difference: t-1 replayed), or one could not be
  admitted at t (shorter: the difference is its first chunk);
* more context requests: one still prefills at t in ours but finished at t-1 (its
  length is what it had computed: t-1 replayed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MAX_FIXES = 6  # corrections per request before its length is left as it is


@dataclass(slots=True)
class Group:
    """Requests whose prompts the lines showed only as a sum."""
    members: list[int]
    step: int  # the step the sum was seen in
    splits: int = 0


@dataclass(slots=True)
class Fix:
    restore_step: int
    lengths: dict[int, int]  # request index -> prompt length
    status: str  # "exact" | "sum" | "bound" | "block" (a sum split to a block)


class LineLengths:
    """The estimated prompts of one replay and what the lines have said of them."""

    def __init__(self, workload: Any, estimated: list[bool], budget: int,
                 block_size: int = 16) -> None:
        self.workload = workload
        self.index = {s.id: i for i, s in enumerate(workload.requests)}
        self.open = {i for i, e in enumerate(estimated) if e}
        self.status: dict[int, str] = {i: "estimated" for i in self.open}
        self.fixes: dict[int, int] = {}
        self.budget = budget
        self.changed: set[int] = set()
        self.groups: dict[int, Group] = {}
        self.block_size = block_size

    def __bool__(self) -> bool:
        return bool(self.open)

    def uncertain(self, rid: str) -> bool:
        i = self.index.get(rid)
        return i is not None and self.status.get(i) in ("sum", "bound", "block")

    def group_blocks(self, rid: str, computed: int) -> int:
        """The blocks a running request of uncertain length (`computed` tokens) may hold
        more or fewer than the replay gives it: its own (a sum's member), else one (a
        bound, a block's split)."""
        i = self.index.get(rid)
        if i is None or i not in self.groups or self.status.get(i) != "sum":
            return 1
        return -(-computed // self.block_size)

    def tokens(self, i: int, n: int) -> list[int]:
        """The request's prompt with n tokens: its own tokens (never shared with another
        request's), the leading ones kept, so computed blocks keep their identity."""
        old = self.workload.requests[i].prompt_token_ids
        if n <= len(old):
            return old[:n]
        start = old[-1] + 1 if old else 1_000_000 + i * 100_003
        return old + list(range(start, start + n - len(old)))

    def prompt_len(self, i: int) -> int:
        return len(self.workload.requests[i].prompt_token_ids)

    def fix(self, step: int, out: Any, prev_ctx: dict[str, int] | None, requests: dict,
            blocked: Any, line: Any) -> Fix | None:
        """The correction the disagreement of `line` with step `step` asks for, or None
        when no estimated prompt explains it."""
        ctx = [rid for rid in out.ctx_req_ids if self.index.get(rid) in self.open]
        d_req = line.context_requests - out.num_ctx_requests
        d_tok = line.context_tokens - out.num_ctx_tokens
        sched = out.num_scheduled_tokens

        def ok(i: int) -> bool:
            return self.fixes.get(i, 0) < MAX_FIXES

        if d_req == 0 and d_tok and ctx:
            group = [rid for rid in ctx if ok(self.index[rid])]
            # a member a line showed alone (exact) keeps its length: the rest of the sum
            # takes the difference
            loose = [rid for rid in group if self.status.get(self.index[rid]) != "exact"]
            group = loose or group
            if not group:
                return None
            ours = sum(sched[rid] for rid in group)
            total = ours + d_tok
            if total < len(group):
                return None
            # the difference shared in proportion to what each computed here: the line
            # shows only the sum, and a split the replay already had (a finish's KV
            # usage, an earlier line) stays as it was
            chunks = [max(1, round(sched[rid] * total / ours)) for rid in group]
            chunks[-1] += total - sum(chunks)
            if chunks[-1] < 1:
                share, extra = divmod(total, len(group))
                chunks = [share + (1 if j < extra else 0) for j in range(len(group))]
            lengths = {}
            for rid, chunk in zip(group, chunks):
                req = requests.get(rid)
                if req is None:
                    return None
                before = req.num_computed_tokens - sched[rid]
                lengths[self.index[rid]] = before + chunk
            full = line.context_tokens + line.generation_tokens >= self.budget
            status = "sum" if len(group) > 1 else "bound" if full else "exact"
            return Fix(step, lengths, status)
        if d_req == 0 and d_tok == 0 and not ctx:
            fix = self._recompute(step, out, line)
            if fix is not None:
                return fix
        if d_req > 0 and prev_ctx is not None:
            # still prefilling in the log, done in ours: longer
            late = [rid for rid in sched if rid not in out.ctx_req_ids and rid in prev_ctx
                    and self.index.get(rid) in self.open and ok(self.index[rid])]
            if len(late) == d_req and d_tok > 0:
                share, extra = divmod(d_tok, len(late))
                return Fix(step - 1, {self.index[rid]: self.prompt_len(self.index[rid]) + share
                                      + (1 if j < extra else 0) for j, rid in enumerate(late)},
                           "exact" if len(late) == 1 else "sum")
        if d_req > 0 and blocked is not None and d_tok > 0:
            i = self.index.get(blocked.request)
            if i in self.open and ok(i) and requests.get(blocked.request) is not None \
                    and requests[blocked.request].num_computed_tokens == 0:
                return Fix(step, {i: d_tok}, "exact" if d_req == 1 else "sum")
        if d_req < 0 and prev_ctx is not None:
            # done in the log, still prefilling in ours: shorter
            early = [rid for rid in ctx if rid in prev_ctx and ok(self.index[rid])]
            if len(early) >= -d_req:
                lengths = {}
                for rid in early[d_req:]:
                    req = requests.get(rid)
                    if req is None:
                        return None
                    lengths[self.index[rid]] = req.num_computed_tokens - sched[rid]
                return Fix(step - 1, lengths, "exact")
        return None

    def _recompute(self, step: int, out: Any, line: Any) -> Fix | None:
        """A preempted request recomputed (its prompt and outputs, counted as generation
        tokens): the line's generation tokens show its prompt, exactly when it is the only
        one of uncertain length recomputed in the step and the budget did not cut it."""
        sched = out.num_scheduled_tokens
        total = sum(sched.values())
        gen_req = len(sched) - out.num_ctx_requests
        d_gen = line.generation_tokens - (total - out.num_ctx_tokens)
        if not d_gen or gen_req != line.generation_requests:
            return None
        if line.context_tokens + line.generation_tokens >= self.budget or total >= self.budget:
            return None  # a chunk: the budget, not the prompt, set its size
        again = [rid for rid, n in sched.items() if n > 1 and rid not in out.ctx_req_ids]
        mine = [rid for rid in again if self.index.get(rid) in self.open
                and self.fixes.get(self.index[rid], 0) < MAX_FIXES]
        loose = [rid for rid in mine if self.status.get(self.index[rid]) != "exact"]
        mine = loose if len(loose) == 1 else mine  # (one a line showed alone keeps its own)
        if len(mine) != 1:
            return None
        i = self.index[mine[0]]
        n = self.prompt_len(i) + d_gen
        return Fix(step, {i: n}, "exact") if n >= 1 else None

    def ahead(self, sched: Any, pending: list[int], line: Any, step: int,
              prefix_caching: bool) -> Fix | None:
        """The lengths the coming step's line gives the requests it will admit, set before
        the step runs (no replay from a snapshot): the line's context tokens less what the
        running prefills will compute are the new requests' prompts. Only where that is
        certain from the replay's state: the running requests are the line's (its
        generation requests: each decoding one takes 1 token), nothing is cut by the token
        budget or the long-prefill threshold, the next waiting requests are the line's new
        ones, each unscheduled, its prompt not pinned yet, and no prefix cache hides part
        of a prompt. Several new ones show their sum (split as the replay had them).
        `pending`: the requests submitted for the step (they join the waiting queue's back)."""
        if prefix_caching or line.context_tokens + line.generation_tokens >= self.budget:
            return None
        cont, rest, decoding = [], 0, 0
        for r in sched.running:
            if r.num_output_tokens == 0 and r.num_computed_tokens < r.num_tokens:
                cont.append(r)
                rest += r.num_tokens - r.num_computed_tokens
            else:
                decoding += 1
        if decoding != line.generation_requests or decoding != line.generation_tokens:
            return None  # (a recomputed or an async request: not a plain decode step)
        k = line.context_requests - len(cont)
        new_tokens = line.context_tokens - rest
        if k <= 0 or new_tokens < k or len(sched.running) + k > sched.max_num_running_reqs:
            return None
        heads: list[int] = []
        for r in sched.waiting:
            if len(heads) == k:
                break
            i = self.index.get(r.request_id)
            if (i is None or i not in self.open or self.status.get(i) != "estimated"
                    or r.num_computed_tokens or r.num_output_tokens or r.num_preemptions):
                return None
            heads.append(i)
        for i in pending[:k - len(heads)]:
            if i not in self.open or self.status.get(i) != "estimated":
                return None
            heads.append(i)
        if len(heads) < k:
            return None
        ours = [self.prompt_len(i) for i in heads]
        if k == 1:
            lengths = {heads[0]: new_tokens}
        else:  # the sum shared in proportion to the replay's lengths
            new = [max(1, round(n * new_tokens / sum(ours))) for n in ours]
            new[-1] = new_tokens - sum(new[:-1])
            if new[-1] < 1:
                return None
            lengths = dict(zip(heads, new))
        if all(lengths[i] == n for i, n in zip(heads, ours)) or any(
                n > sched.max_model_len - self.workload.requests[i].max_tokens
                for i, n in lengths.items()):
            return None
        return Fix(step, lengths, "exact" if k == 1 else "sum")

    def applied(self, fix: Fix) -> None:
        for i, n in fix.lengths.items():
            self.fixes[i] = self.fixes.get(i, 0) + 1
            self.status[i] = fix.status
            self.changed.add(i)
        if fix.status == "sum":  # a later finish splits it
            g = Group(sorted(fix.lengths), fix.restore_step)
            for i in g.members:
                self.groups[i] = g

    def split(self, rec: Any, logged_kv: float, usable_blocks: int) -> Fix | None:
        """A sum's split, from the KV usage once one of its requests left the pool
        (finished or preempted: its blocks are freed): the blocks the replay freed too many
        or too few are 16 tokens each of its prompt, given to or taken from the others of
        the sum. Known to a block (the line prints 0.1 %)."""
        left = [*rec.finished, *(e.victim for e in rec.preemptions)]
        for rid in left:
            i = self.index.get(rid)
            g = self.groups.get(i) if i is not None else None
            if g is None or g.splits >= MAX_FIXES or self.status.get(i) != "sum":
                continue  # (a member split once is known to a block: the next leaving
                # member's KV difference is the other requests' error, not this sum's)
            diff = round((rec.kv_usage - logged_kv / 100.0) * usable_blocks)
            if abs(diff) <= usable_blocks // 2000:  # within the line's 0.1 %
                continue
            bs = self.block_size
            others = [j for j in g.members if j != i]
            if not others:
                continue
            n_i = self.prompt_len(i) + diff * bs  # freed fewer blocks than ours: it held fewer
            total = sum(self.prompt_len(j) for j in g.members)
            rest = total - n_i
            if n_i < 1 or rest < len(others):
                continue
            share, extra = divmod(rest, len(others))
            lengths = {i: n_i}
            for k, j in enumerate(others):
                lengths[j] = share + (1 if k < extra else 0)
            g.splits += 1
            return Fix(g.step, lengths, "block")
        return None

    def observe(self, out: Any) -> None:
        """A step its line accepted: an estimated prompt computed alone in it is shown
        exactly; two in one step only as their sum."""
        mine = [self.index[rid] for rid in out.ctx_req_ids if self.index.get(rid) in self.open]
        for i in mine:
            if len(mine) > 1:
                if self.status[i] == "estimated":  # (a split or a line that showed
                    self.status[i] = "sum"  # it alone stays: a replay passes here again)
            elif self.status[i] == "estimated":
                self.status[i] = "exact"

    def sum_groups(self) -> list[list[int]]:
        """Each group of requests a line showed only as one sum (in order, once)."""
        seen: dict[int, list[int]] = {}
        for g in self.groups.values():
            seen.setdefault(id(g), g.members)
        return sorted(list(m) for m in seen.values())

    def summary(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for i in self.open:
            out[self.status[i]] = out.get(self.status[i], 0) + 1
        return out
