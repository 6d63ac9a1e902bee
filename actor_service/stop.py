"""`StopSignal`: one flag that every blocking wait of the actor wakes up on.

An actor blocks in several places — a GetJob long poll, a backoff while the coordinator or a learner is away,
a full trajectory queue — and SIGTERM must cut each of them short. Each place waits on this signal (or
registers a listener that wakes its own condition), so nothing has to poll a flag. It is a `SignalFlag`
(safe to set from a signal handler: reentrant lock, waits in slices) with listeners and a wait on a future.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from common.signal_flag import SLICE_S, SignalFlag


class _Future(Protocol):
    def done(self) -> bool: ...

    def add_done_callback(self, fn: Callable[[_Future], object]) -> None: ...


class StopSignal(SignalFlag):
    """A one-way flag; Event-compatible (`is_set`, `wait`), so `common.rpc.call_idempotent` takes it."""

    def __init__(self) -> None:
        super().__init__()
        self._listeners: list[Callable[[], None]] = []

    def set(self) -> None:
        with self._cond:
            if self._set:
                return
            super().set()
            listeners = list(self._listeners)
        for listener in listeners:  # outside our lock: a listener takes its own
            listener()

    def wait_for_future(self, future: _Future) -> bool:
        """Wait until `future` is done or the signal is set; returns whether the future is done."""
        future.add_done_callback(self._poke)
        with self._cond:
            while not (self._set or future.done()):
                self._cond.wait(SLICE_S)
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
