"""Each request's life as phase slices, step by step, from one checked re-run.

The phases change only at step boundaries (model.py gives the invariants):
- arrival (StepRecord.arrivals): `waiting` from the step's start;
- preemption (StepRecord.preemptions, costs from the matching PreemptionRecord): the phase
  ends at the step's start, `preempted` (`swapped` for a V0 swap) begins; `preemption`
  instants on the victim's and the engine's track, a flow from the trigger;
- admission (StepRecord.admitted): `prefill` (new), `recompute` (readmitted after a
  recompute preemption) or the phase it had (swapped back in) begins at the step's start;
- scheduled tokens (the engine's output): a chunk of a prefill or recompute, exactly its
  step; a chunk that reaches the end of the sequence samples a token (will_sample), and
  `decode` begins at the step's end;
- finish: the phase ends at the step's end; an abort before a step: at its start.
Everything is clipped to the exported window [w0, w1).
"""

from __future__ import annotations

from typing import Any, Sequence

from kvreplay.export.model import ENGINE, Instant, Slice, scalar
from kvreplay.replay.records import PreemptionRecord, StepRecord
from kvreplay.replay.result import Replay

PREFILLS = ("prefill", "recompute")


class _Life:
    __slots__ = ("phase", "start", "args", "chunks", "before_swap")

    def __init__(self, phase: str, start: int, args: dict[str, Any]) -> None:
        self.phase = phase
        self.start = start
        self.args = args
        self.chunks = 0
        self.before_swap = "decode"


class Lives:
    def __init__(self, replay: Replay, starts: Sequence[int], w0: int, w1: int,
                 uid_of: dict[str, int]) -> None:
        self.replay = replay
        self.starts = starts
        self.w0, self.w1 = w0, w1
        self.uid_of = uid_of
        self.v0 = replay.engine_name == "V0"
        self.pre: list[PreemptionRecord] = replay.preemptions
        self.next_pre = 0
        self.open_pre: dict[str, PreemptionRecord] = {}  # victim -> its last preemption
        self.lives: dict[str, _Life] = {}
        self.slices: list[Slice] = []
        self.instants: list[Instant] = []
        unc = replay.uncertainty
        self.common: dict[str, Any] = {}
        if replay.confidence != "exact":
            self.common["confidence"] = replay.confidence
        self.p_request = ({r["id"]: r["p_preempted"] for r in unc.requests}
                          if unc is not None else {})

    # -- slices -------------------------------------------------------------------------
    def _slice(self, rid: str, name: str, a: int, b: int, depth: int, args: dict) -> None:
        a2, b2 = max(a, self.w0), min(b, self.w1)
        if b2 <= a2:
            return
        if (a2, b2) != (a, b):
            args["clipped"] = True
        self.slices.append(Slice(self.uid_of[rid], name, a2, b2, depth, args))

    def _open(self, rid: str, phase: str, t: int, step: int, **args: Any) -> _Life:
        a = {"step": step, **self.common}
        if rid in self.p_request:
            a["p_preempted"] = self.p_request[rid]
        a.update({k: scalar(v) for k, v in args.items() if v is not None})
        life = _Life(phase, t, a)
        self.lives[rid] = life
        return life

    def _close(self, rid: str, t: int, step: int, ended_by: str) -> _Life | None:
        life = self.lives.pop(rid, None)
        if life is None:
            return None
        life.args["last_step"] = step
        life.args["ended_by"] = ended_by
        if life.phase in PREFILLS:
            life.args["chunks"] = life.chunks
        self._slice(rid, life.phase, life.start, t, 0, life.args)
        return life

    def close_all(self, t: int) -> None:
        last = self.replay.num_steps - 1
        for rid in list(self.lives):
            self._close(rid, t, last, "replay ends")

    # -- one step -----------------------------------------------------------------------
    def step(self, eng: Any, rec: StepRecord, in_window: bool) -> None:
        s = rec.step
        t0, t1 = self.starts[s], self.starts[s + 1]
        sched, will_sample = self._scheduled(eng)
        for rid in rec.arrivals:
            self._open(rid, "waiting", t0, s)
        for rid in rec.aborted:
            if rid not in sched:  # aborted between two steps (else mid-step: below)
                self._close(rid, t0, s, "aborted")
        for e in rec.preemptions:
            p = self.pre[self.next_pre]
            self.next_pre += 1
            assert p.step == s and p.victim == e.victim, "records out of order"
            self._preempt(p, t0, in_window)
        for a in rec.admitted:
            if not a.resumed:
                self._close(a.request, t0, s, "admitted")
                self._open(a.request, "prefill", t0, s, prefix_hit=a.prefix_hit,
                           num_tokens=a.num_tokens)
                continue
            p = self.open_pre.pop(a.request, None)
            old = self._close(a.request, t0, s, "readmitted")
            if a.swapped_in:
                self._open(a.request, old.before_swap if old else "decode", t0, s,
                           swapped_in=True)
            else:
                self._open(a.request, "recompute", t0, s, prefix_hit=a.prefix_hit,
                           num_tokens=a.num_tokens,
                           tokens_recomputed=p.tokens_recomputed if p else None,
                           preemption=p.index if p else None)
        for rid, n in sched.items():
            life = self.lives.get(rid)
            if life is None:
                continue
            if life.phase in PREFILLS:
                life.chunks += 1
                life.args["tokens"] = life.args.get("tokens", 0) + n
                self._slice(rid, "chunk", t0, t1, 1, {"step": s, "chunk": life.chunks,
                                                       "tokens": n, **self.common})
                if rid in will_sample:  # the prompt (and outputs) are in: a token comes out
                    self._close(rid, t1, s, "sampled")
                    self._open(rid, "decode", t1, s + 1)
            elif life.phase == "decode":
                life.args["tokens"] = life.args.get("tokens", 0) + n
                life.args["decode_steps"] = life.args.get("decode_steps", 0) + 1
        for rid in rec.finished:
            self._close(rid, t1, s, "finished")
        for rid in rec.aborted:
            if rid in sched:
                self._close(rid, t1, s, "aborted")

    def _scheduled(self, eng: Any) -> tuple[dict[str, int], set[str]]:
        """This step's tokens per request (what the budget counted) and the requests whose
        tokens reach the end of their sequence (they sample)."""
        if self.v0:
            raw = eng.last_record or {}
            cached = raw.get("cached_tokens") or {}
            sched = {rid: n - cached.get(rid, 0) for rid, n in raw.get("scheduled") or ()}
            return sched, set(raw.get("will_sample") or ())
        out = eng.last_output
        if out is None:
            return {}, set()
        return out.num_scheduled_tokens, set(eng.last_sample_ids)

    def _preempt(self, p: PreemptionRecord, t0: int, in_window: bool) -> None:
        s = p.step
        old = self._close(p.victim, t0, s, "preempted")
        args = {"preemption": p.index, "trigger": p.trigger, "victim_rule": p.victim_rule,
                "self_preemption": p.self_preemption, "mode": p.mode,
                "tokens_lost": p.computed_tokens_lost, "tokens_recomputed": p.tokens_recomputed,
                "prefix_hit_at_readmission": p.prefix_hit_at_readmission,
                "readmission_step": p.readmission_step, "blocks_held": p.blocks_held,
                "blocks_freed": p.blocks_freed, "nth_of_victim": p.nth_of_victim,
                "preemption_confidence": p.confidence, "probability": p.probability,
                "basis": p.basis}
        life = self._open(p.victim, "swapped" if p.mode == "swap" else "preempted", t0, s, **args)
        if old is not None:
            life.before_swap = "decode" if old.phase == "decode" else "prefill"
        self.open_pre[p.victim] = p
        if not in_window:
            return
        inst = {"step": s, "victim": p.victim, **{k: scalar(v) for k, v in args.items()
                                                   if v is not None}}
        flow = None
        trig = p.trigger
        if trig is not None and not p.self_preemption and trig in self.uid_of:
            flow = p.index + 1
            fail = {"step": s, "victim": p.victim, "preemption": p.index,
                    "blocks_needed": p.blocks_needed,
                    "free_blocks_at_failure": p.free_blocks_at_failure}
            self.instants.append(Instant(self.uid_of[trig], "allocation failed", t0,
                                         {k: v for k, v in fail.items() if v is not None},
                                         flow_out=flow))
        self.instants.append(Instant(self.uid_of[p.victim], "preemption", t0, dict(inst),
                                     flow_in=flow))
        self.instants.append(Instant(ENGINE, "preemption", t0, dict(inst)))
