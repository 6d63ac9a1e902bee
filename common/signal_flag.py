"""`SignalFlag`: what a signal handler sets to tell the main thread to stop. `threading.Event` is not safe there.

A Python signal handler runs in the main thread between two bytecodes, whatever that thread is doing, and
signals come in bursts: a supervisor killed outright sends its children one SIGTERM per thread it had (the
parent-death signal), and people press Ctrl-C twice. With `threading.Event`, a coordinator hung in such a
burst both ways this guards against:
- a handler called `set()` while its own thread held the event's plain `Lock` (inside `wait()`, or inside an
  earlier handler's `set()`), and waited for that lock forever. The flag's lock is reentrant.
- a handler set the flag after the waiting thread had checked it but before it went to sleep: the handler
  runs on that very thread, so there was nobody to wake, and the wake-up was lost. The flag waits in slices
  of at most `SLICE_S`, so such a set is seen within a slice.
"""

from __future__ import annotations

import threading
import time

SLICE_S = 0.1


class SignalFlag:
    """A one-way flag with `threading.Event`'s `set`, `is_set` and `wait`, safe to set from signal handlers."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.RLock())
        self._set = False

    def set(self) -> None:
        with self._cond:
            self._set = True
            self._cond.notify_all()

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until set or `timeout` seconds passed; returns whether it is set."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not self._set:
                remaining = SLICE_S if deadline is None else min(SLICE_S, deadline - time.monotonic())
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            return self._set
