"""One replay, every view. Each input (every sample, every log case plain and with an
`Aborted request` line and a cut added, the V0 logs) is replayed ONCE, by the one join
(kvreplay.sources.open_replay); then each view runs from its own entry point with that join
replaced by one that hands back the same `Replay` and records how it was called:
`kvreplay replay --format json` and its `--trace`, `kvreplay audit`, the TUI (Pilot) and the
golden-log plugin. So each view is shown to (a) open its input through the join, once, with
the arguments that give the same replay, and (b) render that `Replay`: the same preemptions
(step, victim, trigger, tokens lost, tokens recomputed, prefix hit) and totals. The trace is
read here independently of kvreplay's records (the recompute cost from the trace's own
fields). `test_every_entry_point_goes_through_the_one_join` covers the commands not shown
here (export, whatif)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

import kvreplay.sources as sources
from kvreplay.errors import UserError
from kvreplay.samples import sample_path

DATA = Path(__file__).parents[1] / "data"
SAMPLES = sample_path("vllm033_fcfs_heavy.log").parent
YEAR = 2026


# inputs whose replay (and its ensemble) takes several CPU seconds: p1's 200 requests without
# Iteration lines with prompts, and the long V0 log
SLOW = ("p1_poisson_fcfs_200/server.log", "p1_poisson_fcfs_200/server.otlp.log",
        "p1_poisson_fcfs_200/server.reqbody.log", "p1_poisson_fcfs_200/server.iter.log",
        "v0/v066_realistic_recompute.log")


def _param(p: Path, variant: str, name: str):
    marks = [pytest.mark.slow] if name in SLOW else []
    return pytest.param(p, variant, id=name + (f"+{variant}" if variant else ""), marks=marks)


def _inputs() -> list:
    out = [_param(p, "", f"samples/{p.name}") for p in sorted(SAMPLES.iterdir())
           if p.suffix in (".log", ".json")]
    for p in sorted(DATA.glob("logcases/*/server*.log")):
        out.append(_param(p, "", f"{p.parent.name}/{p.name}"))
        if p.name != "server.default.log":  # (no request to abort: no request lines)
            out.append(_param(p, "abort+cut", f"{p.parent.name}/{p.name}"))
    out += [_param(p, "", f"v0/{p.name}") for p in sorted(DATA.glob("v0_logs/*.log"))]
    return out


INPUTS = _inputs()


def test_the_inputs_are_all_there() -> None:
    """The data this file runs on is present (a moved folder fails here, not silently)."""
    ids = [p.id for p in INPUTS]
    assert sum(i.startswith("samples/") for i in ids) >= 4
    assert sum(i.endswith("+abort+cut") for i in ids) >= 10
    assert sum(i.startswith("v0/") for i in ids) >= 3
    assert "b_fcfs_heavy/server.reqbody.log" in ids


def abort_and_cut(src: Path, dst: Path) -> str:
    """`src` with the last request aborted at the first stats line after it came in (its
    access line dropped), and the log cut halfway between the abort and its end (a server
    killed mid-run). Returns the aborted request's id (the `Received request` one)."""
    lines = src.read_text().splitlines()
    recv = max(i for i, ln in enumerate(lines) if "Received request" in ln)
    rid = lines[recv].split("Received request ")[1].split(":")[0]
    internal = next((ln.split("Added request ")[1].rstrip(".") for ln in lines[recv:]
                     if "Added request " in ln), rid)
    stats = next(i for i in range(recv, len(lines)) if "Engine 000:" in lines[i])
    head = lines[stats].split("[")[0]
    lines.insert(stats + 1, f"{head}[async_llm.py:620] Aborted request(s) {internal}.")
    access = [i for i, ln in enumerate(lines) if '"POST /v1/' in ln]
    del lines[access[-1]]
    cut = stats + 1 + (len(lines) - stats) // 2
    dst.write_text("\n".join(lines[:cut]) + "\n")
    return rid


# ---------------------------------------------------------------- the one join, recorded
class Join:
    """Stands in for kvreplay.sources.open_replay: returns `rep` (or raises `error`) and
    records every call. `same_replay` says whether a call's arguments give the replay the
    real join computed (the input's paths, its year, every replay option at its default)."""

    def __init__(self, path: Path, rep: Any, error: UserError | None) -> None:
        self.path, self.rep, self.error = str(path), rep, error
        self.calls: list[tuple[list[str], dict[str, Any]]] = []

    def __call__(self, paths, **kw):
        self.calls.append(([str(p) for p in paths], kw))
        if self.error is not None:
            raise type(self.error)(*self.error.args)
        return self.rep

    def same_replay(self, paths: list[str], kw: dict[str, Any]) -> bool:
        defaults = {"profile": (None, "auto"), "vllm_version": (None,), "samples": (None,),
                    "seed": (0,), "step_time": (None,), "config": (None,)}
        log = kw.get("log")
        return (paths == [self.path] and kw.get("year") == YEAR
                and all(kw.get(k, v[0]) in v for k, v in defaults.items())
                and (log is None or list(log.paths) == [self.path]))

    def check_tui_calls(self) -> None:
        """The TUI opens the point replay first (samples=0: the same run, shown at once;
        tui/later.py) and, when that leaves an ensemble to compute, the full replay with
        every option at its default."""
        assert 1 <= len(self.calls) <= 2, f"tui: opened its input {len(self.calls)} times"
        paths, kw = self.calls[0]
        assert kw.get("samples") == 0, f"tui: {self.calls[0]}"
        assert self.same_replay(paths, {**kw, "samples": None}), f"tui: {self.calls[0]}"
        if len(self.calls) == 2:
            assert self.same_replay(*self.calls[1]), f"tui: {self.calls[1]}"
        self.calls.clear()

    def check_one_call(self, view: str) -> None:
        assert len(self.calls) == 1, f"{view}: opened its input {len(self.calls)} times"
        assert self.same_replay(*self.calls[0]), f"{view}: {self.calls[0]}"
        self.calls.clear()


# ---------------------------------------------------------------- each view
def key(step, victim, trigger, lost, recomputed, hit) -> tuple:
    return (step, victim, trigger, lost, recomputed, hit)


def from_report(report: dict) -> list[tuple]:
    return [key(p["step"], p["victim"], p["trigger"], p["computed_tokens_lost"],
                p["tokens_recomputed"], p["prefix_hit_at_readmission"]) for p in report["preemptions"]]


def from_trace(records: list[dict], prompt_len: dict[str, int]) -> list[tuple]:
    """Preemptions read from a conformance (V1) or oracle (V0) trace: the victim's next
    admission, its prefix hit there, and what that admission computes: its prompt and
    outputs so far (the previous step's record) less the hit; nothing for a V0 swap."""
    out = []
    for i, r in enumerate(records):
        for p in r.get("preemptions", ()):
            v, swap = p["req"], p.get("mode") == "swap"
            back = next((k for k in range(i + 1, len(records))
                         if v in records[k].get("resumed", ()) or v in records[k].get("swapped_in", ())), None)
            lost = 0 if swap else p["num_computed_tokens_before"]
            if back is None:
                out.append(key(r["step"], v, p["trigger"], lost, None, None))
                continue
            if swap:
                out.append(key(r["step"], v, p["trigger"], 0, 0, None))
                continue
            hits = records[back].get("prefix_hit_tokens", records[back].get("cached_tokens", {}))
            hit = hits.get(v, 0)
            n = prompt_len[v] + records[back - 1]["num_output_tokens"][v]
            out.append(key(r["step"], v, p["trigger"], lost, n - hit, hit))
    return out


def from_golden(doc: dict) -> list[tuple]:
    return [key(p["step"], p["victim"], p["trigger"], p["lost"], p["recompute"], p["prefix_hit"])
            for p in doc["preemptions"]]


def tui_view(path: Path):
    """(the preemptions the TUI's timeline lists, the Why panel of the first three, the
    load error, the load exception) after a headless load."""
    from kvreplay.tui.app import ReplayApp

    app = ReplayApp([str(path)], year=YEAR)
    why: list[str] = []

    async def body():
        async with app.run_test(size=(150, 48)) as pilot:
            try:
                await app.workers.wait_for_complete()
            except Exception:  # the load failed: the app leaves with its error
                return
            await pilot.pause()
            if app.tl is None:
                return
            for _ in range(min(3, len(app.tl.preemptions))):
                await pilot.press("n")
                await pilot.pause()
                why.append(str(app.query_one("#why-panel").render()))

    asyncio.run(body())
    tl = app.tl
    got = None if tl is None else [key(p.step, p.victim, p.trigger, p.computed_tokens_lost,
                                      p.tokens_recomputed, p.prefix_hit_at_readmission)
                                  for p in tl.preemptions]
    return got, why, app.load_error, app.load_exception, app.default_answer


def _snapshot(rep: Any) -> str:
    """What the views read of a Replay, as text: a view that changed it shows here."""
    from kvreplay.cli.replay_report import to_json

    return json.dumps(to_json(rep), sort_keys=True, default=str)


@pytest.mark.parametrize("path, variant", INPUTS)
def test_every_view_renders_the_one_replay(path: Path, variant: str, tmp_path: Path,
                                           capsys, monkeypatch) -> None:
    from kvreplay.audit.record import audit_records
    from kvreplay.cli import main
    from kvreplay.pytest_plugin import golden

    assert path.is_file(), path
    aborted = None
    if variant:
        aborted = abort_and_cut(path, tmp_path / path.name)
        path = tmp_path / path.name
    # the replay, computed once
    rep, error = None, None
    try:
        rep = sources.open_replay([str(path)], year=YEAR)
    except UserError as exc:
        error = exc
    before = None if rep is None else _snapshot(rep)
    join = Join(path, rep, error)
    monkeypatch.setattr(sources, "open_replay", join)
    if path.suffix == ".json":  # golden opens a workload file with the join's workload branch
        import kvreplay.replay.result as result
        from kvreplay.replay.workload import load_workload

        def workload_join(data, **kw):
            join.calls.append(([str(path)], {"year": YEAR}))
            assert data == load_workload(str(path)) and kw.get("profile") is None
            return rep
        monkeypatch.setattr(result, "replay_workload", workload_join)

    out, trace = tmp_path / "r.json", tmp_path / "t.jsonl"
    rc = main(["replay", str(path), "--format", "json", "-o", str(out), "--trace", str(trace),
               "--year", str(YEAR)])
    err = capsys.readouterr().err
    join.check_one_call("kvreplay replay")
    audit = audit_records(str(path), year=YEAR)[0]
    join.check_one_call("kvreplay audit")
    doc = golden.build(str(path), year=YEAR).doc
    join.check_one_call("golden plugin")
    tui, why, tui_error, tui_exc, tui_default = tui_view(path)
    assert tui_exc is None, tui_exc
    join.check_tui_calls()

    if error is not None and rc == 0:  # no request lines: replay answers as a default log
        report = json.loads(out.read_text())
        assert report["kind"] == "default log (no request lines)"
        assert "victims" not in report and "preemptions" in report
        reason = str(error)
        assert audit["replay"] == "inferred (default log)", audit["replay"]
        # the golden and the TUI give the same answer's intervals (seed 0), no victims
        assert doc["replay"]["answered"].startswith("default log") and "preemptions" not in doc
        assert tui is None and tui_error is None and tui_default is not None
        got = report["preemptions"]
        for k in ("median", "low", "high"):
            assert doc["default_log"][f"preemptions_{k}"] == got[k]
            assert getattr(tui_default.preemptions, k) == got[k]
        return
    if error is not None:  # a log that cannot be replayed: every view says the same why
        assert rc == 2
        reason = err.split("error: ", 1)[1].split(" | ")[0].strip()
        assert reason == str(error)
        assert audit["replay"] == "skipped" and any(reason in r for r in audit["null_reasons"])
        assert doc["replay"]["error"] == reason and doc["preemptions"] == []
        assert tui is None and tui_error.startswith(reason)
        return
    assert rc == 0, err
    assert _snapshot(rep) == before  # no view changed the Replay it was given
    report = json.loads(out.read_text())
    pre = from_report(report)
    s = report["summary"]
    assert [p.step for p in rep.preemptions] == [p[0] for p in pre]
    # the trace, read independently
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    assert len(records) == s["steps"]
    assert from_trace(records, report["run"]["prompt_tokens"]) == pre
    # the golden plugin
    assert from_golden(doc) == pre
    for k in ("preemptions", "computed_tokens_lost", "tokens_recomputed", "steps"):
        assert doc["replay"][k] == s[k], k
    # the TUI: its timeline lists the report's preemptions, the Why panel shows their cost
    assert tui == pre
    steps = sorted({p["step"] for p in report["preemptions"]})
    assert len(why) == min(3, len(pre))
    for text, step in zip(why, steps):  # `n` goes to the next step with a preemption
        for p in (q for q in report["preemptions"] if q["step"] == step):
            assert p["victim"] in text and f"{p['computed_tokens_lost']} computed tokens" in text
            if p["tokens_recomputed"] and p["mode"] != "swap":
                assert f"{p['tokens_recomputed']} tokens prefilled again" in text
    # the audit (one row per log: totals, and the requests hurt most)
    if path.suffix != ".json":
        assert (audit["preemptions_replayed"], audit["computed_tokens_lost"],
                audit["recomputed_tokens"]) == (s["preemptions"], s["computed_tokens_lost"],
                                                s["tokens_recomputed"])
        assert audit["recompute_ratio"] == s["recompute_ratio"]
        per: dict[str, int] = {}
        for p in report["preemptions"]:
            per[p["victim"]] = per.get(p["victim"], 0) + (p["tokens_recomputed"] or 0)
        for w in audit["worst_requests"]:
            assert w["recomputed_tokens"] == per[w["request"]]
    if aborted is not None:  # the abort line reached the replay
        assert [a for _, a in report["run"]["aborts"]] == [aborted]
    # a cut log (the clock passed its last line before the run ended) stops there
    assert report["run"]["cut_after_steps"] == (s["steps"] if s["cut_short"] else None)


# ---------------------------------------------------------------- every entry point
def test_every_entry_point_goes_through_the_one_join(tmp_path: Path, capsys, monkeypatch) -> None:
    """Each command that shows a replay of a log opens it through sources.open_replay (and
    nothing else replays it): with the join refusing, every one says the join's words."""
    from kvreplay.audit.record import audit_records
    from kvreplay.cli import main
    from kvreplay.pytest_plugin import golden

    log = DATA / "logcases" / "b_fcfs_heavy" / "server.reqbody.log"
    assert log.is_file()
    words = "refused by the one join (test)"
    calls: list[list[str]] = []

    def join(paths, **kw):
        calls.append([str(p) for p in paths])
        raise UserError(words)

    monkeypatch.setattr(sources, "open_replay", join)
    commands = {
        "replay": ["replay", str(log), "--year", str(YEAR)],
        "export": ["export", str(log), "--year", str(YEAR), "--chrome", str(tmp_path / "t.json")],
        "whatif": ["whatif", str(log), "--year", str(YEAR), "--max-num-seqs", "16"],
    }
    for name, argv in commands.items():
        rc = main(argv)
        err = capsys.readouterr().err
        assert rc == 2 and words in err, (name, rc, err)
        assert calls == [[str(log)]], name
        calls.clear()
    audit = audit_records(str(log), year=YEAR)[0]
    assert audit["replay"] == "skipped" and any(words in r for r in audit["null_reasons"])
    assert calls == [[str(log)]]
    calls.clear()
    assert golden.build(str(log), year=YEAR).doc["replay"] == {"error": words}
    assert calls == [[str(log)]]
    calls.clear()
    _, _, tui_error, tui_exc, _ = tui_view(log)
    assert tui_exc is None and tui_error == words and calls == [[str(log)]]


def test_the_abort_changes_the_replay(tmp_path: Path) -> None:
    """An `Aborted request` line is applied where the replay's clock passes it: the
    request is finished there and never completes."""
    from kvreplay.sources import open_replay

    src = DATA / "logcases" / "b_fcfs_heavy" / "server.reqbody.log"
    rid = abort_and_cut(src, tmp_path / "a.log")
    rep = open_replay([str(tmp_path / "a.log")], year=YEAR)
    plain = open_replay([str(src)], year=YEAR)
    assert [r for _, r in rep.inputs.aborts] == [rid]
    step = rep.inputs.aborts[0][0]
    assert rid in rep.steps[step].aborted
    assert not any(rid in r.finished for r in rep.steps)
    assert any(rid in r.finished for r in plain.steps)
    assert rep.steps[:step] == plain.steps[:step]  # the same run up to the abort
    assert rep.cut_short and rep.unfinished and len(rep.steps) < len(plain.steps)
