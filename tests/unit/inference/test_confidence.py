"""inference/confidence.py: the labels' rules, on hand-made checks.

A V0 log is checked within tolerances and pins lines and arrivals only to a second: a row
is exact-by-log (a matched warning) or consistent (agreeing lines on both sides) only
where its second holds at most PIN_STEPS = 11 steps (then it pins the step to +-5). A V1
log's rule is untouched."""

from __future__ import annotations

from kvreplay.inference.confidence import PIN_STEPS, set_confidence, steps_per_second
from kvreplay.replay.checks import (StatsLineCheck, Verification, WarningLineCheck,
                                    WarningsCheck)
from kvreplay.replay.records import PreemptionRecord


def _pre(step: int, cumulative: int | None = None, time: float | None = None) -> PreemptionRecord:
    return PreemptionRecord(index=0, step=step, victim="r1", trigger="r2", self_preemption=False,
                            victim_rule="lowest", mode="recompute", computed_tokens_lost=10,
                            num_tokens=10, num_output_tokens=2, nth_of_victim=1, blocks_held=1,
                            free_blocks_before=0, free_blocks_after=1, blocks_needed=1,
                            free_blocks_at_failure=0, rolled_back_tokens=0,
                            was_scheduled_this_step=True, cumulative=cumulative, time=time)


def _lines(steps_per_s: float) -> list[StatsLineCheck]:
    # stats lines every 5 s, each agreeing (tolerant check: no exact check)
    return [StatsLineCheck(file="l", line=k, step=int(k * 5 * steps_per_s), time=1000.0 + 5 * k,
                           read_at="step end", differences=[], agrees=True)
            for k in range(4)]


def _check(rows: list[StatsLineCheck]) -> Verification:
    return Verification(stats_lines=len(rows), agreeing_lines=len(rows), lines=rows)


def _warnings(cumulative: int | None = None) -> WarningsCheck:
    """A V0 log's warnings check: one warning at `cumulative`, matched (None: none logged)."""
    lines = [] if cumulative is None else [
        WarningLineCheck(file="l", line=1, time=1000.0, request_id="r1", mode="recompute",
                         cumulative=cumulative, victim_matches=True, matched=True)]
    return WarningsCheck(warnings_logged=len(lines), warnings_matched=len(lines),
                         victims_matched=len(lines), lines=lines)


def test_steps_per_second_between_the_lines_around_the_step():
    rows = _lines(2.0)  # steps 0, 10, 20, 30 at 1000, 1005, 1010, 1015
    assert steps_per_second(rows, [], 12) == 10 / 5
    # before the first line: over the whole run (30 steps in 15 s)
    assert steps_per_second(rows, [], 0) == 30 / 15
    assert steps_per_second([], [], 3) is None


def test_v0_slow_steps_keep_exact_by_log_and_consistent():
    # 2 steps a second: a second pins a step to +-1
    pre = [_pre(12, cumulative=50), _pre(13)]
    set_confidence(pre, _check(_lines(2.0)), _warnings(50), prompts_estimated=False)
    assert [p.confidence for p in pre] == ["exact-by-log", "consistent"]


def test_v0_fast_steps_make_every_row_inferred():
    # 40 steps a second (25 ms steps): neither the warning's second nor agreeing lines 5 s
    # apart (200 steps) pin a step to +-5
    pre = [_pre(300, cumulative=50), _pre(310)]
    set_confidence(pre, _check(_lines(40.0)), _warnings(50), prompts_estimated=False)
    assert [p.confidence for p in pre] == ["inferred", "inferred"]
    assert "warning" in pre[0].basis and "the step is not" in pre[0].basis


def test_v0_threshold_is_pin_steps_a_second():
    at = _lines(PIN_STEPS)  # exactly PIN_STEPS a second: pinned
    over = _lines(PIN_STEPS + 1)
    a, b = [_pre(60)], [_pre(60)]
    set_confidence(a, _check(at), _warnings(), prompts_estimated=False)
    set_confidence(b, _check(over), _warnings(), prompts_estimated=False)
    assert (a[0].confidence, b[0].confidence) == ("consistent", "inferred")


def test_v1_rule_unchanged_by_step_rate():
    # no warnings checked (V1): agreeing exact lines make a row consistent however fast
    rows = _lines(100.0)
    for r in rows:
        r.exact = True
    pre = [_pre(700)]
    set_confidence(pre, _check(rows), None, prompts_estimated=False)
    assert pre[0].confidence == "consistent"
    rows[2].exact = False  # the line after step 700 (step 1000) misses the exact check
    set_confidence(pre, _check(rows), None, prompts_estimated=False)
    assert pre[0].confidence == "inferred"
