"""`kvreplay export`: the trace read back from its file (protobuf decoded with the perfetto
package's own classes; Chrome JSON with `json`) agrees with the replay it came from, for
the embedded sample log (inferred, with an ensemble), a log case (exact by its Iteration
lines, prefix caching), a V1 workload, two V0 workloads (recompute and swap) and a V0 log.

The expected times and lives are read here from the replay's own records (arrival,
finish and abort steps; the clock, or the step-time model's durations for a workload),
not from the exporter."""

from __future__ import annotations

from collections import Counter as Tally
from pathlib import Path

import pytest
from hypothesis import given
from helpers.strategies import workloads
from helpers.trace_read import Read, read_chrome, read_trace, value_at

from kvreplay.cli.replay_report import to_json
from kvreplay.export import build_trace, export
from kvreplay.export.chrome import chrome_json
from kvreplay.inference.clock import StepTimeModel
from kvreplay.replay.result import replay_workload
from kvreplay.samples import sample_path
from kvreplay.sources import open_replay

DATA = Path(__file__).parents[2] / "data"
INPUTS = {
    "sample-log": sample_path("vllm033_fcfs_heavy.log"),
    "logcase-f-iter": DATA / "logcases/f_prefix_caching/server.iter.reqbody.log",
    "v1-workload": sample_path("fcfs_heavy.workload.json"),
    "v0-recompute": DATA / "conformance/v0/v0_a_recompute_basic/workload.json",
    "v0-swap": DATA / "conformance/v0/v0_f_swap_enough_cpu/workload.json",
    "v0-log-swap": DATA / "v0_logs/v066_swap_1s.log",
}
FORMATS = {"perfetto": ".pftrace", "chrome": ".json"}
_replays: dict[str, object] = {}


def replay_of(name: str):
    if name not in _replays:
        _replays[name] = open_replay([str(INPUTS[name])], year=2026)
    return _replays[name]


def expected_starts(rep) -> list[int]:
    """Step starts in ns: the replay's clock (whole microseconds), else the step-time
    model's durations from 0; the last step lasts one model duration."""
    model = rep.step_time_model or StepTimeModel()
    secs = list(rep.clock) if rep.clock else [0.0]
    while len(secs) < rep.num_steps + 1:
        secs.append(secs[-1] + model.dt_record(rep.steps[len(secs) - 1]))
    return [round(x * 1e6) * 1000 for x in secs]


def expected_lives(rep, starts: list[int]) -> dict[str, tuple[int, int]]:
    """request -> (arrival, end) from the step records: arrival at its step's start, a
    finish at its step's end, an abort at the start of the step it came before, else the
    end of the replay."""
    arrive: dict[str, int] = {}
    end: dict[str, int] = {}
    for rec in rep.steps:
        for rid in rec.arrivals:
            arrive[rid] = starts[rec.step]
        for rid in rec.finished:
            end.setdefault(rid, starts[rec.step + 1])
        for rid in rec.aborted:
            end.setdefault(rid, starts[rec.step])
    return {rid: (a, end.get(rid, starts[-1])) for rid, a in arrive.items()}


def check_trace(got: Read, rep, starts: list[int], lo: int = 0, hi: int | None = None) -> None:
    hi = rep.num_steps - 1 if hi is None else hi
    w0, w1 = starts[lo], starts[hi + 1]
    names = got.tracks
    # every slice's and instant's track exists; request tracks sit under the engine
    assert got.event_tracks <= set(names), got.event_tracks - set(names)
    assert names[got.engine].startswith("engine") or "engine" in names[got.engine]
    for uid, parent in got.parents.items():
        assert parent is None or parent in names
    tid = {name: uid for uid, name in names.items() if uid != got.engine}
    for s in got.slices:
        assert "step" in s["args"], s
        assert w0 <= s["start"] < s["end"] <= w1, s
    # one preemption instant per preemption in the window, on the engine's and the victim's
    # track, at its step's start; their count is the report's
    pre = [p for p in rep.preemptions if lo <= p.step <= hi]
    eng = [i for i in got.instants if i["track"] == got.engine and i["name"] == "preemption"]
    vic = [i for i in got.instants if i["track"] != got.engine and i["name"] == "preemption"]
    assert len(eng) == len(vic) == len(pre)
    if (lo, hi) == (0, rep.num_steps - 1):
        assert len(eng) == to_json(rep)["summary"]["preemptions"]
    for p, e, v in zip(pre, eng, vic):
        assert e["ts"] == v["ts"] == starts[p.step]
        assert names[v["track"]] == p.victim == e["args"]["victim"]
        assert e["args"]["step"] == p.step and e["args"]["victim_rule"] == p.victim_rule
        assert e["args"]["tokens_lost"] == p.computed_tokens_lost
        assert e["args"].get("tokens_recomputed") == p.tokens_recomputed
        assert e["args"]["preemption_confidence"] == p.confidence
        assert e["args"].get("probability") == p.probability
        assert e["args"].get("trigger") == p.trigger
    # a flow from each trigger's failed allocation to its victim (none for self-preemption)
    outs = [(i["flow_out"][0], i) for i in got.instants if i["flow_out"]]
    ins = {i["flow_in"][0]: i for i in got.instants if i["flow_in"]}
    with_trigger = [p for p in pre if p.trigger is not None and not p.self_preemption]
    assert len(outs) == len(ins) == len(with_trigger)
    for (fid, src), p in zip(outs, with_trigger):
        assert names[src["track"]] == p.trigger and names[ins[fid]["track"]] == p.victim
        assert src["ts"] == ins[fid]["ts"] == starts[p.step]
    # each request's phases tile its life (clipped to the window), chunks sit in a prefill
    by_track = got.by_track()
    lives = expected_lives(rep, starts)
    tokens = 0
    for rid, (a, b) in lives.items():
        a, b = max(a, w0), min(b, w1)
        sl = sorted(by_track.get(tid.get(rid, -1), []), key=lambda s: (s["start"], s["depth"]))
        top = [s for s in sl if s["depth"] == 0]
        if b <= a:
            assert not top, rid
            continue
        assert top, rid
        assert top[0]["start"] == a and top[-1]["end"] == b, (rid, a, b, top[0], top[-1])
        for x, y in zip(top, top[1:]):
            assert x["end"] == y["start"], (rid, x, y)
            assert x["name"] != y["name"], (rid, x, y)
        if lo == 0:  # admitted in the step it came in: no time waiting
            assert top[0]["name"] in ("waiting", "prefill")
        assert {s["name"] for s in top} <= {"waiting", "prefill", "decode", "preempted",
                                           "swapped", "recompute"}
        # preempted from eviction to readmission (as far as the window shows it)
        mine = [p for p in rep.preemptions if p.victim == rid and starts[p.step] < w1 and (
            p.readmission_step is None or starts[p.readmission_step] > w0)]
        evicted = [s for s in top if s["name"] in ("preempted", "swapped")]
        assert len(evicted) == len(mine), rid
        for s, p in zip(evicted, mine):
            assert s["start"] == max(w0, starts[p.step])
            assert s["args"]["tokens_lost"] == p.computed_tokens_lost
            assert s["args"]["victim_rule"] == p.victim_rule
            if p.readmission_step is not None:
                assert s["end"] == min(w1, starts[p.readmission_step])
        if rep.confidence != "exact":
            assert all(s["args"]["confidence"] == rep.confidence for s in sl)
        for c in sl:
            if c["depth"] == 0:
                if c["name"] in ("prefill", "recompute", "decode"):
                    tokens += c["args"].get("tokens", 0)
                continue
            assert c["depth"] == 1 and c["name"] == "chunk", c
            st = c["args"]["step"]
            assert (c["start"], c["end"]) == (starts[st], starts[st + 1])
            parent = next(s for s in top if s["start"] <= c["start"] and c["end"] <= s["end"])
            assert parent["name"] in ("prefill", "recompute")
    if (lo, hi) == (0, rep.num_steps - 1):  # every scheduled token is some request's
        assert tokens == rep.totals().processed_tokens
    # counters: the replay's own numbers, after a step from its end, per step from its start
    for s in range(lo, hi + 1):
        rec = rep.steps[s]
        if s == hi or starts[s + 2] > starts[s + 1]:
            t = starts[s + 1]
            assert value_at(got.counters["KV free blocks"], t) == rec.free_blocks, s
            assert value_at(got.counters["KV usage"], t) == pytest.approx(rec.kv_usage), s
            assert value_at(got.counters["running"], t) == rec.num_running, s
            assert value_at(got.counters["waiting"], t) == rec.num_waiting, s
            free = value_at(got.counters["KV free blocks"], t)
            held = value_at(got.counters["KV held blocks"], t)
            assert free + held == (rep.workload.config.num_gpu_blocks
                                   - (0 if rep.engine_name == "V0" else 1))
        if starts[s + 1] > starts[s]:
            assert value_at(got.counters["scheduled tokens"], starts[s]) == rec.num_scheduled_tokens


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", INPUTS)
def test_the_file_read_back_agrees_with_the_replay(name: str, fmt: str, tmp_path: Path) -> None:
    rep = replay_of(name)
    out = tmp_path / f"t{FORMATS[fmt]}"
    sizes = export(rep, {fmt: out})
    assert sizes[str(out)] == out.stat().st_size > 0
    got = read_trace(out)
    starts = expected_starts(rep)
    check_trace(got, rep, starts)
    # the engine's steps carry the replay's clock (the log's wall time) or model time
    steps = [s for s in got.slices if s["track"] == got.engine]
    assert [s["args"]["step"] for s in steps] == [s for s in range(rep.num_steps)
                                                  if starts[s + 1] > starts[s]]
    if rep.clock:
        assert steps[0]["start"] == round(rep.clock[0] * 1e6) * 1000
    # same input, byte-identical output
    again = tmp_path / f"again{FORMATS[fmt]}"
    export(replay_of(name), {fmt: again})
    assert again.read_bytes() == out.read_bytes()


def test_the_sample_has_what_an_inferred_replay_needs() -> None:
    """By hand: the sample log's replay is inferred with an ensemble; its preemptions carry
    a probability, its requests p_preempted, the trace its headline."""
    rep = replay_of("sample-log")
    assert rep.confidence == "inferred" and rep.uncertainty is not None
    tr = build_trace(rep)
    assert "headline" in tr.meta and tr.meta["confidence"] == "inferred"
    pre = [i for i in tr.instants if i.name == "preemption" and i.track == 1]
    assert len(pre) == 5 and all(0 < i.args["probability"] <= 1 for i in pre)
    victims = {p.victim for p in rep.preemptions}
    name = {t.uid: t.name for t in tr.tracks}
    phases = [s for s in tr.slices if s.track != 1 and s.depth == 0 and name[s.track] in victims]
    p = {r["id"]: r["p_preempted"] for r in rep.uncertainty.requests}
    assert phases and all(s.args["p_preempted"] == p[name[s.track]] for s in phases)


def test_the_log_case_by_hand() -> None:
    """f_prefix_caching, exact by its Iteration lines: 10 preemptions (4 self), so 6 flows;
    its pool is 64 blocks of which 63 usable; prefix caching fills the cached counter."""
    rep = replay_of("logcase-f-iter")
    tr = build_trace(rep)
    assert rep.confidence == "exact-by-log" and len(rep.preemptions) == 10
    assert sum(1 for i in tr.instants if i.flow_out is not None) == 6
    by_name = {t.name: t.uid for t in tr.tracks}
    free = next(c for c in tr.counters if c.track == by_name["KV free blocks"])
    assert free.values[0] == rep.workload.config.num_gpu_blocks - 1  # empty pool at the start
    cached = next(c for c in tr.counters if c.track == by_name["KV cached blocks"])
    assert max(cached.values) > 0


def test_a_v0_swap_is_a_swapped_slice_and_resumes_decoding() -> None:
    rep = replay_of("v0-swap")
    assert all(p.mode == "swap" for p in rep.preemptions)
    got = read_chrome(chrome_json(build_trace(rep)))
    top = [s for s in got.slices if s["depth"] == 0 and s["track"] != got.engine]
    swapped = [s for s in top if s["name"] == "swapped"]
    assert len(swapped) == len(rep.preemptions)
    assert all(s["args"]["tokens_lost"] == 0 for s in swapped)
    nxt = {(s["track"], s["start"]): s for s in top}
    for s in swapped:
        after = nxt.get((s["track"], s["end"]))
        if after is not None:
            assert after["name"] in ("decode", "prefill") and after["args"]["swapped_in"] is True


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_step_range(fmt: str, tmp_path: Path) -> None:
    rep = replay_of("logcase-f-iter")
    lo, hi = rep.preemptions[2].step - 3, rep.preemptions[5].step + 10
    out = tmp_path / f"r{FORMATS[fmt]}"
    export(rep, {fmt: out}, steps=(lo, hi))
    got = read_trace(out)
    starts = expected_starts(rep)
    check_trace(got, rep, starts, lo, hi)
    # the counters start with the state after the step before the window
    assert got.counters["KV free blocks"][0] == (starts[lo], rep.steps[lo - 1].free_blocks)
    assert any(s["args"].get("clipped") for s in got.slices)


def test_a_bad_range_is_a_user_error() -> None:
    from kvreplay.errors import UserError

    rep = replay_of("v1-workload")
    with pytest.raises(UserError, match="steps 10-5"):
        build_trace(rep, (10, 5))
    with pytest.raises(UserError, match="the replay has steps 0-"):
        build_trace(rep, (0, rep.num_steps))


@given(workloads())
def test_any_workload_tiles(data: dict) -> None:
    """Property: for any workload (sync or async, chunked or not, prefix caching or not),
    the JSON trace passes every check."""
    data["config"]["policy"] = "fcfs"
    rep = replay_workload(data)
    check_trace(read_chrome(chrome_json(build_trace(rep))), rep, expected_starts(rep))
    kinds = Tally(s.name for s in build_trace(rep).slices)
    assert kinds["preempted"] == len(rep.preemptions)
