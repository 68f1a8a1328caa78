"""`kvreplay tui [LOG|WORKLOAD.json ...] [--profile P]`: the terminal debugger.

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
    parser.add_argument("--config", metavar="CONFIG.json",
                        help="the engine config for request spans opened without their log "
                             "(as kvreplay replay --config)")


def default_paths() -> list[str]:
    from kvreplay.samples import sample_path

    return [str(sample_path(DEFAULT_SAMPLE))]


def run(args: argparse.Namespace) -> int:
    from kvreplay.sources import precheck_inputs

    paths = args.paths or default_paths()
    precheck_inputs(paths)  # bad input: one line before the app takes the screen
    from kvreplay.tui.app import ReplayApp

    app = ReplayApp(paths, profile=args.profile, year=args.year,
                    config=args.config)
    app.run()
    # The app has left the screen and restored the terminal by now.
    if app.load_exception is not None:
        raise app.load_exception
    if app.load_error:
        # `kvreplay` prints it on one line (stderr) and exits 2, e.g. for a V0-engine log
        raise UserError(app.load_error)
    return 0
