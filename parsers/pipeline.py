"""Physical lines -> events. The reader, the record grouper and the clock.

Invariant: for every input file, the `lines` of the events emitted for it sum to the number
of physical lines (newline-terminated, plus a final unterminated one). Nothing is dropped:
a line is a typed event, part of a multi-line event (traceback, re-joined wrap), a Log /
Noise event, or an Unparsed event.
"""

from __future__ import annotations

import calendar
import gzip
import heapq
import io
import os
import re
import sys
import time as _time
from typing import IO, Any, Iterable, Iterator

from kvreplay import events as ev
from kvreplay.errors import UserError
from kvreplay.parsers import build, matchers

MAX_LINE = 4 * 1024 * 1024  # characters kept per physical line; the rest is dropped with a note
WRAP_WIDTHS = frozenset({80, 100, 120, 132, 160, 200, 240, 250, 256, 300, 500, 512, 1000, 1024, 2000, 2048, 4000, 4096})

_ENV_MATCH = matchers.ENVELOPE.match
_DISPATCH = matchers.dispatch
_MATCHERS = matchers.MATCHERS
_BUILDERS = build.BUILDERS
_UVICORN = re.compile(
    r"(?:\(([A-Za-z][\w-]*(?: [\w=-]+)*?) pid=(\d+)\) +)?INFO: +(?:(\S+) - \"([A-Z]+) (\S+)(?: (HTTP/[\d.]+))?\" (\d{3})(?: (.*))?|(.*))$"
)
_EXC_LINE = re.compile(r"[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning|Failure)\b(?::|$)")
_PROGRESS = re.compile(r"\d+%\|.*\|.*(?:it/s|s/it|\?it/s)")
_RANK = re.compile(r"\[rank\d+\]: ?")
_FOREIGN_SRC = re.compile(r" \(([\w/]+\.py):(\d+)\)$")
_PY_WARNING = re.compile(r"\S+\.py:\d+: \w*Warning: ")
_TB_LEVELS = frozenset({"ERROR", "CRITICAL", "WARNING"})


# ------------------------------------------------------------------ reader


def open_text(path: str) -> tuple[IO[str], str, float | None]:
    """(text stream, label, mtime). `-` is stdin; `.gz` is decompressed. UserError if unreadable."""
    if path == "-":
        return io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="replace", newline="\n"), "<stdin>", None
    try:
        mtime = os.path.getmtime(path)
        if os.path.isdir(path):
            raise UserError(f"{path}: is a directory, not a log file")
        raw: IO[bytes] = open(path, "rb")
    except UserError:
        raise
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None
    if path.endswith(".gz"):
        raw = gzip.GzipFile(fileobj=raw)  # type: ignore[assignment]
    return io.TextIOWrapper(raw, encoding="utf-8", errors="replace", newline="\n"), path, mtime


def physical_lines(stream: IO[str], limit: int = MAX_LINE) -> Iterator[tuple[str, str | None]]:
    """(text without EOL, note) per physical line; over-long lines are cut to `limit` chars."""
    readline = stream.readline
    while True:
        try:
            s = readline(limit)
        except (OSError, EOFError, gzip.BadGzipFile) as exc:
            yield "", f"read error: {exc}"
            return
        if not s:
            return
        note = None
        if s[-1] == "\n":
            s = s[:-1]
        elif len(s) >= limit:
            dropped = 0
            while True:
                rest = readline(limit)
                if not rest:
                    break
                if rest[-1] == "\n":
                    dropped += len(rest) - 1
                    break
                dropped += len(rest)
            note = f"line truncated to {limit} characters ({dropped} dropped)"
        if s and s[-1] == "\r":
            s = s[:-1]
        if "\ufffd" in s:
            note = "invalid UTF-8 replaced" if note is None else note + "; invalid UTF-8 replaced"
        yield s, note


# ------------------------------------------------------------------ clock


class Clock:
    """MM-DD HH:MM:SS -> epoch seconds (local wall time read as UTC), year inferred, monotonic
    across a new year (a jump from Oct-Dec back to Jan-Mar adds a year)."""

    def __init__(self, year: int | None = None, ref: tuple[int, str] | None = None) -> None:
        self.explicit = year is not None
        self.year = year
        self.ref = ref  # (year, "MM-DD") of the file's mtime: the log ends no later than that
        self.last_md: str | None = None
        self.cache: dict[str, float | None] = {}

    def hint_year(self, year: int) -> None:
        if not self.explicit and self.last_md is None:
            self.year = year
            self.explicit = True

    def epoch(self, date: str, hms: str) -> float | None:
        if date != self.last_md:
            if self.year is None:
                if self.ref is None:
                    self.year = _time.gmtime().tm_year
                else:
                    ry, rmd = self.ref
                    self.year = ry if date <= rmd else ry - 1
            elif self.last_md is not None and date < self.last_md and self.last_md[:2] >= "10" and date[:2] <= "03":
                self.year += 1
                self.cache.clear()
            self.last_md = date
        key = date + hms
        t = self.cache.get(key, False)
        if t is False:
            t = self._compute(date, hms)
            self.cache[key] = t
        return t  # type: ignore[return-value]

    def _compute(self, date: str, hms: str) -> float | None:
        try:
            mon, day = int(date[:2]), int(date[3:5])
            hh, mm, ss = int(hms[:2]), int(hms[3:5]), int(hms[6:8])
        except ValueError:
            return None
        if not (1 <= mon <= 12 and 1 <= day <= calendar.monthrange(self.year, mon)[1] and hh < 24 and mm < 60 and ss < 61):
            return None
        return float(calendar.timegm((self.year, mon, day, hh, mm, ss, 0, 0, 0)))


def _abs_time(text: str) -> float | None:
    """`2026-05-12T08:01:39.331Z` / `2026-05-07 10:00:05,123` -> epoch (UTC)."""
    try:
        y, mo, d = int(text[0:4]), int(text[5:7]), int(text[8:10])
        h, mi, s = int(text[11:13]), int(text[14:16]), int(text[17:19])
        frac = text[19:].rstrip("Z")
        f = float("0." + frac[1:]) if len(frac) > 1 and frac[0] in ".," else 0.0
        return calendar.timegm((y, mo, d, h, mi, s, 0, 0, 0)) + f
    except (ValueError, IndexError, OverflowError):
        return None


# ------------------------------------------------------------------ record -> events


_PROC_CACHE: dict[str, tuple[str | None, int | None, int | None]] = {}
_ENGINE_NUM = re.compile(r"EngineCore(?:_DP|_)(\d+)$")


def _procs(text: str) -> tuple[str | None, int | None, int | None]:
    r = _PROC_CACHE.get(text)
    if r is None:
        m = matchers.PROC.search(text)
        if m is None:
            r = (None, None, None)
        else:
            name = m.group(1)
            em = _ENGINE_NUM.match(name)
            r = (name, int(m.group(2)), int(em.group(1)) if em else None)
        if len(_PROC_CACHE) < 10000:
            _PROC_CACHE[text] = r
    return r


def message_event(msg: str, base: dict[str, Any], level: str | None, lark: bool = False) -> ev.Event:
    """One log message (envelope already removed) -> one event."""
    d = _DISPATCH(msg)
    if d is not None:
        kind, text = d
        if lark:
            from kvreplay.parsers.grammar import lark_message_fields

            fields = lark_message_fields(kind, text)
        else:
            fields = _MATCHERS[kind](text)
            if fields is not None and kind == "generated":
                fields = [(matchers.RENAME.get(k, k), v) for k, v in fields]
        if fields is None:
            return ev.Unparsed(reason=f"malformed {kind} line (cut or unknown variant)", text=msg, **base)
        try:
            return _BUILDERS[kind](fields, base)
        except Exception as exc:  # a builder rejecting odd values must not stop the parse
            return ev.Unparsed(reason=f"bad {kind} line: {type(exc).__name__}: {str(exc)[:80]}", text=msg, **base)
    e = build.config_line(msg, base)
    if e is not None:
        return e
    if level in _TB_LEVELS or level is None:
        e = build.error_event(msg, base)
        if e is not None:
            return e
    return ev.Log(message=msg, **base)


def _traceback_event(head: str, body: list[str], base: dict[str, Any]) -> ev.Event:
    exc_type = exc_msg = None
    for s in reversed(body):
        t = s.strip()
        if _EXC_LINE.match(t):
            exc_type, _, exc_msg = t.partition(":")
            exc_msg = exc_msg.strip() or None
            break
    probe = "\n".join([head] + body[-3:])
    hit = build.classify_error(probe)
    return ev.Traceback(head=head, exc_type=exc_type, exc_message=exc_msg, category=hit[0] if hit else None, **base)


def _tb_continuation(msg: str) -> bool:
    c = msg[:1]
    return (
        c == " " or c == "\t" or c == "^" or msg.startswith(("Traceback (", "During handling", "The above exception", "File \""))
        or _EXC_LINE.match(msg) is not None
    )


class FileParser:
    """Feeds the physical lines of one file; yields events. One record of look-behind is kept
    (`pending`) so tracebacks and wrapped lines can be grouped into one event."""

    def __init__(self, label: str, clock: Clock, lark: bool = False) -> None:
        self.file = label
        self.clock = clock
        self.lark = lark
        self.pending: list | None = None  # [lineno, span, base, msg, prefix, level, raw_len, tb_body, note]
        self.raw_tb: list | None = None  # [lineno, span, head, body, note]

    # -- records with a vLLM envelope
    def _envelope(self, s: str):
        if self.lark:
            return _lark_envelope(s)
        m = _ENV_MATCH(s)
        if m is None:
            return None
        return m.groups(), m.end()

    def feed(self, lineno: int, s: str, note: str | None) -> Iterator[ev.Event]:
        if "\x1b" in s:
            s = matchers.ANSI.sub("", s)
        env = self._envelope(s)
        pending = self.pending
        if env is not None:
            (wt, comp, wdt, procs, level, date, hms, source), end = env
            msg = s[end:]
            prefix = s[:end]
            if pending is not None:
                if pending[4] == prefix and pending[5] in _TB_LEVELS and _tb_continuation(msg):
                    if pending[7] is None:
                        pending[7] = []
                    pending[7].append(msg)
                    pending[1] += 1
                    return
                yield from self._flush()
            if self.raw_tb is not None:
                yield self._flush_raw_tb()
            clock = self.clock
            if wt or wdt:
                clock.hint_year(int((wt or wdt)[:4]))
            if procs:
                process, pid, engine = _procs(procs)
            else:
                process = pid = engine = None
            base = {
                "file": self.file, "line": lineno, "time": clock.epoch(date, hms), "time_text": f"{date} {hms}",
                "level": level, "process": process, "pid": pid, "engine": engine, "source": source, "note": note,
            }
            self.pending = [lineno, 1, base, msg, prefix, level, len(s), None, note]
            return
        # -- no envelope
        if pending is not None:
            if pending[7] is None and s and self._wrapped(pending, s):
                pending[3] += s
                pending[1] += 1
                pending[2]["note"] = "re-joined a wrapped line"
                return
            yield from self._flush()
        yield from self._raw(lineno, s, note)

    def _wrapped(self, pending: list, s: str) -> bool:
        if s[0] in " \t{" or s.startswith(("INFO:", "Traceback", "(", "[")) or _PROGRESS.search(s):
            return False
        msg = pending[3]
        if pending[6] in WRAP_WIDTHS:
            return True
        opens = msg.count("(") + msg.count("[") + msg.count("{")
        closes = msg.count(")") + msg.count("]") + msg.count("}")
        return opens > closes

    def _flush(self) -> Iterator[ev.Event]:
        p = self.pending
        self.pending = None
        if p is None:
            return
        lineno, span, base, msg, _prefix, level, _raw_len, body, _note = p
        if span > 1:
            base["lines"] = span
        if body:
            yield _traceback_event(msg, body, base)
            return
        yield message_event(msg.rstrip(), base, level, self.lark)

    def _flush_raw_tb(self) -> ev.Event:
        lineno, span, head, body, note = self.raw_tb  # type: ignore[misc]
        self.raw_tb = None
        return _traceback_event(head, body, {"file": self.file, "line": lineno, "lines": span, "note": note})

    def _raw(self, lineno: int, s: str, note: str | None) -> Iterator[ev.Event]:
        """A line without a vLLM envelope."""
        t = s
        if t.startswith("[rank"):
            t = _RANK.sub("", t, count=1)
        if self.raw_tb is not None:
            if t and _tb_continuation(t):
                self.raw_tb[1] += 1
                self.raw_tb[3].append(t)
                return
            yield self._flush_raw_tb()
        base = {"file": self.file, "line": lineno, "note": note}
        stripped = t.strip()
        if not stripped:
            yield ev.Noise(what="blank", **base)
            return
        if stripped.startswith("Traceback (most recent call last)"):
            self.raw_tb = [lineno, 1, stripped, [], note]
            return
        if "INFO:" in t[:60]:
            m = _UVICORN.match(t)
            if m is not None:
                proc, pid, client, method, path, httpv, status, status_text, other = m.groups()
                if proc:
                    base["process"], base["pid"] = proc, int(pid)
                if method:
                    yield ev.HttpAccess(client=client, method=method, path=path, http_version=httpv, status=int(status), status_text=status_text, **base)
                elif ' - "' in other:
                    yield ev.Unparsed(reason="malformed http_access line (cut or unknown variant)", text=s, **base)
                else:
                    yield ev.Noise(what="uvicorn", text=other, **base)
                return
        if t[:1] == "{":
            yield self._json_record(t, base)
            return
        # a record glued after other text (tqdm bar without newline, a wrapper we do not know)
        m = matchers.ENVELOPE_SEARCH.search(t)
        if m is not None and m.start() > 0:
            inner = t[m.start():]
            im = _ENV_MATCH(inner)
            if im is not None:
                wt, comp, wdt, procs, level, date, hms, source = im.groups()
                process, pid, engine = _procs(procs) if procs else (None, None, None)
                gbase = {
                    "file": self.file, "line": lineno, "time": self.clock.epoch(date, hms), "time_text": f"{date} {hms}",
                    "level": level, "process": process, "pid": pid, "engine": engine, "source": source,
                    "note": "record glued after non-log text" + (f"; {note}" if note else ""),
                }
                yield message_event(inner[im.end():].rstrip(), gbase, level, self.lark)
                return
        if _PROGRESS.search(t):
            yield ev.Noise(what="progress", text=t, **base)
            return
        if stripped.strip("`") == "" or stripped in ("...", "…"):
            yield ev.Noise(what="markdown", text=t, **base)
            return
        if _PY_WARNING.match(stripped):
            yield ev.Noise(what="python_warning", text=t, **base)
            return
        # a vLLM message without its envelope (user stripped it, or a foreign formatter)
        msg = stripped
        fm = _FOREIGN_SRC.search(msg)
        if fm is not None:
            msg = msg[: fm.start()]
            base["source"] = f"{fm.group(1)}:{fm.group(2)}"
        if _DISPATCH(msg) is not None:
            base["note"] = "no log envelope" + (f"; {note}" if note else "")
            yield message_event(msg, base, None, self.lark)
            return
        e = build.error_event(msg, base) if ("Error" in msg or "error" in msg) else None
        if e is not None:
            yield e
            return
        yield ev.Unparsed(reason="not a vLLM log line", text=s, **base)

    def _json_record(self, t: str, base: dict[str, Any]) -> ev.Event:
        import msgspec

        try:
            rec = msgspec.json.decode(t)
        except msgspec.DecodeError:
            return ev.Unparsed(reason="invalid JSON record", text=t, **base)
        if not isinstance(rec, dict) or not isinstance(rec.get("message"), str):
            return ev.Unparsed(reason="JSON record without a message", text=t, **base)
        asctime = rec.get("asctime")
        if isinstance(asctime, str):
            base["time"] = _abs_time(asctime)
            base["time_text"] = asctime
        level = rec.get("levelname") if isinstance(rec.get("levelname"), str) else None
        base["level"] = level
        proc = rec.get("processName")
        if isinstance(proc, str):
            base["process"] = proc
            em = _ENGINE_NUM.match(proc)
            if em:
                base["engine"] = int(em.group(1))
        if isinstance(rec.get("process"), int):
            base["pid"] = rec["process"]
        if isinstance(rec.get("filename"), str) and isinstance(rec.get("lineno"), int):
            base["source"] = f"{rec['filename']}:{rec['lineno']}"
        msg = rec["message"]
        if "\n" in msg:
            first, *rest = msg.split("\n")
            if any(r.startswith("Traceback") for r in rest) or first.startswith("Traceback"):
                return _traceback_event(first, rest, base)
            msg = first if not rest else msg
        return message_event(msg.rstrip(), base, level, self.lark)

    def close(self) -> Iterator[ev.Event]:
        yield from self._flush()
        if self.raw_tb is not None:
            yield self._flush_raw_tb()


def _lark_envelope(s: str):
    """The Lark twin of ENVELOPE.match: ((groups...), end offset) or None."""
    from kvreplay.parsers.grammar import lark_envelope_fields

    if not s or s[0] not in "([0123456789DIWECabcdefghijklmnopqrstuvwxyzABFGHJKLMNOPQRSTUVXYZ_-.":
        return None
    fields = lark_envelope_fields(s)
    if fields is None:
        return None
    d: dict[str, str] = {}
    procs = []
    for k, v in fields:
        if k == "process":
            procs.append(v)
        elif k == "pid":
            procs[-1] = f"({procs[-1]} pid={v}) "
        else:
            d[k] = v
    msg = d.get("message", "")
    end = len(s) - len(msg)
    return (d.get("wrapper_time"), d.get("compose"), d.get("wrapper_datetime"), "".join(procs) or None,
            d["level"], d["date"], d["time"], d["source"]), end


# ------------------------------------------------------------------ files


def parse_stream(stream: IO[str], label: str, clock: Clock, lark: bool = False) -> Iterator[ev.Event]:
    fp = FileParser(label, clock, lark)
    feed = fp.feed
    lineno = 0
    for s, note in physical_lines(stream):
        lineno += 1
        yield from feed(lineno, s, note)
    yield from fp.close()


def _clock_for(year: int | None, mtime: float | None) -> Clock:
    if year is not None:
        return Clock(year=year)
    if mtime is None:
        return Clock()
    tm = _time.localtime(mtime)
    return Clock(ref=(tm.tm_year, f"{tm.tm_mon:02d}-{tm.tm_mday:02d}"))


def parse_path(path: str, *, year: int | None = None, lark: bool = False) -> Iterator[ev.Event]:
    stream, label, mtime = open_text(path)
    try:
        yield from parse_stream(stream, label, _clock_for(year, mtime), lark)
    finally:
        if path != "-":
            stream.close()


def merge_by_time(iters: list[Iterable[ev.Event]]) -> Iterator[ev.Event]:
    """k-way merge in time order; events without a time keep their place after the previous
    timed event of the same file (ties: file order, then line order)."""

    def keyed(i: int, it: Iterable[ev.Event]) -> Iterator[tuple[float, int, int, ev.Event]]:
        last = float("-inf")
        for seq, e in enumerate(it):
            if e.time is not None and e.time > last:
                last = e.time
            yield (last, i, seq, e)

    for _t, _i, _s, e in heapq.merge(*(keyed(i, it) for i, it in enumerate(iters))):
        yield e
