"""`kvreplay tui [LOG|WORKLOAD.json ...] [--profile P]`, `kvreplay tui --follow LOG`: the
terminal debugger, on a finished replay or a live one.

Textual is imported only inside `run()`: building the `kvreplay` parser must not import it.
"""

from __future__ import annotations

import argparse

from kvreplay.errors import UserError

# What `kvreplay tui` opens with no argument (one place to change it).
DEFAULT_SAMPLE = "vllm033_fcfs_heavy.reqbody.log"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "paths", nargs="*", metavar="LOG|WORKLOAD.json",
        help=f"vLLM log file(s) or a workload JSON (default: the embedded sample {DEFAULT_SAMPLE})",
    )
    parser.add_argument("--profile", default=None,
                        help="vLLM version profile (default: from the log, else 0.33)")
    parser.add_argument("--year", type=int,
                        help="year of the log's time stamps (default: the file's mtime)")
    # (LOG is --follow's value, not among `paths`: those are read whole, stdin spooled)
    parser.add_argument("--follow", metavar="LOG",
                        help="follow LOG as it grows (as `kvreplay watch` does: appended, "
                             "rotated, truncated): the timeline grows with it, a restart "
                             "banner starts a new replay")
    parser.add_argument("--config", metavar="CONFIG.json",
                        help="the engine config for request spans opened without their log "
                             "(as kvreplay replay --config)")


def default_paths() -> list[str]:
    from kvreplay.samples import sample_path

    return [str(sample_path(DEFAULT_SAMPLE))]


def run(args: argparse.Namespace) -> int:
    from kvreplay.sources import precheck_inputs

    follow = getattr(args, "follow", None) is not None
    if follow:
        check_follow([args.follow, *args.paths])
        paths = [args.follow]
    else:
        paths = args.paths or default_paths()
        precheck_inputs(paths)  # bad input: one line before the app takes the screen
    from kvreplay.tui.app import ReplayApp

    app = ReplayApp(paths, profile=args.profile, year=args.year,
                    config=args.config, follow=follow)
    app.run()
    # The app has left the screen and restored the terminal by now.
    if app.load_exception is not None:
        raise app.load_exception
    if app.load_error:
        # `kvreplay` prints it on one line (stderr) and exits 2, e.g. for a V0-engine log
        raise UserError(app.load_error)
    return 0


def check_follow(paths: list[str]) -> None:
    """`--follow` takes one growing log file (UserError otherwise, before the screen)."""
    if len(paths) != 1:
        raise UserError("--follow takes one log file (the one the server writes)")
    if paths[0] == "-":
        raise UserError("--follow reads its keys from the terminal, so not a log from stdin: "
                        "follow a file (kubectl logs -f ... > server.log &), or use "
                        "`kvreplay watch -`")
    from kvreplay.live.follow import FileFollower

    FileFollower(paths[0]).close()  # a directory, a .gz, a missing file: one line
