"""A damaged log never crashes the replay: it replays, or says in one line what is missing."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from kvreplay.errors import UserError
from kvreplay.sources import replay_logs

from helpers.examples import few

LOG = Path(__file__).parents[1] / "data" / "logcases" / "f_prefix_caching" / "server.reqbody.log"
LINES = LOG.read_text().splitlines()


@st.composite
def damaged(draw) -> list[str]:
    lines = list(LINES)
    for _ in range(draw(st.integers(min_value=1, max_value=12))):
        op = draw(st.sampled_from(["drop", "cut", "dup", "swap", "garble"]))
        i = draw(st.integers(min_value=0, max_value=len(lines) - 1))
        if op == "drop":
            del lines[i]
        elif op == "cut":
            lines[i] = lines[i][: draw(st.integers(min_value=0, max_value=max(0, len(lines[i]) - 1)))]
        elif op == "dup":
            lines.insert(i, lines[i])
        elif op == "swap":
            j = draw(st.integers(min_value=0, max_value=len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        else:
            lines[i] = draw(st.text(max_size=80))
        if not lines:
            lines = [""]
    return lines


# An ensemble of 4 members instead of 32: the same code paths (a damaged log's estimates
# once overflowed the ensemble's arrays), a quarter of the cost per example. Still, a damaged
# log can take seconds to place (0.2-3.4 s CPU an example): few examples in CI, 100 under
# the thorough profile.
@settings(few())
@given(damaged())
def test_damaged_log_replays_or_explains(tmp_path_factory, lines: list[str]) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "server.log"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8", errors="surrogatepass")
    try:
        rep = replay_logs([str(path)], year=2026, samples=4)
    except UserError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    s = rep.summary()
    ids = {r.id for r in rep.workload.requests}
    assert ids and s["steps"] == len(rep.steps) > 0
    # the totals are the records' sums, each record within the run
    assert s["preemptions"] == len(rep.preemptions)
    assert s["computed_tokens_lost"] == sum(p.computed_tokens_lost for p in rep.preemptions)
    assert s["recompute_ratio"] is None or 0 <= s["recompute_ratio"] <= 1
    for p in rep.preemptions:
        assert p.victim in ids and 0 <= p.step < len(rep.steps)
    # every request ends once (finished or aborted), or the replay says it did not
    ended = [r for st in rep.steps for r in (*st.finished, *st.aborted)]
    assert len(ended) == len(set(ended)) and set(ended) <= ids
    assert set(ended) | set(s["unfinished_requests"] or ()) >= ids or s["cut_short"]


def test_an_impossible_prompt_length_is_capped_not_built() -> None:
    """A damaged log's numbers can imply a prompt of millions of tokens (one such log made a
    test process grow to 24 GB): a prompt whose content is unknown is built no longer than
    max_model_len, the longest vLLM accepts, and never built longer first."""
    import tracemalloc

    from kvreplay.inference.formats import log_format
    from kvreplay.inference.rebuild import rebuild_workload
    from kvreplay.replay.profile import get_profile
    from kvreplay.sources import read_facts

    facts = read_facts([str(LOG.parent.parent / "p1_poisson_fcfs_200" / "server.log")], year=2026)
    fmt = log_format(facts.vllm_version, facts.engine_version)
    assert not any(r.prompt_token_ids for r in facts.requests)
    for r in facts.requests:
        r.prompt_len = 100
    facts.requests[0].prompt_len = 5_000_000
    tracemalloc.start()
    try:
        rebuilt = rebuild_workload(facts, fmt, get_profile(facts.vllm_version))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    lens = [len(s.prompt_token_ids) for s in rebuilt.workload.requests]
    assert max(lens) <= facts.config.max_model_len and lens[1] == 100
    assert peak < 50 * 2**20  # (5M tokens built first: about 180 MB)
