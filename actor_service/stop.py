"""`StopSignal`: one flag that every blocking wait of the actor wakes up on.

An actor blocks in several places — a GetJob long poll, a backoff while the coordinator or a learner is away,
a full trajectory queue — and SIGTERM must cut each of them short. Each place waits on this signal (or
registers a listener that wakes its own condition), so nothing has to poll a flag.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol


class _Future(Protocol):
    def done(self) -> bool: ...

    def add_done_callback(self, fn: Callable[[_Future], object]) -> None: ...


class StopSignal:
    """A one-way flag; Event-compatible (`is_set`, `wait`), so `common.rpc.call_idempotent` takes it."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._set = False
        self._listeners: list[Callable[[], None]] = []

    def set(self) -> None:
        with self._cond:
            if self._set:
                return
            self._set = True
            listeners = list(self._listeners)
            self._cond.notify_all()
        for listener in listeners:  # outside our lock: a listener takes its own
            listener()

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until set or `timeout` passed; returns whether it is set (a backoff sleep that stops early)."""
        with self._cond:
            self._cond.wait_for(lambda: self._set, timeout)
            return self._set

    def wait_for_future(self, future: _Future) -> bool:
        """Wait until `future` is done or the signal is set; returns whether the future is done."""
        future.add_done_callback(self._poke)
        with self._cond:
            self._cond.wait_for(lambda: self._set or future.done())
        return future.done()

    def add_listener(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call `listener()` when the signal is set (at once if it already is); returns an unregister function."""
        with self._cond:
            already = self._set
            if not already:
                self._listeners.append(listener)
        if already:
            listener()

        def remove() -> None:
            with self._cond:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return remove

    def _poke(self, _future: object) -> None:
        with self._cond:
            self._cond.notify_all()
