"""V0-engine log replay (issue 9): replay/from_log_v0.py, tools/oracle/render_v0_log.py.

* round trip: V0 workloads (conformance + oracle bank) simulated -> rendered as a 0.6.6 log
  with 1 s steps -> parsed -> replayed: the same preemptions (step, victim, mode,
  cumulative count), every warning matched, every stats line agreeing;
* the same with the step-time model fitted instead of given;
* a rendered log with realistic millisecond step times (tests/data/v0_logs/): how many
  preemptions the replay finds (victim within 5 steps) and how the warnings compare;
* the real V0 excerpts of the corpus: none carries the KV cache size and request lines
  together, so each fails with one line naming what is missing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvreplay.errors import ReplayError
from kvreplay.inference import replay_facts
from kvreplay.inference.clock import StepTimeModel
from tools.oracle.realistic_v0 import realistic_workload
from tools.oracle.render_v0_log import render_v0_log
from kvreplay.replay.v0 import run_workload, summarize
from kvreplay.sources import read_facts

DATA = Path(__file__).parents[1] / "data"
V0_LOGS = DATA / "v0_logs"
YEAR = 2025


def _workloads() -> list[Path]:
    dirs = sorted((DATA / "conformance" / "v0").glob("v0_*")) + sorted((DATA / "v0_oracle").glob("*"))
    out = []
    for d in dirs:
        w = json.loads((d / "workload.json").read_text())
        # V0 servers do not log request priorities: priority workloads cannot round-trip
        if any(r.get("priority", 0) for r in w["requests"]):
            continue
        out.append(d)
    return out


def _load(d: Path) -> dict:
    w = json.loads((d / "workload.json").read_text())
    # the log has no output token ids: the replay samples distinct tokens ("index")
    w.setdefault("config", {})["fake_token_mode"] = "index"
    return w


def _render(tmp_path: Path, w: dict, dt, name: str, **kw) -> tuple[list[dict], Path]:
    trace = run_workload(w)
    lines = render_v0_log(w, trace, step_time_s=dt, **kw)
    p = tmp_path / f"{name}.log"
    p.write_text("\n".join(lines) + "\n")
    return trace, p


def _orig_preemptions(trace: list[dict]) -> list[tuple]:
    """(non-idle step, victim, mode, cumulative) of a simulate trace: the replay skips the
    idle iterations (the engine does not step while it has nothing to do)."""
    out = []
    k = 0
    for r in trace:
        if r.get("idle"):
            continue
        for p in r.get("preemptions", ()):
            out.append((k, p["req"], p["mode"], p["cumulative_before"] + 1))
        k += 1
    return out


def _got(rep) -> list[tuple]:
    return [(p.step, p.victim, p.mode, p.cumulative) for p in rep.preemptions]


WORKLOADS = _workloads()


@pytest.mark.parametrize("d", WORKLOADS, ids=[d.name for d in WORKLOADS])
def test_round_trip_fixed_step_time(tmp_path, d):
    w = _load(d)
    trace, log = _render(tmp_path, w, 1.0, d.name)
    rep = replay_facts(read_facts([str(log)], year=YEAR),
                       step_time=StepTimeModel(overhead_s=1.0, per_token_s=0.0, per_request_s=0.0))
    assert _got(rep) == _orig_preemptions(trace)
    s = summarize(trace)
    counters = rep.summary()
    assert counters["prometheus_num_preemptions_total"] == s["prometheus_num_preemptions_total"]
    assert counters["num_cumulative_preemption"] == s["num_cumulative_preemption"]
    assert (counters["terminal_error"] is None) == (s["terminal_error"] is None)
    ws = rep.warnings
    assert ws.warnings_logged == s["preemption_warnings_logged"]
    assert ws.warnings_matched == ws.warnings_logged
    assert not ws.replay_warnings_not_in_log
    v = rep.verification
    assert v.agreeing_lines == v.stats_lines, v.first_divergence
    # a victim a warning names at its cumulative count is exact by the log
    for p in rep.preemptions:
        if p.warning_logged:
            assert p.confidence == "exact-by-log"


FITTED = ["v0_a_recompute_basic", "v0h_parallel_n", "v0r_2142", "v0h_swap_blocks_prefill"]


@pytest.mark.parametrize("name", FITTED)
def test_round_trip_fitted_step_time(tmp_path, name):
    d = next(x for x in WORKLOADS if x.name == name)
    w = _load(d)
    trace, log = _render(tmp_path, w, 1.0, name)
    rep = replay_facts(read_facts([str(log)], year=YEAR))
    assert _got(rep) == _orig_preemptions(trace)
    assert rep.warnings.warnings_matched == rep.warnings.warnings_logged >= 1
    assert rep.verification.agreeing_lines == rep.verification.stats_lines
    m = rep.step_time_model
    assert abs(m.dt(100, 4) - 1.0) < 0.01, m.describe()


# ---------------------------------------------------------------- realistic step times
def realistic_dt(rec: dict) -> float:
    """18 ms + 40 us per scheduled token + 0.3 ms per scheduled group."""
    if rec.get("idle"):
        return 0.02
    sched = rec.get("scheduled", ())
    return 0.018 + 4e-5 * sum(n for _, n in sched) + 3e-4 * len(sched)


REALISTIC_LOG = V0_LOGS / "v066_realistic_recompute.log"


def test_realistic_sample_is_current():
    """tests/data/v0_logs/v066_realistic_recompute.log is the rendering of the workload above."""
    w = realistic_workload()
    lines = render_v0_log(w, run_workload(w), step_time_s=realistic_dt, start=1736071200.37)
    assert REALISTIC_LOG.read_text() == "\n".join(lines) + "\n"


@pytest.mark.slow
def test_realistic_step_times_accuracy():
    w = realistic_workload()
    trace = run_workload(w)
    orig = [(s, v) for s, v, _, _ in _orig_preemptions(trace)]
    rep = replay_facts(read_facts([str(REALISTIC_LOG)], year=YEAR))
    got = [(p.step, p.victim) for p in rep.preemptions]
    used: set[int] = set()
    found = 0
    for s, v in orig:
        for j, (s2, v2) in enumerate(got):
            if j not in used and v2 == v and abs(s2 - s) <= 5:
                used.add(j)
                found += 1
                break
    ws = rep.warnings
    print(f"\nrealistic V0 log: {len(orig)} preemptions simulated, {len(got)} replayed, "
          f"{found} found (victim within 5 steps); warnings matched "
          f"{ws.warnings_matched}/{ws.warnings_logged} (victims "
          f"{ws.victims_matched}); stats lines agreeing "
          f"{rep.verification.agreeing_lines}/{rep.verification.stats_lines}; "
          f"{rep.step_time_model.describe()}")
    # At the time of writing (seed 7): 147 simulated, 142 replayed, 35 found within 5
    # steps (24%), warnings 2 of 3 matched, 5 of 14 stats lines agreeing; the fitted model
    # 17.0 ms + 51 us/token + 0.42 ms/group (true: 18 ms + 40 us + 0.3 ms). The count is
    # close; the victims drift because sub-second arrival order is not in the log.
    # Regression guards only.
    assert abs(len(got) - len(orig)) <= 0.15 * len(orig)
    assert found >= 0.2 * len(orig)
    assert ws.warnings_matched >= 1
    assert ws.warnings_logged == sum(1 for r in trace for p in r.get("preemptions", ())
                                        if p["warning_logged"])
    assert len(ws.lines) == ws.warnings_logged


def test_deterministic():
    a = replay_facts(read_facts([str(V0_LOGS / "v066_recompute_basic_1s.log")], year=YEAR))
    b = replay_facts(read_facts([str(V0_LOGS / "v066_recompute_basic_1s.log")], year=YEAR))
    assert a.preemptions == b.preemptions
    assert a.verification == b.verification
    assert a.warnings == b.warnings


def test_cli_table(capsys):
    from kvreplay.cli import main

    rc = main(["replay", str(V0_LOGS / "v066_swap_1s.log"), "--year", str(YEAR)])
    assert rc in (0, None)
    out = capsys.readouterr().out
    assert "profile v0-0.6.6.post1" in out
    assert "every-50th preemption warnings: 1 of 1 match the replay" in out
    assert "swap" in out or "Swapped" in out or "preemptions:" in out


# ---------------------------------------------------------------- the real corpus excerpts
CORPUS = DATA / "corpus"
# file -> what the failure must name. Hand-checked: none of the V0 excerpts carries both
# the `# GPU blocks` startup line and request lines, so none can be replayed.
V0 = "cannot replay this V0-engine log: it lacks "
V0_EXCERPTS = {
    "01-v03-metrics-single-line.log": (V0, "# GPU blocks", "max_model_len", "request lines",
                                       "(it has only 1 stats line(s))"),
    # (its Received line is cut mid-params: a truncated request line, counted)
    "03-v03-stuck-engine-completions.log": (V0, "# GPU blocks", "max_model_len",
                                            "(it has only 1 stats line(s), 1 request line(s))"),
    "05-v050-tqdm-interleaved-swap-preemption.log": (
        V0, "# GPU blocks", "request lines", "3 stats line(s)",  # (the 3rd is cut: truncated)
        "1 preemption warning(s) (total_num_cumulative_preemption=151)"),
    # (the warning is cut before its count: truncated, no cumulative count)
    "09-v063-swap-preemption-chat-ids.log": (V0, "# GPU blocks", "request lines",
                                             "(it has only 2 stats line(s), 1 preemption warning(s))"),
    "13-v065-init-engine-config-specdecode.log": (V0, "# GPU blocks", "request lines"),
    "37-v07x-preemption-foreign-formatter.log": (
        V0, "# GPU blocks", "request lines", "total_num_cumulative_preemption=51"),
    # Not recognised as V0 (no startup line, no stats or preemption fingerprint; the
    # Received lines of 07 and 17 are cut mid-line, truncated request lines): the V1 path
    # says what is missing.
    "07-v060-received-request-chat-escaped-prompt.log": ("the log does not give the KV cache size",),
    "11-v064-received-request-chatcmpl-health.log": ("the log does not give the KV cache size",),
    "17-v080-v0engine-startup-404-received.log": ("the log does not give the KV cache size",),
}


@pytest.mark.parametrize("name", sorted(V0_EXCERPTS))
def test_corpus_v0_excerpts_say_what_is_missing(name):
    facts = read_facts([str(CORPUS / name)], year=YEAR)
    with pytest.raises(ReplayError) as exc:
        replay_facts(facts)
    msg = str(exc.value)
    assert "\n" not in msg
    first, *rest = V0_EXCERPTS[name]
    assert msg.startswith(first), msg
    for want in rest:
        assert want in msg, msg


@pytest.mark.slow
def test_streaming_access_lines_are_not_finishes(tmp_path):
    """V0 too: with every request streaming, uvicorn's access line comes right after the
    request line (corpus 11 shows it), not at the finish. Read as finishes they serialised
    the realistic log's requests (0 of its 142 preemptions kept); recognised from the stats
    lines (running + waiting requests have not finished), they are left out and the replay
    is the non-streaming log's."""
    src = REALISTIC_LOG.read_text()
    out = []
    for i, line in enumerate(src.splitlines()):
        if "POST /v1/completions" in line:
            continue
        out.append(line)
        if "Received request" in line:
            out.append(f'INFO:     127.0.0.1:{53000 + i} - "POST /v1/completions HTTP/1.1" 200 OK')
    log = tmp_path / "streaming.log"
    log.write_text("\n".join(out) + "\n")
    plain = replay_facts(read_facts([str(REALISTIC_LOG)], year=YEAR))
    rep = replay_facts(read_facts([str(log)], year=YEAR))
    assert any("access lines are not used" in n for n in rep.notes)
    assert len(plain.preemptions) == 142
    assert [(p.step, p.victim) for p in rep.preemptions] == [
        (p.step, p.victim) for p in plain.preemptions]
