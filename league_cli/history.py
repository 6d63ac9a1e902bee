"""The run's status history, `status_history.jsonl`: one league status per line, for plots and evaluations.

Why it is thinned: a record holds every player and payoff entry, so it grows with the league (~80 KB after five
minutes of the default league, ~300 KB after twenty, linearly on). Written at every 2 s status poll, the file
grew with the square of the run's length: ~89 MB in a 20-minute run, so ~0.8 GB in an hour and ~30 GB in six
(extrapolated). `HistoryLog`
writes a record only once the previous one's bytes are "paid for" at `bytes_per_s`, so the file grows by at
most that rate however large the league gets: small leagues keep every poll, large ones record less often.
The newest record is always written at the end, so readers see the final state.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

HISTORY_FILE = "status_history.jsonl"
"""Its name in a run directory."""

HISTORY_BYTES_PER_S = 16 * 1024
"""Average growth limit of the history file: ~58 MB an hour."""


class HistoryLog:
    """A write that fails (the run directory's disk is full) costs that record, never the run: `error` says
    what failed until a write works again, the line is not left torn in the file, and the newest record is
    tried again at the next offer and at `close`. So does a file that cannot be opened (a directory of its
    name, no permission): it is tried again at each write (it ended `league run` in a traceback)."""

    def __init__(self, path: Path, bytes_per_s: float = HISTORY_BYTES_PER_S) -> None:
        if not bytes_per_s > 0:
            raise ValueError(f"bytes_per_s must be > 0, got {bytes_per_s}")
        self.path = path
        self._fd: int | None = None
        self._closed = False
        self._bytes_per_s = bytes_per_s
        self._next_due = -math.inf
        self._unwritten: bytes | Callable[[], dict[str, Any]] | None = None
        self.error: str | None = None
        """Why the last write failed; None once one works (or none failed)."""
        self._open()

    def _open(self) -> bool:
        try:
            _drop_torn_tail(self.path)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as err:
            self.error = f"{self.path}: status records cannot be written: {err.strerror or err}"
            return False
        return True

    def offer(self, record: dict[str, Any] | Callable[[], dict[str, Any]], now: float) -> bool:
        """Write `record` (taken at monotonic time `now`) if it is due; else keep it as the newest unwritten one.
        False also when the write failed (see `error`). A callable is called only for a record written: a large
        league's record took over a second of CPU to build and encode at every 2 s poll, mostly for nothing."""
        if now < self._next_due:
            self._unwritten = record if callable(record) else _line(record)
            return False
        line = _line(record() if callable(record) else record)
        if not self._write(line):
            return False
        self._next_due = now + len(line) / self._bytes_per_s
        return True

    def close(self) -> None:
        """Write the newest record if it was held back, then close (idempotent)."""
        if self._closed:
            return
        if self._unwritten is not None:
            unwritten = self._unwritten
            self._write(unwritten if isinstance(unwritten, bytes) else _line(unwritten()))
        self._closed = True
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def _write(self, line: bytes) -> bool:
        assert not self._closed
        if self._fd is None and not self._open():
            self._unwritten = line
            return False
        assert self._fd is not None
        size = os.fstat(self._fd).st_size
        try:
            written = os.write(self._fd, line)
            if written != len(line):  # a full disk takes part of the line
                raise OSError(f"only {written} of {len(line)} bytes written")
        except OSError as err:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, size)  # no torn line in the middle of the history
            self._unwritten = line
            self.error = f"{self.path}: a status record was not written: {err.strerror or err}"
            return False
        self._unwritten = None
        self.error = None
        return True

    def __enter__(self) -> HistoryLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _line(record: dict[str, Any]) -> bytes:
    return (json.dumps(record) + "\n").encode()


def newest_record(path: Path) -> dict[str, Any] | None:
    """The last complete record of a history, read from the file's end (a torn last line, from a live run, is
    skipped); None when it has none. Reading every line for it took minutes at a day's history (~1.3 GB)."""
    with open(path, "rb") as fh:
        pos = fh.seek(0, os.SEEK_END)
        partial = b""  # the start of a line whose beginning lies further back
        while pos > 0:
            start = max(0, pos - (1 << 20))
            fh.seek(start)
            lines = (fh.read(pos - start) + partial).split(b"\n")
            pos = start
            partial = lines.pop(0) if pos > 0 else b""
            for line in reversed(lines):
                if line.strip():
                    try:
                        return json.loads(line)
                    except (json.JSONDecodeError, UnicodeDecodeError):
                        continue
    return None


def _drop_torn_tail(path: Path) -> None:
    """Cut off a last line without its newline: a run killed mid-write leaves its last record torn, and a
    resumed run appending after it would leave an unreadable line in the middle of the history. Readers forgive
    a torn last line only (a middle one means the file is not a history), so the plots would fail for good."""
    try:
        file = open(path, "r+b")
    except FileNotFoundError:
        return
    with file:
        end = file.seek(0, os.SEEK_END)
        pos = end
        while pos > 0:
            start = max(0, pos - 65536)
            file.seek(start)
            block = file.read(pos - start)
            newline = block.rfind(b"\n")
            if newline >= 0:
                cut = start + newline + 1
                break
            pos = start
        else:
            cut = 0
        if cut < end:
            file.truncate(cut)


def is_status_record(record: Any) -> bool:
    """The shape `league plot` and `league eval --run-dir` read: players with ids, payoff rows naming home and away, times that are numbers."""
    if not isinstance(record, dict) or not isinstance(record.get("players"), list):
        return False
    if any(key in record and not _is_number(record[key]) for key in ("elapsed_s", "now")):
        return False  # (the run's clock failed on it: "could not convert string to float: 'abc'", no line named)
    if not all(isinstance(p, dict) and isinstance(p.get("player_id"), str) for p in record["players"]):
        return False
    payoff = record.get("payoff", [])
    return isinstance(payoff, list) and all(isinstance(r, dict) and {"home", "away"} <= r.keys() for r in payoff)


def _is_number(value: Any) -> bool:
    """A finite number a float holds (an int of 400 digits overflows one: OverflowError; a review)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False
