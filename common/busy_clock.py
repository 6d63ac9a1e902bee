"""How long the operation under way has taken, and when a job's heartbeat should let its lease go.

Why: a read or write on a network filesystem whose server went away (a hard NFS mount) never returns, and no
interrupt reaches a thread waiting in the kernel. The thread that keeps a job's lease alive (an actor's or a
learner's heartbeat) checks its `StallWatch`es (a `BusyClock`'s `busy_s`, the env manager's overrun) through a
`StallGate` and stops renewing once one is past its limit, so the league gives the job to someone else instead of
waiting for ever.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass


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


@dataclass(frozen=True)
class StallWatch:
    """Something a job's thread may be stuck in where nothing breaks it off, and when to give the job up."""

    what: str
    """For the log, before "over N s": "its env has been stuck past its timeout for", "a checkpoint read has taken"."""
    seconds: Callable[[], float]
    """How long it has been stuck so far (0: not stuck); called from the heartbeat thread."""
    limit_s: float
    """Past this, renewals stop."""

    def __post_init__(self) -> None:
        if not self.limit_s >= 0:
            raise ValueError(f"StallWatch {self.what!r}: limit_s must be >= 0 s, got {self.limit_s}")


class StallGate:
    """A heartbeat's check before each renewal: the first watch past its limit (renewals withheld), or None. Says
    so in `log` when a stall starts ("no longer renewing the lease, so that `consequence`") and when it ends."""

    def __init__(self, watches: Sequence[StallWatch], subject: str, consequence: str, log: logging.Logger) -> None:
        self._watches = tuple(watches)
        self._subject = subject
        self._consequence = consequence
        self._log = log
        self._stuck: StallWatch | None = None

    def stuck(self) -> StallWatch | None:
        was, now = self._stuck, next((w for w in self._watches if w.seconds() > w.limit_s), None)
        self._stuck = now
        if now is not None and was is None:
            self._log.error("%s: %s over %g s (a hang nothing breaks off); no longer renewing the lease, so that %s",
                            self._subject, now.what, now.limit_s, self._consequence)
        elif now is None and was is not None:
            self._log.warning("%s: no longer stuck (%s no more); renewing the lease again", self._subject, was.what)
        return now
