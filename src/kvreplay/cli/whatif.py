"""`kvreplay whatif LOG --max-num-seqs 16,32,64 [--concurrency 16,32,48,64] ...`"""

from __future__ import annotations

import argparse
import os
import sys

from kvreplay.errors import UserError


def _ints(name: str):
    def parse(text: str) -> list[int]:
        out = []
        for part in text.split(","):
            part = part.strip().replace("_", "")
            if not part:
                continue
            try:
                v = int(part)
            except ValueError:
                raise argparse.ArgumentTypeError(f"{name}: {part!r} is not an integer (give e.g. 16,32,64)") from None
            if v < 1:
                raise argparse.ArgumentTypeError(f"{name}: {v} must be >= 1")
            out.append(v)
        if not out:
            raise argparse.ArgumentTypeError(f"{name}: no values")
        return list(dict.fromkeys(out))
    return parse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("log", nargs="+", metavar="LOG", help="the vLLM server log (several files of one server are merged)")
    g = p.add_argument_group("settings (vLLM's flag names; comma-separated values are swept)")
    g.add_argument("--max-num-seqs", type=_ints("--max-num-seqs"), metavar="N,...")
    g.add_argument("--num-gpu-blocks", "--num-gpu-blocks-override", dest="num_gpu_blocks",
                   type=_ints("--num-gpu-blocks"), metavar="N,...", help="KV cache size in blocks")
    g.add_argument("--max-num-batched-tokens", type=_ints("--max-num-batched-tokens"), metavar="N,...")
    g.add_argument("--max-model-len", type=_ints("--max-model-len"), metavar="N,...")
    g.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None)
    g.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--concurrency", type=_ints("--concurrency"), metavar="N,...",
                   help="closed loop with N clients (as vllm bench serve --max-concurrency), "
                   "for every setting; prints the knee of throughput vs concurrency")
    p.add_argument("--grid", action="store_true", help="every combination of the settings instead of one variable at a time")
    p.add_argument("--format", choices=("table", "json", "markdown", "parquet"), default="table")
    p.add_argument("-o", "--output", metavar="PATH", default="-", help="write here (an HTML report with the plots goes next to it)")
    p.add_argument("--html", metavar="PATH", help="write the HTML report here")
    p.add_argument("-j", "--jobs", type=int, default=None, help="parallel processes (default: one per CPU)")
    p.add_argument("--samples", type=int, default=None, metavar="N",
                   help="uncertainty ensemble of a log that cannot pin every arrival (default: "
                   "as kvreplay replay; 0: off); rows' intervals re-run some of its members")
    p.add_argument("--draws", type=int, default=None, metavar="N",
                   help="step-time models drawn for each row's range (default 6; with --samples 0 "
                   "as well: no ranges)")
    p.add_argument("--profile", default=None, help="vLLM release whose scheduler rules apply (default: the log's)")
    p.add_argument("--year", type=int, default=None)


def _default_log_sweep(args: argparse.Namespace, settings: list) -> tuple[dict | None, object]:
    """The sweep of a default log (no request lines; with the same server's scrapes among
    the inputs): over the workloads its stats lines allow (audit/whatif_default.py). None
    for a log with request lines (the replay's what-if); scrapes beside such a log are
    refused. Also the log read (the replay's what-if reads it once)."""
    from kvreplay.audit import whatif_default
    from kvreplay.audit.default_report import is_default_log
    from kvreplay.audit.prom import looks_like_prometheus
    from kvreplay.sources import read_log

    metric = [p for p in args.log if p != "-" and looks_like_prometheus(p)]
    logs = [p for p in args.log if p not in metric]
    if not logs:
        raise UserError("Prometheus scrapes are read beside their server's log: give the log too")
    if "-" in logs:
        if metric:
            raise UserError("scrapes go with a log file, not stdin")
        return None, None
    log = read_log(logs, year=args.year)
    if not is_default_log(log.facts):
        if metric:
            raise UserError("what-if reads scrapes beside a default log (no request lines) "
                            "only; this log has request lines: drop the scrapes")
        return None, log
    ctx = whatif_default.load(log, logs, metric, profile=args.profile, samples=args.samples)
    return whatif_default.sweep(ctx, settings, args.concurrency, jobs=args.jobs), log


def run(args: argparse.Namespace) -> int:
    import json

    from kvreplay.audit import report
    from kvreplay.audit import whatif_replays as whatif

    knobs = {}
    for k in whatif.KNOBS:
        v = getattr(args, k, None)
        if v is None:
            continue
        knobs[k] = v if isinstance(v, list) else [v]
    if not knobs and not args.concurrency:
        raise UserError("give at least one setting to change (e.g. --max-num-seqs 16,32,64) or --concurrency")
    if args.format == "parquet" and args.output in (None, "-"):
        raise UserError("--format parquet needs -o PATH")
    if args.jobs is not None and args.jobs < 1:
        raise UserError("--jobs must be >= 1")
    settings = whatif.plan(knobs, grid=args.grid)
    if len(settings) * max(1, len(args.concurrency or [])) > 400:
        raise UserError(f"{len(settings)} settings x {len(args.concurrency or [1])} concurrencies is too many runs (max 400)")
    if args.samples is not None and args.samples < 0 or args.draws is not None and args.draws < 0:
        raise UserError("--samples and --draws must be >= 0")
    res, log = _default_log_sweep(args, settings)
    if res is None:
        ctx = whatif.load(args.log, profile=args.profile, year=args.year, samples=args.samples,
                          draws=whatif.DRAWS if args.draws is None else args.draws, log=log)
        res = whatif.sweep(ctx, settings, args.concurrency, jobs=args.jobs)
    if args.format == "parquet":
        import polars as pl

        pl.DataFrame(res["rows"], infer_schema_length=None).write_parquet(args.output)
    else:
        if args.format == "json":
            text = json.dumps(res, indent=1, default=str) + "\n"
        else:
            text = report.whatif_text(res, markdown=args.format == "markdown")
        stdin = getattr(args, "_stdin", None)
        if stdin is not None:  # stdin is named as given
            text = stdin.as_given(text)
        if args.output in (None, "-"):
            sys.stdout.write(text)
        else:
            with open(args.output, "w", encoding="utf-8") as f:
                f.write(text)
    html = args.html or (os.path.splitext(args.output)[0] + ".html" if args.output not in (None, "-") else None)
    if html:
        with open(html, "w", encoding="utf-8") as f:
            f.write(report.whatif_html(res))
        print(f"kvreplay whatif: report {html}", file=sys.stderr)
    return 0
