"""`kvreplay tui --follow LOG`: the debugger on a live replay. Lines are appended to a
temporary log while the app runs headless; the model grows with them (steps, preemptions),
ends on the offline replay of the same file, `n` at the newest step jumps to the newest
preemption, and a restart banner starts a new replay and says so."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from kvreplay.cli import main
from kvreplay.sources import open_replay
from kvreplay.tui.app import ReplayApp

CASES = Path(__file__).parents[1] / "data" / "logcases"
B_EXACT = CASES / "b_fcfs_heavy" / "server.iter.reqbody.log"
SIZE = (130, 40)


def _lines(path: Path) -> list[str]:
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    assert len(lines) > 600, path  # the published case is present, not skipped
    return lines


async def _until(pilot, cond, timeout: float = 90.0) -> None:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, "the followed log was not replayed in time"
        await pilot.pause(0.1)


def test_the_timeline_grows_with_the_log_and_ends_on_the_offline_replay(tmp_path) -> None:
    lines = _lines(B_EXACT)
    log = tmp_path / "server.log"
    log.write_text("".join(lines[:300]), encoding="utf-8")
    offline = open_replay([str(B_EXACT)], year=2026)
    grew: dict[str, tuple[int, int]] = {}

    async def body():
        app = ReplayApp([str(log)], follow=True, year=2026)
        async with app.run_test(size=SIZE) as pilot:
            await _until(pilot, lambda: app.tl is not None and app.tl.num_steps > 0)
            tl = app.tl
            grew["first"] = (tl.num_steps, len(tl.preemptions))
            # following: the cursor stays at the newest step
            assert app.tailing and app.cursor == tl.num_steps - 1
            assert "following run 1" in str(app.query_one("#status-label").render())
            with log.open("a", encoding="utf-8") as f:
                f.write("".join(lines[300:]))
            await _until(pilot, lambda: app.session.replay_lines == len(lines)
                         and app.tl.num_steps > grew["first"][0])
            tl = app.tl
            grew["last"] = (tl.num_steps, len(tl.preemptions))
            assert app.tailing and app.cursor == tl.num_steps - 1
            # the whole file's replay: the offline one, step for step
            assert tl.replay.steps == offline.steps
            assert [(p.step, p.victim) for p in tl.preemptions] == [
                (p.step, p.victim) for p in offline.preemptions]
            # `n` at the newest step: the newest preemption, its why-panel
            await pilot.press("n")
            await pilot.pause()
            newest = offline.preemptions[-1]
            assert app.cursor == newest.step and not app.tailing
            why = app.query_one("#why-panel").plain
            n = len(offline.preemptions)
            assert f"Preemption {n} of {n} at step {newest.step}" in why
            assert newest.victim in why
            # the why-panel on a step seen before the log grew
            first = offline.preemptions[0]
            await pilot.press("g", "n")
            await pilot.pause()
            assert app.cursor == first.step
            assert f"Preemption 1 of {n} at step {first.step}" in app.query_one("#why-panel").plain
            # the Log tab reads the followed lines (numbered as in the file)
            await pilot.press("5")
            await pilot.pause()
            shown = app.query_one("#log-panel").plain
            ref = next(ln for step, refs in sorted(tl.replay.log_lines.items())
                       if step <= first.step for _, ln in refs)
            assert f"server.log:{ref}: {lines[ref - 1].strip()[:60]}" in shown
            app.exit()

    asyncio.run(body())
    # the model grew: more steps and more preemptions once the rest of the log came
    assert grew["first"][0] < grew["last"][0] == len(offline.steps)
    assert grew["first"][1] < grew["last"][1] == len(offline.preemptions)


def test_a_restart_banner_starts_a_new_replay_and_says_so(tmp_path) -> None:
    lines = _lines(B_EXACT)
    log = tmp_path / "server.log"
    log.write_text("".join(lines), encoding="utf-8")
    offline = open_replay([str(B_EXACT)], year=2026)

    async def body():
        app = ReplayApp([str(log)], follow=True, year=2026)
        async with app.run_test(size=SIZE) as pilot:
            await _until(pilot, lambda: app.tl is not None
                         and app.tl.num_steps == len(offline.steps))
            await pilot.press("g", "m")  # a bookmark of run 1
            assert app.bookmarks == {0}
            with log.open("a", encoding="utf-8") as f:  # the server starts again
                f.write("".join(lines[:200]))
            await _until(pilot, lambda: app.server_run == 2)
            assert "vLLM restarted" in (app.follow_note or "")
            assert not app.bookmarks  # they were run 1's steps
            early = app.tl  # run 2 from its first lines
            with log.open("a", encoding="utf-8") as f:
                f.write("".join(lines[200:]))
            # (the lines before the banner are run 1's: its replay has every line of run 2)
            await _until(pilot, lambda: app.tl is not early and app.session.replay_lines
                         == len(app.session.lines) and app.tl.num_steps == len(offline.steps))
            # the new run's steps count from 0 again: the same replay as the first run's
            assert app.tl.replay.steps == offline.steps
            assert "following run 2" in str(app.query_one("#status-label").render())
            app.exit()

    asyncio.run(body())


@pytest.mark.parametrize("args, words", [
    (["-"], "not a log from stdin"),
    (["a.log", "b.log"], "--follow takes one log file"),
    (["missing.log"], "no such file"),
])
def test_follow_bad_input_one_line_exit_2(tmp_path, monkeypatch, capsys, args, words) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["tui", "--follow", *args]) == 2
    out, err = capsys.readouterr()
    got = [ln for ln in err.splitlines() if ln.strip()]
    assert len(got) == 1 and words in got[0], err


def test_cli_follow_opens_the_live_replay(tmp_path, monkeypatch) -> None:
    """`kvreplay tui --follow LOG` (LOG is the option's value, never spooled as stdin)."""
    from textual.app import App

    lines = _lines(B_EXACT)
    log = tmp_path / "server.log"
    log.write_text("".join(lines), encoding="utf-8")
    seen: list[ReplayApp] = []

    async def pilot_fn(pilot) -> None:
        app = pilot.app
        seen.append(app)
        await _until(pilot, lambda: app.tl is not None and app.tl.num_steps > 0)
        app.exit()

    monkeypatch.setattr(ReplayApp, "run",
                        lambda self, **kw: App.run(self, headless=True, auto_pilot=pilot_fn))
    assert main(["tui", "--follow", str(log), "--year", "2026"]) == 0
    app = seen[0]
    assert app.follow_path == str(log) and app.paths == [str(log)]
    assert app.tl.num_steps == len(open_replay([str(B_EXACT)], year=2026).steps)
