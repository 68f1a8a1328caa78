"""`kvreplay audit LOG...`: one record per log (per engine for data-parallel logs).
`-o DIR/` writes the fleet dataset (kvreplay.audit.fleet); `--summarize DIR/` reads it."""

from __future__ import annotations

import argparse
import os
import sys

from kvreplay.errors import UserError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("logs", nargs="*", metavar="LOG",
                   help="vLLM server logs (.log/.gz), Prometheus scrape files (.prom, several "
                   "scrapes each), folders or globs of them; each file is one log")
    p.add_argument("--format", choices=("table", "json", "markdown", "parquet"), default="table")
    p.add_argument("-o", "--output", metavar="PATH", default="-",
                   help="write here instead of stdout (required for parquet); an HTML report "
                   "with the plots is written next to it. A folder (DIR/, ending in '/', or "
                   "an existing folder): the fleet dataset, one Parquet file per log, "
                   "hive-partitioned by day and deployment")
    p.add_argument("--executor", default="local", metavar="local|dask[:ADDRESS]",
                   help="where logs are audited: local processes (default); dask: a "
                   "dask.distributed LocalCluster; dask:tcp://host:8786: an existing "
                   "scheduler (needs kvreplay[fleet])")
    p.add_argument("--summarize", metavar="DIR",
                   help="print the fleet tables of a dataset written with -o DIR/")
    p.add_argument("--force", action="store_true",
                   help="-o DIR/: audit again the logs the dataset already has")
    p.add_argument("--retry-errors", action="store_true",
                   help="-o DIR/: audit again the logs whose rows are error rows")
    p.add_argument("--html", metavar="PATH", help="write the HTML report (inline SVG plots) here")
    p.add_argument("--fail-on", metavar="EXPR",
                   help="exit 1 when EXPR holds for any record, e.g. 'recompute_ratio > 0.05' "
                   "(fields, numbers, 'strings', comparisons, and/or/not)")
    p.add_argument("-j", "--jobs", type=int, default=None,
                   help="parallel processes, or LocalCluster workers (default: one per CPU, "
                   "at most one per log)")
    p.add_argument("--profile", default=None, help="vLLM release whose scheduler rules the replay uses (default: the log's)")
    p.add_argument("--no-replay", action="store_true", help="only the stats lines and config: faster, no replay fields")
    p.add_argument("--year", type=int, default=None, help="year of the log's timestamps (default: the file's mtime)")


def _html_path(args) -> str | None:
    if args.html:
        return args.html
    if args.output not in (None, "-"):
        root, _ = os.path.splitext(args.output)
        return root + ".html"
    return None


def _is_dataset(out: str) -> bool:
    return out not in (None, "-") and (out.endswith(("/", os.sep)) or os.path.isdir(out))


def run(args: argparse.Namespace) -> int:
    from kvreplay.audit.expr import compile_fail_on
    from kvreplay.audit.fleet import parse_spec

    expr = compile_fail_on(args.fail_on) if args.fail_on is not None else None  # fail fast
    if args.summarize:
        return _summarize(args)
    if not args.logs:
        raise UserError("give logs to audit (LOG, DIR or GLOB ...), or --summarize DIR/")
    dataset = _is_dataset(args.output)
    if args.format == "parquet" and args.output in (None, "-"):
        raise UserError("--format parquet needs -o PATH")
    if dataset and args.format not in ("table", "parquet"):
        raise UserError(f"-o {args.output}: a folder is the Parquet dataset; --format "
                        f"{args.format} needs -o FILE")
    if (args.force or args.retry_errors) and not dataset:
        raise UserError("--force / --retry-errors apply to a dataset (-o DIR/)")
    if args.jobs is not None and args.jobs < 1:
        raise UserError("--jobs must be >= 1")
    parse_spec(args.executor)
    from kvreplay.audit import expand_paths

    paths = expand_paths(args.logs)
    from kvreplay.parsers.span_files import spans_format

    span_paths = [p for p in paths if p != "-" and spans_format(p) is not None]
    paths = [p for p in paths if p not in span_paths]
    if span_paths and (len(paths) != 1 or dataset):
        raise UserError("request spans are joined to one server's log by request id: give "
                        "one log with them (kvreplay audit LOG SPANS.jsonl)")
    from kvreplay.audit import join

    # a log and the scrapes of the same server: one input, one joined record
    paths, metrics = join.pair(paths, year=args.year)
    if dataset:
        return _write_dataset(args, paths, expr, metrics)
    from kvreplay.audit import audit_many, records_to_frame, report
    from kvreplay.audit.record import audit_records

    stdin = getattr(args, "_stdin", None)
    warnings: list[str] = []

    def warn(path, msg):  # printed once the rows are in (or as the one error line)
        text = _about(path, msg)
        warnings.append(stdin.as_given(text) if stdin is not None else text)

    if span_paths:  # one server: its log and spans, audited here
        df = records_to_frame(audit_records(paths + span_paths + list(dict(metrics).get(paths[0], ())),
                                            profile=args.profile, replay=not args.no_replay,
                                            year=args.year))
    else:
        ex = _executor(args, len(paths))
        try:
            df = audit_many(paths, profile=args.profile, replay=not args.no_replay,
                            year=args.year, on_error=warn, executor=ex, metrics=metrics)
        finally:
            ex.close()
    rows = df.to_dicts()
    if stdin is not None and stdin.path is not None:
        for r in rows:  # stdin is named as given
            r["log"] = stdin.as_given(r["log"])
        if "log" in df.columns:
            import polars as pl

            df = df.with_columns(pl.col("log").str.replace(stdin.path, "-", literal=True))
    failed = _unaudited(rows)
    if failed and len(failed) == len({r["log"] for r in rows}):
        # nothing could be audited: no output, exit 2 with the reason (one line per input)
        if len(warnings) == 1:
            raise UserError(warnings[0])
        for w in warnings:
            print(f"kvreplay audit: {w}", file=sys.stderr)
        raise UserError(f"none of the {_count(len(failed), 'input')} could be audited")
    for w in warnings:
        print(f"kvreplay audit: {w}", file=sys.stderr)
    if args.format == "parquet":
        df.write_parquet(args.output)
    else:
        if args.format == "json":
            text = report.to_json(rows)
        else:
            text = report.audit_text(rows, markdown=args.format == "markdown")
        if args.output in (None, "-"):
            sys.stdout.write(text)
            sys.stdout.flush()
        else:
            with open(args.output, "w", encoding="utf-8") as f:
                f.write(text)
    html = _html_path(args)
    if html:
        with open(html, "w", encoding="utf-8") as f:
            f.write(report.audit_html(rows))
        print(f"kvreplay audit: report {html}", file=sys.stderr)
    code = _fail_on(args, expr, [r for r in rows if not r.get("error")])
    if failed:  # a gate never passes on input it could not read
        print(f"kvreplay audit: {len(failed)} of {_count(len({r['log'] for r in rows}), 'input')} "
              "could not be audited (error rows)", file=sys.stderr)
        return 2
    return code


def _unaudited(rows) -> list[str]:
    """The inputs whose rows are error rows (unreadable, not a vLLM log, ...)."""
    return sorted({r["log"] for r in rows if r.get("error")})


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _about(path: str, msg: str) -> str:
    return msg if msg.startswith(path) else f"{path}: {msg}"


def _executor(args, n: int):
    from kvreplay.audit.fleet import make_executor, parse_spec

    kind, _ = parse_spec(args.executor)
    if args.jobs:
        workers = args.jobs
    elif kind == "local":
        workers = max(1, min(n, os.cpu_count() or 1))
    else:
        workers = None  # a LocalCluster: one per CPU; a scheduler: its own workers
    return make_executor(args.executor, workers)


def _write_dataset(args, paths: list[str], expr, metrics=()) -> int:
    from kvreplay.audit.fleet import Options, run as run_fleet

    out = args.output
    os.makedirs(out, exist_ok=True)
    ex = _executor(args, len(paths))
    done = False
    try:
        fr = run_fleet(paths, ex, options=Options(args.profile, not args.no_replay, args.year, metrics),
                       out_dir=out, force=args.force, retry_errors=args.retry_errors)
        done = True
    except KeyboardInterrupt:  # main() prints it: one line
        raise KeyboardInterrupt(f"interrupted; {out} holds whole files only: run the same "
                                "command again to continue") from None
    finally:
        ex.close(cancel=not done)
    for path, reason in fr.errors:
        print(f"kvreplay audit: {_about(path, reason)}", file=sys.stderr)
    peak = max(fr.peak_rss_kb.values(), default=0)
    print(f"kvreplay audit: {fr.inputs} logs ({fr.executor}): {fr.status()}; {fr.seconds:.1f} s"
          + (f", peak worker RSS {peak / 1024:.0f} MiB" if peak else "")
          + f"; dataset {out}", file=sys.stderr)
    if fr.errors:  # a gate never passes on input it could not read
        print(f"kvreplay audit: {len(fr.errors)} of {_count(fr.inputs, 'input')} could not be "
              "audited (error rows in the dataset; --retry-errors audits them again)",
              file=sys.stderr)
        return 2
    if expr is None:
        return 0
    from kvreplay.audit.fleet.dataset import scan_dataset
    import polars as pl

    rows = (scan_dataset(out).select(list(dict.fromkeys(["log", "engine", *expr.names])))
            .filter(pl.col("log").is_in(paths)).collect().to_dicts())
    return _fail_on(args, expr, rows)


def _fail_on(args, expr, rows) -> int:
    from kvreplay.audit import report

    if expr is None:
        return 0
    hits = [r for r in rows if expr.evaluate(r)]
    if not hits:
        return 0
    for r in hits:
        eng = "" if r.get("engine") is None else f" (engine {r['engine']})"
        vals = ", ".join(f"{n}={report.fmt(r.get(n), n)}" for n in expr.names)
        print(f"kvreplay audit: --fail-on {args.fail_on!r} holds for {r['log']}{eng}: {vals}",
              file=sys.stderr)
    return 1


def _summarize(args) -> int:
    import json

    from kvreplay.audit.fleet import summarize, summary_text

    if args.logs:
        raise UserError("--summarize DIR/ reads a dataset; give no logs with it")
    s = summarize(args.summarize)
    if args.format == "json":
        text = json.dumps(s, indent=1, ensure_ascii=False, default=str) + "\n"
    elif args.format in ("table", "markdown"):
        text = summary_text(s, markdown=args.format == "markdown")
    else:
        raise UserError("--summarize prints table, markdown or json")
    if args.output in (None, "-"):
        sys.stdout.write(text)
    else:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)
    return 0
