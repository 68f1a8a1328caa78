"""The lines of a growing log, as `tail -F` follows it, in batches.

Invariants: every complete line (ending in a newline) is given exactly once, in order; a
partial last line waits for its newline (or the end of stdin). A file replaced at its path
(a new inode: logrotate's create mode) is read to its end, then the new file from its
start; a file that shrank (copytruncate, `> log`) is read again from its start. A file
that is gone waits for one to appear, as `tail -F` does.
"""

from __future__ import annotations

import os
import select
from typing import IO

from kvreplay.errors import UserError

CHUNK = 1 << 20  # bytes read at once: a batch is bounded however far behind we are
POLL_S = 0.05  # how long a read waits for new lines before a session may replay (watch, tui)


class Batch:
    """New complete lines, and what happened to the file meanwhile (notices for stderr)."""

    __slots__ = ("lines", "notices", "eof")

    def __init__(self, lines: list[str], notices: list[str], eof: bool = False) -> None:
        self.lines, self.notices, self.eof = lines, notices, eof


def _split(partial: bytes, data: bytes) -> tuple[list[str], bytes]:
    buf = partial + data
    cut = buf.rfind(b"\n")
    if cut < 0:
        return [], buf
    return buf[:cut + 1].decode("utf-8", "replace").splitlines(keepends=True), buf[cut + 1:]


class FileFollower:
    """`tail -F PATH` from the file's first line."""

    def __init__(self, path: str) -> None:
        self.path = path
        if os.path.isdir(path):
            raise UserError(f"{path}: is a directory, not a log file")
        if path.endswith(".gz"):
            raise UserError(f"{path}: a compressed file does not grow; replay it with "
                            f"`kvreplay replay`, or follow `zcat {path} |` as `-`")
        try:
            self.f: IO[bytes] | None = open(path, "rb")
        except FileNotFoundError:
            raise UserError(f"{path}: no such file") from None
        except OSError as exc:
            raise UserError(f"{path}: cannot read: {exc.strerror or exc}") from None
        st = os.fstat(self.f.fileno())
        self.ino = (st.st_dev, st.st_ino)
        self.mtime: float | None = st.st_mtime
        self.pos = 0
        self.partial = b""

    def read(self, timeout: float) -> Batch:
        """What is new; waits up to `timeout` seconds only when nothing is."""
        lines, notices = self._drain()
        if lines:
            return Batch(lines, notices)
        notices += self._reopen_if_moved()
        lines2, more = self._drain()
        if not lines2 and not notices:
            import time

            time.sleep(timeout)
        return Batch(lines2, notices + more)

    def _drain(self) -> tuple[list[str], list[str]]:
        if self.f is None:
            return [], []
        data = self.f.read(CHUNK)
        if not data:
            return [], []
        self.pos += len(data)
        lines, self.partial = _split(self.partial, data)
        return lines, []

    def _reopen_if_moved(self) -> list[str]:
        try:
            st = os.stat(self.path)
        except OSError:
            return []  # gone (between a rotation's move and create): wait for it
        if self.f is None or (st.st_dev, st.st_ino) != self.ino:
            old = self.f
            try:
                self.f = open(self.path, "rb")
            except OSError:
                return []
            if old is not None:
                old.close()
            self.ino = (st.st_dev, st.st_ino)
            self.pos, self.partial = 0, b""
            return [f"{self.path}: replaced (rotated): following the new file from its start"]
        if st.st_size < self.pos:
            self.f.seek(0)
            self.pos, self.partial = 0, b""
            return [f"{self.path}: truncated: reading it again from its start"]
        return []

    def close(self) -> None:
        if self.f is not None:
            self.f.close()
            self.f = None


class StdinFollower:
    """stdin (`kubectl logs -f | kvreplay watch -`): its lines as they come; `eof` at its end."""

    def __init__(self, fd: int | None = None) -> None:
        import sys

        self.fd = sys.stdin.fileno() if fd is None else fd
        self.partial = b""
        self.done = False
        self.mtime = None

    def read(self, timeout: float) -> Batch:
        if self.done:
            return Batch([], [], eof=True)
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return Batch([], [])
        data = os.read(self.fd, CHUNK)
        if not data:
            self.done = True
            tail = [self.partial.decode("utf-8", "replace")] if self.partial else []
            self.partial = b""
            return Batch(tail, [], eof=True)
        lines, self.partial = _split(self.partial, data)
        return Batch(lines, [])

    def close(self) -> None:
        pass


def open_follower(source: str) -> FileFollower | StdinFollower:
    return StdinFollower() if source == "-" else FileFollower(source)
