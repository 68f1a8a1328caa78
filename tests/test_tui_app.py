"""Pilot tests: drive `kvreplay tui` headless and check what its panels show against the
replay's own records (a straight Engine.run())."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("textual")

from kvreplay.replay.session import open_source  # noqa: E402
from kvreplay.replay.timeline import CACHED, FREE, HELD, NULL, SHARED  # noqa: E402
from kvreplay.samples import sample_path  # noqa: E402
from kvreplay.tui.app import KEYS, ReplayApp, parse_step  # noqa: E402
from kvreplay.tui.cli import default_paths  # noqa: E402

CASES = Path(__file__).parent / "data" / "conformance" / "cases"
SIZE = (150, 48)


def records_of(path):
    return list(open_source([path]).engine().run())


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
                assert v.record == records[app.cursor]
                assert v.after.running == records[app.cursor]["running"]
                assert v.after.waiting == records[app.cursor]["waiting"]
            await pilot.press("g")
            for _ in range(20):
                await pilot.press("right")
                assert app.view.record == records[app.cursor]
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
        app = ReplayApp([f.name])
        async with app.run_test(size=SIZE) as pilot:
            while app.tl is None or app.tl.num_steps < 500:
                await pilot.pause(0.05)
            await pilot.press("right")  # usable while loading
            await pilot.press("escape")
            await app.workers.wait_for_complete()
            await pilot.pause()
            assert app.tl.cancelled and not app.tl.done
            assert "stopped" in str(app.query_one("#status-label").render())
            await pilot.press("G")
            assert app.cursor == app.tl.num_steps - 1

    run(body())


def test_bad_input_is_reported_not_raised(tmp_path) -> None:
    async def body():
        app = ReplayApp([str(tmp_path / "missing.json")])
        async with app.run_test(size=SIZE) as pilot:
            await app.workers.wait_for_complete()
            await pilot.pause()
            assert app.load_error and "no such file" in app.load_error
            await pilot.press("n", "right", "slash")

    run(body())


def test_parse_step() -> None:
    assert parse_step("12", 0, 100) == 12
    assert parse_step("+5", 10, 100) == 15
    assert parse_step("-5", 10, 100) == 5
    assert parse_step("50%", 0, 101) == 50
    assert parse_step("end", 0, 100) == 99
    assert parse_step("x", 0, 100) is None


def test_cli_import_path_does_not_import_textual() -> None:
    code = ("import sys\nfrom kvreplay.cli import build_parser\n"
            "a = build_parser().parse_args(['tui'])\n"
            "assert a._module.__name__ == 'kvreplay.tui.cli', a._module\n"
            "print(','.join(m for m in sys.modules if m.startswith('textual')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
