"""When a session replays (a bounded cost per line) and how it gives and withdraws rows;
a fake clock, no replay run except where said."""

from __future__ import annotations

from kvreplay.live import session as sess
from kvreplay.live.session import PreemptionRow, Session


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _session() -> tuple[Session, Clock]:
    c = Clock()
    return Session("x.log", clock=c), c


def test_no_replay_without_a_deciding_line():
    s, c = _session()
    s.feed(["(APIServer pid=1) INFO 05-07 10:00:00 [x.py:1] Received request r1\n"] * 10)
    c.t = 10.0
    assert not s.due()


def test_growth_or_the_duty_cycle():
    s, c = _session()
    it = "INFO 05-07 10:00:00 [loggers.py:1] Engine 000: Iteration(0): ...\n"
    s.at_replay, s.last_cost, s.replay_end = 100, 1.0, 0.0  # last replay: 100 lines, 1 s
    s.lines = ["x\n"] * 100
    s.feed([it] * 10)  # grew by 10 < GROWTH x 100
    assert not s.due()
    c.t = 0.5  # the last replay (1 s) is over DUTY of the 1.5 s since it began
    assert not s.due()
    c.t = 1.0  # 1 s <= 0.5 x 2 s
    assert s.due()
    c.t = 0.0
    s.feed([it] * 15)  # 125 lines: grown by 25 = GROWTH x 100: due at once
    assert s.due()


def test_the_replays_cost_is_a_geometric_sum():
    """Lines arriving faster than replays (never quiet): the lines replayed in all stay
    within (1 + 1 / GROWTH) x the log's lines."""
    s, c = _session()
    replayed = 0
    it = "Iteration(1)\n"
    for _ in range(20000):
        s.feed([it])
        if s.due():
            replayed += len(s.lines)
            s.at_replay, s.pending = len(s.lines), False
            s.last_cost, s.replay_end = 1e9, c.t  # a slow replay: never the duty rule
    assert replayed <= (1 + 1 / sess.GROWTH) * 20000


def _row(step: int, victim: str) -> PreemptionRow:
    return PreemptionRow(run=1, step=step, time=None, victim=victim, trigger="t", rule="fcfs",
                         self_preemption=False, tokens_lost=10, confidence="inferred")


def test_rows_are_given_once_and_withdrawn_when_a_later_replay_undoes_them():
    s, _ = _session()
    first = s._reconcile([_row(5, "a"), _row(9, "b")], lambda r: r.step <= 9)
    assert [(r.event, r.victim) for r in first] == [("preemption", "a"), ("preemption", "b")]
    assert s._reconcile([_row(5, "a"), _row(9, "b")], lambda r: r.step <= 9) == []
    # b is gone from the decided part, c is new; a row past the horizon is not withdrawn
    again = s._reconcile([_row(5, "a"), _row(9, "c")], lambda r: r.step <= 9)
    assert [(r.event, r.victim) for r in again] == [("withdrawn", "b"), ("preemption", "c")]
    assert s._reconcile([_row(5, "a")], lambda r: r.step <= 5) == []  # c (step 9) stands
