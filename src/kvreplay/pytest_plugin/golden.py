"""Golden files for kvreplay: build, render, parse, select and compare (no pytest import).

A golden file is what kvreplay makes of one input (a vLLM log, or a workload JSON), written
so that a code review can read it and a change shows as a small diff:

    # kvreplay golden file: written by `pytest --kvreplay-update`; review it like code.
    [input]
    files = ["vllm033_fcfs_heavy.reqbody.log"]
    kind = log
    ...
    [events]                        counts per event kind (logs)
    [version]                       detected vLLM version (logs)
    [config]                        engine / scheduler configuration
    [workload]                      name and request count (workloads)
    [replay]                        totals of the replay, or `error = "..."` when it cannot run
    [preemptions]                   one line per preemption, fixed column order:
    step=41 victim=r3 trigger=r3 self=true rule="fcfs: running[-1]" lost=240 recompute=241 prefix_hit=0 readmitted=150
    [default_log]                   a default log (no request lines): its answer's 90% intervals
    [windows]                       ... and its preemptions per stats interval, one line each:
    start=10:01:00 end=10:01:01 median=2 low=0 high=4

Keys inside a section are sorted. Values are JSON, except that plain words are written bare
and a missing value is `-`. Comment lines (`#`) and blank lines are not compared.

Public functions (the CLI can reuse them):
    build(source, *, kind=None, profile=None, vllm_version=None, year=None) -> Golden
and, from golden_text.py (the file's text), render, parse, select and compare.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from kvreplay.events import LINE_FIELDS
from kvreplay.pytest_plugin.golden_text import (  # noqa: F401  (the golden API, one import)
    COLUMN_HELP, COLUMNS, LIST_SECTIONS, SECTIONS, WINDOW_COLUMNS, Doc, GoldenUsageError, Mismatch,
    compare, decode, doc_lines, encode, normalize_fields, parse, parse_record, render,
    render_record, select,
)

LOG_REPLAY_NOTE = (
    "NOTE: [replay] and [preemptions] come from log replay (rebuilt workload, fitted",
    "step times), which kvreplay is still tuning: when it improves, refresh this file",
    "with `pytest --kvreplay-update` and review the diff.",
)

DEFAULT_LOG_NOTE = (
    "NOTE: a default log (no request lines): [default_log] and [windows] are 90% intervals",
    "over the workloads its stats lines allow (drawn with seed 0; no victim can be named);",
    "when kvreplay's inference improves, refresh with `pytest --kvreplay-update`.",
)

_LOCATION_FIELDS = LINE_FIELDS | {"origin"}  # where a config line was, not what it says
_SUMMARY_KEYS = (
    "profile",
    "requests",
    "steps",
    "preemptions",
    "self_preemptions",
    "requests_preempted",
    "computed_tokens_lost",
    "tokens_recomputed",
    "prompts",
    "output_lengths",
    "cut_short",
)


@dataclass
class Golden:
    """What kvreplay made of one input: the document plus what the header should say."""

    doc: Doc
    kind: str  # "log" | "workload"
    from_log_replay: bool = False  # the replay sections depend on log-replay heuristics
    default_log: bool = False  # [default_log] and [windows]: a default log's answer

    def header(self, source_label: str | None = None, fields: Sequence[str] | None = None) -> list[str]:
        out = ["kvreplay golden file: written by `pytest --kvreplay-update`; review it like code."]
        if source_label:
            out.append(f"source: {source_label}")
        if fields:
            out.append("compared fields: " + ", ".join(fields))
        if self.default_log:
            out.extend(DEFAULT_LOG_NOTE)
        elif self.from_log_replay:
            out.extend(LOG_REPLAY_NOTE)
        return out


# ---------------------------------------------------------------- build
def build(
    source: str | Path | Sequence[str | Path] | Mapping[str, Any],
    *,
    kind: str | None = None,
    profile: str | None = None,
    vllm_version: str | None = None,
    year: int | None = None,
) -> Golden:
    """Parse and replay `source` (log file(s), a workload file, or a workload dict).

    kind: "log" | "workload" (default: a dict or a `.json` file is a workload, else a log).
    profile: scheduler profile to replay with (vLLM release, e.g. "0.33"); default: the
        one the log's version selects (logs) or kvreplay's default (workloads).
    vllm_version: logs only: the vLLM version the log is from, instead of detecting it.
    """
    if isinstance(source, Mapping):
        kind = kind or "workload"
        if kind != "workload":
            raise GoldenUsageError("a dict source is a workload; kind must be 'workload'")
        return _build_workload(dict(source), "<dict>", profile)
    paths = [str(source)] if isinstance(source, (str, Path)) else [str(p) for p in source]
    if not paths:
        raise GoldenUsageError("no source given")
    if kind is None:
        kind = "workload" if len(paths) == 1 and paths[0].endswith(".json") else "log"
    if kind == "workload":
        if len(paths) != 1:
            raise GoldenUsageError("a workload source is one JSON file")
        from kvreplay.replay.workload import load_workload

        return _build_workload(load_workload(paths[0]), Path(paths[0]).name, profile)
    if kind != "log":
        raise GoldenUsageError(f"kind must be 'log' or 'workload', not {kind!r}")
    return _build_log(paths, profile=profile, vllm_version=vllm_version, year=year)


def _build_log(paths: list[str], *, profile: str | None, vllm_version: str | None, year: int | None) -> Golden:
    import msgspec

    from kvreplay.errors import UserError
    from kvreplay.sources import open_replay, read_log

    from kvreplay.parsers.span_files import spans_format

    # request-span files go to the replay (joined there), not to the log's parse
    log = read_log([p for p in paths if p == "-" or spans_format(p) is None], year=year,
                   vllm_version=vllm_version)
    events = log.events
    kinds = Counter(type(e).__struct_config__.tag for e in events)
    doc: Doc = {
        "input": {
            "kind": "log",
            "files": [Path(p).name for p in paths],
            "profile": profile or "auto",
            "vllm_version": vllm_version or "auto",
            "events": len(events),
            "lines": sum(getattr(e, "lines", 1) for e in events),
        },
        "events": dict(kinds),
    }
    dialect = log.dialect
    doc["version"] = {
        "vllm_version": dialect.vllm_version,
        "how": dialect.how,
        "engine_version": dialect.engine_version,
    }
    doc["config"] = {
        k: v for k, v in msgspec.structs.asdict(log.config).items()
        if k not in _LOCATION_FIELDS and v is not None
    }
    try:
        rep = open_replay(paths, profile=profile, vllm_version=vllm_version, year=year, log=log)
    except UserError as exc:
        doc["replay"] = {"error": str(exc)}
        doc["preemptions"] = []
        if _default_log(doc, log, profile):
            doc["replay"] = {"answered": "default log (no request lines): [default_log]"}
            del doc["preemptions"]
            return Golden(doc, "log", from_log_replay=True, default_log=True)
        return Golden(doc, "log", from_log_replay=True)
    summary = rep.summary()
    replay = {k: summary[k] for k in _SUMMARY_KEYS if k in summary}
    replay["unfinished_requests"] = len(summary["unfinished_requests"] or ())
    ver = rep.verification
    if ver is not None:
        replay["stats_lines"] = ver.stats_lines
        replay["stats_lines_agreeing"] = ver.agreeing_lines
        if ver.exact_lines is not None:  # V1 logs: matched without tolerance at the step each saw
            replay["stats_lines_exact"] = ver.exact_lines
    stats = getattr(rep.facts, "stats", None) or []
    logged = [s.preemptions for s in stats if getattr(s, "preemptions", None) is not None]
    replay["logged_preemptions"] = sum(logged) if logged else None
    if rep.uncertainty is not None:  # the ensemble's 90% intervals (inference/ensemble.py)
        u = rep.uncertainty
        replay["preemptions_low"] = u.preemptions["low"]
        replay["preemptions_high"] = u.preemptions["high"]
    elif rep.estimate is not None:
        replay["preemptions_low"] = rep.estimate.preemptions_low
        replay["preemptions_high"] = rep.estimate.preemptions_high
    doc["replay"] = replay
    if "spans" in summary:  # request spans: join, coverage, clock offset, contradictions
        doc["spans"] = {k: v for k, v in summary["spans"].items() if not k.endswith("_ids")}
    doc["preemptions"] = preemption_rows(rep.preemptions, confidence=True)
    return Golden(doc, "log", from_log_replay=rep.kind == "log")


def _default_log(doc: Doc, log: Any, profile: str | None) -> bool:
    """A default log's answer (inference/default_log.py, seed 0, as `kvreplay replay`) in
    [default_log] (intervals; the count exact when a scraped counter bounds it) and
    [windows]; False when the log is not one or cannot be answered."""
    import time

    from kvreplay.audit import default_report
    from kvreplay.errors import UserError

    if not default_report.is_default_log(log.facts):
        return False
    try:
        ans, _how = default_report.answer_for(log.facts, [], profile=profile)
    except UserError:
        return False

    def hms(t: float) -> str:
        return time.strftime("%H:%M:%S", time.gmtime(t))

    d: dict[str, Any] = {"requests": ans.requests, "samples": ans.samples, "seed": ans.seed,
                         "certainty": "interval", "victims": "none named"}
    for name in ("preemptions", "recomputed_tokens", "recompute_ratio"):
        iv = getattr(ans, name)
        for k in ("median", "low", "high"):
            v = getattr(iv, k)
            d[f"{name}_{k}"] = round(v, 4) if name == "recompute_ratio" else int(v)
    doc["default_log"] = d
    doc["windows"] = [{"start": hms(w.start), "end": hms(w.end), "median": int(w.preemptions.median),
                       "low": int(w.preemptions.low), "high": int(w.preemptions.high)}
                      for w in ans.windows]
    return True


def _build_workload(data: dict[str, Any], label: str, profile: str | None) -> Golden:
    from dataclasses import asdict, is_dataclass

    from kvreplay.errors import UserError
    from kvreplay.replay.result import replay_workload

    engine = "v0" if data.get("engine") == "v0" else "v1"
    doc: Doc = {
        "input": {"kind": "workload", "files": [label], "engine": engine, "profile": profile or "default"},
        "workload": {
            "name": data.get("name"),
            "requests": len(data.get("requests") or ()),
        },
    }
    try:
        rep = replay_workload(data, profile=profile, label=label)
    except UserError as exc:
        doc["replay"] = {"error": str(exc)}
        doc["preemptions"] = []
        return Golden(doc, "workload")
    cfg = rep.workload.config
    if engine == "v0":
        doc["config"] = {k: v for k, v in (data.get("config") or {}).items()}
        replay: dict[str, Any] = {"profile": "v0", "completed": not rep.unfinished and not any(
            r.terminal_error for r in rep.steps), "steps": rep.num_steps}
    else:
        doc["config"] = asdict(cfg) if is_dataclass(cfg) else dict(cfg)
        replay = {"profile": rep.profile.name, "completed": not rep.unfinished,
                  "steps": rep.num_steps,
                  "prefix_hit_tokens": sum(a.prefix_hit for r in rep.steps for a in r.admitted)}
    t = rep.totals()
    replay.update(preemptions=t.preemptions, self_preemptions=t.self_preemptions,
                  requests_preempted=t.requests_preempted,
                  computed_tokens_lost=t.computed_tokens_lost,
                  tokens_recomputed=t.tokens_recomputed)
    doc["replay"] = replay
    doc["preemptions"] = preemption_rows(rep.preemptions, confidence=False)
    return Golden(doc, "workload")


def preemption_rows(preemptions: Iterable[Any], *, confidence: bool) -> list[dict[str, Any]]:
    """One golden row per preemption, from the replay's own records."""
    out = []
    for p in preemptions:
        row = {"step": p.step, "victim": p.victim, "trigger": p.trigger, "self": p.self_preemption,
               "rule": p.victim_rule, "lost": p.computed_tokens_lost,
               "recompute": p.tokens_recomputed, "prefix_hit": p.prefix_hit_at_readmission,
               "readmitted": p.readmission_step}
        if p.mode != "recompute" or p.cumulative is not None:  # a V0 run
            row["mode"] = p.mode
        if confidence:
            row["confidence"] = p.confidence
            if p.probability is not None:
                row["p"] = p.probability
        out.append(row)
    return out
