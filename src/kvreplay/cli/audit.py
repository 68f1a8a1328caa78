"""`kvreplay audit LOG...`: one record per log (per engine for data-parallel logs)."""

from __future__ import annotations

import argparse
import os
import sys

from kvreplay.errors import UserError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("logs", nargs="+", metavar="LOG",
                   help="vLLM server logs (.log/.gz), Prometheus scrape files (.prom, several "
                   "scrapes each) or folders of them; each file is one log")
    p.add_argument("--format", choices=("table", "json", "markdown", "parquet"), default="table")
    p.add_argument("-o", "--output", metavar="PATH", default="-",
                   help="write here instead of stdout (required for parquet); an HTML report "
                   "with the plots is written next to it")
    p.add_argument("--html", metavar="PATH", help="write the HTML report (inline SVG plots) here")
    p.add_argument("--fail-on", metavar="EXPR",
                   help="exit 1 when EXPR holds for any record, e.g. 'recompute_ratio > 0.05' "
                   "(fields, numbers, 'strings', comparisons, and/or/not)")
    p.add_argument("-j", "--jobs", type=int, default=None,
                   help="parallel processes (default: one per CPU, at most one per log)")
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


def run(args: argparse.Namespace) -> int:
    from kvreplay.audit import audit_many, expand_paths
    from kvreplay.audit import report
    from kvreplay.audit.expr import compile_fail_on

    expr = compile_fail_on(args.fail_on) if args.fail_on is not None else None  # fail fast
    if args.format == "parquet" and args.output in (None, "-"):
        raise UserError("--format parquet needs -o PATH")
    if args.jobs is not None and args.jobs < 1:
        raise UserError("--jobs must be >= 1")
    paths = expand_paths(args.logs)

    def warn(path, msg):
        print(f"kvreplay audit: {path}: {msg}", file=sys.stderr)

    df = audit_many(paths, jobs=args.jobs, profile=args.profile, replay=not args.no_replay,
                    year=args.year, on_error=warn)
    rows = df.to_dicts()
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
    if expr is not None:
        hits = [r for r in rows if expr.evaluate(r)]
        if hits:
            for r in hits:
                eng = "" if r.get("engine") is None else f" (engine {r['engine']})"
                vals = ", ".join(f"{n}={report.fmt(r.get(n), n)}" for n in expr.names)
                print(f"kvreplay audit: --fail-on {args.fail_on!r} holds for {r['log']}{eng}: {vals}",
                      file=sys.stderr)
            return 1
    return 0
