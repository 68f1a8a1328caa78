"""`kvreplay parse LOG... [-o events.jsonl] [--format jsonl|table|summary] [--strict]`.

Without LOG it parses the embedded sample and prints the summary. `-o FILE` always writes
JSON Lines to FILE (streamed, memory flat); stdout then gets the summary unless --format says
otherwise. Exit codes: 0 ok, 1 `--strict` and some line was unparsed, 2 user error (an
empty file or one with no vLLM line too: nothing is written then).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from typing import IO, Any, Iterable, Iterator

from kvreplay.errors import UserError

FORMATS = ("jsonl", "table", "summary")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("logs", nargs="*", metavar="LOG", help="vLLM log files ('-' = stdin, .gz ok); none = the embedded sample")
    p.add_argument("-o", "--output", metavar="EVENTS.jsonl", help="write the events as JSON Lines to this file")
    p.add_argument("--format", choices=FORMATS, help="what to print on stdout (default: jsonl, or summary with -o / no LOG)")
    p.add_argument("--strict", action="store_true", help="exit 1 if any line was not understood")
    p.add_argument("--vllm-version", metavar="V", help="the vLLM version that wrote the log (default: detected)")
    p.add_argument("--year", type=int, metavar="Y", help="year of the first time stamp (default: from the file's mtime)")
    p.add_argument("--engine", choices=("fast", "lark"), default="fast", help=argparse.SUPPRESS)


class Summary:
    """Streaming summary: counts per kind, unparsed examples, version, merged config, span."""

    def __init__(self, vllm_version: str | None) -> None:
        from kvreplay.events import EngineConfig, KvCapacity, Unparsed
        from kvreplay.parsers.version import Detector

        self._unparsed_t, self._config_t = Unparsed, (EngineConfig, KvCapacity)
        self.kinds: Counter[str] = Counter()
        self.lines: Counter[str] = Counter()
        self.unparsed: list[Any] = []
        self.n_unparsed = 0
        self.detector = Detector(vllm_version)
        self.config_events: list[Any] = []
        self.t0: float | None = None
        self.t1: float | None = None

    def feed(self, e: Any) -> None:
        kind = e.__struct_config__.tag
        self.kinds[kind] += 1
        self.lines[e.file] += e.lines
        if isinstance(e, self._unparsed_t):
            self.n_unparsed += 1
            if len(self.unparsed) < 5:
                self.unparsed.append(e)
        elif isinstance(e, self._config_t):
            self.config_events.append(e)
        self.detector.feed(e)
        t = e.time
        if t is not None:
            if self.t0 is None or t < self.t0:
                self.t0 = t
            if self.t1 is None or t > self.t1:
                self.t1 = t

    def render(self, out: IO[str]) -> None:
        import time

        from kvreplay.parsers import merge_config

        w = out.write
        total = sum(self.lines.values())
        w(f"files: {len(self.lines)}   lines: {total}   events: {sum(self.kinds.values())}\n")
        for f, n in self.lines.items():
            w(f"  {f}: {n} lines\n")
        if self.t0 is not None:
            fmt = "%Y-%m-%d %H:%M:%S"
            w(f"time: {time.strftime(fmt, time.gmtime(self.t0))} .. {time.strftime(fmt, time.gmtime(self.t1))} (server local time)\n")
        d = self.detector.result()
        w(f"vLLM version: {d.vllm_version or 'unknown'} ({d.how})   engine: {d.engine_version or 'unknown'}\n")
        w("events by kind:\n")
        for k, n in sorted(self.kinds.items(), key=lambda kv: (-kv[1], kv[0])):
            w(f"  {k:20s} {n}\n")
        cfg = merge_config(self.config_events)
        shown = {k: getattr(cfg, k) for k in cfg.__struct_fields__
                 if k not in ("origin", "file", "line", "lines", "time", "time_text", "level", "process", "pid", "engine", "source", "note")
                 and getattr(cfg, k) is not None}
        w("config (merged from startup lines):\n")
        if not shown:
            w("  (none logged)\n")
        for k, v in shown.items():
            w(f"  {k} = {v}\n")
        w(f"unparsed lines: {self.n_unparsed}\n")
        for e in self.unparsed:
            w(f"  {e.file}:{e.line}: {e.reason}: {e.text[:100]!r}\n")


def _table_row(e: Any) -> str:
    import msgspec

    d = msgspec.to_builtins(e)
    kind = d.pop("kind")
    for k in ("file", "line", "lines", "time", "time_text", "level", "process", "pid", "source", "note"):
        d.pop(k, None)
    body = ", ".join(f"{k}={_short(v)}" for k, v in d.items())
    where = f"{e.file.rsplit('/', 1)[-1]}:{e.line}"
    return f"{where:28s} {e.time_text or '':15s} {kind:18s} {body}\n"


def _short(v: Any) -> str:
    if isinstance(v, list) and len(v) > 6:
        return f"[{len(v)} items]"
    s = str(v)
    return s if len(s) <= 60 else s[:57] + "..."


VET_EVENTS = 50_000  # events held back, at most, until a vLLM line shows the input is a log


def _vetted(events: Iterable[Any], logs: list[str]) -> Iterator[Any]:
    """The events, once the input has shown a vLLM line: an empty file or one with no vLLM
    line (in its first VET_EVENTS events) is a UserError before anything is written. A file
    the reader could not finish (a corrupt or cut .gz, past the decompressed-size limit) is
    a UserError where it stops (what came before it is written; -o leaves no file)."""
    from kvreplay import events as ev
    from kvreplay.sources import check_vllm_log

    held: list[Any] = []
    it = iter(events)
    for e in it:
        held.append(e)
        if not isinstance(e, (ev.Unparsed, ev.Noise)) or len(held) >= VET_EVENTS:
            break
    if not held:
        raise UserError(f"{', '.join(logs)}: empty log")
    check_vllm_log(held, logs)
    yield from held
    for e in it:
        if e.note is not None and e.note.startswith("read error"):
            check_vllm_log([e], logs)  # (raises: unreadable at line N)
        yield e


def run(args: argparse.Namespace) -> int:
    from kvreplay.events import iter_encode_jsonl
    from kvreplay.errors import UserError
    from kvreplay.parsers import parse_files

    logs: list[str] = list(args.logs)
    year = args.year
    fmt = args.format
    if not logs:
        from kvreplay.samples import DEFAULT_LOG, DEFAULT_LOG_YEAR, sample_path

        logs = [str(sample_path(DEFAULT_LOG))]
        year = year if year is not None else DEFAULT_LOG_YEAR
        fmt = fmt or "summary"
    if fmt is None:
        fmt = "summary" if args.output else "jsonl"
    if logs.count("-") > 1:
        raise UserError("stdin ('-') can be given only once")

    for p in logs:
        if p != "-" and not os.path.exists(p):
            raise UserError(f"{p}: no such file")
    events = _vetted(parse_files(logs, year=year, vllm_version=args.vllm_version,
                                 engine=args.engine), logs)
    summary = Summary(args.vllm_version)
    out_file = None
    part = None
    if args.output:  # written beside and renamed at the end: bad input leaves nothing
        part = f"{args.output}.part"
        try:
            out_file = open(part, "wb")
        except OSError as exc:
            raise UserError(f"cannot write {args.output}: {exc.strerror or exc}") from None
    stdout = sys.stdout

    def tee(it: Iterable[Any]) -> Iterable[Any]:
        table = fmt == "table" and out_file is not None
        for e in it:
            summary.feed(e)
            if table:
                stdout.write(_table_row(e))
            yield e

    try:
        stream = tee(events)
        if out_file is not None or fmt == "jsonl":
            sinks = []
            if out_file is not None:
                sinks.append(out_file)
            if fmt == "jsonl":
                sinks.append(stdout.buffer)
            for chunk in iter_encode_jsonl(stream):
                for s in sinks:
                    s.write(chunk)
        elif fmt == "table":
            for e in stream:
                stdout.write(_table_row(e))
        else:
            for _ in stream:
                pass
        if fmt == "summary":
            summary.render(stdout)
        stdout.flush()
    except BaseException:
        if out_file is not None:
            out_file.close()
            os.unlink(part)  # type: ignore[arg-type]
        raise
    if out_file is not None:
        out_file.close()
        os.replace(part, args.output)  # type: ignore[arg-type]
    if args.strict and summary.n_unparsed:
        print(f"kvreplay parse: {summary.n_unparsed} line(s) not understood (--strict)", file=sys.stderr)
        return 1
    return 0
