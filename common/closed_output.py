"""What a command does once the reader of its output went away (`league status | head`, a closed terminal)."""

from __future__ import annotations

import os
import sys
from typing import IO, Any


def discard_output(stream: IO[Any] | None = None) -> None:
    """Point `stream`'s file (default: stdout) at /dev/null once its reader is gone: the interpreter flushes
    stdout at exit, and what is left in the buffer raised BrokenPipeError again there ("Exception ignored",
    exit status 120), as would any later write. A stream with no file (captured in a test) is left as it is."""
    stream = sys.stdout if stream is None else stream
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def raise_broken_pipe() -> None:
    """A rich Console's `on_broken_pipe`: rich's own exits 1 (SystemExit); this lets the command end as for any
    closed output (`league_cli.main`: nowhere to write, exit 0)."""
    raise BrokenPipeError
