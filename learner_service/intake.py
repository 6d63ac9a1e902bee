"""Where pushed chunks wait for the trainer: a bounded queue (backpressure) and duplicate detection.

The queue is bounded in chunks and in bytes. A pushing stream whose chunk does not fit blocks in `put` (its
RPC thread stops reading the stream, so gRPC flow control slows the actor down); nothing is buffered without
bound and nothing is dropped. `close` wakes every waiter: the session ends, blocked streams are told to retry; what was accepted before
stays for `drain` (a stopping learner still trains on it).
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

from learner_service.chunks import PreparedChunk


class IntakeClosedError(Exception):
    """The queue was closed (the learner stops or rebinds) while a chunk waited for room."""


class ChunkQueue:
    """FIFO of prepared chunks, bounded by count and total bytes; one chunk larger than the byte bound fits
    alone, so no chunk waits forever."""

    def __init__(self, max_chunks: int, max_bytes: int) -> None:
        if max_chunks < 1 or max_bytes < 1:
            raise ValueError(f"max_chunks and max_bytes must be >= 1, got {max_chunks}, {max_bytes}")
        self.max_chunks = max_chunks
        self.max_bytes = max_bytes
        self._items: deque[PreparedChunk] = deque()
        self._bytes = 0
        self._closed = False
        self._cond = threading.Condition()

    def __len__(self) -> int:
        with self._cond:
            return len(self._items)

    @property
    def closed(self) -> bool:
        with self._cond:
            return self._closed

    def put(self, chunk: PreparedChunk, abandoned: Callable[[], bool] = lambda: False) -> bool:
        """Wait for room, then enqueue. False when ``abandoned()`` became true first (the stream was cancelled;
        call `wake` after it changes). Raises `IntakeClosedError` when the queue is closed first."""
        size = chunk.nbytes
        with self._cond:
            self._cond.wait_for(lambda: self._closed or abandoned() or self._fits(size))
            if self._closed:
                raise IntakeClosedError("the learner is not taking data now (stopping or rebinding); retry")
            if not self._fits(size):
                return False
            self._items.append(chunk)
            self._bytes += size
            self._cond.notify_all()
            return True

    def get(self, timeout: float | None = None) -> PreparedChunk | None:
        """The oldest chunk; None when closed (what is left stays for `drain`) or when ``timeout`` passed."""
        with self._cond:
            self._cond.wait_for(lambda: self._closed or self._items, timeout)
            if self._closed or not self._items:
                return None
            chunk = self._items.popleft()
            self._bytes -= chunk.nbytes
            self._cond.notify_all()
            return chunk

    def drain(self) -> list[PreparedChunk]:
        """Everything still queued, oldest first; the queue is empty afterwards."""
        with self._cond:
            items, self._items, self._bytes = list(self._items), deque(), 0
            self._cond.notify_all()
            return items

    def wake(self) -> None:
        """Make blocked `put` calls re-check their ``abandoned`` predicate."""
        with self._cond:
            self._cond.notify_all()

    def close(self) -> None:
        """Refuse further chunks and wake everyone; queued chunks stay for `drain`."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _fits(self, size: int) -> bool:
        if not self._items:
            return True
        return len(self._items) < self.max_chunks and self._bytes + size <= self.max_bytes


@dataclass
class _StreamSeqs:
    below: int = 0
    """Every seq below this was seen."""
    above: set[int] | None = None
    """Seen seqs >= below (out of order)."""
    holes: set[int] | None = None
    """Seqs below `below` released after all (their chunks not accepted): not seen, a resend is new."""


MAX_OUT_OF_ORDER = 4096
"""Seqs one stream may have accepted past a gap before the gap is given up on (an actor has a few dozen chunks
in flight at most; resends come first)."""


class SeqDeduper:
    """Remembers which (worker_id, job_id, seq) were accepted, for the most recent ``max_streams`` streams.

    Per stream it keeps the contiguous prefix as one number and only out-of-order seqs in a set, so memory
    stays small however long a job streams. `reserve` is atomic: of two concurrent copies, one wins.
    """

    def __init__(self, max_streams: int = 4096) -> None:
        if max_streams < 1:
            raise ValueError(f"max_streams must be >= 1, got {max_streams}")
        self.max_streams = max_streams
        self._streams: OrderedDict[tuple[str, str], _StreamSeqs] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """Streams remembered."""
        with self._lock:
            return len(self._streams)

    def reserve(self, worker_id: str, job_id: str, seq: int) -> bool:
        """True if the seq is new (now recorded), False for a duplicate."""
        with self._lock:
            key = (worker_id, job_id)
            stream = self._streams.get(key)
            if stream is None:
                stream = self._streams[key] = _StreamSeqs()
                while len(self._streams) > self.max_streams:
                    self._streams.popitem(last=False)
            self._streams.move_to_end(key)
            if stream.holes and seq in stream.holes:
                stream.holes.discard(seq)  # a resend of a chunk released below the prefix
                return True
            if seq < stream.below or (stream.above is not None and seq in stream.above):
                return False
            if seq == stream.below:
                stream.below += 1
                while stream.above and stream.below in stream.above:
                    stream.above.discard(stream.below)
                    stream.below += 1
            else:
                stream.above = stream.above or set()
                stream.above.add(seq)
                if len(stream.above) > MAX_OUT_OF_ORDER:
                    # Seqs below the oldest held out of order never came (a stream first seen past seq 0: its
                    # learner restarted mid-job; or a sender skipping some): given up on, so memory stays bounded
                    # and no later seq walks a million-long gap under the lock. A resend of one is a duplicate.
                    stream.below = min(stream.above)
                    while stream.above and stream.below in stream.above:
                        stream.above.discard(stream.below)
                        stream.below += 1
            return True

    def release(self, worker_id: str, job_id: str, seq: int) -> None:
        """Forget a reserved seq whose chunk was not accepted after all (so a resend is not a duplicate)."""
        with self._lock:
            stream = self._streams.get((worker_id, job_id))
            if stream is None:
                return
            if stream.above is not None and seq in stream.above:
                stream.above.discard(seq)
            elif seq < stream.below and not (stream.holes and seq in stream.holes):
                # Inside the contiguous prefix: a hole in it. (Splitting the prefix, keeping the seqs above as
                # out-of-order ones, enumerated them under the lock: after a gap given up on, a seq reserved
                # before it and released made a set of every seq up to the gap's end, ~10^12 for a client that
                # wanted it; a review.)
                stream.holes = stream.holes or set()
                stream.holes.add(seq)
                if len(stream.holes) > MAX_OUT_OF_ORDER:  # (released chunks never sent again: forgotten, seen)
                    stream.holes.discard(min(stream.holes))
                while stream.holes and stream.below - 1 in stream.holes:
                    stream.holes.discard(stream.below - 1)
                    stream.below -= 1
            if stream.below == 0 and not stream.above and not stream.holes:  # nothing of it accepted: a refused
                del self._streams[(worker_id, job_id)]  # stream leaves nothing

    def export(self, max_streams: int | None = None) -> list[list]:
        """The seqs seen, in plain lists (what a checkpoint's training state may hold): one
        ``[worker_id, job_id, below, above, holes]`` per stream, the ``max_streams`` most recently used (all by
        default), oldest first. `seed` takes it back."""
        with self._lock:  # (the sets too: a reserve on the intake's thread changes them in place)
            streams = list(self._streams.items())
            if max_streams is not None:
                streams = streams[-max_streams:] if max_streams > 0 else []
            return [[worker_id, job_id, s.below, sorted(s.above or ()), sorted(s.holes or ())]
                    for (worker_id, job_id), s in streams]

    def seed(self, streams: list[list]) -> None:
        """Count as seen every seq an `export` names, besides those seen already (a learner resuming a checkpoint
        takes the chunks trained into it: resent, they are duplicates). Raises ValueError on a malformed entry,
        before changing anything."""
        parsed = [_parse_exported(entry) for entry in streams]
        with self._lock:
            for key, seen in parsed:
                stream = self._streams.get(key)
                self._streams[key] = seen if stream is None else _union(stream, seen)
                self._streams.move_to_end(key)
                while len(self._streams) > self.max_streams:
                    self._streams.popitem(last=False)


def _parse_exported(entry: object) -> tuple[tuple[str, str], _StreamSeqs]:
    def seqs(value: object, what: str) -> set[int]:
        if not isinstance(value, list | tuple) or len(value) > MAX_OUT_OF_ORDER or not all(
                isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in value):
            raise ValueError(f"{what}: expected at most {MAX_OUT_OF_ORDER} seqs >= 0, got {value!r:.80}")
        return set(value)

    if not isinstance(entry, list | tuple) or len(entry) != 5:
        raise ValueError(f"expected [worker_id, job_id, below, above, holes], got {entry!r:.80}")
    worker_id, job_id, below, above, holes = entry
    if not (isinstance(worker_id, str) and isinstance(job_id, str)):
        raise ValueError(f"worker_id and job_id must be strings, got {worker_id!r:.40}, {job_id!r:.40}")
    if not isinstance(below, int) or isinstance(below, bool) or below < 0:
        raise ValueError(f"below must be an int >= 0, got {below!r:.40}")
    return (worker_id, job_id), _StreamSeqs(below, seqs(above, "above") or None, seqs(holes, "holes") or None)


def _seen(stream: _StreamSeqs, seq: int) -> bool:
    if seq < stream.below:
        return not (stream.holes and seq in stream.holes)
    return bool(stream.above and seq in stream.above)


def _union(a: _StreamSeqs, b: _StreamSeqs) -> _StreamSeqs:
    """The seqs seen in either: below the larger prefix a seq is unseen only where both had not seen it."""
    hi, lo = (a, b) if a.below >= b.below else (b, a)
    holes = {seq for seq in hi.holes or () if not _seen(lo, seq)}
    above = {seq for seq in (*(hi.above or ()), *(lo.above or ())) if seq >= hi.below}
    merged = _StreamSeqs(hi.below, above or None, holes or None)
    while merged.above and merged.below in merged.above:
        merged.above.discard(merged.below)
        merged.below += 1
    return merged
