"""`kvreplay watch` on a server that is never quiet: the window is cut at decided steps with
the engine's state carried into the next (live/session.py `Session._carry`,
inference/start_state.py), and the rows printed are the offline replay's, at the same
steps and times, none withdrawn; the window stays a bounded share of the log."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

import kvreplay.live.session as session_mod
from kvreplay.live.session import PreemptionRow, Session
from kvreplay.sources import open_replay


def _busy_log(path: Path, steps: int, caching: bool, seed: int) -> Path:
    """Poisson arrivals, long decodes: 30-100 running, the engine never idle after its
    first request (asserted below on the offline replay); with `caching`, prompts share
    prefixes (the carried pool's cached blocks are hit after a cut)."""
    from kvreplay.replay import parse_workload, simulate
    from tools.oracle.render_log import render_log

    rng = random.Random(seed)
    shared = [[rng.randrange(10, 30000) for _ in range(96)] for _ in range(4)]
    reqs, t, i = [], 0.0, 0
    while True:
        t += rng.expovariate(0.25)
        if t >= steps:
            break
        prefix = rng.choice(shared)[:rng.choice((0, 48, 96))] if caching else []
        reqs.append({"id": f"cmpl-busy-{i}-0", "arrival_step": int(t),
                     "prompt_token_ids": prefix + [rng.randrange(10, 30000)
                                                   for _ in range(rng.randrange(32, 300))],
                     "max_tokens": rng.randrange(80, 400)})
        i += 1
    wl = parse_workload({"name": "busy", "config": {
        "num_gpu_blocks": 900, "block_size": 16, "max_num_seqs": 128,
        "max_num_batched_tokens": 2048, "max_model_len": 1024,
        "enable_prefix_caching": caching, "max_steps": 10**7}, "requests": reqs})
    records, _ = simulate(wl)
    path.write_text("\n".join(render_log(wl, records, step_time_s=0.03, stats_interval_s=10.0,
                                         iteration_lines=True, with_prompts=True)) + "\n")
    return path


def _watched(s: Session, lines: list[str], chunk: int, seen=lambda s, cuts: None) -> list:
    """Every row `s` gives for `lines` fed `chunk` at a time, a replay after each chunk;
    `seen(s, cuts before the replay)` after each."""
    rows: list = []
    for i in range(0, len(lines), chunk):
        rows += s.feed(lines[i:i + chunk])
        cuts = s.cuts
        rows += s.update()
        seen(s, cuts)
    return rows + s.finish(end=True)


def _offline(rep, timed: bool = False) -> list[tuple]:
    return sorted((p.step, str(p.victim), p.trigger, p.computed_tokens_lost, p.confidence)
                  + ((p.time,) if timed else ()) for p in rep.preemptions)


def _printed(rows: list, timed: bool = False) -> list[tuple]:
    return sorted((r.step, r.victim, r.trigger, r.tokens_lost, r.confidence)
                  + ((r.time,) if timed else ()) for r in rows if isinstance(r, PreemptionRow))


@pytest.mark.parametrize("caching, chunk", [(False, 300), (True, 457)])
def test_a_never_quiet_run_cut_with_its_state_carried_keeps_the_offline_rows(
        tmp_path, monkeypatch, caching, chunk):
    path = _busy_log(tmp_path / "busy.log", 1500, caching, seed=3)
    lines = path.read_text().splitlines(True)
    monkeypatch.setattr(session_mod, "WINDOW_LINES", 400)
    monkeypatch.setattr(session_mod, "CARRY_BACK", 64)
    s = Session(str(path))
    longest = [0]
    rows = _watched(s, lines, chunk, lambda s, _: longest.append(len(s.lines)))
    assert not s.failed
    rep = open_replay([str(path)])
    first = rep.inputs.arrival_steps[0]
    last = max(rep.inputs.arrival_steps)
    assert not any(r.num_running == 0 and r.num_waiting == 0
                   for r in rep.steps[first + 1:last])  # never quiet: no quiet-point cut
    off = _offline(rep, timed=True)
    assert _printed(rows, timed=True) == off and len(off) > 20
    assert not any(r.event == "withdrawn" for r in rows)
    assert s.cuts >= 5 and s.start is not None
    assert max(longest) < len(lines) / 3
    if caching:
        assert sum(rec.stats_prompt_cached for rec in rep.steps) > 0


CASES = Path(__file__).parent.parent / "data" / "logcases"


@pytest.mark.parametrize("name, chunk", [("b_fcfs_heavy", 40), ("f_prefix_caching", 40),
                                         ("p1_poisson_fcfs_200", 300)])
def test_the_published_logs_cut_at_decided_steps_keep_the_offline_rows(monkeypatch, name, chunk):
    """Prompts logged (JSON bodies), a window cut whenever it holds over 100 lines, the
    state carried 16 lines behind the last decided one: the published logs' rows (f: its
    prefix cache carried across the cuts; p1: a cut every few lines)."""
    path = CASES / name / "server.iter.reqbody.log"
    lines = path.read_text().splitlines(True)
    monkeypatch.setattr(session_mod, "WINDOW_LINES", 100)
    monkeypatch.setattr(session_mod, "CARRY_BACK", 16)
    s = Session(str(path))
    rows = _watched(s, lines, chunk)
    off = _offline(open_replay([str(path)]))
    assert _printed(rows) == off and off
    assert not any(r.event == "withdrawn" for r in rows)
    assert s.cuts >= 4 and not s.failed


def test_quiet_points_and_decided_steps_both_cut_a_bursty_run(tmp_path, monkeypatch):
    """A bursty run (quiet between bursts) with windows small enough to be cut inside a
    burst too: cuts with a carried state and at quiet points (an empty engine) follow each
    other, and the rows are the offline replay's."""
    from tools.oracle.bursty_log import render_bursty

    path = tmp_path / "bursty.log"
    path.write_text("\n".join(render_bursty(12)) + "\n")
    lines = path.read_text().splitlines(True)
    monkeypatch.setattr(session_mod, "WINDOW_LINES", 150)
    monkeypatch.setattr(session_mod, "CARRY_BACK", 16)
    s = Session(str(path))
    kinds: list[bool] = []  # per cut: whether it carried a state (else a quiet point)
    rows = _watched(s, lines, 120,
                    lambda s, cuts: kinds.append(s.start is not None) if s.cuts > cuts else None)
    carried, quiet = kinds.count(True), kinds.count(False)
    off = _offline(open_replay([str(path)]))
    assert _printed(rows) == off and len(off) > 12
    assert not any(r.event == "withdrawn" for r in rows)
    assert carried >= 2 and quiet >= 2


def test_the_day_bench_renders_the_same_log_whatever_its_chunks_and_names_the_true_rows(tmp_path):
    """bench_watch_memory --stream writes a day's log a chunk of steps at a time: the log
    is the same for any chunk (Iteration numbers, context counts and KV usage across the
    edges), and its offline replay names the run's true preemptions at the steps the bench
    gives (idle steps before the first arrival not counted)."""
    from bench.bench_watch_memory import render_busy_stream

    whole = render_busy_stream(0.03, 0.03, 0.07, tmp_path / "a.log", chunk=10**6)
    cut = render_busy_stream(0.03, 0.03, 0.07, tmp_path / "b.log", chunk=333)
    assert (tmp_path / "a.log").read_text() == (tmp_path / "b.log").read_text()
    assert whole[1:] == cut[1:]
    truth = whole[2]
    rep = open_replay([str(tmp_path / "a.log")])
    assert sorted((p.step, str(p.victim)) for p in rep.preemptions) == truth and len(truth) > 50
