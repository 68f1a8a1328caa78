"""The reader: physical lines of a log file (plain, `.gz` or stdin), in batches of one read.

Over-long lines are cut to `MAX_LINE` characters and invalid UTF-8 is replaced, each with a
note on the line; pipeline.py turns the lines into events.
"""

from __future__ import annotations

import gzip
import io
import os
import sys
import zlib
from typing import IO, Any, Iterator

from kvreplay.errors import UserError

MAX_LINE = 4 * 1024 * 1024  # characters kept per physical line; the rest is dropped with a note


# path -> the label its events carry (the CLI's spooled stdin is "<stdin>", as `-` is)
LABELS: dict[str, str] = {}


def open_text(path: str) -> tuple[IO[str], str, float | None]:
    """(text stream, label, mtime). `-` is stdin; `.gz` is decompressed. UserError if unreadable."""
    if path in LABELS:
        stream, _, _ = open_text_file(path)
        return stream, LABELS[path], None
    return open_text_file(path)


def open_text_file(path: str) -> tuple[IO[str], str, float | None]:
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
        counted = _Counted(raw)
        raw = _Bounded(gzip.GzipFile(fileobj=counted), counted)  # type: ignore[assignment]
    return io.TextIOWrapper(raw, encoding="utf-8", errors="replace", newline="\n"), path, mtime


class _Counted:
    """A compressed file read in small pieces, counting them: the compressed bytes behind
    the decompressed ones, to within one piece (gzip asks for 128 kB at a time)."""

    PIECE = 16 << 10

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw
        self.n = 0

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(self.PIECE if n is None or n < 0 else min(n, self.PIECE))
        self.n += len(data)
        return data

    def close(self) -> None:
        self.raw.close()


class _Bounded(io.RawIOBase):
    """A decompressed stream that stops with an OSError past the `decompressed` limit or,
    past GZIP_RATIO_FREE bytes, the `gzip_ratio` limit (kvreplay.limits): a small .gz that
    expands without end is a read error, not a full memory of events."""

    def __init__(self, inner: gzip.GzipFile, compressed: _Counted) -> None:
        from kvreplay.limits import GZIP_RATIO_FREE, limit

        self.inner = inner
        self.compressed = compressed
        self.max = limit("decompressed")
        self.ratio = limit("gzip_ratio")
        self.free = GZIP_RATIO_FREE
        self.out = 0

    def readable(self) -> bool:
        return True

    def _count(self, data: bytes) -> bytes:
        self.out += len(data)
        if self.out > self.max or (self.out > self.free
                                   and self.out > self.ratio * self.compressed.n):
            from kvreplay.limits import too_large

            raise OSError(too_large(self.out, self.compressed.n))
        return data

    def read(self, n: int = -1) -> bytes:
        return self._count(self.inner.read(n if n is not None and n >= 0 else CHUNK))

    def read1(self, n: int = -1) -> bytes:
        return self._count(self.inner.read1(n if n is not None and n >= 0 else CHUNK))

    def readinto(self, b) -> int:  # type: ignore[override]
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self.inner.close()
        self.compressed.close()  # (GzipFile leaves the file it was given open)
        super().close()


def physical_lines(stream: IO[str], limit: int = MAX_LINE) -> Iterator[tuple[str, str | None]]:
    """(text without EOL, note) per physical line; over-long lines are cut to `limit` chars."""
    for lines, notes in line_chunks(stream.read, limit):
        if notes is None:
            for s in lines:
                yield s, None
        else:
            get = notes.get
            for i, s in enumerate(lines):
                yield s, get(i)


CHUNK = 64 << 10  # bytes (or characters) read at a time: events of one read stay in the CPU cache


def line_chunks(read: Any, limit: int = MAX_LINE, decode: Any = None, size: int = CHUNK) -> Iterator[tuple[list[str], dict[int, str] | None]]:
    """Physical lines in batches: `(lines, notes)`, lines without EOL, notes `{index: note}`
    (None when no line of the batch has one). `read(n)` returns text, or bytes when `decode`
    (an incremental UTF-8 decoder's `decode`) is given. The result equals `readline(limit)`
    on a newline="\n" text stream: CR before LF dropped, invalid UTF-8 replaced with a note,
    over-long lines cut to `limit` characters with a note (memory stays bounded by `limit`)."""
    tail = ""
    parts: list[str] = []  # pieces of a line longer than one read (joined once, not per read)
    plen = 0
    cut: str | None = None  # head of an over-long line whose end is still being skipped
    dropped = 0
    while True:
        try:
            data = read(size)
            eof = not data
            text = decode(data, eof) if decode is not None else data
        except (OSError, EOFError, zlib.error, gzip.BadGzipFile) as exc:  # (a corrupt or cut .gz)
            yield [""], {0: f"read error: {exc}"}
            return
        if cut is None and not eof and "\n" not in text:  # the middle of a long line
            if tail:
                parts.append(tail)
                plen += len(tail)
                tail = ""
            parts.append(text)
            plen += len(text)
            if plen >= limit:
                tail = "".join(parts)
                cut, dropped = tail[:limit], len(tail) - limit
                parts, plen, tail = [], 0, ""
            continue
        if parts:
            tail = "".join(parts)
            parts, plen = [], 0
        if cut is not None:  # skipping the rest of an over-long line
            nl = text.find("\n")
            if nl < 0 and not eof:
                dropped += len(text)
                continue
            if nl < 0:
                dropped += len(text)
                text = ""
            else:
                dropped += nl
                text = text[nl + 1:]
            yield [_finish(cut)], {0: _cut_note(cut, limit, dropped)}
            cut = None
            if eof and nl < 0:
                return
            tail = ""
        elif tail:
            text = tail + text
        if eof and not text:
            return
        lines = text.split("\n")
        tail = lines.pop()
        if eof and tail:
            lines.append(tail)
            tail = ""
        notes: dict[int, str] | None = None
        if len(text) >= limit or len(tail) >= limit:
            if len(tail) >= limit:  # an over-long line without its end yet
                cut, dropped, tail = tail[:limit], len(tail) - limit, ""
            for i, s in enumerate(lines):
                if len(s) >= limit:
                    if notes is None:
                        notes = {}
                    notes[i] = f"line truncated to {limit} characters ({len(s) - limit} dropped)"
                    lines[i] = s[:limit]
        if "\r" in text:
            lines = [s[:-1] if s[-1:] == "\r" else s for s in lines]
        if "\ufffd" in text:
            for i, s in enumerate(lines):
                if "\ufffd" in s:
                    if notes is None:
                        notes = {}
                    n = notes.get(i)
                    notes[i] = "invalid UTF-8 replaced" if n is None else n + "; invalid UTF-8 replaced"
        if lines:
            yield lines, notes
        if eof:
            if cut is not None:
                yield [_finish(cut)], {0: _cut_note(cut, limit, dropped)}
            return


def _finish(cut: str) -> str:
    return cut[:-1] if cut[-1:] == "\r" else cut


def _cut_note(cut: str, limit: int, dropped: int) -> str:  # for a line cut across reads
    note = f"line truncated to {limit} characters ({dropped} dropped)"
    if "\ufffd" in _finish(cut):
        note += "; invalid UTF-8 replaced"
    return note
