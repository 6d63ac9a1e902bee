"""The ERROR lines the league's processes write to their logs, for `league run` to show as they happen.

A league whose learner cannot publish (a full disk), whose actor's env fails to build, or whose coordinator
cannot write its state keeps running, and the run's output showed nothing of it: the reason sat in a log
file under the run directory, and the first sign in the output was a stall line a minute later. Healthy runs
log no ERROR line (BENCHMARKS.md's end-to-end runs check it), so each one is worth a line of its own.

Every process logs in `common.cli_args.LOG_FORMAT`; a traceback's lines follow its
ERROR line and are left in the log (the run's output gets the message, the log the details).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from league_cli.processes import LOG_LINE_START, ManagedProcess

MAX_LINES_PER_POLL = 3
"""ERROR lines shown per process and poll; the rest are counted ("and N more")."""
MAX_READ_BYTES = 1 << 20
"""Log bytes read per process and poll: a process writing faster is read on at the next polls."""
MAX_MESSAGE_CHARS = 400

_ERROR_LINE = re.compile(LOG_LINE_START + r"\S* (ERROR|CRITICAL) (\S+): (.*)$")


@dataclass
class _Follow:
    path: Path
    position: int


class LogErrors:
    """Follows log files from where each process's lines begin and returns their new ERROR lines."""

    def __init__(self) -> None:
        self._follows: dict[str, _Follow] = {}

    def check(self, processes: Iterable[ManagedProcess], *, to_end: bool = False) -> list[str]:
        """New ERROR lines of `processes` as "name: LEVEL logger: message", oldest first per process. A process
        restarted under its name is read on from where its predecessor's lines were left (its last words), and
        one followed before but no longer among `processes` (a supervisor forgets the workers it has stopped) is
        read on all the same: what it said while it stopped is the most likely ERROR of all. A poll reads up to
        MAX_READ_BYTES of each log (the rest at the next); `to_end`, for the last check of a run, reads it all."""
        for proc in processes:
            follow = self._follows.get(proc.name)
            if follow is None or follow.path != proc.log_path:
                self._follows[proc.name] = _Follow(proc.log_path, proc.log_offset)
        lines: list[str] = []
        for name, follow in self._follows.items():
            lines += self._new_errors(name, follow, to_end)
        return lines

    def _new_errors(self, name: str, follow: _Follow, to_end: bool) -> list[str]:
        errors: list[str] = []
        while True:
            read = self._read_on(name, follow, errors)
            if not (to_end and read == MAX_READ_BYTES):
                break
        if len(errors) > MAX_LINES_PER_POLL:
            more = len(errors) - MAX_LINES_PER_POLL
            errors = errors[:MAX_LINES_PER_POLL] + [f"{name}: and {more} more ERROR line(s) in {follow.path}"]
        return errors

    @staticmethod
    def _read_on(name: str, follow: _Follow, errors: list[str]) -> int:
        """Read up to MAX_READ_BYTES of whole lines from where `follow` is, adding their ERROR lines to `errors`;
        returns the bytes read (0: nothing new, or a line still being written)."""
        try:
            with open(follow.path, "rb") as log:
                size = log.seek(0, 2)
                if size < follow.position:  # truncated or replaced: read it from the start
                    follow.position = 0
                log.seek(follow.position)
                chunk = log.read(MAX_READ_BYTES)
        except OSError:
            return 0  # not written yet, or unreadable: nothing to show, and the run goes on
        end = chunk.rfind(b"\n")
        if end < 0:
            if len(chunk) < MAX_READ_BYTES:
                return 0  # a line still being written: read it whole at a later poll
            end = len(chunk) - 1  # one line longer than a read: take it in pieces
        follow.position += end + 1
        for raw in chunk[: end + 1].splitlines():
            match = _ERROR_LINE.match(raw.decode(errors="replace"))
            if match is not None:
                level, logger, message = match.groups()
                if len(message) > MAX_MESSAGE_CHARS:
                    message = message[: MAX_MESSAGE_CHARS - 1] + "…"
                errors.append(f"{name}: {level} {logger}: {message}")
        return len(chunk)
