"""Golden files for the logs and workloads kvreplay ships and tests with (tests/goldens/golden/).

They go through kvreplay's own pytest plugin (kvreplay.pytest_plugin, `kvreplay_golden`):
after a change that moves a replay on purpose, run

    pytest tests/goldens/test_golden_samples.py --kvreplay-update

and review the diff of tests/goldens/golden/. Goldens of log sources carry a NOTE at the top: they
depend on log-replay heuristics (rebuilt workload, fitted step times) and are expected to
move when that fit improves.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvreplay.samples import DEFAULT_LOG, sample_path

DATA = Path(__file__).parents[1] / "data"
SAMPLES = sample_path(DEFAULT_LOG).parent
# 200 requests without logged prompts: ~5 s of prompt-length fitting for little the other
# no-prompt logs (b_fcfs_heavy, f_prefix_caching server.log) do not already cover.
SLOW_WITHOUT_PROMPTS = ("p1_poisson_fcfs_200",)


def _cases() -> list:
    out = []
    for p in sorted(SAMPLES.iterdir()):
        if p.suffix in (".log", ".json") or p.name.endswith(".log.gz"):
            out.append(pytest.param(p, f"samples/{p.name}", id=f"samples/{p.name}"))
    for group, pattern in (
        ("conformance", "conformance/cases/*/workload.json"),
        ("conformance-v0", "conformance/v0/*/workload.json"),
        ("logcases", "logcases/*/server*.log"),
        ("corpus", "corpus/*.log"),
    ):
        for p in sorted(DATA.glob(pattern)):
            if p.parent.name in SLOW_WITHOUT_PROMPTS and p.name == "server.log":
                continue
            if p.name == "server.otlp.log":
                continue  # server.log's lines plus the OTLP endpoint: read with its spans below
            if group == "corpus":
                stem = p.name
            elif group == "logcases":
                stem = f"{p.parent.name}.{p.name}"
            else:
                stem = p.parent.name
            out.append(pytest.param(p, f"{group}/{stem}", id=f"{group}/{stem}"))
    # a log with its request spans (issue 21): [spans] records the join, coverage, clock
    # offset and contradictions
    for case in ("b_fcfs_heavy", "f_prefix_caching", "p1_poisson_fcfs_200"):
        d = DATA / "logcases" / case
        out.append(pytest.param([d / "server.otlp.log", d / "spans.otlp.jsonl"],
                                f"logcases/{case}.server.otlp.log+spans",
                                id=f"logcases/{case}.server.otlp.log+spans"))
    return out


@pytest.mark.parametrize(("source", "name"), _cases())
def test_golden(kvreplay_golden, source: Path, name: str) -> None:
    kvreplay_golden.check(source, name=name)


@pytest.mark.parametrize("profile", ["0.11", "0.19", "0.33"])
def test_golden_pinned_profile(kvreplay_golden, profile: str) -> None:
    """One workload under each scheduler profile: the profile is part of the golden."""
    kvreplay_golden.check(
        DATA / "conformance/cases/b_fcfs_heavy/workload.json",
        name=f"profiles/b_fcfs_heavy@{profile}",
        profile=profile,
    )


@pytest.mark.kvreplay(fields=["replay.preemptions", "preemptions.step", "preemptions.victim"])
def test_golden_default_log_victims(kvreplay_golden) -> None:
    """The embedded default log, compared on who was preempted when (and nothing else)."""
    kvreplay_golden.check(sample_path(DEFAULT_LOG), name="fields/default_log_victims")
