"""Doorbells: message counters in shared memory that let a process waiting for a message busy-wait on
memory instead of sleeping in a system call, and the budget that decides how long to busy-wait.

Why: on these virtual machines, waking a process that sleeps in `read`/`poll` costs tens of microseconds
(a cross-CPU interrupt and an exit from idle), more than stepping several light envs. A process that
expects a message soon spins on the sender's counter instead, and the sender's write then finds nobody to
wake. The pipe stays the only carrier of messages and of EOF: a counter only says that a message is (being)
written into the pipe, so the worst a stale counter can do is cost time.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import Any

from actor_service.envs.env_manager.shared_memory import unlink
from actor_service.envs.env_manager.shm_blocks import create_block

_LINE = 64  # bytes per counter: one cache line each, so two processes never write the same line
_WORDS_PER_LINE = _LINE // 8
# A gap this long between two looks at a doorbell means the spinning process was off its CPU.
_PREEMPTED_S = 30e-6


@dataclass(frozen=True)
class DoorbellAddress:
    """Where one worker's pair of counters lives (sent to the worker)."""

    shm_name: str
    index: int


class Doorbells:
    """One shared-memory block of counters, two per worker: commands sent to it, replies sent by it. The
    parent creates (and removes) it; each worker attaches to its own pair."""

    def __init__(self, shm: shared_memory.SharedMemory, count: int, owner: bool) -> None:
        self._shm = shm
        self._owner = owner
        self.count = count
        self._words: memoryview | None = shm.buf[: 2 * count * _LINE].cast("Q")

    @classmethod
    def create(cls, count: int) -> Doorbells:
        if count < 1:
            raise ValueError(f"Doorbells: count must be >= 1, got {count}")
        shm = create_block(2 * count * _LINE)
        bells = cls(shm, count, owner=True)
        for i in range(count):
            bells.clear(i)
        return bells

    @classmethod
    def attach(cls, address: DoorbellAddress) -> Doorbells:
        shm = shared_memory.SharedMemory(name=address.shm_name)
        return cls(shm, shm.size // (2 * _LINE), owner=False)

    def address(self, index: int) -> DoorbellAddress:
        return DoorbellAddress(self._shm.name, index)

    def clear(self, index: int) -> None:
        """Zero worker `index`'s counters (before a new worker process takes the slot)."""
        words = self._live()
        words[2 * index * _WORDS_PER_LINE] = 0
        words[(2 * index + 1) * _WORDS_PER_LINE] = 0

    def parent_end(self, index: int) -> Doorbell:
        return Doorbell(self._live(), out=2 * index * _WORDS_PER_LINE, peer=(2 * index + 1) * _WORDS_PER_LINE)

    def worker_end(self, index: int) -> Doorbell:
        return Doorbell(self._live(), out=(2 * index + 1) * _WORDS_PER_LINE, peer=2 * index * _WORDS_PER_LINE)

    def close(self) -> None:
        """Unmap the block (the owner also removes it). Doorbells handed out must not be used afterwards."""
        if self._words is None:
            return
        words, self._words = self._words, None
        words.release()
        self._shm.close()
        if self._owner:
            unlink(self._shm)

    def _live(self) -> memoryview:
        if self._words is None:
            raise ValueError("Doorbells are closed")
        return self._words


class Doorbell:
    """One end's view of a pair of counters: `ring` counts a message sent, `peer_sent` reads the other's."""

    __slots__ = ("_words", "_out", "_peer", "_sent")

    def __init__(self, words: memoryview, out: int, peer: int) -> None:
        self._words = words
        self._out = out
        self._peer = peer
        self._sent = words[out]

    def ring(self) -> None:
        self._sent += 1
        self._words[self._out] = self._sent

    def peer_sent(self) -> int:
        return self._words[self._peer]


class SpinBudget:
    """Busy-waiting for the next message, within a budget that follows how waits have gone.

    Spinning pays when the message comes within `limit` and this process has a CPU to itself. So the
    budget is the full `limit` while messages have been arriving within it and is halved after each longer
    wait (a slow peer: sleep instead), and it drops to nothing the moment the spinning process finds it was
    kept off its CPU (another process wanted that CPU: on a crowded machine a sleeping process, woken by
    the kernel with priority, gets its message sooner than one that queues for the CPU with the others).
    """

    __slots__ = ("limit", "current")

    def __init__(self, limit: float) -> None:
        self.limit = limit
        self.current = limit

    def spin(self, ready: Callable[[], Any], until: float = math.inf) -> Any:
        """Call `ready()` until it returns something true (returned), the budget is spent or `until` (a
        `time.monotonic()` instant) has passed, or this process was preempted (then None)."""
        end = min(time.monotonic() + self.current, until)
        before = time.monotonic()
        while True:
            for _ in range(16):
                found = ready()
                if found:
                    return found
            now = time.monotonic()
            if now >= end:
                return None
            if now - before > _PREEMPTED_S:
                self.current = 0.0
                return None
            os.sched_yield()  # a process this one waits for may be queued for this CPU
            before = now

    def waited(self, seconds: float) -> None:
        """Record how long the last wait for a message took (spinning and sleeping)."""
        if seconds <= self.limit:
            self.current = min(self.limit, self.current * 2 + self.limit / 8)
        else:
            self.current = self.current / 2 if self.current > self.limit / 32 else 0.0
