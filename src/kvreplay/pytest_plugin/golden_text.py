"""The golden file's text: its sections and columns, one value's encoding, render and
parse, select and compare (no pytest import; golden.py builds the document).

    render(doc, *, header=()) -> str
    parse(text) -> doc                      # dict: section -> dict | list of dicts
    select(doc, fields) -> doc              # keep only the selected sections / keys / columns
    compare(expected_doc, actual_doc, *, fields=None) -> Mismatch | None
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

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


class GoldenUsageError(ValueError):
    """A bad argument (unknown field, unreadable source): the message says what to fix."""


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


def render(golden: Any, *, header: Sequence[str] = ()) -> str:
    """The file's text of a document (or of anything holding one as `.doc`)."""
    doc = golden.doc if hasattr(golden, "doc") else golden
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
