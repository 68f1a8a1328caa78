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
    render(golden_or_doc, *, header=()) -> str
    parse(text) -> doc                      # dict: section -> dict | list of dicts
    select(doc, fields) -> doc              # keep only the selected sections / keys / columns
    compare(expected_doc, actual_doc, *, fields=None) -> Mismatch | None
"""

from __future__ import annotations

import difflib
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from kvreplay.events import LINE_FIELDS

Doc = dict[str, Any]  # section name -> {key: value} or, for "preemptions", [record, ...]

SECTIONS = ("input", "events", "version", "config", "workload", "replay", "spans", "preemptions",
            "default_log", "windows")
LIST_SECTIONS = ("preemptions", "windows")
# a default log's preemptions per stats interval (inference/default_log.py: 90% intervals)
WINDOW_COLUMNS = ("start", "end", "median", "low", "high")

# Preemption columns, in the order they are written (unknown extra keys follow, sorted).
COLUMNS = (
    "step",
    "victim",
    "trigger",
    "self",
    "rule",
    "mode",
    "lost",
    "recompute",
    "prefix_hit",
    "readmitted",
    "confidence",
    "p",
)
COLUMN_HELP = {
    "step": "engine step of the preemption",
    "victim": "request preempted",
    "trigger": "request whose allocation failed",
    "self": "the victim was the trigger",
    "rule": "victim-selection rule that picked it",
    "mode": "V0: recompute or swap",
    "lost": "computed tokens thrown away",
    "recompute": "tokens computed again at readmission (num_tokens - prefix hit)",
    "prefix_hit": "prefix-cache hit tokens at readmission",
    "readmitted": "step the victim was scheduled again",
    "confidence": "log replay: consistent | inferred",
    "p": "log replay: share of the uncertainty ensemble preempting this victim within 5 steps",
}

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


class GoldenUsageError(ValueError):
    """A bad argument (unknown field, unreadable source): the message says what to fix."""


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


# ---------------------------------------------------------------- render / parse
_BARE = re.compile(r"[A-Za-z0-9_.:/+@%\-]+\Z")
_RESERVED = {"-", "true", "false", "null"}


def encode(value: Any) -> str:
    """One value as written in a golden file."""
    if value is None:
        return "-"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return json.dumps(value)
    if isinstance(value, str):
        if _BARE.match(value) and value not in _RESERVED and not _looks_numeric(value):
            return value
        return _json(value)
    if isinstance(value, (list, tuple)):
        return _json(list(value))
    if isinstance(value, Mapping):
        return _json(dict(value))
    return _json(str(value))


def _json(value: Any) -> str:
    """Compact JSON on one line: readable non-ASCII text, but escaped line separators."""
    text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    for ch in "\x85\u2028\u2029":
        text = text.replace(ch, f"\\u{ord(ch):04x}")
    return text


def _looks_numeric(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


_DECODER = json.JSONDecoder()


def decode(text: str) -> Any:
    value, end = _decode_at(text.strip(), 0)
    return value


def _decode_at(text: str, pos: int) -> tuple[Any, int]:
    """Decode one value starting at `pos`; return it and the position after it."""
    if pos < len(text) and text[pos] in "\"[{":
        try:
            return _DECODER.raw_decode(text, pos)
        except json.JSONDecodeError:
            pass
    end = pos
    while end < len(text) and not text[end].isspace():
        end += 1
    word = text[pos:end]
    if word == "-":
        return None, end
    if word in ("true", "false", "null"):
        return {"true": True, "false": False, "null": None}[word], end
    if re.fullmatch(r"-?\d+", word):
        return int(word), end
    if _looks_numeric(word):
        return float(word), end
    return word, end


def _columns(records: Sequence[Mapping[str, Any]]) -> list[str]:
    keys = {k for r in records for k in r}
    order = WINDOW_COLUMNS if keys and keys <= set(WINDOW_COLUMNS) else COLUMNS
    return [c for c in order if c in keys] + sorted(keys.difference(order))


def render_record(rec: Mapping[str, Any], columns: Sequence[str] | None = None) -> str:
    cols = columns or _columns([rec])
    return " ".join(f"{c}={encode(rec.get(c))}" for c in cols if c in rec)


def parse_record(line: str) -> dict[str, Any]:
    rec: dict[str, Any] = {}
    pos, text = 0, line.strip()
    while pos < len(text):
        m = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)=").match(text, pos)
        if not m:
            raise GoldenUsageError(f"cannot read golden record near {text[pos:pos + 30]!r}")
        value, pos = _decode_at(text, m.end())
        rec[m.group(1)] = value
    return rec


def doc_lines(doc: Doc) -> list[str]:
    """The compared lines of a document (section headers included, comments not)."""
    lines: list[str] = []
    order = [s for s in SECTIONS if s in doc] + sorted(set(doc).difference(SECTIONS))
    for name in order:
        body = doc[name]
        if lines:
            lines.append("")
        lines.append(f"[{name}]")
        if isinstance(body, list):
            cols = _columns(body)
            lines.extend(render_record(r, cols) for r in body)
        else:
            lines.extend(f"{k} = {encode(body[k])}" for k in sorted(body))
    return lines


def render(golden: Golden | Doc, *, header: Sequence[str] = ()) -> str:
    doc = golden.doc if isinstance(golden, Golden) else golden
    out = [f"# {h}" for h in header]
    if out:
        out.append("")
    out.extend(doc_lines(doc))
    return "\n".join(out) + "\n"


def parse(text: str) -> Doc:
    doc: Doc = {}
    current: str | None = None
    for n, raw in enumerate(text.split("\n"), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"\[([A-Za-z0-9_.\-]+)\]", line)
        if m:
            current = m.group(1)
            doc[current] = [] if current in LIST_SECTIONS else {}
            continue
        if current is None:
            raise GoldenUsageError(f"golden line {n}: a value before any [section]: {line!r}")
        body = doc[current]
        try:
            if isinstance(body, list):
                body.append(parse_record(line))
            else:
                key, sep, value = line.partition(" = ")
                if not sep:
                    raise GoldenUsageError(f"expected 'key = value', got {line!r}")
                body[key.strip()] = decode(value)
        except GoldenUsageError as exc:
            raise GoldenUsageError(f"golden line {n}: {exc}") from None
    return doc


# ---------------------------------------------------------------- select
def normalize_fields(fields: str | Iterable[str] | None) -> list[str] | None:
    """'preemptions.victim, replay' -> ['preemptions.victim', 'replay']; check the names."""
    if fields is None:
        return None
    items = fields.split(",") if isinstance(fields, str) else list(fields)
    out: list[str] = []
    for raw in items:
        f = str(raw).strip()
        if not f:
            continue
        section, _, key = f.partition(".")
        if section not in SECTIONS:
            raise GoldenUsageError(
                f"unknown golden field {f!r}: sections are {', '.join(SECTIONS)} "
                "(select a key with section.key, e.g. replay.preemptions or preemptions.victim)"
            )
        if section == "preemptions" and key and key not in COLUMNS:
            raise GoldenUsageError(
                f"unknown preemption column {key!r}: columns are {', '.join(COLUMNS)}"
            )
        if section == "windows" and key and key not in WINDOW_COLUMNS:
            raise GoldenUsageError(
                f"unknown window column {key!r}: columns are {', '.join(WINDOW_COLUMNS)}"
            )
        if f not in out:
            out.append(f)
    return out or None


def select(doc: Doc, fields: Sequence[str] | None) -> Doc:
    """Keep [input] and the selected sections / keys / preemption columns."""
    if not fields:
        return doc
    whole = {f for f in fields if "." not in f}
    keys: dict[str, list[str]] = {}
    for f in fields:
        if "." in f:
            s, _, k = f.partition(".")
            if s not in whole:
                keys.setdefault(s, []).append(k)
    out: Doc = {}
    for name, body in doc.items():
        if name == "input" or name in whole:
            out[name] = body
        elif name in keys:
            want = keys[name]
            if isinstance(body, list):
                out[name] = [{k: r[k] for k in want if k in r} for r in body]
            else:
                out[name] = {k: body[k] for k in want if k in body}
    for name in keys:  # a selected section absent on this side still shows, empty
        out.setdefault(name, [] if name in LIST_SECTIONS else {})
    return out


# ---------------------------------------------------------------- compare
@dataclass
class Mismatch:
    summary: list[str] = field(default_factory=list)  # the first differences, in words
    diff: list[str] = field(default_factory=list)  # unified diff lines (- golden, + now)
    changed_lines: int = 0

    def message(self, *, max_diff_lines: int = 56) -> str:
        out = ["first differences:"]
        out.extend(f"  {s}" for s in self.summary)
        shown = self.diff[:max_diff_lines]
        out.append(f"diff (- golden file, + now; {self.changed_lines} changed lines):")
        out.extend(f"  {d}" for d in shown)
        if len(self.diff) > len(shown):
            out.append(f"  ... {len(self.diff) - len(shown)} more diff lines not shown")
        return "\n".join(out)


def compare(expected: Doc, actual: Doc, *, fields: Sequence[str] | None = None,
            max_items: int = 8) -> Mismatch | None:
    """None when equal (on the selected fields), else what differs, first things first."""
    exp = select(expected, fields)
    act = select(actual, fields)
    a_lines, b_lines = doc_lines(exp), doc_lines(act)
    if a_lines == b_lines:
        return None
    diff = [
        d.rstrip("\n")
        for d in difflib.unified_diff(a_lines, b_lines, "golden", "now", n=1, lineterm="")
    ][2:]
    changed = sum(1 for d in diff if d[:1] in "+-")
    return Mismatch(_describe(exp, act, max_items), diff, changed)


_GONE = object()
PER_SECTION = 5  # differences listed per section before the next section's first

# What a reader wants first: what was run, what the replay found, then the inputs to it.
_DESCRIBE_ORDER = ("input", "replay", "default_log", "windows", "preemptions", "version", "workload",
                   "config", "events")


def _describe(exp: Doc, act: Doc, max_items: int) -> list[str]:
    out: list[str] = []
    names = [s for s in _DESCRIBE_ORDER if s in exp or s in act]
    names += sorted((set(exp) | set(act)).difference(SECTIONS))
    for name in names:
        a, b = exp.get(name), act.get(name)
        if a == b:
            continue
        if a is None:
            out.append(f"[{name}] is new (not in the golden file)")
            continue
        if b is None:
            out.append(f"[{name}] is in the golden file but not produced any more")
            continue
        if isinstance(a, list) or isinstance(b, list):
            out.extend(_describe_records(name, list(a or []), list(b or [])))
            continue
        keys = [k for k in sorted(set(a) | set(b)) if a.get(k, _GONE) != b.get(k, _GONE)]
        for k in keys[:PER_SECTION]:
            if k not in b:
                out.append(f"{name}.{k}: {encode(a[k])} -> (gone)")
            elif k not in a:
                out.append(f"{name}.{k}: (new) -> {encode(b[k])}")
            else:
                out.append(f"{name}.{k}: {encode(a[k])} -> {encode(b[k])}")
        if len(keys) > PER_SECTION:  # (room for the next sections' first difference)
            out.append(f"... and {len(keys) - PER_SECTION} more in [{name}]")
    if len(out) > max_items:
        out = out[:max_items] + [f"... and {len(out) - max_items} more"]
    return out


def _describe_records(name: str, a: list[dict], b: list[dict]) -> list[str]:
    out: list[str] = []
    if len(a) != len(b):
        out.append(f"{name}: {len(a)} in the golden file, {len(b)} now")
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            where = f"{name} #{i + 1}" + (f" (golden step {x['step']})" if "step" in x else "")
            parts = []
            for k in _columns([x, y]):
                if x.get(k) != y.get(k):
                    parts.append(f"{k} {encode(x.get(k))} -> {encode(y.get(k))}")
            out.append(f"first changed record: {where}: " + ", ".join(parts))
            break
    else:
        if len(a) > len(b):
            out.append(f"first missing record: {render_record(a[len(b)])}")
        elif len(b) > len(a):
            out.append(f"first extra record: {render_record(b[len(a)])}")
    return out
