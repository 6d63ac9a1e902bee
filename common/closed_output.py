"""What a command does once the reader of its output went away (`league status | head`, a closed terminal)."""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Callable
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


class GuardedOutput:
    """A text stream that no write error escapes: a long-running command's progress must never end it half way.

    The reader gone (EPIPE: `| head`, `| tee` at a Ctrl-C) or the terminal gone (EIO: a closed ssh session under
    `&`), or the file closed: from then on everything is written nowhere and `on_closed` is called once (the
    command stops in order, as at SIGHUP). Known only once the callback is set: called then. No room for the
    output (ENOSPC: `> out.log` on a full disk) drops that write only; the command goes on, and its output
    resumes once there is room. (`league run` died with a traceback from a print at its stop, before its
    ordered stop: every process got the parent-death signal at once; a review.)"""

    _GONE = frozenset({errno.EPIPE, errno.EIO, errno.EBADF, errno.ECONNRESET, errno.ENXIO})

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream
        self._on_closed: Callable[[], None] | None = None
        self.gone = False

    def on_closed(self, callback: Callable[[], None]) -> None:
        self._on_closed = callback
        if self.gone:
            callback()

    def write(self, text: str) -> int:
        if not self.gone:
            self._guarded(self._stream.write, text)
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            self._guarded(self._stream.flush)

    def _guarded(self, call: Callable[..., Any], *args: Any) -> None:
        try:
            call(*args)
        except UnicodeEncodeError:  # a character its encoding lacks (LANG=C): that line, legibly, not the run
            encoding = getattr(self._stream, "encoding", None) or "ascii"
            self._guarded(call, *(a.encode(encoding, "replace").decode(encoding) for a in args))
        except (OSError, ValueError) as err:  # (ValueError: a write to a closed file)
            if isinstance(err, OSError) and err.errno not in self._GONE:
                return  # ENOSPC and the like: this write is lost, later ones are tried
            self.gone = True
            discard_output(self._stream)  # what is still buffered goes nowhere (the flush at exit too)
            if self._on_closed is not None:
                self._on_closed()

    def isatty(self) -> bool:
        try:
            return not self.gone and self._stream.isatty()
        except (OSError, ValueError):
            return False

    def fileno(self) -> int:
        return self._stream.fileno()

    def __getattr__(self, name: str) -> Any:  # encoding, errors, ...: the stream's
        return getattr(self._stream, name)
