"""Physical lines -> events: the record grouper (the reader is in reader.py, the clock in
timestamps.py, a record's envelope in envelopes.py, a message's event in message_events.py).

Invariant: for every input file, the `lines` of the events emitted for it sum to the number
of physical lines (newline-terminated, plus a final unterminated one). Nothing is dropped:
a line is a typed event, part of a multi-line event (traceback, re-joined wrap), a Log /
Noise event, or an Unparsed event.

Speed (bench/bench_parse.py): files are read in 64 KiB binary reads, decoded and split once
per read (`line_chunks`); `parse_chunks` runs a hot loop for the common record (memoised
envelope and time stamp, the fused handlers of fast.py, uvicorn access lines) and hands
every other line to `FileParser.feed`, the general route. `FAST_PATHS = False` forces the
general route everywhere; tests/unit/parsers/test_parse_fast.py checks both give the same JSON Lines.
"""

from __future__ import annotations

import codecs
import heapq
import re
from typing import IO, Any, Iterable, Iterator

from kvreplay import events as ev
from kvreplay.parsers import build, matchers, newlines
from kvreplay.parsers.timestamps import Clock, _abs_time, _clock_for
from kvreplay.parsers.fast import _FAST_GET
from kvreplay.parsers.fast import fast_message as _fast
from kvreplay.parsers.reader import CHUNK, MAX_LINE, line_chunks, open_text, physical_lines  # noqa: F401
from kvreplay.parsers.envelopes import (  # noqa: F401  (_ENV_CACHE, _ENV_COMMON: tests read them here)
    _ENV_CACHE, _ENV_COMMON, _ENV_MATCH, _envelope, _envelope_plain, _lark_env, _procs, _rust_env,
    _small_int, _ENGINE_NUM)
from kvreplay.parsers.message_events import (  # noqa: F401  (message_event: the API's name here)
    _I64, _TB_LEVELS, _check_ints, _tb_continuation, _traceback_event, message_event)

# False: every line takes the general route (FileParser.feed, matchers, builders); the tests
# compare both routes. True: the hot loop of `parse_chunks` and the fused paths of fast.py.
FAST_PATHS = True
WRAP_WIDTHS = frozenset({80, 100, 120, 132, 160, 200, 240, 250, 256, 300, 500, 512, 1000, 1024, 2000, 2048, 4000, 4096})

_DISPATCH = matchers.dispatch
_UVICORN = re.compile(
    r"(?:\(([A-Za-z][\w-]*(?: [\w=-]+)*?) pid=(\d+)\) +)?INFO: +(?:(\S+) - \"([A-Z]+) (\S+)(?: (HTTP/[\d.]+))?\" (\d{3})(?: (.*))?|(.*))$"
)
_WRAPPER_ISO = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z) +")
_PCT_BAR = re.compile(r"\d%\|")


class _Progress:
    """A tqdm progress bar: `N%|` then `|` then `it/s` or `s/it`, in that order (the match of
    `\\d+%\\|.*\\|.*(?:it/s|s/it)` on a line without newlines, in linear time: that regex
    backtracks cubically on `1%|1%|...`)."""

    @staticmethod
    def search(t: str) -> bool:
        m = _PCT_BAR.search(t)
        if m is None:
            return False
        j = t.find("|", m.end())
        if j < 0:
            return False
        k = max(t.rfind("it/s"), t.rfind("s/it"))
        return k > j


_PROGRESS = _Progress
_RANK = re.compile(r"\[rank\d+\]: ?")
_FOREIGN_SRC = re.compile(r" \(([\w/]+\.py):(\d+)\)$")
_PY_WARNING = re.compile(r"\S+\.py:\d+: \w*Warning: ")
_QUOTES = {'"': '"', "'": "'", "`": "`", "\u201c": "\u201d", "\u2018": "\u2019"}  # opening -> closing
_FOREIGN_TIME = re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?")
_FOREIGN_LEVEL = re.compile(r"\b(DEBUG|INFO|WARNING|ERROR|CRITICAL)\b")


# pending record: [lineno, span, msg, prefix (TB levels only), level, raw_len, tb_body, note,
#                  time, time_text, process, pid, engine, source, wrapper_time]
_P_LINE, _P_SPAN, _P_MSG, _P_PREFIX, _P_LEVEL, _P_RAWLEN, _P_BODY, _P_NOTE = range(8)


class FileParser:
    """Feeds the physical lines of one file; appends events to `out`. One record of
    look-behind is kept (`pending`) so tracebacks and wrapped lines can be grouped into one
    event."""

    def __init__(self, label: str, clock: Clock, lark: bool = False) -> None:
        self.file = label
        self.clock = clock
        self.lark = lark
        self.envelope = _lark_env if lark else _envelope if FAST_PATHS else _envelope_plain
        self.pending: list | None = None
        self.raw_tb: list | None = None  # [lineno, span, head, body, note]
        self.out: list[ev.Event] = []

    def feed(self, lineno: int, s: str, note: str | None) -> None:
        if "\x1b" in s:
            s = matchers.ANSI.sub("", s)
        env = self.envelope(s)
        if env is None and ".rs:" in s:  # a record of vLLM's Rust front end
            env = _rust_env(s)
        pending = self.pending
        if env is not None:
            wtd, level, date, hms, source, process, pid, engine, end = env
            msg = s[end:]
            if pending is not None:
                if pending[_P_PREFIX] is not None and pending[_P_PREFIX] == s[:end] and _tb_continuation(msg):
                    if pending[_P_BODY] is None:
                        pending[_P_BODY] = []
                    pending[_P_BODY].append(msg)
                    pending[_P_SPAN] += 1
                    return
                self._flush()
            if self.raw_tb is not None:
                self.out.append(self._flush_raw_tb())
            clock = self.clock
            wrapper = None
            if wtd:
                clock.hint_year(int(wtd[:4]))
                if "T" in wtd:  # RFC 3339 from a container runtime: sub-second, UTC
                    wrapper = _abs_time(wtd)
            t, tt = clock.stamp(date, hms)
            self.pending = [lineno, 1, msg, s[:end] if level in _TB_LEVELS else None, level, len(s), None, note,
                            t, tt, process, pid, engine, source, wrapper]
            return
        # -- no envelope
        if pending is not None:
            if pending[_P_BODY] is None and s and self._wrapped(pending, s):
                pending[_P_MSG] += s
                pending[_P_SPAN] += 1
                pending[_P_NOTE] = "re-joined a wrapped line"
                return
            self._flush()
        self._raw(lineno, s, note)

    def _wrapped(self, pending: list, s: str) -> bool:
        if s[0] in " \t{" or s.startswith(("INFO:", "Traceback", "(", "[")) or _PROGRESS.search(s):
            return False
        msg = pending[_P_MSG]
        if pending[_P_RAWLEN] in WRAP_WIDTHS:
            return True
        opens = msg.count("(") + msg.count("[") + msg.count("{")
        closes = msg.count(")") + msg.count("]") + msg.count("}")
        return opens > closes

    def _flush(self) -> None:
        p = self.pending
        self.pending = None
        if p is None:
            return
        if p[_P_SPAN] == 1 and not p[_P_BODY] and not self.lark and FAST_PATHS:
            try:
                e = _fast(p[2].rstrip(), self.file, p[0], p[8], p[9], p[4], p[10], p[11], p[12], p[13], p[7])
            except Exception:  # any doubt: the general route decides (and says what is wrong)
                e = None
            if e is not None:
                if p[14] is not None:
                    e.wrapper_time = p[14]
                self.out.append(e)
                return
        self._emit(p)
        if p[14] is not None:
            self.out[-1].wrapper_time = p[14]

    def _emit(self, p: list) -> None:
        """The general route for a pending record."""
        lineno, span, msg, _prefix, level, _raw_len, body, note, t, tt, process, pid, engine, source, _ = p
        base = {"file": self.file, "line": lineno, "time": t, "time_text": tt, "level": level, "process": process,
                "pid": pid, "engine": engine, "source": source, "note": note}
        if span > 1:
            base["lines"] = span
        if body:
            self.out.append(_traceback_event(msg, body, base))
            return
        self.out.append(message_event(msg.rstrip(), base, level, self.lark))

    def _flush_raw_tb(self) -> ev.Event:
        lineno, span, head, body, note = self.raw_tb  # type: ignore[misc]
        self.raw_tb = None
        return _traceback_event(head, body, {"file": self.file, "line": lineno, "lines": span, "note": note})

    def _raw(self, lineno: int, s: str, note: str | None) -> None:
        """A line without a vLLM envelope (a container runtime's time stamp before it is
        taken off and kept as the events' `wrapper_time`)."""
        m = _WRAPPER_ISO.match(s)
        if m is None:
            self._raw_line(lineno, s, note)
            return
        n = len(self.out)
        self._raw_line(lineno, s[m.end():], note)
        wrapper = _abs_time(m.group(1))
        for e in self.out[n:]:
            e.wrapper_time = wrapper

    def _raw_line(self, lineno: int, s: str, note: str | None) -> None:
        out = self.out
        t = s
        if t.startswith("[rank"):
            t = _RANK.sub("", t, count=1)
        if self.raw_tb is not None:
            if t and _tb_continuation(t):
                self.raw_tb[1] += 1
                self.raw_tb[3].append(t)
                return
            out.append(self._flush_raw_tb())
        stripped = t.strip()
        if not stripped:
            out.append(ev.Noise(what="blank", file=self.file, line=lineno, note=note))
            return
        if stripped.startswith("Traceback (most recent call last)"):
            self.raw_tb = [lineno, 1, stripped, [], note]
            return
        if "INFO:" in t[:60]:
            m = _UVICORN.match(t)
            if m is not None:
                proc, pid, client, method, path, httpv, status, status_text, other = m.groups()
                if method:
                    out.append(ev.HttpAccess(client=client, method=method, path=path, http_version=httpv, status=int(status), status_text=status_text,
                                             file=self.file, line=lineno, note=note, process=proc, pid=_small_int(pid) if proc else None))
                elif ' - "' in other:
                    out.append(ev.Unparsed(reason="malformed http_access line (cut or unknown variant)", text=s, file=self.file, line=lineno, note=note,
                                           process=proc, pid=_small_int(pid) if proc else None))
                else:
                    out.append(ev.Noise(what="uvicorn", text=other, file=self.file, line=lineno, note=note, process=proc, pid=_small_int(pid) if proc else None))
                return
        base = {"file": self.file, "line": lineno, "note": note}
        if t[:1] == "{":
            out.append(self._json_record(t, base))
            return
        # a record glued after other text (tqdm bar without newline, a wrapper we do not know,
        # quoted in prose)
        m = matchers.ENVELOPE_SEARCH.search(t)
        if m is not None and m.start() > 0:
            inner = t[m.start():]
            quote = _QUOTES.get(t[m.start() - 1])
            if quote is not None:  # "... "INFO 10-27 ... Running: 2 reqs ..."." : the record ends at its quote
                q = inner.rfind(quote)
                if q > 0:
                    inner = inner[:q]
            im = _ENV_MATCH(inner)
            if im is not None:
                wt, comp, wdt, procs, level, date, hms, source = im.groups()
                process, pid, engine = _procs(procs) if procs else (None, None, None)
                gbase = {
                    "file": self.file, "line": lineno, "time": self.clock.epoch(date, hms), "time_text": f"{date} {hms}",
                    "level": level, "process": process, "pid": pid, "engine": engine, "source": source,
                    "note": "record glued after non-log text" + (f"; {note}" if note else ""),
                }
                out.append(message_event(inner[im.end():].rstrip(), gbase, level, self.lark))
                return
        if _PROGRESS.search(t):
            out.append(ev.Noise(what="progress", text=t, **base))
            return
        if stripped.strip("`") == "" or stripped in ("...", "…"):
            out.append(ev.Noise(what="markdown", text=t, **base))
            return
        if _PY_WARNING.match(stripped):
            out.append(ev.Noise(what="python_warning", text=t, **base))
            return
        # a vLLM message without its envelope (user stripped it, or a foreign formatter)
        msg = stripped
        fm = _FOREIGN_SRC.search(msg)
        if fm is not None:
            msg = msg[: fm.start()]
            base["source"] = f"{fm.group(1)}:{fm.group(2)}"
        if _DISPATCH(msg) is not None:
            base["note"] = "no log envelope" + (f"; {note}" if note else "")
            out.append(message_event(msg, base, None, self.lark))
            return
        mm = matchers.MESSAGE_SEARCH.search(msg)
        if mm is not None and mm.start() > 0 and _DISPATCH(msg[mm.start():]) is not None:
            # another formatter's prefix before a vLLM message: its time stamp and level, if any
            prefix = msg[: mm.start()]
            ts = _FOREIGN_TIME.search(prefix)
            if ts is not None:
                base["time"] = _abs_time(ts.group(0).replace("T", " "))
                base["time_text"] = ts.group(0)
            lv = _FOREIGN_LEVEL.search(prefix)
            level = lv.group(1) if lv is not None else None
            base["level"] = level
            base["note"] = "vLLM message after a foreign prefix" + (f"; {note}" if note else "")
            out.append(message_event(msg[mm.start():], base, level, self.lark))
            return
        try:
            e = build.error_event(msg, base) if ("Error" in msg or "error" in msg) else None
            if e is not None:
                _check_ints(e)
        except Exception as exc:  # (odd numbers in an error message)
            e = ev.Unparsed(reason=f"bad error line: {type(exc).__name__}: {str(exc)[:80]}", text=s, **base)
        if e is not None:
            out.append(e)
            return
        out.append(ev.Unparsed(reason="not a vLLM log line", text=s, **base))

    def _json_record(self, t: str, base: dict[str, Any]) -> ev.Event:
        import msgspec

        try:
            rec = msgspec.json.decode(t)
        except (msgspec.DecodeError, RecursionError):
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
                base["engine"] = _small_int(em.group(1))
        if isinstance(rec.get("process"), int) and -_I64 <= rec["process"] < _I64:
            base["pid"] = rec["process"]
        if isinstance(rec.get("filename"), str) and isinstance(rec.get("lineno"), int) and 0 <= rec["lineno"] < _I64:
            base["source"] = f"{rec['filename']}:{rec['lineno']}"
        msg = rec["message"]
        if "\n" in msg:
            first, *rest = msg.split("\n")
            if any(r.startswith("Traceback") for r in rest) or first.startswith("Traceback"):
                return _traceback_event(first, rest, base)
            msg = first if not rest else msg
        return message_event(msg.rstrip(), base, level, self.lark)

    def close(self) -> None:
        self._flush()
        if self.raw_tb is not None:
            self.out.append(self._flush_raw_tb())


# ------------------------------------------------------------------ files


def parse_stream(stream: IO[str], label: str, clock: Clock, lark: bool = False) -> Iterator[ev.Event]:
    """Events of a text stream (newline="\n")."""
    return parse_chunks(line_chunks(stream.read), label, clock, lark)


def parse_chunks(chunks: Iterable[tuple[list[str], dict[int, str] | None]], label: str, clock: Clock, lark: bool = False) -> Iterator[ev.Event]:
    """Events of a file given as batches of physical lines (see `line_chunks`)."""
    fp = FileParser(label, clock, lark)
    feed = fp.feed
    out = fp.out
    lineno = 0
    # The hot loop, inlined for the common case: a record whose envelope is memoised, after a
    # complete record, with no traceback open. Every other line goes through
    # `FileParser.feed`, which does the same and the rest; both share the state in `fp`.
    # A one-line INFO/DEBUG record waits here as `lp` = (line, envelope, lineno, time,
    # time_text) instead of `fp.pending` (never both); `_pending(lp)` hands it over.
    file = label
    stamp = clock.stamp
    hint = clock.hint_year
    cache_get = _ENV_CACHE.get
    fast = _fast
    fast_get = _FAST_GET
    emit = fp._emit
    tb_levels = _TB_LEVELS
    uvicorn = _UVICORN.match
    HttpAccess = ev.HttpAccess
    lp = None
    no_stamp = (None,) * 9
    lr, lt, ltt = no_stamp, None, None  # the last envelope stamped here and its time (reset by any other clock use)
    for lines, notes in chunks:
        if notes is not None or lark or not FAST_PATHS:
            if lp is not None:
                fp.pending, lp = _pending(lp), None
            get = notes.get if notes is not None else {}.get
            for i, s in enumerate(lines):
                lineno += 1
                feed(lineno, s, get(i))
            lr = no_stamp
        else:
            for s in lines:
                lineno += 1
                k = s.find("] ")
                if k > 0:
                    r = cache_get(s[: k + 2])
                    if r is None and "\x1b" not in s:
                        r = _envelope(s)  # not memoised yet (a new second, a new source ...)
                    if r is not None and fp.raw_tb is None and "\x1b" not in s and not (r[0] and "T" in r[0]):
                        # (a container runtime's time stamp before the line goes the general
                        # way, which keeps it as the event's wrapper_time)
                        if lp is not None:  # the previous record is complete
                            ps, pr, pl, pt, ptt = lp
                            msg = ps[pr[8]:].rstrip()
                            h = fast_get(msg[:3])
                            e = None
                            if h is not None:
                                try:
                                    e = h(msg, file, pl, pt, ptt, pr[1], pr[5], pr[6], pr[7], pr[4], None)
                                except Exception:  # any doubt: the general route decides
                                    e = None
                            if e is not None:
                                out.append(e)
                            else:
                                emit(_pending(lp))
                        else:
                            p = fp.pending
                            if p is not None:
                                if p[3] is not None:  # it may continue as a traceback
                                    feed(lineno, s, None)
                                    lr = no_stamp
                                    continue
                                fp._flush()
                        if r is lr or (r[3] == lr[3] and r[2] == lr[2]):  # same time stamp as the last one
                            t, tt = lt, ltt
                        else:
                            if r[0]:
                                hint(int(r[0][:4]))
                            t, tt = stamp(r[2], r[3])
                            lr, lt, ltt = r, t, tt
                        if r[1] in tb_levels:
                            lp = None
                            fp.pending = _pending((s, r, lineno, t, tt))
                        else:
                            lp = (s, r, lineno, t, tt)
                        continue
                elif s.startswith("INFO:     ") and fp.raw_tb is None and "\x1b" not in s:
                    # uvicorn access line: never an envelope nor a wrap, so the record before it
                    # is complete (what `feed` then `_raw` do, without their other checks)
                    if lp is not None:
                        ps, pr, pl, pt, ptt = lp
                        lp = None
                        e = fast(ps[pr[8]:].rstrip(), file, pl, pt, ptt, pr[1], pr[5], pr[6], pr[7], pr[4], None)
                        if e is not None:
                            out.append(e)
                        else:
                            emit(_pending((ps, pr, pl, pt, ptt)))
                    elif fp.pending is not None:
                        fp._flush()
                    m = uvicorn(s)
                    if m is None:
                        fp._raw(lineno, s, None)
                        lr = no_stamp
                        continue
                    _proc, _pid, client, method, path, httpv, status, status_text, other = m.groups()
                    if method:
                        out.append(HttpAccess(client=client, method=method, path=path, http_version=httpv, status=int(status),
                                              status_text=status_text, file=file, line=lineno))
                    elif ' - "' in other:
                        out.append(ev.Unparsed(reason="malformed http_access line (cut or unknown variant)", text=s, file=file, line=lineno))
                    else:
                        out.append(ev.Noise(what="uvicorn", text=other, file=file, line=lineno))
                    continue
                if lp is not None:
                    fp.pending, lp = _pending(lp), None
                feed(lineno, s, None)
                lr = no_stamp
        if out:
            yield from out
            out.clear()
    if lp is not None:
        fp.pending = _pending(lp)
    fp.close()
    yield from out
    out.clear()


def _pending(lp: tuple) -> list:
    """The `FileParser.pending` record of a line waiting in the hot loop."""
    s, r, lineno, t, tt = lp
    end = r[8]
    return [lineno, 1, s[end:], s[:end] if r[1] in _TB_LEVELS else None, r[1], len(s), None, None, t, tt, r[5], r[6], r[7], r[4],
            None]


def parse_path(path: str, *, year: int | None = None, lark: bool = False) -> Iterator[ev.Event]:
    stream, label, mtime = open_text(path)
    try:
        raw = stream.buffer  # type: ignore[attr-defined]  # nothing read through the wrapper yet
        read = getattr(raw, "read1", raw.read)
        decode = codecs.getincrementaldecoder("utf-8")("replace").decode
        yield from parse_chunks(line_chunks(read, decode=decode), label, _clock_for(year, mtime), lark)
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
