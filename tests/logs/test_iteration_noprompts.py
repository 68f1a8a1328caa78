"""Iteration lines without prompt bodies: what the lines pin of the unknown prompt lengths,
the uncertainty a replay of such a log carries, and the notes that say why."""
from __future__ import annotations

import json
import random
from pathlib import Path
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from kvreplay.inference.iteration_ensemble import draw_lengths
from kvreplay.inference.line_lengths import LineLengths
from kvreplay.replay import parse_workload, simulate
from tools.oracle.render_log import render_log
from kvreplay.sources import replay_logs

DATA = Path(__file__).parents[1] / "data" / "logcases"


def _lengths(lens: list[int], budget: int = 8192) -> LineLengths:
    reqs = [SimpleNamespace(id=f"r{i}", prompt_token_ids=list(range(n))) for i, n in enumerate(lens)]
    return LineLengths(SimpleNamespace(requests=reqs), [True] * len(lens), budget)


def _line(cr: int, ct: int, gr: int, gt: int) -> SimpleNamespace:
    return SimpleNamespace(context_requests=cr, context_tokens=ct, generation_requests=gr,
                           generation_tokens=gt)


def test_a_sums_difference_is_shared_in_proportion() -> None:
    """Two prompts prefilled together, estimated 200 and 600, logged as 1,200 context
    tokens: each grows in proportion (300 and 900), the sum exact, the split no line made
    left as the replay had it."""
    ll = _lengths([200, 600])
    out = SimpleNamespace(ctx_req_ids=["r0", "r1"], num_ctx_requests=2, num_ctx_tokens=800,
                          num_scheduled_tokens={"r0": 200, "r1": 600})
    reqs = {"r0": SimpleNamespace(num_computed_tokens=200), "r1": SimpleNamespace(num_computed_tokens=600)}
    fix = ll.fix(7, out, None, reqs, None, _line(2, 1200, 0, 0))
    assert fix is not None and fix.status == "sum"
    assert fix.lengths == {0: 300, 1: 900}


def test_a_recomputed_victim_shows_its_prompt() -> None:
    """A preempted request recomputed counts as generation tokens: the line's 26 fewer
    generation tokens than the replay's are its prompt's, when it is the one request of
    uncertain length recomputed (one shown alone in a line keeps its length)."""
    ll = _lengths([526, 900])
    ll.status[0] = "block"
    ll.status[1] = "exact"
    out = SimpleNamespace(ctx_req_ids=[], num_ctx_requests=0, num_ctx_tokens=0,
                          num_scheduled_tokens={"r0": 540, "r1": 950, "x": 1})
    fix = ll.fix(248, out, None, {}, None, _line(0, 0, 3, 1465))
    assert fix is not None and fix.status == "exact"
    assert fix.lengths == {0: 500} and fix.restore_step == 248


@settings(deadline=None)
@given(st.lists(st.integers(1, 3000), min_size=2, max_size=12), st.integers(0, 2**31))
def test_drawn_lengths_keep_what_the_lines_pinned(lens: list[int], seed: int) -> None:
    """An ensemble member's prompts: exact ones kept, a sum's total kept, a block's moved
    by at most one block, none under 1 token or over its cap."""
    n = len(lens)
    status = {i: ("exact", "sum", "block", "estimated")[i % 4] for i in range(n)}
    group = [i for i in range(n) if status[i] == "sum"]
    cap = [4096] * n
    out = draw_lengths(lens, status, [group], cap, 16, random.Random(seed))
    assert all(1 <= x <= 4096 for x in out)
    for i in range(n):
        if status[i] == "exact":
            assert out[i] == min(lens[i], 4096)
        if status[i] == "block":
            assert abs(out[i] - lens[i]) <= 16 or out[i] in (1, 4096)
    if len(group) >= 2:
        assert sum(out[i] for i in group) == sum(lens[i] for i in group) or \
            any(out[i] in (1, 4096) for i in group)


def test_without_prompts_the_count_carries_an_interval_that_holds() -> None:
    """The prefix-caching case without prompts: the replay is not pinned (prompts known as
    sums), so it carries the uncertainty object; its 90% interval holds the true count,
    every row is inferred with a probability, and the notes say what the lines gave."""
    rep = replay_logs([str(DATA / "f_prefix_caching" / "server.iter.log")], year=2026)
    truth = json.loads((DATA / "f_prefix_caching" / "truth.json").read_text())
    u = rep.uncertainty
    assert u is not None and u.samples > 0
    c = u.preemptions
    assert c["low"] <= len(truth["preemptions"]) <= c["high"]
    assert all(p.confidence == "inferred" and p.probability is not None for p in rep.preemptions)
    assert any(n.startswith("prompt lengths from the Iteration lines") for n in rep.notes)
    assert any("uncertainty ensemble" in n for n in rep.notes)
    # the report says what weighed the members: these logs' Iteration lines, not stats lines
    assert u.weighted_by == "the Iteration lines"
    from kvreplay.cli.replay_report import to_json, uncertainty_lines
    assert "reproduces the Iteration lines" in uncertainty_lines(to_json(rep)["uncertainty"])[0]


def test_with_prompts_no_ensemble() -> None:
    rep = replay_logs([str(DATA / "f_prefix_caching" / "server.iter.reqbody.log")], year=2026)
    assert rep.uncertainty is None and rep.confidence == "exact-by-log"


def test_priority_policy_without_bodies_says_priorities_are_not_logged(tmp_path: Path) -> None:
    """A priority-policy log without JSON bodies: the priorities are not in it, and the
    report says so (and draws them in the ensemble)."""
    rng = random.Random(5)
    reqs = [{"id": f"q{i}", "arrival_step": 3 * i, "max_tokens": rng.randrange(20, 80),
             "prompt_token_ids": [rng.randrange(10, 9000) for _ in range(rng.randrange(40, 300))],
             "priority": rng.randrange(0, 5)} for i in range(16)]
    wl = parse_workload({"name": "prio", "config": {
        "num_gpu_blocks": 40, "block_size": 16, "max_num_seqs": 8, "max_num_batched_tokens": 2048,
        "max_model_len": 512, "enable_chunked_prefill": True, "enable_prefix_caching": False,
        "policy": "priority", "max_steps": 5000}, "requests": reqs})
    recs, _ = simulate(wl)
    lines = render_log(wl, recs, step_time_s=0.01, start=1778148060.05, stats_interval_s=10.0,
                       with_prompts=False, iteration_lines=True)
    log = tmp_path / "server.iter.log"
    log.write_text("\n".join(lines) + "\n")
    rep = replay_logs([str(log)], year=2026)
    assert any("no priority is logged" in n for n in rep.notes), rep.notes
