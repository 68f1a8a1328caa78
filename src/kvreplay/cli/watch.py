"""`kvreplay watch LOG|-`: follow a running server's log and print each preemption as the
lines that decide it arrive (kvreplay.live)."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, TextIO

import msgspec

from kvreplay.errors import UserError



def add_arguments(p: argparse.ArgumentParser) -> None:
    # (not `logs`: the CLI spools a `-` among those to a file, and stdin here never ends)
    p.add_argument("source", metavar="LOG",
                   help="the log to follow (as `tail -F` does: appended, rotated, truncated), "
                        "or '-' for stdin (kubectl logs -f ... | kvreplay watch -)")
    p.add_argument("--format", choices=("table", "jsonl"), default="table",
                   help="jsonl: one JSON object per line (preemptions, intervals, notices)")
    p.add_argument("--exit-idle", type=float, metavar="S",
                   help="stop when the log has not grown for S seconds, after giving every "
                        "row its lines decide (default: follow until Ctrl-C or end of stdin)")
    p.add_argument("--settle", type=int, default=1, metavar="LINES",
                   help="Iteration / step-trace lines after a preemption's step before it is "
                        "printed (default 1)")
    p.add_argument("--metrics", metavar="URL",
                   help="also read the server's /metrics (PORT, HOST:PORT or an http(s) URL; "
                        "a bare port is this host's loopback) and print its preemption counter "
                        "beside what the log's rows name")
    p.add_argument("--metrics-every", type=float, default=15.0, metavar="S",
                   help="seconds between /metrics reads (default 15)")
    from kvreplay.cli.replay import add_replay_inputs

    add_replay_inputs(p)


def run(args: argparse.Namespace) -> int:
    from kvreplay.live.driver import follow
    from kvreplay.live.follow import open_follower
    from kvreplay.live.session import Session

    if args.exit_idle is not None and args.exit_idle < 0:
        raise UserError("--exit-idle must be 0 or more")
    if args.settle < 0:
        raise UserError("--settle must be 0 or more")
    from kvreplay.cli.replay import step_time_of

    step_time = step_time_of(args)
    if args.config is not None:
        raise UserError("--config is for request spans replayed alone; a watched log "
                        "carries its own config")
    import kvreplay.inference  # noqa: F401  (loaded now: not counted in the first replay's cost)
    import kvreplay.sources  # noqa: F401

    feed = None
    if args.metrics is not None:
        from kvreplay.live.metrics_feed import MetricsFeed, metrics_url

        if not args.metrics_every > 0:
            raise UserError("--metrics-every must be above 0")
        feed = MetricsFeed(metrics_url(args.metrics), args.metrics_every)
    follower = open_follower(args.source)
    label = "<stdin>" if args.source == "-" else args.source
    session = Session(label, mtime=follower.mtime, year=args.year, settle=args.settle,
                      replay_opts={"profile": args.profile, "vllm_version": args.vllm_version,
                                   "samples": args.samples, "seed": args.seed,
                                   "step_time": step_time})
    out = sys.stdout
    write = _jsonl if args.format == "jsonl" else _text
    tally = _Tally()

    def emit(rows: list[Any]) -> None:
        tally.add(rows)
        write(out, rows)

    if feed is not None:
        feed.start()
    try:
        for tick in follow(follower, session, label, exit_idle=args.exit_idle):
            for n in tick.notices:
                print(f"kvreplay watch: {n}", file=sys.stderr)
            emit(tick.rows)
            if tick.failed is not None:
                print(f"kvreplay watch: the lines so far could not be replayed "
                      f"({tick.failed}); trying again as more come", file=sys.stderr)
            if feed is not None and not tick.end:
                _counters(out, write, feed.take(tally.named))
        if feed is not None:  # the counter once more, against every row the log gave
            feed.close()
            feed.scrape_now()
            _counters(out, write, feed.take(tally.named, final=True))
    finally:
        follower.close()
        if feed is not None:
            feed.close()
    return 0


def _counters(out: TextIO, write: Any, rows: list[Any]) -> None:
    """Counter rows to the output; the endpoint's notices to stderr, as the log's are."""
    from kvreplay.live.metrics_feed import MetricsNotice

    for r in rows:
        if isinstance(r, MetricsNotice):
            print(f"kvreplay watch: metrics: {r.text}", file=sys.stderr)
    write(out, [r for r in rows if not isinstance(r, MetricsNotice)])


class _Tally:
    """Preemptions the rows name in the current server run: given minus withdrawn (an
    interval row counts its median)."""

    def __init__(self) -> None:
        self.named = 0

    def add(self, rows: list[Any]) -> None:
        from kvreplay.live.session import IntervalRow, NoticeRow, PreemptionRow

        for r in rows:
            if isinstance(r, NoticeRow) and r.event == "restart":
                self.named = 0
            elif isinstance(r, (PreemptionRow, IntervalRow)):
                n = 1 if isinstance(r, PreemptionRow) else r.median
                self.named += -n if r.event == "withdrawn" else n


def _jsonl(out: TextIO, rows: list[Any]) -> None:
    for r in rows:
        out.write(msgspec.json.encode(r).decode() + "\n")
    if rows:
        out.flush()


def _text(out: TextIO, rows: list[Any]) -> None:
    for r in rows:
        out.write(row_text(r) + "\n")
    if rows:
        out.flush()


def row_text(r: Any) -> str:
    """A row as one line, in the words of `kvreplay replay`'s preemption table."""
    from kvreplay.live.metrics_feed import CounterRow, counter_text
    from kvreplay.live.session import IntervalRow, NoticeRow

    if isinstance(r, CounterRow):
        return counter_text(r)
    if isinstance(r, NoticeRow):
        return f"# run {r.run}: {r.text}"
    head = "  withdrawn:" if r.event == "withdrawn" else " "
    if isinstance(r, IntervalRow):
        return (f"{head} {_hms(r.start, 1)}-{_hms(r.end, 1)}  preemptions: median {r.median}, "
                f"{r.low}-{r.high} (interval)")
    t = _hms(r.time, 3) if r.time is not None else "-"
    row = (f"{head} step {r.step:>5}  {t:>12}  victim {r.victim}  trigger {r.trigger or '-'}  "
           f"rule {r.rule}  lost {r.tokens_lost}  {r.confidence}")
    if r.probability is not None:
        from kvreplay.inference.uncertainty import LEAD_BELOW

        row += f"  p {r.probability:.2f}" + ("  lead" if r.probability < LEAD_BELOW else "")
    return row


def _hms(t: float, digits: int) -> str:
    frac = int((t % 1) * 10 ** digits)
    return time.strftime("%H:%M:%S", time.gmtime(t)) + f".{frac:0{digits}d}"
