"""kvreplay's pytest plugin: golden-log tests (registered through the `pytest11` entry point).

    def test_incident(kvreplay_golden):
        kvreplay_golden.check("logs/incident.log")

The first `pytest --kvreplay-update` writes golden/test_incident.golden next to the test
file; later runs parse + replay the log again and fail with a short diff when the event
summary, the detected version, the config, the replay totals or the preemptions change.

Options (the call's own arguments win, then the `kvreplay` marker, then the command line,
then the ini file):
    --kvreplay-update            write / refresh golden files instead of comparing
    --kvreplay-profile=VER       scheduler profile (vLLM release) to replay with
    --kvreplay-fields=LIST       compare only these sections / keys (e.g. preemptions.victim)
    ini: kvreplay_golden_dir (default "golden", relative to the test file), kvreplay_profile,
         kvreplay_fields
    marker: @pytest.mark.kvreplay(profile="0.19", fields=["preemptions"], vllm_version=...)

Only the standard library and pytest are imported here: the plugin loads in every pytest
run once kvreplay is installed, and kvreplay itself is imported on the first check.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import pytest

_UPDATE_STATS = pytest.StashKey[dict]()
_SEEN_PATHS = pytest.StashKey[dict]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvreplay", "kvreplay golden-log tests")
    group.addoption(
        "--kvreplay-update",
        action="store_true",
        default=False,
        help="write or refresh kvreplay golden files instead of comparing with them",
    )
    group.addoption(
        "--kvreplay-profile",
        default=None,
        metavar="VER",
        help="scheduler profile (vLLM release, e.g. 0.33) for golden checks that do not pin one",
    )
    group.addoption(
        "--kvreplay-fields",
        default=None,
        metavar="LIST",
        help="compare only these golden fields (comma separated: sections such as "
        "preemptions, replay, events, config, version, or section.key such as "
        "preemptions.victim)",
    )
    parser.addini("kvreplay_golden_dir", "folder of golden files, relative to the test file", default="golden")
    parser.addini("kvreplay_profile", "default scheduler profile for golden checks", default="")
    parser.addini("kvreplay_fields", "default golden fields to compare (comma separated)", default="")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "kvreplay(profile=None, fields=None, vllm_version=None, year=None): defaults for "
        "the kvreplay_golden checks of this test",
    )
    config.stash[_UPDATE_STATS] = {"written": [], "updated": [], "unchanged": 0}
    config.stash[_SEEN_PATHS] = {}


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if not config.getoption("kvreplay_update", False):
        return
    stats = config.stash.get(_UPDATE_STATS, None)
    if not stats or not (stats["written"] or stats["updated"] or stats["unchanged"]):
        return
    tr = terminalreporter
    tr.write_sep("-", "kvreplay golden files")
    for what in ("written", "updated"):
        for p in stats[what]:
            tr.write_line(f"{what}: {p}")
    tr.write_line(
        f"{len(stats['written'])} written, {len(stats['updated'])} updated, "
        f"{stats['unchanged']} unchanged"
    )


class GoldenChecker:
    """The `kvreplay_golden` fixture: `check(source)` compares with (or writes) a golden file."""

    def __init__(self, request: pytest.FixtureRequest) -> None:
        self._request = request
        self._config = request.config
        self._calls = 0
        marker = request.node.get_closest_marker("kvreplay")
        self._marker: dict[str, Any] = dict(marker.kwargs) if marker else {}
        self.update: bool = bool(self._config.getoption("kvreplay_update", False))
        self.golden_dir: Path = self._test_dir() / (self._config.getini("kvreplay_golden_dir") or "golden")

    # ------------------------------------------------------------ public
    def check(
        self,
        source: str | Path | Sequence[str | Path] | Mapping[str, Any],
        *,
        name: str | None = None,
        golden: str | Path | None = None,
        profile: str | None = None,
        fields: str | Iterable[str] | None = None,
        vllm_version: str | None = None,
        year: int | None = None,
        kind: str | None = None,
    ) -> None:
        """Parse + replay `source` and compare with its golden file.

        source: a vLLM log (or a list of logs from one server), a workload JSON file, or a
            workload dict. Relative paths are looked up next to the test file, then from
            the rootdir, then from the current directory.
        name / golden: the golden file (default: <golden dir>/<test name>.golden).
        profile: pin the scheduler profile (vLLM release) instead of detecting it.
        fields: compare only these sections / keys ("preemptions", "replay.preemptions",
            "preemptions.victim", ...); with --kvreplay-update only those are written.
        vllm_version: the vLLM release the log is from (skips detection); year: for log
            time stamps without one.
        kind: "log" or "workload" when the file name does not say (.json = workload).
        """
        __tracebackhide__ = True
        from kvreplay.pytest_plugin import golden as g

        self._calls += 1
        profile = self._opt("profile", profile, "kvreplay_profile")
        vllm_version = vllm_version if vllm_version is not None else self._marker.get("vllm_version")
        year = year if year is not None else self._marker.get("year")
        try:
            field_list = g.normalize_fields(self._opt("fields", fields, "kvreplay_fields"))
        except g.GoldenUsageError as exc:
            pytest.fail(f"kvreplay_golden: {exc}", pytrace=False)
        path = self._golden_path(name, golden)
        rel = self._rel(path)
        resolved, label = self._resolve(source)
        if not self.update and not path.exists():
            pytest.fail(
                f"kvreplay golden file {rel} does not exist.\n"
                f"Create it by running:\n"
                f"    pytest --kvreplay-update {self._nodeid()}\n"
                f"then review it and commit it with the test.",
                pytrace=False,
            )
        try:
            result = g.build(resolved, kind=kind, profile=profile, vllm_version=vllm_version, year=year)
        except g.GoldenUsageError as exc:
            pytest.fail(f"kvreplay_golden: {exc}", pytrace=False)
        except Exception as exc:  # UserError (unreadable file, bad JSON) and the like
            from kvreplay.errors import UserError

            if isinstance(exc, UserError):
                pytest.fail(f"kvreplay_golden: {label}: {exc}", pytrace=False)
            raise
        doc = g.select(result.doc, field_list)
        text = g.render(doc, header=result.header(label, field_list))
        if self.update:
            self._write(path, text, rel)
            return
        try:
            expected = g.parse(path.read_text(encoding="utf-8"))
        except g.GoldenUsageError as exc:
            pytest.fail(f"kvreplay golden file {rel} is damaged: {exc}\n"
                        f"Rewrite it with: pytest --kvreplay-update {self._nodeid()}",
                        pytrace=False)
        mismatch = g.compare(expected, doc, fields=field_list)
        if mismatch is None:
            return
        what = "log" if result.kind == "log" else "workload"
        lines = [
            f"kvreplay golden mismatch: {rel}",
            f"{what}: {label}" + (f"  (fields: {', '.join(field_list)})" if field_list else ""),
            mismatch.message(),
            "If the change is intended, refresh the golden file and review its diff:",
            f"    pytest --kvreplay-update {self._nodeid()}",
        ]
        if result.from_log_replay:
            lines.append("(this golden comes from log replay, whose fit kvreplay is still tuning)")
        pytest.fail("\n".join(lines), pytrace=False)

    __call__ = check

    def render(self, source: Any, **kw: Any) -> str:
        """The golden text for `source`, without comparing (for debugging a test)."""
        from kvreplay.pytest_plugin import golden as g

        resolved, label = self._resolve(source)
        result = g.build(resolved, **kw)
        return g.render(result, header=result.header(label))

    # ------------------------------------------------------------ internals
    def _opt(self, key: str, value: Any, ini: str) -> Any:
        if value is not None:
            return value
        if self._marker.get(key) is not None:
            return self._marker[key]
        cli = self._config.getoption(ini, None)
        if cli:
            return cli
        return self._config.getini(ini) or None

    def _nodeid(self) -> str:
        import shlex

        return shlex.quote(self._request.node.nodeid)

    def _test_dir(self) -> Path:
        path = getattr(self._request.node, "path", None)
        return Path(path).parent if path is not None else Path(self._config.rootpath)

    def _golden_path(self, name: str | None, golden: str | Path | None) -> Path:
        if golden is not None:
            p = Path(golden)
            path = p if p.is_absolute() else self._test_dir() / p
        else:
            if name is None:
                name = _safe_name(self._request.node.name)
            if not name.endswith(".golden"):
                name += ".golden"
            path = self.golden_dir / name
        path = path.resolve()
        seen: dict = self._config.stash[_SEEN_PATHS]
        key = str(path)
        owner = (self._request.node.nodeid, self._calls)
        prev = seen.get(key)
        if prev is not None and prev[0] != owner[0]:
            pytest.fail(
                f"kvreplay_golden: {self._rel(path)} is already the golden file of {prev[0]}; "
                "pass name=... to give this check its own file",
                pytrace=False,
            )
        if prev is not None and prev[1] != owner[1]:
            pytest.fail(
                f"kvreplay_golden: this test checks more than one source; pass name=... to "
                f"each check (both would write {self._rel(path)})",
                pytrace=False,
            )
        seen[key] = owner
        return path

    def _resolve(self, source: Any) -> tuple[Any, str]:
        if isinstance(source, Mapping):
            return source, str(source.get("name") or "<workload dict>")
        many = not isinstance(source, (str, Path))
        items = list(source) if many else [source]
        out = []
        for item in items:
            p = Path(item)
            if not p.is_absolute():
                for base in (self._test_dir(), Path(self._config.rootpath), Path.cwd()):
                    if (base / p).exists():
                        p = base / p
                        break
                else:
                    pytest.fail(
                        f"kvreplay_golden: {item}: no such file (looked next to the test "
                        f"file, in the rootdir and in the current directory)",
                        pytrace=False,
                    )
            elif not p.exists():
                pytest.fail(f"kvreplay_golden: {item}: no such file", pytrace=False)
            out.append(str(p))
        label = ", ".join(self._rel(Path(p)) for p in out)
        return (out if many else out[0]), label

    def _rel(self, path: Path) -> str:
        root = Path(self._config.rootpath).resolve()
        try:
            return Path(path).resolve().relative_to(root).as_posix()
        except ValueError:
            return Path(path).as_posix()

    def _write(self, path: Path, text: str, rel: str) -> None:
        stats = self._config.stash[_UPDATE_STATS]
        old = path.read_text(encoding="utf-8") if path.exists() else None
        if old == text:
            stats["unchanged"] += 1
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8", newline="\n")
        stats["written" if old is None else "updated"].append(rel)


def _safe_name(name: str) -> str:
    """test_x[a/b c] -> test_x-a_b_c: a portable file name."""
    name = name.replace("[", "-").replace("]", "")
    return re.sub(r"[^A-Za-z0-9_.\-]+", "_", name).strip("._") or "golden"


@pytest.fixture
def kvreplay_golden(request: pytest.FixtureRequest) -> GoldenChecker:
    """Compare what kvreplay makes of a log or workload with a golden file:
    `kvreplay_golden.check("incident.log")`; `pytest --kvreplay-update` writes the file."""
    return GoldenChecker(request)
