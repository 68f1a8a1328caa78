"""What every command does with its input arguments before it runs.

* stdin (`-`) is read once into a private file (`stdin`, or `stdin.gz` when the bytes are
  gzip's), so that it is read exactly as a file is: every reader may open it again, a
  gzipped stream is decompressed, and its messages name it `-` (`as_given`).
* Ctrl-C: the command ends with one line and exit 130; processes forked for the work
  (ensemble, what-if, audit pools) leave quietly instead of printing their tracebacks.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
from typing import Any

# the attributes of the subcommands' namespaces that hold input paths
INPUT_ARGS = ("logs", "log", "paths", "workload")
GZIP_MAGIC = b"\x1f\x8b"


class Stdin:
    """stdin spooled to a file; `path` replaces `-` in the arguments."""

    def __init__(self) -> None:
        self.dir: str | None = None
        self.path: str | None = None

    def spool(self) -> str:
        if self.path is None:
            self.dir = tempfile.mkdtemp(prefix="kvreplay-stdin-")
            data = sys.stdin.buffer.read(2)
            name = "stdin.gz" if data == GZIP_MAGIC else "stdin"
            self.path = os.path.join(self.dir, name)
            with open(self.path, "wb") as f:
                f.write(data)
                shutil.copyfileobj(sys.stdin.buffer, f, 1 << 20)
            from kvreplay.parsers.reader import LABELS

            LABELS[self.path] = "<stdin>"  # its events carry the label `-` always had
        return self.path

    def as_given(self, text: str) -> str:
        """`text` with the private file's path put back as `-`."""
        if self.path is None:
            return text
        return text.replace(self.path, "-")

    def close(self) -> None:
        if self.path is not None:
            from kvreplay.parsers.reader import LABELS

            LABELS.pop(self.path, None)
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None


def spool_stdin(args: Any, stdin: Stdin) -> None:
    """Replace `-` among the input arguments with stdin's spooled file (read once)."""
    for name in INPUT_ARGS:
        v = getattr(args, name, None)
        if v == "-":
            setattr(args, name, stdin.spool())
        elif isinstance(v, list) and "-" in v:
            setattr(args, name, [stdin.spool() if p == "-" else p for p in v])


_MAIN_PID = os.getpid()


def _on_sigint(signum, frame) -> None:
    if os.getpid() != _MAIN_PID:  # a forked worker: its parent reports the interrupt
        os._exit(130)
    raise KeyboardInterrupt


def install_sigint() -> None:
    """Ctrl-C raises KeyboardInterrupt in this process only; forked workers exit quietly."""
    global _MAIN_PID
    _MAIN_PID = os.getpid()
    signal.signal(signal.SIGINT, _on_sigint)
