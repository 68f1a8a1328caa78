"""kvreplay's pytest plugin (kvreplay.pytest_plugin), tested from the outside with pytester:
the plugin must load from its entry point alone (no conftest in the tested project)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvreplay.pytest_plugin import golden as g
from kvreplay.samples import DEFAULT_LOG, sample_path

pytest_plugins = ["pytester"]

DATA = Path(__file__).parents[1] / "data"
WORKLOAD = DATA / "conformance/cases/b_fcfs_heavy/workload.json"

TEST_LOG = """
def test_incident(kvreplay_golden):
    kvreplay_golden.check("incident.log")
"""

TEST_WORKLOAD = """
def test_heavy(kvreplay_golden):
    kvreplay_golden.check("heavy.json")
"""


@pytest.fixture(scope="module", autouse=True)
def _import_kvreplay_first() -> None:
    """pytester's in-process runs drop the modules first imported during a run; kvreplay
    imports lazily, so load every module a check needs before the first inner run (else a
    second run mixes two copies of kvreplay.events and isinstance checks fail)."""
    g.build(sample_path(DEFAULT_LOG))
    g.build(sample_path("synthetic_v032_json_format.log"))
    g.build(WORKLOAD, profile="0.19")
    g.build(DATA / "conformance/v0/v0_f_swap_enough_cpu/workload.json")


@pytest.fixture
def log_project(pytester: pytest.Pytester) -> pytest.Pytester:
    shutil.copy(sample_path(DEFAULT_LOG), pytester.path / "incident.log")
    pytester.makepyfile(test_incident=TEST_LOG)
    return pytester


@pytest.fixture
def workload_project(pytester: pytest.Pytester) -> pytest.Pytester:
    shutil.copy(WORKLOAD, pytester.path / "heavy.json")
    pytester.makepyfile(test_heavy=TEST_WORKLOAD)
    return pytester


# Inner runs leave out plugins that keep global state between sessions (textual-snapshot)
# or cost ~1 s a run (hypothesis, syrupy): none of them matters to the plugin under test.
_INNER = tuple(
    a for p in ("textual-snapshot", "cacheprovider", "benchmark", "hypothesispytest", "syrupy")
    for a in ("-p", f"no:{p}")
)


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest(*_INNER, *args)


def _failure_text(result: pytest.RunResult) -> str:
    return "\n".join(result.outlines)


# ---------------------------------------------------------------- registration
def test_options_come_from_the_entry_point(pytester: pytest.Pytester) -> None:
    result = _run(pytester, "--help")
    result.stdout.fnmatch_lines(["*--kvreplay-update*", "*--kvreplay-profile*", "*--kvreplay-fields*"])


def test_plugin_import_is_light() -> None:
    """Loaded in every pytest run: kvreplay's parsers, replay and heavy deps stay unloaded."""
    code = (
        "import sys, kvreplay.pytest_plugin\n"
        "heavy = [m for m in ('kvreplay.replay', 'kvreplay.parsers', 'kvreplay.sources',"
        " 'msgspec', 'polars', 'textual', 'lark') if m in sys.modules]\n"
        "print(heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ---------------------------------------------------------------- the four must-haves
def test_missing_golden_says_how_to_create_it(log_project: pytest.Pytester) -> None:
    result = _run(log_project)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*kvreplay golden file golden/test_incident.golden does not exist*",
        "*pytest --kvreplay-update test_incident.py::test_incident*",
    ])
    assert not (log_project.path / "golden").exists()


def test_update_writes_the_golden_and_then_it_passes(log_project: pytest.Pytester) -> None:
    result = _run(log_project, "--kvreplay-update")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*written: golden/test_incident.golden*", "*1 written, 0 updated, 0 unchanged*"])
    path = log_project.path / "golden/test_incident.golden"
    text = path.read_text()
    assert "# NOTE: [replay] and [preemptions] come from log replay" in text
    for section in ("[input]", "[events]", "[version]", "[config]", "[replay]", "[preemptions]"):
        assert section in text
    assert re.search(r"^step=\d+ victim=\S+ trigger=\S+ self=(true|false) ", text, re.M)
    _run(log_project).assert_outcomes(passed=1)
    again = _run(log_project, "--kvreplay-update")
    again.stdout.fnmatch_lines(["*0 written, 0 updated, 1 unchanged*"])
    assert path.read_text() == text


def test_changed_log_fails_with_a_short_readable_diff(log_project: pytest.Pytester) -> None:
    _run(log_project, "--kvreplay-update").assert_outcomes(passed=1)
    log = log_project.path / "incident.log"
    log.write_text(log.read_text().replace("num_gpu_blocks_override': 64", "num_gpu_blocks_override': 80")
                   .replace("num_gpu_blocks_override=64", "num_gpu_blocks_override=80"))
    result = _run(log_project)
    result.assert_outcomes(failed=1)
    out = _failure_text(result)
    result.stdout.fnmatch_lines([
        "*kvreplay golden mismatch: golden/test_incident.golden*",
        "*log: incident.log*",
        "*first differences:*",
        "*  *.*: * -> *",
        "*diff (- golden file, + now;*",
        "*+num_gpu_blocks = 80*",
        "*pytest --kvreplay-update test_incident.py::test_incident*",
    ])
    assert re.search(r"^\s+-step=\d+ victim=", out, re.M)
    # a short message, not a traceback nor a wall of JSON
    section = out.split("FAILURES", 1)[1].split("short test summary", 1)[0]
    assert len(section.splitlines()) < 80
    assert "Traceback" not in section and "def test_incident" not in section
    assert not re.search(r"^\s*[{\[]\"", section, re.M)


def test_changed_workload_fails_and_update_refreshes(workload_project: pytest.Pytester) -> None:
    _run(workload_project, "--kvreplay-update").assert_outcomes(passed=1)
    wl = workload_project.path / "heavy.json"
    data = json.loads(wl.read_text())
    data["config"]["num_gpu_blocks"] += 16
    wl.write_text(json.dumps(data))
    result = _run(workload_project)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*kvreplay golden mismatch*", "*  *.*: * -> *", "*-num_gpu_blocks = 64*", "*+num_gpu_blocks = 80*"])
    update = _run(workload_project, "--kvreplay-update")
    update.assert_outcomes(passed=1)
    update.stdout.fnmatch_lines(["*updated: golden/test_heavy.golden*"])
    _run(workload_project).assert_outcomes(passed=1)


# ---------------------------------------------------------------- options
def test_fields_compare_only_what_is_selected(workload_project: pytest.Pytester) -> None:
    _run(workload_project, "--kvreplay-update").assert_outcomes(passed=1)
    path = workload_project.path / "golden/test_heavy.golden"
    # Hand-edit what replay.preemptions and preemptions.victim do not cover.
    text = re.sub(r"(?m)^(step=\d+ .*?lost=)(\d+)", lambda m: m.group(1) + str(int(m.group(2)) + 1), path.read_text(), count=1)
    path.write_text(text)
    full = _run(workload_project)
    full.assert_outcomes(failed=1)
    full.stdout.fnmatch_lines(["*first changed record: preemptions #1 (golden step *): lost * -> *"])
    _run(workload_project, "--kvreplay-fields=replay.preemptions,preemptions.victim").assert_outcomes(passed=1)
    workload_project.makepyfile(test_heavy="""
        import pytest

        @pytest.mark.kvreplay(fields=["preemptions.step", "preemptions.victim"])
        def test_heavy(kvreplay_golden):
            kvreplay_golden.check("heavy.json")
    """)
    _run(workload_project).assert_outcomes(passed=1)


def test_fields_in_update_mode_write_only_those(workload_project: pytest.Pytester) -> None:
    _run(workload_project, "--kvreplay-update", "--kvreplay-fields=preemptions.victim").assert_outcomes(passed=1)
    text = (workload_project.path / "golden/test_heavy.golden").read_text()
    assert "# compared fields: preemptions.victim" in text
    assert "[config]" not in text and "[replay]" not in text
    assert re.search(r"(?m)^victim=r\d+$", text)
    _run(workload_project, "--kvreplay-fields=preemptions.victim").assert_outcomes(passed=1)


def test_unknown_field_is_a_clear_error(workload_project: pytest.Pytester) -> None:
    result = _run(workload_project, "--kvreplay-fields=preemption")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*unknown golden field 'preemption': sections are input, events, *"])


def test_profile_pin(workload_project: pytest.Pytester) -> None:
    _run(workload_project, "--kvreplay-update", "--kvreplay-profile=0.19").assert_outcomes(passed=1)
    text = (workload_project.path / "golden/test_heavy.golden").read_text()
    assert 'profile = "0.19"' in text
    # Without the pin the default profile replays: the golden no longer matches.
    result = _run(workload_project)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*input.profile: \"0.19\" -> default*"])
    workload_project.makepyfile(test_heavy="""
        def test_heavy(kvreplay_golden):
            kvreplay_golden.check("heavy.json", profile="0.19")
    """)
    _run(workload_project).assert_outcomes(passed=1)


def test_ini_golden_dir_and_names(pytester: pytest.Pytester) -> None:
    shutil.copy(WORKLOAD, pytester.path / "heavy.json")
    pytester.makeini("[pytest]\nkvreplay_golden_dir = snapshots\n")
    pytester.makepyfile(test_many="""
        import pytest

        @pytest.mark.parametrize("profile", ["0.19", "0.33"])
        def test_profiles(kvreplay_golden, profile):
            kvreplay_golden.check("heavy.json", profile=profile)

        def test_two(kvreplay_golden):
            kvreplay_golden.check("heavy.json", name="two/a")
            kvreplay_golden.check("heavy.json", name="two/b", profile="0.11")
    """)
    _run(pytester, "--kvreplay-update").assert_outcomes(passed=3)
    names = sorted(p.relative_to(pytester.path).as_posix() for p in (pytester.path / "snapshots").rglob("*.golden"))
    assert names == [
        "snapshots/test_profiles-0.19.golden",
        "snapshots/test_profiles-0.33.golden",
        "snapshots/two/a.golden",
        "snapshots/two/b.golden",
    ]
    _run(pytester).assert_outcomes(passed=3)


def test_two_unnamed_checks_in_one_test_are_refused(pytester: pytest.Pytester) -> None:
    shutil.copy(WORKLOAD, pytester.path / "heavy.json")
    pytester.makepyfile(test_x="""
        def test_twice(kvreplay_golden):
            kvreplay_golden.check("heavy.json")
            kvreplay_golden.check("heavy.json", profile="0.19")
    """)
    result = _run(pytester, "--kvreplay-update")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*checks more than one source; pass name=...*"])


def test_thin_log_records_the_reason(pytester: pytest.Pytester) -> None:
    shutil.copy(sample_path("synthetic_v032_json_format.log"), pytester.path / "thin.log")
    pytester.makepyfile(test_thin="""
        def test_thin(kvreplay_golden):
            kvreplay_golden("thin.log")
    """)
    _run(pytester, "--kvreplay-update").assert_outcomes(passed=1)
    doc = g.parse((pytester.path / "golden/test_thin.golden").read_text())
    # a default log (a stats line, no request line): its answer's intervals, not a refusal
    assert doc["replay"]["answered"].startswith("default log (no request lines)")
    assert doc["events"] and "preemptions" not in doc
    d = doc["default_log"]
    assert d["requests"] == 12 and d["preemptions_low"] <= d["preemptions_high"]
    assert len(doc["windows"]) == 1  # its one stats line
    _run(pytester).assert_outcomes(passed=1)


def test_missing_source_and_damaged_golden(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_src="""
        def test_gone(kvreplay_golden):
            kvreplay_golden.check("nowhere.log")
    """)
    result = _run(pytester)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*kvreplay_golden: nowhere.log: no such file*"])
    shutil.copy(WORKLOAD, pytester.path / "heavy.json")
    pytester.makepyfile(test_src=TEST_WORKLOAD)
    (pytester.path / "golden").mkdir()
    (pytester.path / "golden/test_heavy.golden").write_text("steps = 3\n")
    result = _run(pytester)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*golden/test_heavy.golden is damaged*", "*pytest --kvreplay-update*"])


def test_workload_dict_and_v0_workload(pytester: pytest.Pytester) -> None:
    v0 = DATA / "conformance/v0/v0_f_swap_enough_cpu/workload.json"
    pytester.makepyfile(test_d=f"""
        import json

        def test_dict(kvreplay_golden):
            kvreplay_golden.check(json.load(open({str(WORKLOAD)!r})))

        def test_v0(kvreplay_golden):
            kvreplay_golden.check({str(v0)!r})
    """)
    _run(pytester, "--kvreplay-update").assert_outcomes(passed=2)
    v0_doc = g.parse((pytester.path / "golden/test_v0.golden").read_text())
    assert v0_doc["input"]["engine"] == "v0"
    assert {p["mode"] for p in v0_doc["preemptions"]} == {"swap"}
    assert all(p["lost"] == 0 and p["recompute"] == 0 for p in v0_doc["preemptions"])
    _run(pytester).assert_outcomes(passed=2)


# ---------------------------------------------------------------- the pure module
@pytest.mark.parametrize("value", [
    None, True, False, 0, -3, 1.5, "plain", "two words", "-", "true", "12", "1e3", 'q"uote',
    "fcfs: running[-1]", "", ["a", "b c"], [], {"k": [1, None]}, "ünïcode",
])
def test_values_round_trip(value) -> None:
    assert g.decode(g.encode(value)) == value
    rec = {"step": 1, "victim": value, "lost": 2}
    assert g.parse_record(g.render_record(rec)) == rec


_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)


@given(st.dictionaries(st.from_regex(r"[a-z_]{1,8}", fullmatch=True), st.one_of(_scalars, st.lists(_scalars, max_size=3)), max_size=6),
       st.lists(st.dictionaries(st.sampled_from(g.COLUMNS), _scalars, min_size=1), max_size=4))
def test_documents_round_trip(section: dict, records: list) -> None:
    doc = {"replay": section, "preemptions": records}
    assert g.parse(g.render(doc, header=["a comment"])) == doc


def test_render_parse_round_trip_and_sorted_keys() -> None:
    result = g.build(WORKLOAD)
    text = g.render(result, header=result.header("heavy.json"))
    assert g.parse(text) == result.doc
    cfg = text.split("[config]\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert cfg == sorted(cfg)
    assert g.render(g.build(WORKLOAD)) == g.render(result)  # deterministic


def test_compare_reports_the_first_differences() -> None:
    a = g.build(WORKLOAD).doc
    b = json.loads(json.dumps(a))
    b["preemptions"][2]["victim"] = "r99"
    b["replay"]["steps"] += 1
    m = g.compare(a, b)
    assert m is not None
    assert m.summary[0].startswith("replay.steps: ")
    assert "first changed record: preemptions #3" in m.summary[1]
    assert m.changed_lines == 4
    assert g.compare(a, b, fields=["config", "preemptions.step"]) is None
