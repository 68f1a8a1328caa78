"""The `kvreplay` console script: one module per command in this package.

Each subcommand lives in its own module, imported only when it runs, so `kvreplay parse`
never pays for the TUI or polars. A subcommand module provides
`add_arguments(parser)` and `run(args) -> int`.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

from kvreplay import __version__
from kvreplay.errors import UserError

# name -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "parse": ("kvreplay.cli.parse", "parse vLLM logs into typed events"),
    "replay": ("kvreplay.cli.replay", "reconstruct every preemption from a vLLM server log"),
    "simulate": ("kvreplay.cli.simulate", "run a workload through the faithful vLLM scheduler"),
    "record-kv-events": ("kvreplay.cli.record_kv_events", "record vLLM's KV-cache events (ZMQ, --kv-events-config) to a file"),
    "tui": ("kvreplay.cli.tui", "step through every scheduling decision in a terminal debugger"),
    "audit": ("kvreplay.cli.audit", "audit logs or Prometheus scrapes: one record per log, status, storms, CI gates"),
    "whatif": ("kvreplay.cli.whatif", "replay a log's workload under other settings or concurrencies"),
    "watch": ("kvreplay.cli.watch", "follow a running server's log and print each preemption as it is decided"),
    "export": ("kvreplay.cli.export", "write the replay as a Perfetto or Chrome trace (timeline viewers)"),
}


class _Unavailable:
    def __init__(self, name: str, exc: ImportError) -> None:
        self.name, self.exc = name, exc

    def run(self, args: argparse.Namespace) -> int:
        raise UserError(f"'{self.name}' is unavailable in this install: {self.exc}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvreplay",
        description="Replay vLLM's scheduler from its logs and explain every preemption.",
    )
    parser.add_argument("--version", action="version", version=f"kvreplay {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:  # a broken optional part must not take the others down
            p.set_defaults(_module=_Unavailable(name, exc))
            continue
        module.add_arguments(p)
        p.set_defaults(_module=module)
    return parser


MAX_SAMPLES = 4096  # ensemble replays: beyond this the interval gains nothing but hours


def _check_samples(args: argparse.Namespace) -> None:
    """--samples (ensemble replays) and --draws (what-if's step-time models) are bounded:
    each is a whole replay more, and past a few thousand the interval gains nothing."""
    n = getattr(args, "samples", None)
    if n is not None and not 0 <= n <= MAX_SAMPLES:
        raise UserError(f"--samples {n}: give 0 (no ensemble) to {MAX_SAMPLES} replays "
                        "(the default, 32, gives a 90% interval; each replay costs about as "
                        "much as the replay itself)")
    d = getattr(args, "draws", None)
    if d is not None and not 0 <= d <= MAX_SAMPLES:
        raise UserError(f"--draws {d}: give 0 (no drawn models) to {MAX_SAMPLES} (default 6; "
                        "each is a what-if run more per row)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    from kvreplay.cli.inputs import Stdin, install_sigint, spool_stdin
    from kvreplay.cli.progress_bar import progress_bar

    install_sigint()
    stdin = Stdin()
    try:
        from kvreplay.replay.profile import check_profile_arg

        check_profile_arg(getattr(args, "profile", None))
        _check_samples(args)
        spool_stdin(args, stdin)
        args._stdin = stdin
        # stderr a terminal: long stages show a bar (not under the TUI, which owns it, nor
        # watch, whose replays are many and whose stderr says what happened to the file)
        with progress_bar(False if args.command in ("tui", "watch") else None,
                          prog=f"kvreplay {args.command}"):
            return int(args._module.run(args) or 0)
    except UserError as exc:
        print(f"kvreplay {args.command}: error: {stdin.as_given(str(exc))}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `kvreplay parse big.log | head`
        sys.stderr.close()
        return 0
    except KeyboardInterrupt as exc:
        why = exc.args[0] if exc.args and isinstance(exc.args[0], str) else "interrupted"
        print(f"kvreplay {args.command}: {why}", file=sys.stderr)
        return 130
    finally:
        stdin.close()


if __name__ == "__main__":
    raise SystemExit(main())
