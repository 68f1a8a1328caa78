"""The anchoring's rounds (inference/placement.py): round 0 reuses the fit's replay when it
is the same replay, and a large log's anchoring stops at the first round that does not
improve (issue 17: a round of a 100,000-request log is a half-minute scheduler pass)."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

import kvreplay.inference.log_shape as shape_mod
import kvreplay.inference.placement as placement
from kvreplay.inference.clock import StepTimeModel
from kvreplay.inference.formats import log_format
from kvreplay.inference.rebuild import rebuild_workload
from kvreplay.inference.runs import as_step_replay, step_replay, timed_replay
from kvreplay.replay.profile import get_profile
from kvreplay.sources import read_facts, replay_logs

CASES = Path(__file__).parents[2] / "data" / "logcases"
P1 = str(CASES / "p1_poisson_fcfs_200" / "server.log")


def _setup():
    facts = read_facts([P1], year=2026)
    fmt = log_format(facts.vllm_version, facts.engine_version)
    prof = get_profile(facts.vllm_version)
    return facts, fmt, prof, rebuild_workload(facts, fmt, prof)


def test_reused_run_is_the_step_replay_it_stands_for() -> None:
    """A time-driven run replayed again by its own arrival steps gives the same records; the
    reuse must also rebuild the clock exactly as step_replay runs it."""
    facts, fmt, prof, rebuilt = _setup()
    model = StepTimeModel(overhead_s=0.01, per_token_s=4e-5, per_request_s=5e-5)
    timed = timed_replay(rebuilt, facts, prof, model, (0.0, 1.0), order_window_s=fmt.order_window_s)
    assert timed.num_preemptions > 0
    arrival = list(timed.arrival_steps)
    assert min(arrival) == 0
    again = step_replay(rebuilt, facts, prof, arrival, model)
    reused = as_step_replay(timed, facts, arrival, model)
    assert reused is not None
    enc = msgspec.json.encode
    assert [enc(r) for r in reused.steps] == [enc(r) for r in again.steps]
    assert reused.clock == again.clock and reused.end == again.end
    assert reused.inputs == again.inputs and reused.unfinished == again.unfinished
    # not the same replay: another model, other arrival steps
    assert as_step_replay(timed, facts, arrival, StepTimeModel(overhead_s=0.01)) is None
    assert as_step_replay(timed, facts, [a + 1 for a in arrival], model) is None


def test_a_logged_abort_forbids_the_reuse() -> None:
    """Aborts are applied by the clock, which differs between the two kinds of replay."""
    from kvreplay.inference.log_shape import aborts

    facts, fmt, prof, rebuilt = _setup()
    model = StepTimeModel(overhead_s=0.01, per_token_s=4e-5, per_request_s=5e-5)
    timed = timed_replay(rebuilt, facts, prof, model, (0.0, 1.0), order_window_s=fmt.order_window_s)
    assert not aborts(facts)
    facts.requests[3].aborted_time = facts.requests[3].time + 2.0
    assert aborts(facts)
    assert as_step_replay(timed, facts, list(timed.arrival_steps), model) is None


def _rounds(monkeypatch: pytest.MonkeyPatch, large: int) -> tuple[list[float], object]:
    losses: list[float] = []
    real = placement.anchored_loss

    def spy(*a, **k):
        losses.append(real(*a, **k))
        return losses[-1]

    monkeypatch.setattr(placement, "anchored_loss", spy)
    monkeypatch.setattr(shape_mod, "LARGE_LOG_REQUESTS", large)
    rep = replay_logs([P1], year=2026, samples=0)
    return losses, rep


@pytest.mark.slow
def test_a_large_log_runs_one_anchoring_round_after_its_first_replay(
        monkeypatch: pytest.MonkeyPatch) -> None:
    full, rep_full = _rounds(monkeypatch, 10**9)
    budget, rep_budget = _rounds(monkeypatch, 1)  # every log counts as large
    assert len(full) > 2  # (else this test shows nothing)
    # the budget runs the same first two rounds, keeps the better, and says so
    assert budget == full[:2]
    assert rep_budget.info.fit_loss == pytest.approx(min(full[:2]), abs=1e-4)
    assert rep_full.info.fit_loss == pytest.approx(min(full), abs=1e-4)
    assert any("a large log" in n for n in rep_budget.facts.notes)
    assert not any("a large log" in n for n in rep_full.facts.notes)


@pytest.mark.slow
def test_a_stopped_timed_replay_is_a_prefix_of_the_whole_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """A large log's first fit round replays only its first stretch (fit.prefix_end) for a
    model: that stretch must be the whole run's, step for step."""
    import kvreplay.inference.fit as fit_mod
    from kvreplay.inference.fit import prefix_end

    monkeypatch.setattr(fit_mod, "PREFIX_MIN_LINES", 4)  # p1 has 16 stats lines
    facts, fmt, prof, rebuilt = _setup()
    model = StepTimeModel(overhead_s=0.01, per_token_s=4e-5, per_request_s=5e-5)
    whole = timed_replay(rebuilt, facts, prof, model, (0.0, 1.0), order_window_s=fmt.order_window_s)
    head = prefix_end(facts)
    assert head is not None and facts.first_time < head < facts.last_time
    part = timed_replay(rebuilt, facts, prof, model, (0.0, 1.0), order_window_s=fmt.order_window_s,
                        stop_after=head)
    assert 0 < len(part.steps) < len(whole.steps)
    enc = msgspec.json.encode
    assert [enc(r) for r in part.steps] == [enc(r) for r in whole.steps[: len(part.steps)]]
    assert part.clock == whole.clock[: len(part.clock)]
    assert part.clock[-1] <= head < whole.clock[len(part.steps)]


@pytest.mark.slow
def test_a_large_log_fits_its_first_model_on_a_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forced large, p1's fit replays a prefix first (stopped at prefix_end), then whole
    runs only; a small log never stops early."""
    import kvreplay.inference.fit as fit_mod

    calls: list[float | None] = []
    real = fit_mod.timed_replay

    def spy(*a, **k):
        calls.append(k.get("stop_after"))
        return real(*a, **k)

    monkeypatch.setattr(fit_mod, "timed_replay", spy)
    replay_logs([P1], year=2026, samples=0)
    assert calls and all(c is None for c in calls)
    whole_runs = len(calls)
    calls.clear()
    monkeypatch.setattr(shape_mod, "LARGE_LOG_REQUESTS", 1)
    monkeypatch.setattr(fit_mod, "PREFIX_MIN_LINES", 4)  # p1 has 16 stats lines
    rep = replay_logs([P1], year=2026, samples=0)
    head = fit_mod.prefix_end(rep.facts)
    prefixes = [c for c in calls if c is not None]
    assert prefixes and all(c == head for c in prefixes)
    # each fit starts with the prefix, and the prefix stands in for one whole round
    assert calls[0] == head
    assert calls.count(None) == whole_runs - len(prefixes)
