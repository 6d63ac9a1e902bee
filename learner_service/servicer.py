"""LearnerService.PushTrajectories: the gRPC face of the learner's data plane.

`DataPlane` is the logic (which player the learner takes data for now, duplicates, decoding and checks, the
bounded queue); `LearnerServicer` only translates: each chunk goes to `DataPlane.accept`, its typed refusal
becomes a status code, the stream's counts become the PushSummary.

Status codes: a message that is not a valid TrajectoryChunk -> INVALID_ARGUMENT naming its place in the
stream (`common.rpc_services`, before this servicer sees it); a chunk whose tensors cannot be decoded or do
not fit the model -> INVALID_ARGUMENT naming the key;
a chunk for another player -> FAILED_PRECONDITION; no player bound yet, or the learner stopping/rebinding
-> UNAVAILABLE (retry later); a stream beyond the learner's limit of concurrent streams -> RESOURCE_EXHAUSTED
(retry later). Chunks accepted before a refusal stay accepted.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass

import grpc

from common.job_limits import MAX_ID_CHARS, shown_id
from common.proto.league.v1 import league_pb2, league_pb2_grpc
from common.tensor_codec import CodecError, decode_chunk
from learner_service.chunks import ChunkPreparer, InvalidChunkError, PreparedChunk
from learner_service.idle_streams import IdleStreamGuard
from learner_service.intake import ChunkQueue, IntakeClosedError, SeqDeduper

log = logging.getLogger(__name__)

SERVICE = league_pb2.DESCRIPTOR.services_by_name["LearnerService"]


STOPPING_REFUSAL = "the learner is stopping; retry (the player's next learner takes the data)"


class ChunkRefused(Exception):
    """A chunk the learner does not take; ``code`` is the status the stream ends with."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Intake:
    """Where data for the bound player goes during one learn session."""

    player_id: str
    preparer: ChunkPreparer
    queue: ChunkQueue


class Accepted(enum.Enum):
    NEW = "new"
    DUPLICATE = "duplicate"
    ABANDONED = "abandoned"


@dataclass(frozen=True)
class AcceptResult:
    status: Accepted
    samples: int = 0


@dataclass(frozen=True)
class DataPlaneCounts:
    chunks_accepted: int
    chunks_duplicate: int
    samples_accepted: int


STAGING_CHUNKS = 2
"""Chunks decoded into learn rows at once, by streams checking them or waiting for room in the queue. Rows can be
several times their message (bool observations as float32, DQN's observation pairs: 11x), and every stream
blocked on a full queue held its own (a review: 6 streams of 8 MiB chunks, 634 MB against a 1 MiB queue bound);
past this, streams wait with only their message, which gRPC's receive limit bounds."""


class _StagingGate:
    """At most `limit` holders; a waiter leaves when its stream is abandoned (woken by `wake`)."""

    def __init__(self, limit: int) -> None:
        self._room = threading.Condition()
        self._held = 0
        self.limit = limit

    def enter(self, abandoned) -> bool:
        with self._room:
            while self._held >= self.limit:
                if abandoned():
                    return False
                self._room.wait(0.1)  # (and a cancelled stream's wake)
            self._held += 1
            return True

    def leave(self) -> None:
        with self._room:
            self._held -= 1
            self._room.notify()

    def wake(self) -> None:
        with self._room:
            self._room.notify_all()


class DataPlane:
    """Thread-safe: many streams call `accept` while the learner opens and closes sessions."""

    def __init__(self, deduper: SeqDeduper | None = None) -> None:
        self._lock = threading.Lock()
        self._staging = _StagingGate(STAGING_CHUNKS)
        self._intake: Intake | None = None
        self._stopping = False
        """Set for good by `mark_stopping`: no session opens again, and refused streams are told why."""
        self._deduper = deduper or SeqDeduper()
        self._receiving: set[tuple[str, str, int]] = set()
        """Chunks reserved in the de-duplicator but not yet queued (waiting for room, or being checked)."""
        self._accepted = 0
        self._duplicates = 0
        self._samples = 0
        self.learner_version = 0
        """The newest published version of the bound player (what actors can load); told in PushSummary."""

    def open(self, intake: Intake) -> None:
        with self._lock:
            self._intake = intake

    def mark_stopping(self) -> None:
        """The learner is stopping: streams refused from now on are told so, not that it is not bound yet."""
        with self._lock:
            self._stopping = True

    @property
    def stopping(self) -> bool:
        with self._lock:
            return self._stopping

    def close(self, intake: Intake | None = None) -> None:
        """Stop taking data (streams get UNAVAILABLE); what the queue holds stays for its session to drain.
        `intake`: only that one (a session ending closes its own): a late close of a session that had ended
        closed the next session's intake, failing its loop (and learner), or leaving chunks acknowledged after
        its drain untrained."""
        with self._lock:
            if intake is None:
                intake, self._intake = self._intake, None
            elif self._intake is intake:
                self._intake = None
        if intake is not None:
            intake.queue.close()

    def counts(self) -> DataPlaneCounts:
        with self._lock:
            return DataPlaneCounts(self._accepted, self._duplicates, self._samples)

    def accept(self, chunk: league_pb2.TrajectoryChunk, abandoned=lambda: False) -> AcceptResult:
        """Check, decode, de-duplicate and enqueue one chunk (blocks while the queue is full)."""
        with self._lock:
            intake, stopping = self._intake, self._stopping
        if intake is None:
            if stopping:
                raise ChunkRefused(grpc.StatusCode.UNAVAILABLE, STOPPING_REFUSAL)
            raise ChunkRefused(grpc.StatusCode.UNAVAILABLE, "the learner is not bound to a player yet; retry")
        for name in ("worker_id", "job_id"):  # first: the refusals below name them in the log
            if not getattr(chunk, name):
                raise ChunkRefused(grpc.StatusCode.INVALID_ARGUMENT, f"{name}: required (duplicates are keyed by it)")
            if len(getattr(chunk, name)) > MAX_ID_CHARS:
                raise ChunkRefused(grpc.StatusCode.INVALID_ARGUMENT, f"{name}: longer than {MAX_ID_CHARS} characters")
        if chunk.player_id != intake.player_id:
            raise ChunkRefused(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"player_id: this learner trains {intake.player_id!r}, not {shown_id(chunk.player_id)}",
            )
        if chunk.seq < 0:
            raise ChunkRefused(grpc.StatusCode.INVALID_ARGUMENT, f"seq: must be >= 0, got {chunk.seq}")
        key = (chunk.worker_id, chunk.job_id, chunk.seq)
        with self._lock:  # reserving and marking it received as one step: a copy sees either both or neither
            if self._deduper.reserve(*key):
                self._receiving.add(key)
            elif key in self._receiving:
                # The first copy still waits for room and may yet be abandoned (its stream cancelled): answered
                # DUPLICATE, this copy would count as delivered and then be in no queue.
                raise ChunkRefused(grpc.StatusCode.UNAVAILABLE,
                                   f"chunk seq {chunk.seq} is being received on another stream; retry")
            else:
                self._duplicates += 1
                return AcceptResult(Accepted.DUPLICATE)
        queued = staged = False
        try:
            staged = self._staging.enter(abandoned)
            if not staged:
                return AcceptResult(Accepted.ABANDONED)
            prepared = intake.preparer.prepare(decode_chunk(chunk))
            queued = intake.queue.put(prepared, abandoned)
            if not queued:
                return AcceptResult(Accepted.ABANDONED)
        except (CodecError, InvalidChunkError) as err:
            raise ChunkRefused(grpc.StatusCode.INVALID_ARGUMENT, f"chunk seq {chunk.seq}: {err}") from err
        except IntakeClosedError as err:
            raise ChunkRefused(grpc.StatusCode.UNAVAILABLE, str(err)) from err
        finally:
            if staged:
                self._staging.leave()
            with self._lock:
                self._receiving.discard(key)
                if not queued:  # not accepted after all: a resend is new
                    self._deduper.release(*key)
        with self._lock:
            self._accepted += 1
            self._samples += prepared.agent_steps
        return AcceptResult(Accepted.NEW, prepared.agent_steps)

    def seed_seen(self, streams: list[list]) -> None:
        """Count the chunks of a `SeqDeduper.export` as received (those trained into the checkpoint a session
        resumes: the actors of a learner killed before acknowledging them send them again)."""
        self._deduper.seed(streams)

    def forget(self, chunks: Iterable[PreparedChunk]) -> None:
        """Chunks accepted but dropped untrained (their session ended): a resend of them is new data again, not
        a duplicate acknowledged and never trained on."""
        # Newest first: a stream's released seqs then shrink its accepted prefix instead of each making a hole
        # in it (holes are bounded: past MAX_OUT_OF_ORDER of them the oldest would count as seen, and its resend
        # be answered as a duplicate and never trained on).
        self.forget_keys([(c.header.worker_id, c.header.job_id, c.header.seq) for c in chunks])

    def forget_keys(self, keys: Iterable[tuple[str, str, int]]) -> None:
        """`forget` by (worker_id, job_id, seq)."""
        for worker_id, job_id, seq in sorted(keys, key=lambda key: key[2], reverse=True):
            self._deduper.release(worker_id, job_id, seq)

    def wake(self) -> None:
        """Wake blocked streams so they notice their cancellation."""
        self._staging.wake()
        with self._lock:
            intake = self._intake
        if intake is not None:
            intake.queue.wake()


RESERVED_SERVER_THREADS = 16
"""Server threads trajectory streams never take: health checks and reflection still get an answer when every
stream waits (on a full queue behind a slow trainer, or on an actor that sends nothing)."""


class LearnerServicer(league_pb2_grpc.LearnerServiceServicer):
    def __init__(self, plane: DataPlane, max_streams: int, stream_idle_timeout_s: float = 60.0) -> None:
        """``max_streams``: trajectory streams served at once; more are refused with RESOURCE_EXHAUSTED (actors
        retry with backoff). Each stream holds one of the sync server's threads while it waits for chunks or
        for room in the queue; past the pool's size every call, health included, would hang instead.
        ``stream_idle_timeout_s``: a stream whose client sends nothing for this long is cancelled
        (`IdleStreamGuard`), so quiet clients cannot hold the slots."""
        if max_streams < 1:
            raise ValueError(f"max_streams must be >= 1, got {max_streams}")
        self._plane = plane
        self.idle_streams = IdleStreamGuard(stream_idle_timeout_s)
        self.max_streams = max_streams
        self._lock = threading.Lock()
        self._streams = 0

    @property
    def streams_in_use(self) -> int:
        with self._lock:
            return self._streams

    def PushTrajectories(self, request_iterator, context):
        with self._lock:
            admitted = self._streams < self.max_streams
            self._streams += admitted
        if not admitted:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"the learner already serves {self.max_streams} trajectory streams, its limit; retry later")
        try:
            return self._push(request_iterator, context)
        finally:
            with self._lock:
                self._streams -= 1

    def _push(self, request_iterator, context):
        cancelled = threading.Event()

        def on_done() -> None:
            cancelled.set()
            self._plane.wake()

        context.add_callback(on_done)
        accepted = duplicates = samples = 0
        for chunk in self.idle_streams.watch(request_iterator, context.cancel, context.peer()):
            try:
                result = self._plane.accept(chunk, cancelled.is_set)
            except ChunkRefused as refused:
                # A stopping learner refuses a stream under way as a whole, the chunks it took included: its stop
                # may not train them all in time (a quarter of --stop-timeout) nor publish them (a full disk, a
                # lease gone), and answered, they were lost (a review). Sent again to the player's next learner
                # (or this one restarted), those the final checkpoint was trained on are duplicates there (its
                # ledger of trained chunks), the rest are trained.
                log.info("refused a chunk from %s (job %s): %s", shown_id(chunk.worker_id), shown_id(chunk.job_id),
                         refused)
                context.abort(refused.code, str(refused))
                raise  # abort raises; this keeps the flow explicit
            if result.status is Accepted.ABANDONED:
                break
            if result.status is Accepted.DUPLICATE:
                duplicates += 1
            else:
                accepted += 1
                samples += result.samples
        if self._plane.stopping:
            # The stop came while the stream waited for its client's next chunk, and the client then ended it:
            # refused as a whole as above (answered, its chunks counted as delivered and were lost when the stop
            # could not train or publish them; a review).
            context.abort(grpc.StatusCode.UNAVAILABLE, STOPPING_REFUSAL)
        return league_pb2.PushSummary(
            chunks_accepted=accepted,
            chunks_duplicate=duplicates,
            samples_accepted=samples,
            learner_version=self._plane.learner_version,
        )
