"""Memory for checkpoint loads, reused once the arrays of an earlier load are gone.

A load reads a whole file into a buffer whose memory then *is* the loaded tensors. Fresh memory costs a page
fault and zeroing per page, and on a VM that reports free pages to its host (virtio-balloon free page
reporting, as here) memory freed a few seconds ago must be backed by the host again: 100 MB loads 2.5 s apart
took ~160 ms into fresh memory against ~35 ms into reused memory (most of it hashing). So when every array of
a load has been dropped, its buffer goes back to a small pool instead of to the kernel, and the next load of
about the same size reads into it. The pool holds at most `keep` idle buffers; the price is that much memory
kept between loads.
"""

from __future__ import annotations

import threading
import weakref

import numpy as np

_ROUND = 2 << 20
"""Buffers are allocated in multiples of this (a huge page), so checkpoints of one model fit each other's."""
POOLED_MIN_BYTES = 1 << 20
"""Smaller loads take fresh memory (cheap at that size; not worth keeping)."""


class LoadBuffers:
    """Writable uint8 buffers of an exact size, recycled when the array handed out (and so everything that
    shares its memory: views, torch tensors made from it) has been garbage collected."""

    def __init__(self, keep: int = 2) -> None:
        if keep < 0:
            raise ValueError(f"keep must be >= 0, got {keep}")
        self._keep = keep
        self._idle: list[np.ndarray] = []
        # Reentrant: a garbage collection run while the lock is held may collect a buffer and call _give_back
        # on this very thread.
        self._lock = threading.RLock()

    def take(self, size: int) -> np.ndarray:
        """A buffer of ``size`` bytes with arbitrary content (overwrite all of it)."""
        if size < POOLED_MIN_BYTES or self._keep == 0:
            return np.empty(size, dtype=np.uint8)
        block = self._reuse(size)
        if block is None:
            block = np.empty(-(-size // _ROUND) * _ROUND, dtype=np.uint8)
        buffer = block[:size]  # a view: while anything uses it, it keeps `buffer` (and `block`) alive
        weakref.finalize(buffer, self._give_back, block).atexit = False
        return buffer

    def idle_bytes(self) -> int:
        with self._lock:
            return sum(block.nbytes for block in self._idle)

    def _reuse(self, size: int) -> np.ndarray | None:
        with self._lock:
            for index, block in enumerate(self._idle):
                if size <= block.nbytes <= size + size // 4 + _ROUND:  # not a huge block for a small load
                    return self._idle.pop(index)
        return None

    def _give_back(self, block: np.ndarray) -> None:
        """Called when the buffer made from ``block`` is collected; nothing else refers to ``block`` now."""
        with self._lock:
            if len(self._idle) < self._keep:
                self._idle.append(block)
            # else: dropped here, and its memory goes back to the kernel
