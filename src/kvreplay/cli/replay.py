"""`kvreplay replay LOG...`: which requests were preempted, when, why, and what it cost."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from kvreplay.errors import ReplayError, UserError, write_output


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("logs", nargs="*", metavar="LOG",
                   help="vLLM server log(s) ('-' = stdin, .gz ok), a step-trace log with its "
                        "KV-event files, OpenTelemetry request-span files (OTLP/JSON or Jaeger JSON), "
                        "or a workload JSON (default: the embedded sample)")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.add_argument("-o", "--output", default="-", help="where to write the report (default stdout)")
    p.add_argument("--trace", metavar="TRACE.jsonl",
                   help="also write the replay's per-step trace (conformance format)")
    add_replay_inputs(p)


def add_replay_inputs(p: argparse.ArgumentParser) -> None:
    """The options that say how a log is replayed (every command that opens a `Replay` of
    a log: replay, export)."""
    p.add_argument("--profile", default="auto",
                   help="vLLM release whose scheduler rules apply (default: from the log)")
    p.add_argument("--step-time-ms", type=float, metavar="MS",
                   help="take every engine step to last MS milliseconds instead of fitting a "
                        "step-time model to the stats lines")
    p.add_argument("--samples", type=int, metavar="N",
                   help="replays in the uncertainty ensemble: N placements (and prompt "
                        "variants) the log cannot rule out, weighted by the stats lines; they "
                        "give the count's interval and each preemption's probability "
                        "(default: 32 for logs without Iteration lines, up to 2,000 "
                        "requests; 0: off)")
    p.add_argument("--seed", type=int, default=0, metavar="S",
                   help="seed of the ensemble's draws (same log and seed: same report)")
    p.add_argument("--vllm-version", help="the release that wrote the log, if not detected")
    p.add_argument("--config", metavar="CONFIG.json",
                   help="the engine config (vLLM's setting names: num_gpu_blocks, block_size, "
                        "max_num_seqs, max_num_batched_tokens, max_model_len, ...; or a "
                        "workload JSON's config) for request spans replayed without their log")
    p.add_argument("--year", type=int, help="year of the log's time stamps (they have none)")


def input_paths(paths: list[str], args: argparse.Namespace) -> list[str]:
    """`paths`, or the embedded sample (and its year) when none is given."""
    if paths:
        return paths
    from kvreplay.samples import DEFAULT_LOG, DEFAULT_LOG_YEAR, sample_path

    if args.year is None:
        args.year = DEFAULT_LOG_YEAR
    return [str(sample_path(DEFAULT_LOG))]


def step_time_of(args: argparse.Namespace) -> Any:
    """--step-time-ms as a step-time model (None: fitted), after checking --step-time-ms and
    --samples (one line each: UserError)."""
    from kvreplay.inference.clock import fixed_step_time

    if args.samples is not None and args.samples < 0:
        raise UserError("--samples must be 0 or more")
    if args.step_time_ms is None:
        return None
    if args.step_time_ms <= 0:
        raise UserError("--step-time-ms must be positive")
    return fixed_step_time(args.step_time_ms)


def open_from_args(paths: list[str], args: argparse.Namespace, scrapes: list | None = None) -> Any:
    """The `Replay` of `paths` under add_replay_inputs' options (`scrapes`: the same
    server's, read); raises ReplayError when the log is too thin."""
    from kvreplay.sources import open_replay

    step_time = step_time_of(args)
    return open_replay(paths, profile=args.profile, vllm_version=args.vllm_version,
                       year=args.year, samples=args.samples, seed=args.seed,
                       step_time=step_time, config=args.config, scrapes=scrapes)


class _Windows(list):
    """A default-log answer's windows for json's encoder (indent: its Python encoder, which
    asks a list only for its truth and its items): each window made a dict as it is
    written, not a million dicts first. Same bytes as the list of dicts."""

    def __init__(self, windows: list[Any]) -> None:
        super().__init__()
        self.windows = windows

    def __bool__(self) -> bool:
        return bool(self.windows)

    def __len__(self) -> int:
        return len(self.windows)

    def __iter__(self):
        import msgspec

        for w in self.windows:
            yield msgspec.to_builtins(w)


def default_log_answer(paths: list[str], metric_paths: list[str],
                       args: argparse.Namespace) -> tuple[Any, Any, str | None, list[str]]:
    """After a ReplayError: (the log read, its default-log answer or None, how the scrapes
    joined, what the log lacks). The answer is None unless the log is a default log (no
    request lines, stats lines: audit.default_report) and it could be answered."""
    from kvreplay.audit import default_report
    from kvreplay.parsers.span_files import spans_format
    from kvreplay.sources import read_log

    try:
        log = read_log([p for p in paths if p == "-" or spans_format(p) is None],
                       vllm_version=args.vllm_version, year=args.year)
        missing = list(log.facts.missing)
        log.events = []  # from here on only the facts are read: a long log's events go
    except UserError:
        return None, None, None, []
    ans = how = None
    if default_report.is_default_log(log.facts):
        try:
            ans, how = default_report.answer_for(log.facts, metric_paths, profile=args.profile,
                                                 samples=args.samples, seed=args.seed)
        except UserError as why:
            missing.append(f"no answer from its stats lines either: {why}")
    return log, ans, how, missing


def run(args: argparse.Namespace) -> int:
    from kvreplay.audit import default_report
    from kvreplay.audit.prom import looks_like_prometheus
    from kvreplay.cli.replay_report import render_table, to_json

    paths = input_paths(list(args.logs), args)
    metric_paths = [p for p in paths if p != "-" and looks_like_prometheus(p)]  # same server's
    paths = [p for p in paths if p not in metric_paths]
    if not paths:
        raise UserError("Prometheus scrapes are read beside their server's log: give the log too")
    t0 = time.perf_counter()
    log = None
    rep = None
    reason = ""
    scrapes = None
    if metric_paths:
        from kvreplay.audit.prom import read_scrapes

        scrapes = read_scrapes(metric_paths)
    try:
        rep = open_from_args(paths, args, scrapes)
    except ReplayError as exc:
        reason = str(exc)  # (the exception goes here, and with it its frames' parsed log)
    if rep is None:
        # say everything the log lacks, not only what stopped the replay; a default log:
        # the workloads its stats lines (and scrapes) allow, not a refusal
        log, ans, how, missing = default_log_answer(paths, metric_paths, args)
        if ans is not None:
            if args.format == "json":
                # written as encoded: json.dumps with indent joins millions of pieces (one
                # window per stats line) in memory first; the bytes are the same
                enc = json.JSONEncoder(indent=1, sort_keys=True)
                import msgspec

                data = default_report.to_dict(msgspec.structs.replace(ans, windows=[]), how)
                data["windows"] = _Windows(ans.windows)  # (one dict at a time)

                def put(f: Any) -> None:
                    for chunk in enc.iterencode(data):
                        f.write(chunk)
                    f.write("\n")

                write_output(args.output, put)
                return 0
            text = default_report.report_text(", ".join(paths), log.facts, ans, how)
            write_output(args.output, lambda f: f.write(text))
            return 0
        raise UserError(" | ".join([reason] + (["missing from this log: " + "; ".join(missing)]
                                                  if missing else []))) from None
    elapsed = time.perf_counter() - t0
    stdin = getattr(args, "_stdin", None)
    if stdin is not None:  # stdin is named as given
        rep.paths = [stdin.as_given(p) for p in rep.paths]
    if args.trace:
        import msgspec

        enc = msgspec.json.Encoder()
        records = rep.trace()
        write_output(args.trace, lambda f: [f.write(enc.encode(r).decode() + "\n") for r in records])
    report = to_json(rep)
    scrape_chk = None
    if metric_paths:  # the counters as evidence: each scrape replayed against logged
        from kvreplay.audit import join

        points, how = join.scrapes_for_facts(rep.facts, scrapes)
        scrape_chk = join.scrape_check(rep, points) if points else {"verdict": how, "windows": []}
        if report.get("verification") is None:  # (a step-trace log has no stats-line check)
            report["verification"] = {}
        report["verification"]["scrapes"] = scrape_chk
    if args.format == "json":
        text = json.dumps(report, indent=1, sort_keys=True, default=str) + "\n"
    else:
        text = render_table(rep, report, elapsed)
        if scrape_chk is not None:
            text += join.scrape_check_lines(scrape_chk)
    if stdin is not None:
        text = stdin.as_given(text)
    write_output(args.output, lambda f: f.write(text))
    div = rep.step_check.first_divergence if rep.step_check is not None else None
    return 1 if div else 0
