"""Iteration lines without prompt bodies: what the lines pin of the unknown prompt lengths,
the uncertainty a replay of such a log carries, and the notes that say why."""
from __future__ import annotations

import json
import random
import re

import pytest
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
    reqs = [SimpleNamespace(id=f"r{i}", prompt_token_ids=list(range(n)), max_tokens=100)
            for i, n in enumerate(lens)]
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


def _req(i: int, tokens: int, computed: int, outputs: int = 0) -> SimpleNamespace:
    return SimpleNamespace(request_id=f"r{i}", num_tokens=tokens, num_computed_tokens=computed,
                           num_output_tokens=outputs, num_preemptions=0)


def _sched(running: list, waiting: list) -> SimpleNamespace:
    return SimpleNamespace(running=running, waiting=waiting, max_num_running_reqs=64,
                           max_model_len=4096)


def test_the_coming_steps_line_sets_a_new_prompt_before_it_runs() -> None:
    """r0 still prefills (952 of its 3,000 tokens left), r1-r3 decode; r4 is sent for the
    step, estimated at 500 tokens. The line: 2 context requests, 2,252 tokens, 3 generation
    requests and tokens. r4 is the one new context request: its prompt is 2,252 - 952 =
    1,300 tokens, exact (no budget cut: 2,255 < 8,192)."""
    ll = _lengths([3000, 300, 300, 300, 500])
    ll.status[0] = "exact"
    sched = _sched([_req(0, 3000, 2048), _req(1, 310, 309, 9), _req(2, 320, 319, 19),
                    _req(3, 330, 329, 29)], [])
    fix = ll.ahead(sched, [4], _line(2, 2252, 3, 3), 40, False)
    assert fix is not None and (fix.lengths, fix.status, fix.restore_step) == ({4: 1300}, "exact", 40)


def test_two_new_prompts_ahead_share_their_sum() -> None:
    """r0 waits, r1 is sent, estimated 200 and 600; the line shows 2 context requests of
    1,200 tokens in all: each scaled by 1.5 (300 and 900), known only as a sum."""
    ll = _lengths([200, 600])
    fix = ll.ahead(_sched([], [_req(0, 200, 0)]), [1], _line(2, 1200, 0, 0), 3, False)
    assert fix is not None and (fix.lengths, fix.status) == ({0: 300, 1: 900}, "sum")


def test_no_length_is_set_ahead_where_the_line_does_not_show_it() -> None:
    """The same new request, but: the step is full (the budget cut the prompt: only a
    bound), prefix caching is on (a cache hit is not in the context tokens), the log's step
    recomputes a request (generation tokens over requests), or the next request's length
    is already pinned: no length is set."""
    ll = _lengths([500])
    empty = _sched([], [])
    assert ll.ahead(empty, [0], _line(1, 8192, 0, 0), 1, False) is None
    assert ll.ahead(empty, [0], _line(1, 700, 0, 0), 1, True) is None
    assert ll.ahead(_sched([_req(5, 40, 39, 3)], []), [0], _line(1, 700, 1, 40), 1, False) is None
    ll.status[0] = "exact"
    assert ll.ahead(empty, [0], _line(1, 700, 0, 0), 1, False) is None
    ll.status[0] = "estimated"
    fix = ll.ahead(empty, [0], _line(1, 700, 0, 0), 1, False)
    assert fix is not None and fix.lengths == {0: 700}


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


def test_samples_sets_the_iteration_ensemble_and_the_floor_is_said() -> None:
    """`--samples` reaches the Iteration-line ensemble (0: none, N: N members); b's lines
    show preempted requests recomputed, and the report says the count is at least that."""
    path = [str(DATA / "b_fcfs_heavy" / "server.iter.log")]
    none = replay_logs(path, year=2026, samples=0)
    assert none.uncertainty is None
    two = replay_logs(path, year=2026, samples=2)
    assert two.uncertainty is not None and two.uncertainty.samples == 2
    truth = len(json.loads((DATA / "b_fcfs_heavy" / "truth.json").read_text())["preemptions"])
    floor = two.uncertainty.count_floor
    assert 0 < floor <= truth and two.uncertainty.preemptions["low"] >= floor
    assert any(n.startswith(f"the count is at least {floor}:") for n in two.notes)


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


@pytest.mark.slow
def test_the_poisson_case_without_prompts_has_an_interval_that_holds() -> None:
    """p1 without prompts (200 requests, 54 true preemptions, many prompts admitted two at
    a time): the point replay does not pin the victims, its count's 90% interval holds
    the true count (before this replay's one-pass placement: 23-53), and no row is called
    better than inferred."""
    rep = replay_logs([str(DATA / "p1_poisson_fcfs_200" / "server.iter.log")], year=2026)
    truth = json.loads((DATA / "p1_poisson_fcfs_200" / "truth.json").read_text())
    c = rep.uncertainty.preemptions if rep.uncertainty is not None else None
    assert c is not None and c["low"] <= len(truth["preemptions"]) <= c["high"], c
    assert {p.confidence for p in rep.preemptions} == {"inferred"}


def test_a_replay_that_matches_every_line_keeps_its_rows_likely() -> None:
    """The burst case without prompts: the replay matches all 613 Iteration lines (KV usage
    included), so its rows are likely (p >= 0.8), and they are vLLM's 5 preemptions, each
    at its step (truth.json); still labelled inferred, as 8 prompts were only seen as sums."""
    rep = replay_logs([str(DATA / "b_fcfs_heavy" / "server.iter.log")], year=2026)
    truth = json.loads((DATA / "b_fcfs_heavy" / "truth.json").read_text())
    assert rep.verification.iterations.matched == 613
    assert sorted((p.step, p.victim) for p in rep.preemptions) == \
        sorted((p["step"], p["victim_log_id"]) for p in truth["preemptions"])
    assert all(p.probability is not None and p.probability >= 0.8 and p.confidence == "inferred"
               for p in rep.preemptions)


@pytest.mark.parametrize("case", ["b_fcfs_heavy", "f_prefix_caching"])
def test_the_search_run_kept_as_the_replay_is_the_run_its_inputs_make(
        case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Prompts not logged: where the one forward pass neither went back nor changed a prompt
    the scheduler had read, its own run is the replay (iterations.iteration_replay). Run
    again from the start (forced), every step record and the whole report are the same.
    On b the pass's own run is kept (its lines give the queued requests their lengths
    before the scheduler reads them); on f it went back, and is run again either way."""
    from kvreplay.cli.replay_report import to_json
    from kvreplay.inference import iteration_search

    run = iteration_search.Search.run
    kept: list[bool] = []

    def spy(self: iteration_search.Search) -> None:
        run(self)
        kept.append(not self.rerun)

    def forced(self: iteration_search.Search) -> None:
        run(self)
        self.rerun = True

    path = str(DATA / case / "server.iter.log")
    monkeypatch.setattr(iteration_search.Search, "run", spy)
    own = replay_logs([path], year=2026)
    monkeypatch.setattr(iteration_search.Search, "run", forced)
    again = replay_logs([path], year=2026)
    assert kept == [case == "b_fcfs_heavy"]
    assert len(own.steps) == len(again.steps) > 0
    assert own.steps == again.steps
    assert to_json(own) == to_json(again)


def _lines(*rows: tuple[int, int, int, int], missing: tuple[int, ...] = ()) -> SimpleNamespace:
    its = [SimpleNamespace(step=n, context_requests=cr, context_tokens=ct,
                           generation_requests=gr, generation_tokens=gt)
           for n, (cr, ct, gr, gt) in enumerate(rows) if n not in missing]
    return SimpleNamespace(iterations=its, config=None)


def test_the_recomputes_the_lines_show() -> None:
    """A generation request taking more than 1 token is a recompute: each run of such lines
    is one preemption at least. A run goes on across a line at the token budget (the
    recompute's turn may not come) and a missing line; a line with budget to spare and no
    recompute ends it."""
    from kvreplay.inference.iteration_lines import recomputes_shown
    decode = (0, 0, 5, 5)
    assert recomputes_shown(_lines(decode, decode, (1, 300, 4, 4)), 8192) == 0
    again = (0, 0, 5, 700)  # one of 5 generation requests computes 696 tokens
    assert recomputes_shown(_lines(decode, again, again, decode), 8192) == 1
    assert recomputes_shown(_lines(again, decode, again), 8192) == 2
    full = (1, 8187, 5, 5)  # the budget ran out before the recompute's turn
    assert recomputes_shown(_lines(again, full, again), 8192) == 1
    assert recomputes_shown(_lines(again, decode, again, missing=(1,)), 8192) == 1


_ITER = re.compile(r"Iteration\((\d+)\): (\d+) context requests, (\d+) context tokens, "
                   r"(\d+) generation requests, (\d+) generation tokens")


def test_the_lines_recomputes_are_a_lower_bound_on_the_true_preemptions() -> None:
    """On the three log cases (vLLM 0.33 runs; truth.json from the server's own trace), the
    lines read here by a regex of their own: the recomputes they show are never more than
    the true preemptions, and on p1 most of them; the replay without prompts reports a
    count no lower."""
    from kvreplay.inference.iteration_lines import recomputes_shown
    seen = {}
    for case in ("b_fcfs_heavy", "f_prefix_caching", "p1_poisson_fcfs_200"):
        truth = json.loads((DATA / case / "truth.json").read_text())
        text = (DATA / case / "server.iter.log").read_text()
        lines = [SimpleNamespace(step=int(m[1]), context_requests=int(m[2]),
                                 context_tokens=int(m[3]), generation_requests=int(m[4]),
                                 generation_tokens=int(m[5])) for m in _ITER.finditer(text)]
        budget = int(re.search(r"'max_num_batched_tokens': (\d+)", text)[1])
        shown = recomputes_shown(SimpleNamespace(iterations=lines, config=None), budget)
        seen[case] = (shown, len(truth["preemptions"]))
        assert 0 < shown <= len(truth["preemptions"]), case
    assert seen["p1_poisson_fcfs_200"][0] >= 0.8 * seen["p1_poisson_fcfs_200"][1]
    rep = replay_logs([str(DATA / "p1_poisson_fcfs_200" / "server.iter.log")], year=2026)
    assert rep.uncertainty is not None
    assert rep.uncertainty.preemptions["low"] >= seen["p1_poisson_fcfs_200"][0]


def test_no_recompute_bound_where_a_generation_request_may_take_more_tokens() -> None:
    """Async scheduling, speculative decoding, and the priority policy before 0.33 (a
    running request's turn skipped with budget to spare): no lower bound from the lines."""
    from kvreplay.inference.iteration_lines import recomputes_count
    from kvreplay.replay.profile import get_profile
    facts = _lines((0, 0, 5, 5), (0, 0, 5, 700))
    cfg = SimpleNamespace(async_scheduling=False, policy="fcfs", max_num_batched_tokens=8192)
    wl = SimpleNamespace(config=cfg)
    assert recomputes_count(facts, wl, get_profile("0.33")) == 1
    assert recomputes_count(facts, SimpleNamespace(config=SimpleNamespace(
        **{**vars(cfg), "async_scheduling": True})), get_profile("0.33")) is None
    spec = SimpleNamespace(iterations=facts.iterations, config=SimpleNamespace(speculative="{'n': 3}"))
    assert recomputes_count(spec, wl, get_profile("0.33")) is None
    prio = SimpleNamespace(config=SimpleNamespace(**{**vars(cfg), "policy": "priority"}))
    assert recomputes_count(facts, prio, get_profile("0.33")) == 1
    assert recomputes_count(facts, prio, get_profile("0.31")) is None


def test_a_few_preemptions_keep_their_own_noise_in_the_interval() -> None:
    """COUNT_Z: a count's interval is at least median +- 1.645 sqrt(median) (f: 3 members
    put the median at 7, true 10, and their spread alone gave 5-9); where WIDEN's share of
    the median is wider (large counts), the interval is kept as it was."""
    from kvreplay.inference.iteration_ensemble import count_noise
    small = {"median": 7, "low": 5, "high": 9}
    count_noise(small)
    assert small == {"median": 7, "low": 3, "high": 11}
    large = {"median": 44, "low": 30, "high": 60}
    count_noise(large)
    assert large == {"median": 44, "low": 30, "high": 60}
    zero = {"median": 0, "low": 0, "high": 0}
    count_noise(zero)
    assert zero == {"median": 0, "low": 0, "high": 0}


def test_a_requests_probability_is_no_surer_than_it_is_right() -> None:
    """Where the lines do not pin the run (p1: 249 of 2,166 lines), who the members preempt
    says little about who was (22-28% truly preempted in every raw bin, REQUEST_MAP): no
    request of p1 reads as likely (p >= 0.5), and none is below a row naming it. Where they
    pin it (b: every line, KV usage included) the shares stay as the members give them:
    its 5 true victims at p 1.0."""
    rep = replay_logs([str(DATA / "p1_poisson_fcfs_200" / "server.iter.log")], year=2026)
    reqs = {r["id"]: r["p_preempted"] for r in rep.uncertainty.requests}
    assert reqs and max(reqs.values()) < 0.5
    for p in rep.preemptions:
        assert reqs.get(p.victim, 0.0) >= (p.probability or 0.0)
    b = replay_logs([str(DATA / "b_fcfs_heavy" / "server.iter.log")], year=2026)
    truth = {p["victim_log_id"] for p in
             json.loads((DATA / "b_fcfs_heavy" / "truth.json").read_text())["preemptions"]}
    breqs = {r["id"]: r["p_preempted"] for r in b.uncertainty.requests}
    assert all(breqs[v] == 1.0 for v in truth)
