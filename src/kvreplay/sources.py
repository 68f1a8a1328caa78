"""The one join of parsing and replay: input files -> events -> facts -> one `Replay`.

Every front end (the `replay`, `tui`, `audit` and `whatif` commands, the golden-log
plugin) opens its input here, so that each computes the same replay from the same bytes:

    open_replay(paths)   # a workload JSON, vLLM log file(s), a step-trace log (+ KV events)

It reads the files (parsers) into the inference's `Evidence` and calls its one entry point,
`inference.entry.infer`; a workload JSON goes to the model directly.

The only module (with the CLIs) that imports both kvreplay.parsers and the inference:
parsers -> events <- model <- inference <- front ends.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from kvreplay.errors import UserError
from kvreplay.inference.entry import Evidence, LogEvidence, SpanEvidence, infer


# Log files read once (events, release, config; facts on first use): the inference's type.
LogInput = LogEvidence


def read_log(paths: Sequence[str], *, vllm_version: str | None = None,
             year: int | None = None) -> LogInput:
    """Parse log files (merged by time) into events, once."""
    from kvreplay import events as ev
    from kvreplay.parsers import merge_config, parse_files
    from kvreplay.parsers.compact import EventList
    from kvreplay.parsers.version import Detector
    from kvreplay.progress import stage

    _check_exist(paths)
    # one pass: the events kept (stats lines packed: parsers.compact), the release detected
    # and the startup config's events set aside as they go by
    detector = Detector(vllm_version)
    config_events: list[Any] = []
    events = EventList()
    with stage(f"parse {', '.join(Path(p).name for p in paths)}"):
        for e in parse_files(list(paths), year=year, vllm_version=vllm_version):
            detector.feed(e)
            if isinstance(e, (ev.EngineConfig, ev.KvCapacity)):
                config_events.append(e)
            events.append(e)
    if not events:
        raise UserError(f"{', '.join(paths)}: empty log")
    check_vllm_log(events, paths)
    if len(paths) > 1:
        check_one_server(events, vllm_version)
    return LogInput(list(paths), events, detector.result(), merge_config(config_events))


def check_vllm_log(events: Sequence[Any], paths: Sequence[str]) -> None:
    """Input that is not a vLLM log is refused here, for every command: a file the reader
    could not finish (a truncated .gz), or with no vLLM line at all (and not a workload
    JSON). A replay or a record of nulls would pass for a quiet server."""
    from kvreplay import events as ev

    from kvreplay.parsers.reader import LABELS

    for e in events:
        if e.note and e.note.startswith("read error"):
            # named by its path (the spooled stdin's is shown as `-`), not its events' label
            name = next((p for p in paths if LABELS.get(p) == e.file), e.file)
            raise UserError(f"{name}: unreadable at line {e.line}: {e.note[len('read error: '):]}")
    if (all(isinstance(e, (ev.Unparsed, ev.Noise)) for e in events)
            and not (len(paths) == 1 and _workload_file(paths[0]))):
        n = len(events)
        label = ", ".join(paths)
        what = "binary data" if any(_binary(p) for p in paths) else \
            f"no vLLM log line in its {n} line{'s' if n != 1 else ''}"
        raise UserError(f"{label}: not a vLLM log ({what})")


def check_one_server(events: Sequence[Any], vllm_version: str | None) -> None:
    """Several files are replayed as one server's log (merged by time): refuse files that
    cannot be one server's: different releases or engines (unless --vllm-version says
    which), different models, or two servers started and logging over the same time."""
    from kvreplay import events as ev
    from kvreplay.parsers import detect_version

    by_file: dict[str, list[Any]] = {}
    for e in events:
        by_file.setdefault(e.file, []).append(e)
    if len(by_file) < 2:
        return
    from kvreplay.cli.clocks import check_clocks  # the files' clocks (refuses, or warns)

    for w in check_clocks(by_file):
        import sys
        print(f"kvreplay: warning: {w}", file=sys.stderr)
    info = {}
    for f, evs in by_file.items():
        d = detect_version(evs, None)
        models = {e.model for e in evs if isinstance(e, ev.EngineConfig) and e.model}
        # a server started in this file and took requests in it (an API-server log beside
        # its engine core's may start too, but only one of them logs the requests)
        started = (any(isinstance(e, ev.EngineConfig) for e in evs)
                   and any(isinstance(e, ev.RequestReceived) for e in evs))
        times = [e.time for e in evs if e.time is not None]
        span = (min(times), max(times)) if times else None
        info[f] = (d, models, started, span)
    files = list(info)
    for i, a in enumerate(files):
        for b in files[i + 1:]:
            da, ma, sa, ta = info[a]
            db, mb, sb, tb = info[b]
            if vllm_version is None and da.how != "unknown" and db.how != "unknown" and (
                    da.vllm_version != db.vllm_version or da.engine_version != db.engine_version):
                raise UserError(
                    f"{a} is vLLM {da.vllm_version} ({da.engine_version or '?'} engine), {b} is "
                    f"vLLM {db.vllm_version} ({db.engine_version or '?'} engine): files of "
                    "different servers are not one log; give one server's files (or "
                    "--vllm-version V if they are one release)")
            if ma and mb and not ma & mb:
                raise UserError(f"{a} serves {', '.join(sorted(ma))}, {b} serves "
                                f"{', '.join(sorted(mb))}: files of different servers are not "
                                "one log; replay each on its own")
            if sa and sb and ta and tb and ta[0] < tb[1] and tb[0] < ta[1]:
                raise UserError(f"{a} and {b} each start a server and log over the same time: "
                                "two servers, not one log; replay each on its own")


PRECHECK_LINES = 2000  # lines of a log read before a front end commits to it
PRECHECK_BYTES = 16 << 20  # and at most this much of it (decompressed)


def precheck_inputs(paths: Sequence[str]) -> None:
    """What check_vllm_log says, from the head of each file only: for a front end (the
    TUI) that must refuse bad input before it takes the screen. UserError as read_log."""
    import gzip
    import zlib

    from kvreplay.parsers import parse_lines

    _check_exist(paths)
    for p in paths:
        if p == "-":
            continue
        if Path(p).is_dir():
            raise UserError(f"{p}: is a directory, not a log file")
        if looks_like_workload(p) and _workload_file(p):
            continue
        try:
            raw = open(p, "rb")
            if raw.read(2) == b"\x1f\x8b":
                raw.seek(0)
                raw = gzip.GzipFile(fileobj=raw)  # type: ignore[assignment]
            else:
                raw.seek(0)
            with raw:
                data = raw.read(PRECHECK_BYTES)  # (bounded: a gzip bomb is not read through)
        except (OSError, EOFError, zlib.error) as exc:
            raise UserError(f"{p}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
        whole = len(data) < PRECHECK_BYTES
        parts = data.split(b"\n")
        if parts and not parts[-1]:
            parts.pop()
        if not whole and parts:
            parts.pop()  # a line cut by the read
        head = [b.decode("utf-8", "replace") for b in parts[:PRECHECK_LINES]]
        if not head:
            raise UserError(f"{p}: empty log")
        from kvreplay.parsers.span_files import spans_format
        from kvreplay.parsers.kv_event_files import is_kv_events_file

        if spans_format(p) is not None or is_kv_events_file(p):
            continue
        events = list(parse_lines(head, file=p))
        if (whole and len(head) < PRECHECK_LINES) or not all(
                type(e).__name__ in ("Unparsed", "Noise") for e in events):
            check_vllm_log(events, [p])


def _workload_file(path: str) -> bool:
    """A workload JSON (its reader takes it): the one input here that has no log line."""
    if not looks_like_workload(path):
        return False
    from kvreplay.replay.workload import load_workload

    try:
        load_workload(path)
    except UserError:
        return False
    return True


def _binary(path: str) -> bool:
    """The file's first bytes (decompressed) hold a NUL or are mostly not UTF-8."""
    import gzip
    import zlib

    try:
        with open(path, "rb") as raw:
            head = raw.read(4096)
            if head[:2] == b"\x1f\x8b":
                raw.seek(0)
                head = gzip.GzipFile(fileobj=raw).read(4096)
    except (OSError, EOFError, zlib.error):
        return False
    if b"\x00" in head:
        return True
    text = head.decode("utf-8", "replace")
    return text.count("\ufffd") > len(text) // 10


def read_facts(paths: Sequence[str], *, vllm_version: str | None = None, year: int | None = None):
    """Parse log files into `LogFacts`."""
    return read_log(paths, vllm_version=vllm_version, year=year).facts


def open_replay(paths: Sequence[str | Path], *, profile: str | None = None,
                vllm_version: str | None = None, year: int | None = None,
                samples: int | None = None, seed: int = 0, step_time: Any = None,
                log: LogInput | None = None, check_capacity: bool = True,
                config: str | None = None, scrapes: list | None = None, window: Any = None):
    """The `Replay` of a workload JSON (conformance format, V1 or V0), of vLLM log files,
    or of a log written with kvreplay's step-trace scheduler (with KV-event files beside
    it, checked block by block). `log`: the same files already read (read_log). Request
    span files beside a log are joined to it; spans alone (or beside a log with no request
    lines) are the workload, with the engine config of `config` (a JSON file:
    inference.span_workload.config_from_json) or of the log's startup lines. `scrapes`:
    the same server's Prometheus scrapes (audit.prom.read_scrapes), joined to the log's
    clock; their preemption counter weighs the uncertainty ensemble's members. `window`:
    a log replayed from a carried engine state (inference.start_state.Window: watch)."""
    paths = [str(p) for p in paths]
    if not paths:
        raise UserError("nothing to open: give a workload JSON or vLLM log files")
    _check_exist(paths)
    profile = None if profile in (None, "auto") else profile
    from kvreplay.parsers.span_files import spans_format

    span_paths = [p for p in paths if p != "-" and spans_format(p) is not None]
    if span_paths:
        paths = [p for p in paths if p not in span_paths]
        if not paths and config is None:
            raise UserError("request spans are joined to a server log by request id: give "
                            "the log too (kvreplay replay LOG SPANS.jsonl), or the engine "
                            "config to replay the spans alone (--config CONFIG.json)")
        if not paths:
            return infer(Evidence(spans=_read_spans(span_paths), vllm_version=vllm_version,
                                  config=_config(config) if config is not None else None),
                         profile=profile, step_time=step_time, seed=seed)
    elif config is not None:
        raise UserError("--config gives the engine config of request spans replayed alone; "
                        "a log or workload carries its own")
    if len(paths) == 1 and looks_like_workload(paths[0]):
        if span_paths:
            raise UserError("request spans are read beside a vLLM log, not a workload JSON")
        from kvreplay.replay.result import replay_workload
        from kvreplay.replay.workload import load_workload

        return replay_workload(load_workload(paths[0]), profile=profile,
                               label=f"workload {Path(paths[0]).name}", paths=paths,
                               check_capacity=check_capacity)
    from kvreplay.parsers.kv_event_files import is_kv_events_file, read_kv_events

    kv_paths = [p for p in paths if p != "-" and is_kv_events_file(p)]
    logs = [p for p in paths if p not in kv_paths]
    if kv_paths and not logs:
        raise UserError("a KV-event file is checked against a server log: give the log too")
    if log is None and logs:
        log = read_log(logs, vllm_version=vllm_version, year=year)
    from kvreplay.inference.step_trace import has_step_trace

    evidence = Evidence(log=log, kv_paths=kv_paths, vllm_version=vllm_version,
                        config=_config(config) if config is not None else None)
    if scrapes and log is not None:
        from kvreplay.audit.join import scrapes_for_facts

        evidence.counters = scrapes_for_facts(log.facts, scrapes)[0]
    trace = log is not None and has_step_trace(log.events)
    if span_paths and (trace or log is not None and log.span_join is not None):
        # not read: a step trace leaves them unused; else joined already (the same files)
        evidence.spans = SpanEvidence(span_paths, [], [])
    elif span_paths:
        evidence.spans = _read_spans(span_paths)
    if kv_paths and trace:
        evidence.kv_events = [r for p in kv_paths for r in read_kv_events(p)]
    return infer(evidence, profile=profile, step_time=step_time, samples=samples, seed=seed,
                 window=window)


def _config(path: str) -> Any:
    """--config: the engine config of request spans replayed alone."""
    from kvreplay.inference.span_workload import config_from_json

    return config_from_json(path)


def _read_spans(span_paths: list[str]) -> SpanEvidence:
    """The request spans of their files, with the lines not read."""
    from kvreplay.parsers.span_files import read_spans
    from kvreplay.progress import stage

    spans, problems = [], []
    with stage(f"read spans {', '.join(Path(p).name for p in span_paths)}"):
        for p in span_paths:
            s, pr = read_spans(p)
            spans += s
            problems += pr
    return SpanEvidence(list(span_paths), spans, problems)


def replay_logs(paths: Sequence[str], **kw: Any):
    """The `Replay` of vLLM log files (see open_replay)."""
    return open_replay(paths, **kw)


def looks_like_workload(path: str) -> bool:
    if path.endswith(".json"):
        return True
    try:
        with open(path, "rb") as f:
            head = f.read(64).lstrip()
    except OSError:
        return False
    return head.startswith(b"{") and b'"config"' in head or head.startswith(b'{"name"')


def _check_exist(paths: Sequence[str]) -> None:
    for p in paths:
        if p != "-" and not Path(p).exists():
            raise UserError(f"{p}: no such file")
