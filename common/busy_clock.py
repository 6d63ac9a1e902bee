"""How long the operation under way has taken, for a watchdog on another thread.

Why: a read or write on a network filesystem whose server went away (a hard NFS mount) never returns, and no
interrupt reaches a thread waiting in the kernel. The thread that keeps a job's lease alive (an actor's or a
learner's heartbeat) asks `busy_s` and lets the lease go once the operation has taken too long, so the league
gives the job to someone else instead of waiting for ever.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator


class BusyClock:
    """Times one thread's operations, one at a time; `busy_s` is safe to call from any thread."""

    def __init__(self) -> None:
        self._since: float | None = None  # time.monotonic() when the operation under way began

    def busy_s(self) -> float:
        """How long the operation under way has taken so far; 0 when none is."""
        since = self._since
        return 0.0 if since is None else max(0.0, time.monotonic() - since)

    @contextlib.contextmanager
    def timed(self) -> Iterator[None]:
        """Time the block as the operation under way (not nested: the outermost block counts)."""
        if self._since is not None:  # an operation inside one already timed
            yield
            return
        self._since = time.monotonic()
        try:
            yield
        finally:
            self._since = None
