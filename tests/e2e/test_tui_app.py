"""Pilot tests: drive `kvreplay tui` headless and check what its panels show against the
replay's own records (a straight Engine.run())."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from kvreplay.sources import open_replay as open_source
from kvreplay.replay.timeline import CACHED, FREE, HELD, NULL, SHARED
from kvreplay.samples import sample_path
from kvreplay.tui import panel_text
from kvreplay.tui.app import KEYS, ReplayApp, parse_goto, parse_step
from kvreplay.cli.tui import default_paths

CASES = Path(__file__).parents[1] / "data" / "conformance" / "cases"
SIZE = (150, 48)


def records_of(path):
    """The conformance trace of the replay the app shows (a checked re-run of its inputs)."""
    return open_source([path]).trace()


def run(coro):
    return asyncio.run(coro)


async def loaded(app, pilot):
    await app.workers.wait_for_complete()
    await pilot.pause()
    assert app.tl is not None and app.tl.done


def text(app, selector: str) -> str:
    return app.query_one(selector).plain


def test_jump_to_preemption_why_panel_and_block_map() -> None:
    path = default_paths()[0]
    records = records_of(path)
    pre = [r for r in records if r.get("preemptions")]

    async def body():
        app = ReplayApp([path])
        async with app.run_test(size=SIZE) as pilot:
            await loaded(app, pilot)
            assert app.cursor == 0
            await pilot.press("n", "n")  # the second preemption: r2 evicted for r0
            await pilot.pause()
            rec = pre[1]
            p = rec["preemptions"][0]
            assert app.cursor == rec["step"]
            assert app.selected == p["req"]
            why = text(app, "#why-panel")
            assert f"at step {rec['step']}" in why
            assert f"Victim   {p['req']}" in why
            assert f"Trigger  {p['trigger']}" in why
            assert f"{p['trigger']} needed {p['blocks_needed']} block" in why
            assert f"{p['free_blocks_at_failure']} free at that moment" in why
            assert "fcfs: running[-1]" in why
            assert f"Thrown away: {p['num_computed_tokens_before']} computed tokens" in why
            resumed = next(r for r in records[rec["step"]:] if p["req"] in r.get("resumed", ()))
            assert f"Readmitted at step {resumed['step']}" in why
            assert f"prefix hit {resumed['prefix_hit_tokens'][p['req']]} tokens" in why
            # the default sample is a stock 0.33 log: its replay is checked against the
            # stats lines, not recorded step by step
            assert "confidence: consistent" in why
            # block map: after the step the victim holds nothing, free = record's
            await pilot.press("2")
            await pilot.pause()
            state = app.view.after
            assert state.free_blocks == rec["free_blocks"]
            assert state.block_states[0] == NULL
            counts = state.counts()
            assert counts["free"] + counts["cached"] == rec["free_blocks"]
            assert counts["held"] + counts["shared"] == sum(rec["blocks_held"].values())
            bm = text(app, "#block-map")
            assert f"After step {rec['step']}  free {counts['free']}" in bm
            assert f"Selected {p['req']}: 0 blocks" in bm
            for rid, n in rec["blocks_held"].items():
                assert f"{rid:<8} {n:>4} blocks" in bm
            # before the step, the victim's blocks are highlighted in the map
            await pilot.press("t")
            await pilot.pause()
            bm = text(app, "#block-map")
            assert f"Before step {rec['step']}" in bm
            assert f"Selected {p['req']}: {p['blocks_held_before']} blocks" in bm
            before = app.view.before
            for b in before.requests[p["req"]].blocks:
                assert before.block_states[b] in (HELD, SHARED)
            await pilot.press("N")
            await pilot.pause()
            assert app.cursor == pre[0]["step"]

    run(body())


def test_step_back_and_forward_match_the_records() -> None:
    path = CASES / "d_priority" / "workload.json"
    records = records_of(path)

    async def body():
        app = ReplayApp([str(path)], snapshot_every=16)
        async with app.run_test(size=SIZE) as pilot:
            await loaded(app, pilot)
            await pilot.press("G")
            await pilot.pause()
            assert app.cursor == len(records) - 1
            for _ in range(20):  # backwards across snapshot boundaries
                await pilot.press("left")
                v = app.view
                assert v.step == app.cursor
                assert v.record == app.tl.replay.steps[app.cursor]
                assert [[x.rid, x.tokens] for x in v.scheduled] == records[app.cursor].get(
                    "scheduled", [])
                assert v.after.running == records[app.cursor]["running"]
                assert v.after.waiting == records[app.cursor]["waiting"]
            await pilot.press("g")
            for _ in range(20):
                await pilot.press("right")
                assert app.view.record == app.tl.replay.steps[app.cursor]
                assert app.view.record.finished == records[app.cursor]["finished"]
            assert app.cursor == 20
            step = app.cursor
            assert f"Step {step}" in text(app, "#step")
            running = " ".join(records[step]["running"])
            assert running in text(app, "#step")
            # a priority preemption: the victim rule
            await pilot.press("n")
            await pilot.pause()
            assert "priority: max(priority, arrival_time)" in text(app, "#why-panel")
            # rolled back: the victim was already scheduled this step
            for _ in range(10):
                v = app.view
                if any(p.was_scheduled_this_step for p in v.preemptions):
                    break
                await pilot.press("n")
                await pilot.pause()
            p = next(p for p in app.view.preemptions if p.was_scheduled_this_step)
            assert f"{p.rolled_back_tokens} tokens rolled back" in text(app, "#why-panel")

    run(body())


def test_goto_search_request_view_bookmarks_and_diff() -> None:
    path = CASES / "f_prefix_caching" / "workload.json"
    records = records_of(path)

    async def body():
        app = ReplayApp([str(path)])
        async with app.run_test(size=SIZE) as pilot:
            await loaded(app, pilot)
            await pilot.press("colon", *"120", "enter")
            await pilot.pause()
            assert app.cursor == 120
            await pilot.press("colon", *"+5", "enter")
            await pilot.pause()
            assert app.cursor == 125
            # search a request; the request view lists its life with jumps
            await pilot.press("slash", "r", "4", "enter")
            await pilot.pause()
            assert app.selected == "r4"
            assert app.query_one("#tabs").active == "request"
            header = text(app, "#request-header")
            assert "Request r4" in header
            # the life list has the focus: Enter on an event jumps to its step
            life = app.tl.life["r4"]
            hl = app.query_one("#request-life").highlighted
            await pilot.press("down", "enter")
            await pilot.pause()
            assert app.cursor == life[min(hl + 1, len(life) - 1)].step
            n_pre = sum(1 for r in records for p in r.get("preemptions", ()) if p["req"] == "r4")
            assert f"preempted {n_pre} time" in header
            # next/previous preemption of the selected request
            await pilot.press("g", "p")
            await pilot.pause()
            first = next(r["step"] for r in records
                         if any(p["req"] == "r4" for p in r.get("preemptions", ())))
            assert app.cursor == first
            # prefix hit at readmission shows in the why panel
            why = text(app, "#why-panel")
            resumed = next(r for r in records[first:] if "r4" in r.get("resumed", ()))
            assert f"prefix hit {resumed['prefix_hit_tokens']['r4']} tokens" in why
            # o: next event of r4 (its readmission)
            await pilot.press("o")
            await pilot.pause()
            assert app.cursor == resumed["step"]
            kinds = {s.rid: s.kind for s in app.view.scheduled}
            assert kinds["r4"] in ("recompute", "decode")
            # diff vs previous step: r4 back to RUNNING
            await pilot.press("4")
            await pilot.pause()
            diff = text(app, "#diff-panel")
            assert "r4 status: PREEMPTED → RUNNING" in diff
            # bookmarks: two marks, diff between them
            await pilot.press("m")
            a = app.cursor
            await pilot.press("right", "right", "right", "m")
            b = app.cursor
            await pilot.press("g", "u")
            assert app.cursor == a
            await pilot.press("u")
            assert app.cursor == b
            await pilot.press("U")
            assert app.cursor == a
            await pilot.press("x")
            await pilot.pause()
            assert f"Bookmarks {a} and {b}" in text(app, "#diff-panel")
            # select cycles through this step's requests
            await pilot.press("right_square_bracket")
            assert app.selected is not None

    run(body())


def test_help_lists_every_key_and_palette_has_the_actions() -> None:
    async def body():
        app = ReplayApp(default_paths())
        async with app.run_test(size=SIZE) as pilot:
            await loaded(app, pilot)
            await pilot.press("question_mark")
            await pilot.pause()
            help_text = app.screen.query_one("#help-text").plain
            for keys, _action, desc, _show in KEYS:
                assert desc in help_text
            for key in ("n", "N", "/", ":", "g", "G", "?", "[", "]", "→", "←", "Esc"):
                assert f"\n{key}" in help_text or f" {key} " in help_text or f"{key} " in help_text
            await pilot.press("escape")
            await pilot.pause()
            # the palette renders every entry (titles are markup: no stray brackets)
            await pilot.press("ctrl+p")
            await pilot.pause()
            for ch in "next preemption":
                await pilot.press(ch)
            await pilot.pause(0.3)
            await pilot.press("enter")
            await pilot.pause(0.2)
            assert app.cursor == app.tl.next_event("preemption", 0)  # ran from the palette
            titles = [c.title for c in app.get_system_commands(app.screen)]
            for _keys, action, desc, _show in KEYS:
                if action not in ("quit", "help"):
                    assert any(t.startswith(desc) for t in titles), desc

    run(body())


def test_escape_stops_a_long_load() -> None:
    import json
    import tempfile

    data = json.loads(sample_path("fcfs_heavy.workload.json").read_text())
    data["requests"] = [dict(r, id=f"x{i}", arrival_step=i * 50) for i, r in
                        enumerate(data["requests"] * 400)]
    data["config"]["max_steps"] = 10**7
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(data, f)

    async def body():
        # a snapshot every step keeps the load slow (it runs at ~100k steps/s otherwise,
        # and could end before the key press reaches it); it also checks that dense
        # snapshots do not starve the loader's cancel check
        app = ReplayApp([f.name], snapshot_every=1)
        async with app.run_test(size=SIZE) as pilot:
            while app.tl is None or app.tl.num_steps < 500:
                await pilot.pause(0.05)
            await pilot.press("right")  # usable while loading
            await pilot.press("escape")

            # a cancelled thread worker counts as complete at once; the loader sees the
            # flag at its next progress check (256 steps and 0.25 s apart), later on a
            # busy machine: wait for its Loaded message, not for the worker
            for _ in range(400):
                if app.loaded:
                    break
                await pilot.pause(0.05)
            await pilot.pause()
            assert app.tl.cancelled and not app.tl.done
            assert "stopped" in str(app.query_one("#status-label").render())
            await pilot.press("G")
            assert app.cursor == app.tl.num_steps - 1

    run(body())


async def until_exit(app, pilot, timeout: float = 20.0) -> None:
    for _ in range(int(timeout / 0.05)):
        if app.return_code is not None:
            return
        await pilot.pause(0.05)


def test_bad_input_is_reported_not_raised(tmp_path) -> None:
    app = ReplayApp([str(tmp_path / "missing.json")])

    async def body():
        async with app.run_test(size=SIZE) as pilot:
            await until_exit(app, pilot)

    run(body())
    assert app.load_error and "no such file" in app.load_error
    assert app.return_code == 2  # nothing to show: the app leaves, the CLI prints the error


def test_cli_data_parallel_log_one_line_and_exit_2(monkeypatch, capsys) -> None:
    """`kvreplay tui dp.log`: a log that cannot be replayed gives the terminal back, one
    line on stderr, exit 2."""
    from textual.app import App

    from kvreplay.cli import main

    monkeypatch.setattr(ReplayApp, "run", lambda self, **kw: App.run(self, headless=True))
    assert main(["tui", str(sample_path("synthetic_v022_dp2_iterations.log"))]) == 2
    out, err = capsys.readouterr()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("kvreplay tui: error: this is a data-parallel log")
    assert "Traceback" not in out + err


def test_v0_log_opens_on_the_replays_preemptions() -> None:
    """A V0-engine log (swap and recompute): the timeline, the why panel and the step view
    show the replay's own records (the same as `kvreplay replay`)."""
    log = Path(__file__).parents[1] / "data" / "v0_logs" / "v066_swap_1s.log"
    rep = open_source([str(log)], year=2025)

    async def body():
        app = ReplayApp([str(log)])
        async with app.run_test(size=SIZE) as pilot:
            await loaded(app, pilot)
            tl = app.tl
            assert [(p.step, p.victim, p.mode) for p in tl.preemptions] == [
                (p.step, p.victim, p.mode) for p in rep.preemptions]
            await pilot.press("n")
            await pilot.pause()
            first = rep.preemptions[0]
            assert app.cursor == first.step
            why = text(app, "#why-panel")
            assert first.victim in why and "swapped out to CPU memory" in why
            step = text(app, "#step")
            assert f"step {first.step}" in step.lower()

    run(body())


def test_parse_step() -> None:
    assert parse_step("12", 0, 100) == 12
    assert parse_step("+5", 10, 100) == 15
    assert parse_step("-5", 10, 100) == 5
    assert parse_step("50%", 0, 101) == 50
    assert parse_step("end", 0, 100) == 99
    assert parse_step("x", 0, 100) is None


def clock_epoch(times, hhmmss: str) -> float:
    """Epoch seconds of a log time of day on the run's first day."""
    from datetime import datetime, timezone

    day = datetime.fromtimestamp(times[0], timezone.utc).strftime("%Y-%m-%d")
    return datetime.strptime(f"{day} {hhmmss}", "%Y-%m-%d %H:%M:%S.%f").replace(
        tzinfo=timezone.utc).timestamp()


def running_at(times, t: float) -> int:
    return max(0, max(i for i, x in enumerate(times) if x <= t) if t >= times[0] else 0)


def test_goto_a_time_on_a_log() -> None:
    async def body():
        app = ReplayApp(default_paths())
        async with app.run_test(size=SIZE) as pilot:
            await loaded(app, pilot)
            tl = app.tl
            times = tl.step_times
            assert tl.has_times
            # the prompt says what it takes, with the log's time range
            await pilot.press("colon")
            await pilot.pause()
            label = str(app.screen.query_one("#goto-times").render())
            assert "10:01:02.350" in label and panel_text.clock(tl, 0) in label
            for ch in "10:01:02":
                await pilot.press(ch)
            await pilot.press("enter")
            await pilot.pause()
            want = running_at(times, clock_epoch(times, "10:01:02.000"))
            assert 0 < want < tl.num_steps - 1
            assert app.cursor == want
            assert times[want] <= clock_epoch(times, "10:01:02.000") < times[want + 1]
            # the current step's time: status line and step view
            at = panel_text.clock(tl, want)
            assert at.startswith("10:01:0")
            assert f"step {want}/{tl.num_steps - 1} at {at}" in str(
                app.query_one("#status-label").render())
            assert f"Step {want} / {tl.num_steps - 1}  at {at}" in text(app, "#step")
            # milliseconds, and relative to the current step's start
            await pilot.press("colon", *"10:01:02.350", "enter")
            await pilot.pause()
            assert app.cursor == running_at(times, clock_epoch(times, "10:01:02.350"))
            here = app.cursor
            await pilot.press("colon", *"+1.5s", "enter")
            await pilot.pause()
            assert app.cursor == running_at(times, times[here] + 1.5) > here
            here = app.cursor
            await pilot.press("colon", *"-200ms", "enter")
            await pilot.pause()
            assert app.cursor == running_at(times, times[here] - 0.2) < here
            # steps still work; a time before the run goes to step 0
            await pilot.press("colon", *"+5", "enter")
            await pilot.pause()
            here = app.cursor
            await pilot.press("colon", *"09:00", "enter")
            await pilot.pause()
            assert here > 0 and app.cursor == 0

    run(body())


def test_parse_goto() -> None:
    src = open_source(default_paths())
    from kvreplay.replay.timeline import Timeline

    tl = Timeline(src)
    tl.build()
    times = tl.step_times
    last = tl.num_steps - 1
    assert parse_goto("120", 0, tl) == (120, None)
    assert parse_goto("+5", 10, tl) == (15, None)
    assert parse_goto("end", 0, tl) == (last, None)
    t = clock_epoch(times, "10:01:01.000")
    step, note = parse_goto("10:01:01", 0, tl)
    assert step == running_at(times, t) and f"step {step}" in note
    assert parse_goto("10:01:01.000", 0, tl)[0] == step
    assert parse_goto("05-07 10:01:01", 0, tl)[0] == step
    assert parse_goto(" 10:01 ", 0, tl)[0] == running_at(times, clock_epoch(times, "10:01:00.0"))
    assert parse_goto("+1s", 100, tl)[0] == running_at(times, times[100] + 1)
    assert parse_goto("+1000ms", 100, tl)[0] == running_at(times, times[100] + 1)
    assert parse_goto("-0.5s", 300, tl)[0] == running_at(times, times[300] - 0.5)
    step, note = parse_goto("-1h", 300, tl)
    assert step == 0 and "before the first step" in note
    step, note = parse_goto("10:30:00", 0, tl)
    assert step == last and "after the last step" in note
    # no date: the day nearest the run (23:59:59 the evening before a 10:00 run)
    step, note = parse_goto("23:59:59", 300, tl)
    assert step == 0 and "before the first step" in note
    assert parse_goto("25:00:00", 0, tl)[0] is None
    assert parse_goto("soon", 0, tl)[0] is None
    # a workload has no times: the prompt says so
    wl = Timeline(open_source([CASES / "a_light_load" / "workload.json"]))
    wl.build()
    step, note = parse_goto("10:01:02", 0, wl)
    assert step is None and "no wall-clock times" in note
    assert parse_goto("+1.5s", 0, wl)[0] is None
    assert parse_goto("7", 0, wl) == (7, None)


def test_goto_prompt_on_a_workload_says_it_has_no_times() -> None:
    async def body():
        app = ReplayApp([str(CASES / "a_light_load" / "workload.json")])
        async with app.run_test(size=SIZE) as pilot:
            await loaded(app, pilot)
            await pilot.press("colon")
            await pilot.pause()
            assert "no wall-clock times" in str(app.screen.query_one("#goto-times").render())
            await pilot.press(*"10:01:02", "enter")
            await pilot.pause()
            assert app.cursor == 0
            assert any("no wall-clock times" in n.message for n in app._notifications)
            assert " at " not in str(app.query_one("#status-label").render()).split("·")[0]

    run(body())


def test_why_panel_shows_each_preemptions_own_confidence(monkeypatch) -> None:
    import kvreplay.sources as sources

    real = sources.open_replay

    def patched(paths, **kw):
        src = real(paths, **kw)
        src.preemptions[0].confidence = "inferred"
        src.preemptions[1].confidence = "exact"
        return src

    monkeypatch.setattr(sources, "open_replay", patched)

    async def body():
        app = ReplayApp(default_paths())
        async with app.run_test(size=SIZE) as pilot:
            await loaded(app, pilot)
            shown = []
            for _ in range(3):
                await pilot.press("n")
                await pilot.pause()
                why = text(app, "#why-panel")
                shown.append(why.split("confidence: ")[1].split()[0])
            assert shown == ["inferred", "exact", "consistent"]
            await pilot.press("N", "N")
            await pilot.pause()
            assert "(reconstructed: the stats lines around it disagree" in text(app, "#why-panel")

    run(body())


def test_log_tab_shows_the_nearest_lines_around_a_quiet_step() -> None:
    async def body():
        app = ReplayApp(default_paths())
        async with app.run_test(size=SIZE) as pilot:
            await loaded(app, pilot)
            tl = app.tl
            lines = tl.source.log_lines
            logged = sorted(lines)
            quiet = logged[0] + 7
            assert quiet not in lines and logged[1] > quiet
            await pilot.press("colon", *str(quiet), "enter", "5")
            await pilot.pause()
            log = text(app, "#log-panel")
            assert f"No log line was written at step {quiet} ({panel_text.clock(tl, quiet)})" in log
            before, after = logged[0], logged[1]
            assert f"step {before} ({panel_text.clock(tl, before)}), 7 steps earlier" in log
            assert f"step {after} ({panel_text.clock(tl, after)}), {after - quiet} steps later" in log
            for path, lineno in lines[before][-12:] + lines[after][:12]:
                assert f"{Path(path).name}:{lineno}: " in log
            # the order reads like the log: before, this step, after
            assert log.index(f"step {before} (") < log.index(f"▶ step {quiet}") < log.index(
                f"step {after} (")
            # a step with lines shows its own
            await pilot.press("colon", *str(after), "enter")
            await pilot.pause()
            log = text(app, "#log-panel")
            assert f"Log lines behind step {after}" in log
            path, lineno = lines[after][0]
            assert f"{Path(path).name}:{lineno}: " in log
            assert "No log line" not in log

    run(body())


def test_cli_import_path_does_not_import_textual() -> None:
    code = ("import sys\nfrom kvreplay.cli import build_parser\n"
            "a = build_parser().parse_args(['tui'])\n"
            "assert a._module.__name__ == 'kvreplay.cli.tui', a._module\n"
            "print(','.join(m for m in sys.modules if m.startswith('textual')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
