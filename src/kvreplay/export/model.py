"""The trace a replay exports, whatever the file format: tracks, slices, instants, counters
and flows, read from one `Replay` (its step and preemption records, its clock) and one
checked re-run of its inputs (`Replay.rerun`: which request got how many tokens in a step is
in no record). chrome.py and perfetto.py write exactly this; nothing here knows a format.

Time (integer ns, whole microseconds): step s runs from `starts[s]` to `starts[s+1]`. The
starts are the replay's clock (the log's wall time, epoch seconds) where it has one, else
the step-time model's durations from 0; the last step lasts one model duration.

Invariants the tests check on the written files:
- a request's phase slices (depth 0) tile its life without gaps or overlaps, from its
  arrival (the start of the step it entered before) to its end (the end of the step that
  finished it, the start of the step an abort came before, or the end of the export):
  waiting, prefill, decode, preempted (swapped: a V0 swap), recompute (the prefill again
  after a preemption), decode...; zero-length phases are left out;
- prefill and recompute hold one child slice (depth 1) per chunk, exactly its step;
- one `preemption` instant per preemption on the engine's track and one on the victim's;
  a flow from the trigger's `allocation failed` instant to the victim's (not for a
  self-preemption);
- counters hold the replay's own per-step numbers (StepRecord), the state after a step
  from that step's end, the scheduled tokens of a step from its start.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterator

from kvreplay.errors import UserError
from kvreplay.inference.clock import StepTimeModel
from kvreplay.replay.records import StepRecord
from kvreplay.replay.result import Replay

GROUP = 1 << 40  # the engine's group: its own track, the counters and the requests under it
ENGINE = 1  # the engine's own track: its steps and every preemption

# (name, unit, value type, sampled at): what each counter track shows
COUNTERS: list[tuple[str, str, str, str]] = [
    ("KV free blocks", "blocks", "int", "end"),  # StepRecord.free_blocks: the free queue
    ("KV cached blocks", "blocks", "int", "end"),  # blocks holding a prefix-cache hash
    ("KV held blocks", "blocks", "int", "end"),  # in use by a request: usable - free
    ("KV usage", "fraction", "float", "end"),  # StepRecord.kv_usage, as vLLM's stats
    ("running", "requests", "int", "end"),
    ("waiting", "requests", "int", "end"),
    ("swapped", "requests", "int", "end"),  # V0 only
    ("scheduled tokens", "tokens", "int", "start"),  # StepRecord.num_scheduled_tokens
    ("token budget used", "fraction", "float", "start"),  # of max_num_batched_tokens
]


@dataclass(slots=True)
class Track:
    uid: int
    name: str
    kind: str  # group | engine | counter | request
    parent: int | None = None
    unit: str = ""  # counters
    value_type: str = "int"  # counters: int | float


@dataclass(slots=True)
class Slice:
    track: int
    name: str
    start: int
    end: int
    depth: int  # 0: a phase (or an engine step), 1: a chunk inside a prefill
    args: dict[str, Any]


@dataclass(slots=True)
class Instant:
    track: int
    name: str
    ts: int
    args: dict[str, Any]
    flow_out: int | None = None  # a flow (arrow) starts here ...
    flow_in: int | None = None  # ... and ends here


@dataclass(slots=True)
class Counter:
    track: int
    ts: list[int] = field(default_factory=list)
    values: list[Any] = field(default_factory=list)

    def add(self, ts: int, value: Any) -> None:
        """A sample, kept only when the value changes (a counter holds its last value)."""
        if not self.values or self.values[-1] != value:
            self.ts.append(ts)
            self.values.append(value)


@dataclass(slots=True)
class Trace:
    tracks: list[Track]
    slices: list[Slice]
    instants: list[Instant]
    counters: list[Counter]
    meta: dict[str, Any]

    def events(self) -> Iterator[tuple[str, int, Any]]:
        """("begin" | "end" | "counter" | "instant", ts, object) in the order a track-event
        stream needs: by time; at one time, ends (innermost first), counter samples,
        begins (outermost first), then instants (inside the slice that begins there)."""
        keys: list[tuple[int, int, int, int, str, Any]] = []
        for i, s in enumerate(self.slices):
            keys.append((s.start, 2, s.depth, i, "begin", s))
            keys.append((s.end, 0, -s.depth, i, "end", s))
        n = len(self.slices)
        for c in self.counters:
            for ts, v in zip(c.ts, c.values):
                keys.append((ts, 1, 0, n, "counter", (c.track, v)))
                n += 1
        for i, e in enumerate(self.instants):
            keys.append((e.ts, 3, 0, n + i, "instant", e))
        keys.sort(key=_key)
        for ts, _, _, _, kind, obj in keys:
            yield kind, ts, obj


def _key(k: tuple) -> tuple:
    return k[:4]


def step_starts(replay: Replay, model: StepTimeModel) -> list[int]:
    """Start of every step and the end of the last, in ns (whole microseconds): the
    replay's clock, continued by the model where it has none (a workload: from 0)."""
    steps = replay.steps
    n = len(steps)
    secs = list(replay.clock[:n]) if replay.clock else [0.0]
    while len(secs) < n + 1:
        secs.append(secs[-1] + model.dt_record(steps[len(secs) - 1]))
    out = [round(x * 1e6) * 1000 for x in secs]
    for i in range(1, len(out)):  # a clock never runs backwards; rounding may tie
        if out[i] < out[i - 1]:
            out[i] = out[i - 1]
    return out


def scalar(v: Any) -> Any:
    """Args are scalars (str, int, float, bool) in both formats."""
    if v is None or isinstance(v, (str, int, float, bool)):
        return v
    return json.dumps(v, sort_keys=True, default=str)


def _meta(replay: Replay, model: StepTimeModel, lo: int, hi: int, n_pre: int) -> dict[str, Any]:
    info = replay.info
    m: dict[str, Any] = {
        "label": replay.label, "kind": replay.kind, "engine": replay.engine_name,
        "profile": replay.profile.name, "vllm_version": info.vllm_version,
        "confidence": replay.confidence, "first_step": lo, "last_step": hi,
        "num_steps": replay.num_steps, "preemptions": n_pre,
        "clock": ("log wall time (" + str(info.step_time_model or model.describe()) + ")"
                  if replay.clock else "step-time model from 0: " + model.describe()),
    }
    unc = replay.uncertainty
    if unc is not None:
        m["headline"] = unc.headline
        m["preemptions_90pct"] = scalar(unc.preemptions)
        m["recomputed_tokens_90pct"] = scalar(unc.recomputed_tokens)
    return {k: scalar(v) for k, v in m.items() if v is not None}


def build_trace(replay: Replay, steps: tuple[int, int] | None = None,
                model: StepTimeModel | None = None) -> Trace:
    """The trace of `replay`, of steps lo..hi (inclusive; default: all)."""
    from kvreplay.export.lives import Lives

    n = replay.num_steps
    if n == 0:
        raise UserError("the replay has no steps to export")
    lo, hi = steps if steps is not None else (0, n - 1)
    if not 0 <= lo <= hi < n:
        raise UserError(f"steps {lo}-{hi}: the replay has steps 0-{n - 1}")
    model = model or replay.step_time_model or StepTimeModel()
    starts = step_starts(replay, model)
    w0, w1 = starts[lo], starts[hi + 1]
    tracks = [Track(GROUP, f"vLLM engine {replay.engine_name}: {replay.label}", "group"),
              Track(ENGINE, "engine", "engine", GROUP)]
    counters: dict[str, Counter] = {}
    v0 = replay.engine_name == "V0"
    for name, unit, vtype, _ in COUNTERS:
        if name == "swapped" and not v0:
            continue
        uid = len(tracks)
        tracks.append(Track(uid, name, "counter", GROUP, unit, vtype))
        counters[name] = Counter(uid)
    first_request = len(tracks)
    ids = [s.id for s in replay.workload.requests]
    uid_of = {rid: first_request + i for i, rid in enumerate(ids)}
    lives = Lives(replay, starts, w0, w1, uid_of)
    budget = replay.workload.config.max_num_batched_tokens
    eng0 = replay.new_engine()
    state = _after(eng0, StepRecord(-1, free_blocks=_free(eng0)), v0)
    engine_slices: list[Slice] = []
    for eng, rec in replay.rerun():
        s = rec.step
        if s == lo:
            for name, v in state.items():
                counters[name].add(w0, v)
        lives.step(eng, rec, s >= lo)
        state = _after(eng, rec, v0)
        if s < lo:
            continue
        t0, t1 = starts[s], starts[s + 1]
        counters["scheduled tokens"].add(t0, rec.num_scheduled_tokens)
        counters["token budget used"].add(t0, rec.num_scheduled_tokens / budget if budget else 0.0)
        for name, v in state.items():
            counters[name].add(t1, v)
        if t1 > t0:
            engine_slices.append(Slice(ENGINE, "idle" if rec.idle else "step", t0, t1, 0, {
                "step": s, "scheduled_requests": rec.num_scheduled,
                "scheduled_tokens": rec.num_scheduled_tokens, "decode_tokens": rec.decode_tokens,
                "preemptions": len(rec.preemptions), "admitted": len(rec.admitted),
                "finished": len(rec.finished)}))
        if s == hi:
            break
    lives.close_all(starts[hi + 1])
    used = {sl.track for sl in lives.slices} | {e.track for e in lives.instants}
    tracks += [Track(uid_of[rid], rid, "request", GROUP) for rid in ids if uid_of[rid] in used]
    n_pre = sum(1 for e in lives.instants if e.track == ENGINE and e.name == "preemption")
    meta = _meta(replay, model, lo, hi, n_pre)
    instants = [Instant(ENGINE, "replay", w0, dict(meta)), *lives.instants]
    return Trace(tracks, engine_slices + lives.slices, instants, list(counters.values()), meta)


def _free(eng: Any) -> int:
    if hasattr(eng, "eng"):  # V0Steps
        return eng.eng.sched.block_manager.get_num_free_gpu_blocks()
    return eng.scheduler.pool.get_num_free_blocks()


def _after(eng: Any, rec: StepRecord, v0: bool) -> dict[str, Any]:
    """The counters of the state after `rec`'s step: the record's own numbers, and the
    cached and held blocks read from the engine (vLLM's names: BlockPool)."""
    if v0:
        bm = eng.eng.sched.block_manager
        gpu = bm.gpu
        cached = len(gpu.evictor.free_table) if getattr(gpu, "caching", False) else 0
        usable = bm.num_total_gpu_blocks
    else:
        pool = eng.scheduler.pool
        cached = pool.num_cached_hashes()
        usable = pool.num_usable_blocks
    out = {"KV free blocks": rec.free_blocks, "KV cached blocks": cached,
           "KV held blocks": usable - rec.free_blocks,  # BlockPool.check: held + free = usable
           "KV usage": rec.kv_usage, "running": rec.num_running, "waiting": rec.num_waiting}
    if v0:
        out["swapped"] = rec.num_swapped
    return out
