"""A counts-only engine (the Iteration-line ensemble's members) makes the same run as the
default engine: every field it records equals the default engine's, step by step, and so do
the preemptions, their recomputed tokens and the totals read from them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvreplay.replay.engine import COUNT_FIELDS, Engine
from kvreplay.replay.records import preemption_records, totals
from kvreplay.replay.workload import parse_workload

CASES = Path(__file__).parents[2] / "data" / "conformance" / "cases"


def _steps(wl, counts_only: bool) -> list:
    eng = Engine(wl, counts_only=counts_only)
    return list(eng.run())


@pytest.mark.parametrize("case", ["b_fcfs_heavy", "d_priority", "e_chunked_prefill",
                                  "f_prefix_caching", "g_self_preempt_fcfs"])
def test_counts_only_records_what_the_default_engine_records(case: str) -> None:
    wl = parse_workload(json.loads((CASES / case / "workload.json").read_text()))
    full = _steps(wl, False)
    lean = _steps(wl, True)
    assert len(lean) == len(full) > 0
    for a, b in zip(full, lean):
        for f in COUNT_FIELDS:
            if f == "admitted":  # only the resumed victims' admissions
                assert [x for x in a.admitted if x.resumed] == b.admitted
            else:
                assert getattr(a, f) == getattr(b, f), (case, a.step, f)
    pf, pl = preemption_records(full), preemption_records(lean)
    assert [(p.step, p.victim, p.tokens_recomputed) for p in pf] == \
        [(p.step, p.victim, p.tokens_recomputed) for p in pl]
    tf, tl = totals(full, pf), totals(lean, pl)
    assert (tf.preemptions, tf.tokens_recomputed, tf.processed_tokens) == \
        (tl.preemptions, tl.tokens_recomputed, tl.processed_tokens)


def test_some_case_preempts_and_recomputes() -> None:
    """(the comparison above is not vacuous: the cases preempt and readmit)"""
    wl = parse_workload(json.loads((CASES / "b_fcfs_heavy" / "workload.json").read_text()))
    pre = preemption_records(_steps(wl, True))
    assert pre and any(p.tokens_recomputed for p in pre)
