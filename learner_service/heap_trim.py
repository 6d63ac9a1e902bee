"""Hand the heap's free memory back to the OS now and then (glibc's ``malloc_trim``), from the training loop.

Why: PPO batches change shape every iteration (actors' rows of 8..64 steps, padded to each batch's longest row).
Once torch frees a large buffer, glibc raises its dynamic mmap threshold, so later large buffers of other sizes
are carved from the heap instead of mmap, and the freed ones stay there as holes the process keeps: a default
connect-four learner fed synthetic chunks peaked at ~900 MB RSS after 150 iterations while the memory in use
(mallinfo2) went from 88 to 147 MB, and a league run's learners grew to 700-800 MB in 30 minutes.
``malloc_trim(0)`` gives the free pages of every arena back. Measured on 2 CPU cores (150 iterations, ~1 s each):
trimmed every 2 s the peak stayed ~510-540 MB (every iteration: ~465; every 10 s: ~580-650) at ~26 ms a trim,
about 1% of the training time. A fixed mmap threshold (128 KiB) kept RSS flat (~390 MB) but trained ~23% slower. Where libc has no ``malloc_trim`` (musl, macOS) trimming is a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

TRIM_EVERY_S = 2.0
"""The least time between two trims of the training loop: what the heap grows by between trims is what RSS peaks
above the memory in use, and a trim's cost grows with what it gives back (~12 ms after one iteration, ~70 after
ten), so trims are frequent but not after each of DQN's many small updates."""


@functools.cache
def malloc_trim() -> Callable[[], int] | None:
    """glibc's ``malloc_trim(0)`` as a callable returning its result (1: memory was released), or None."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
        trim = libc.malloc_trim
    except (OSError, AttributeError) as err:
        log.debug("no malloc_trim in this libc (%s): the learner's heap is not trimmed", err)
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: int(trim(0))


class HeapTrimmer:
    """`maybe_trim` trims the heap when at least ``every_s`` passed since the last trim (or since it was built)."""

    def __init__(
        self, every_s: float = TRIM_EVERY_S, *, clock: Callable[[], float] = time.monotonic,
        trim: Callable[[], int] | None = None,
    ) -> None:
        self.every_s = every_s
        self._clock = clock
        self._trim = trim if trim is not None else malloc_trim()
        self._last = clock()
        self.trims = 0

    def maybe_trim(self) -> bool:
        """Trim if one is due; True when it trimmed."""
        if self._trim is None:
            return False
        now = self._clock()
        if now - self._last < self.every_s:
            return False
        self._trim()
        self._last = self._clock()
        self.trims += 1
        return True
