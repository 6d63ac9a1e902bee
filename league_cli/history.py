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

import json
import math
import os
from pathlib import Path
from typing import Any

HISTORY_BYTES_PER_S = 16 * 1024
"""Average growth limit of the history file: ~58 MB an hour."""


class HistoryLog:
    def __init__(self, path: Path, bytes_per_s: float = HISTORY_BYTES_PER_S) -> None:
        if not bytes_per_s > 0:
            raise ValueError(f"bytes_per_s must be > 0, got {bytes_per_s}")
        _drop_torn_tail(path)
        self._file = open(path, "a")  # a resumed run appends to the league's history
        self._bytes_per_s = bytes_per_s
        self._next_due = -math.inf
        self._unwritten: str | None = None

    def offer(self, record: dict[str, Any], now: float) -> bool:
        """Write `record` (taken at monotonic time `now`) if it is due; else keep it as the newest unwritten one."""
        line = json.dumps(record) + "\n"
        if now < self._next_due:
            self._unwritten = line
            return False
        self._write(line)
        self._next_due = now + len(line) / self._bytes_per_s
        return True

    def close(self) -> None:
        """Write the newest record if it was held back, then close (idempotent)."""
        if self._file.closed:
            return
        if self._unwritten is not None:
            self._write(self._unwritten)
        self._file.close()

    def _write(self, line: str) -> None:
        self._file.write(line)
        self._file.flush()
        self._unwritten = None

    def __enter__(self) -> HistoryLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
