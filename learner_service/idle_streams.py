"""Ending trajectory streams whose client went quiet.

A PushTrajectories stream holds one of the learner's few stream slots (and a server thread) while it waits for
its client's next chunk. A client that opens a stream and then sends nothing (an actor frozen by SIGSTOP or a
hung host, a stray tool) would hold its slot until the call's deadline, or for ever without one; enough of them
and every actor is refused with RESOURCE_EXHAUSTED. Our actors end a stream after a few tens of milliseconds
without a chunk (`SenderSettings.stream_idle_s`), so a quiet of many seconds means the client is gone or stuck:
the stream is cancelled (the client sees CANCELLED and sends its unacknowledged chunks again on a new stream,
where duplicates are recognised).

Only the wait for the *client* counts: a stream blocked on the learner's own full queue (backpressure) is not
idle. One watcher thread serves every stream; it exits once no stream has waited for a while.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

_LINGER_S = 5.0
"""How long the watcher thread stays after the last stream stopped waiting (streams come one after another)."""


class IdleStreamGuard:
    def __init__(self, idle_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if not (math.isfinite(idle_s) and idle_s > 0):
            raise ValueError(f"idle_s must be > 0 seconds, got {idle_s}")
        self.idle_s = idle_s
        self._clock = clock
        self._cond = threading.Condition()
        self._waiting: dict[int, tuple[float, str, Callable[[], None]]] = {}
        self._next_key = 0
        self._watcher: threading.Thread | None = None
        self._ended = 0

    @property
    def streams_ended(self) -> int:
        """Streams cancelled for going quiet, since the start."""
        with self._cond:
            return self._ended

    def watch(self, requests: Iterable[T], cancel: Callable[[], None], peer: str = "") -> Iterator[T]:
        """`requests`, cancelled through `cancel` once a wait for its next item lasts `idle_s`. The caller's
        iteration then ends the way the cancelled call makes it (gRPC raises its RpcError)."""
        it = iter(requests)
        with self._cond:
            key = self._next_key
            self._next_key += 1
        while True:
            self._begin_wait(key, peer, cancel)
            try:
                item = next(it)
            except StopIteration:
                return
            finally:
                self._end_wait(key)
            yield item

    def _begin_wait(self, key: int, peer: str, cancel: Callable[[], None]) -> None:
        with self._cond:
            self._waiting[key] = (self._clock() + self.idle_s, peer, cancel)
            if self._watcher is None:
                self._watcher = threading.Thread(target=self._watch, name="idle-streams", daemon=True)
                self._watcher.start()
            elif len(self._waiting) == 1:
                self._cond.notify()

    def _end_wait(self, key: int) -> None:
        with self._cond:
            self._waiting.pop(key, None)

    def _watch(self) -> None:
        quiet_since = self._clock()
        while True:
            expired: list[tuple[str, Callable[[], None]]] = []
            with self._cond:
                now = self._clock()
                if not self._waiting:
                    if now - quiet_since >= _LINGER_S:
                        self._watcher = None
                        return
                    self._cond.wait(_LINGER_S - (now - quiet_since))
                    continue
                quiet_since = now
                for key, (deadline, peer, cancel) in list(self._waiting.items()):
                    if deadline <= now:
                        del self._waiting[key]
                        expired.append((peer, cancel))
                self._ended += len(expired)
                if not expired:
                    self._cond.wait(min(deadline for deadline, _, _ in self._waiting.values()) - now)
                    continue
            for peer, cancel in expired:
                log.warning("ended a trajectory stream from %s: no chunk for %.0f s (the client is gone or stuck; "
                            "it sends its unacknowledged chunks again on a new stream)", peer or "a client",
                            self.idle_s)
                cancel()
