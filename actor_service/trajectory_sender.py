"""Where an actor's trajectories go: the `TrajectorySink` interface and its gRPC implementation.

`TrajectorySender` streams chunks to a learner's PushTrajectories through a bounded queue:

- `write` encodes the trajectory as the next chunk (seq 0, 1, ... per job) and blocks while `queue_chunks` wait
  to be sent — so a slow learner slows the rollout down instead of growing memory (backpressure).
- A sender thread feeds the queue into client streams. A stream ends after `stream_chunks` chunks or when the
  queue stays empty for `stream_idle_s`; the learner's PushSummary at its end acknowledges every chunk in it.
  Chunks of a stream that failed are sent again on the next one (the learner drops duplicates by seq), so at
  most queue_chunks + stream_chunks chunks are ever held.
- A learner that is away (UNAVAILABLE, ...) is retried with exponential backoff on a fresh channel; one that
  stays unreachable for `unreachable_s`, or refuses the data outright, fails the sender: `write` / `flush` raise
  `SenderError` and the job fails.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

import grpc

from actor_service.backoff import Backoff, BackoffSettings, status_code
from actor_service.stop import StopSignal
from common.proto.league.v1 import league_pb2, league_pb2_grpc
from common.rpc import make_channel
from common.tensor_codec import ChunkHeader, encode_chunk
from common.trajectory import Trajectory

log = logging.getLogger(__name__)

# Refusals that may pass: the learner restarting, overloaded, or shutting a stream down.
_RETRY_CODES = frozenset({
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
})
QUIET_RETRY_S = 10.0
"""Retries within this long of the first failure are logged at INFO, later ones at WARNING: a league's start
has a learner refuse its first chunks for a moment ("not bound to a player yet": the coordinator hands out its
address as it hands it the player, before its data plane opens), which a healthy run should not warn about. A
resumed learner loads its checkpoint and training state first: ~3 s on these machines, past the 2 s this was,
so every clean resume of the default league warned (a review)."""
# Chunks are cut below this size; the learner's server must accept messages at least this large.
MAX_CHUNK_BYTES = 4 * 1024 * 1024
_CHANNEL_MAX_MESSAGE_BYTES = 64 * 1024 * 1024


class TrajectorySink(Protocol):
    """Takes the launch player's trajectory rows as they are built."""

    def write(self, trajectory: Trajectory, policy_version: int) -> None: ...


@dataclass
class InMemorySink:
    """A sink that keeps everything (eval runs, tests)."""

    items: list[tuple[Trajectory, int]] = field(default_factory=list)

    def write(self, trajectory: Trajectory, policy_version: int) -> None:
        self.items.append((trajectory, policy_version))


class SenderError(RuntimeError):
    """The learner refused the data, or stayed unreachable too long; the job cannot deliver its trajectories."""


@dataclass(frozen=True)
class SenderSettings:
    queue_chunks: int = 8
    """Encoded chunks waiting to be sent; `write` blocks beyond this (backpressure)."""
    stream_chunks: int = 16
    """Chunks per stream: the learner acknowledges them all at the stream's end."""
    stream_idle_s: float = 0.05
    """A stream ends once no chunk arrived for this long (its chunks are then acknowledged)."""
    stream_timeout_s: float = 120.0
    """Deadline of one stream (a slow learner may take long to read `stream_chunks` chunks)."""
    unreachable_s: float = 120.0
    """The sender fails once the learner has refused or been unreachable this long without a success, counted
    from the end of the first failed stream: a learner that takes streams and never answers (wedged, frozen) is
    given up on up to `stream_timeout_s` later, and the error says how long it answered nothing."""
    backoff: BackoffSettings = BackoffSettings(initial_s=0.1, max_s=2.0)

    def within(self, chunks_in_flight: int) -> SenderSettings:
        """These settings holding at most `chunks_in_flight` chunks (a job's ``adder_kwargs``; 0: as they are)."""
        if not chunks_in_flight:
            return self
        queued = min(self.queue_chunks, chunks_in_flight // 2)
        return replace(self, queue_chunks=queued, stream_chunks=min(self.stream_chunks, chunks_in_flight - queued))

    def __post_init__(self) -> None:
        for name in ("queue_chunks", "stream_chunks"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("stream_idle_s", "stream_timeout_s", "unreachable_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")


@dataclass(frozen=True)
class SenderStats:
    chunks_written: int
    chunks_acked: int
    chunks_resent: int
    chunks_dropped: int
    streams: int
    failed_streams: int
    max_held: int
    """The most chunks held at once (queued + being streamed): the sender's memory bound in action."""
    samples_written: int


class _Stream:
    """The chunks one stream has taken from the queue; they are held until its PushSummary arrives."""

    def __init__(self) -> None:
        self.taken: list[league_pb2.TrajectoryChunk] = []
        self.dead = False


class TrajectorySender:
    def __init__(
        self,
        endpoint: str,
        header: ChunkHeader,
        *,
        stop: StopSignal,
        settings: SenderSettings | None = None,
        token: str | None = None,
        tls_ca: Path | None = None,
        tls_server_name: str | None = None,
    ) -> None:
        if not endpoint:
            raise ValueError("learner endpoint is empty")
        self.endpoint = endpoint
        self._header = header
        self._settings = settings or SenderSettings()
        self._token = token
        self._tls_ca = tls_ca
        self._tls_server_name = tls_server_name
        self._stop = stop
        self._cond = threading.Condition()
        self._queue: deque[league_pb2.TrajectoryChunk] = deque()
        self._resend: deque[league_pb2.TrajectoryChunk] = deque()
        self._stream: _Stream | None = None
        self._next_seq = header.seq
        self._failure: SenderError | None = None
        self._aborted = False
        self._closing = False
        self._channel: grpc.Channel | None = None
        self._counts = dict(written=0, acked=0, resent=0, dropped=0, streams=0, failed=0, max_held=0, samples=0)
        self._unlisten = stop.add_listener(self._wake)
        self._thread = threading.Thread(target=self._serve, name=f"sender-{header.job_id}", daemon=True)
        self._thread.start()

    # ---- producer side -------------------------------------------------------------------------------------

    def write(self, trajectory: Trajectory, policy_version: int) -> None:
        """Queue `trajectory` as the next chunk; blocks while the queue is full (on stop it queues anyway, so
        the current step can finish)."""
        header = ChunkHeader(self._header.job_id, self._header.player_id, self._header.worker_id,
                             0, max(0, int(policy_version)))
        with self._cond:
            self._cond.wait_for(
                lambda: len(self._queue) < self._settings.queue_chunks or self._stopped_locked()
            )
            self._raise_if_failed_locked()
            if self._aborted:
                self._counts["dropped"] += 1
                return
            seq = self._next_seq
            self._next_seq += 1
        chunk = encode_chunk(trajectory, ChunkHeader(header.job_id, header.player_id, header.worker_id, seq,
                                                     header.policy_version))
        if (size := chunk.ByteSize()) > _CHANNEL_MAX_MESSAGE_BYTES:
            # Chunks are cut between rows: one row this large cannot be sent at all. gRPC's own refusal
            # (RESOURCE_EXHAUSTED, as a learner's backpressure) was retried as transient for `unreachable_s`, and
            # the job then failed as "learner unreachable".
            raise SenderError(
                f"one trajectory row of {trajectory.num_steps} steps encodes to {size:,} bytes, above the "
                f"{_CHANNEL_MAX_MESSAGE_BYTES:,} a chunk may carry to the learner: lower the player's "
                "adder_kwargs.unroll_len (rows are cut at it) or make the observations smaller")
        with self._cond:
            if self._aborted:  # aborted while it was encoded: dropped like the rest, not queued behind the abort
                self._counts["dropped"] += 1
                return
            self._queue.append(chunk)
            self._counts["written"] += 1
            self._counts["samples"] += trajectory.num_steps
            self._note_held_locked()
            self._cond.notify_all()

    def flush(self, timeout: float | None = None, *, until_stop: bool = False) -> bool:
        """Wait until every chunk written is acknowledged; False if `timeout` passed first (or, with
        `until_stop`, the stop signal was set). Raises `SenderError` if the sender failed."""
        with self._cond:
            self._cond.wait_for(
                lambda: self._drained_locked() or self._failure is not None or self._aborted
                or (until_stop and self._stop.is_set()),
                timeout,
            )
            self._raise_if_failed_locked()
            return self._drained_locked()

    def abort(self) -> None:
        """Drop whatever is not yet acknowledged and stop sending (the job was revoked, or shutdown)."""
        with self._cond:
            if not self._aborted:
                self._aborted = True
                self._counts["dropped"] += len(self._queue) + len(self._resend)
                if self._stream is not None:
                    self._counts["dropped"] += len(self._stream.taken)
                self._queue.clear()
                self._resend.clear()
            self._cond.notify_all()
            channel, self._channel = self._channel, None
        if channel is not None:
            channel.close()  # ends a stream blocked on a learner that stopped reading

    def close(self) -> None:
        """Stop the sender thread (dropping anything not acknowledged: `flush` first) and free the channel."""
        with self._cond:
            self._closing = True
        self.abort()
        if self._thread is not threading.current_thread():
            self._thread.join()
        self._unlisten()
        self._close_channel()

    @property
    def stats(self) -> SenderStats:
        with self._cond:
            c = self._counts
            return SenderStats(c["written"], c["acked"], c["resent"], c["dropped"], c["streams"], c["failed"],
                               c["max_held"], c["samples"])

    @property
    def held(self) -> int:
        with self._cond:
            return self._held_locked()

    # ---- sender thread -------------------------------------------------------------------------------------

    def _serve(self) -> None:
        """The thread: `_run`, and any error it did not expect fails the sender. A thread that died quietly would
        leave the rollout waiting for room in the queue, or `flush` for the queue to drain, while the job's
        heartbeat kept its lease alive: the job would hang for good."""
        try:
            self._run()
        except BaseException as err:
            with self._cond:
                aborted = self._aborted
            if not aborted:  # an abort closes the channel under a call in flight: nothing is lost then
                log.exception("sender thread for learner %s failed", self.endpoint)
                self._fail(f"sending to learner {self.endpoint} failed: {type(err).__name__}: {err}")

    def _run(self) -> None:
        backoff = Backoff(self._settings.backoff)
        failing_since: float | None = None
        silent_since: float | None = None  # the opening of the first failed stream in a row
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue or self._resend or self._aborted)
                if self._aborted:
                    return
                stream = self._stream = _Stream()
                self._counts["streams"] += 1
                stub = self._stub_locked()
            opened = time.monotonic()
            try:
                summary = stub.PushTrajectories(self._chunks(stream), timeout=self._settings.stream_timeout_s)
            except grpc.RpcError as err:
                code = status_code(err)
                with self._cond:
                    stream.dead = True
                    self._stream = None
                    if self._aborted:
                        return
                    self._resend.extendleft(reversed(stream.taken))
                    self._counts["resent"] += len(stream.taken)
                    self._counts["failed"] += 1
                now = time.monotonic()
                # The clock starts at the first failure's end: a learner that is only slow (a stream past its
                # deadline once: a pause, a disk stall) gets retried, however stream_timeout_s compares with
                # unreachable_s. What the error says is counted from that stream's opening, since when nothing
                # was answered: a wedged learner holds the job for up to stream_timeout_s + unreachable_s, and the
                # error said unreachable_s (a review).
                failing_since = failing_since or now
                silent_since = silent_since or opened
                details = err.details() if hasattr(err, "details") else str(err)
                if code not in _RETRY_CODES:
                    self._fail(f"learner {self.endpoint} refused the trajectories: "
                               f"{code.name if code else code}: {details}")
                    return
                if now - failing_since > self._settings.unreachable_s:
                    self._fail(f"learner {self.endpoint} unreachable for {now - silent_since:.0f} s "
                               f"(last: {code.name}: {details})")
                    return
                delay = backoff.next_delay()
                log.log(logging.INFO if now - failing_since < QUIET_RETRY_S else logging.WARNING,
                        "learner %s: %s (%s); %d chunk(s) to resend, retry in %.2f s",
                        self.endpoint, code.name, details, len(stream.taken), delay)
                self._close_channel()  # a fresh channel reconnects at once when the learner is back
                with self._cond:
                    self._cond.wait_for(lambda: self._aborted, delay)
                continue
            backoff.reset()
            failing_since = silent_since = None
            answered = summary.chunks_accepted + summary.chunks_duplicate
            with self._cond:
                stream.dead = True
                self._stream = None
                # A stopping learner answers with the chunks it took, in the stream's order: the rest are sent
                # again, to the player's next learner.
                rest = stream.taken[answered:] if answered < len(stream.taken) else []
                if rest and not self._aborted:
                    self._resend.extendleft(reversed(rest))
                    self._counts["resent"] += len(rest)
                self._counts["acked"] += len(stream.taken) - len(rest)
                self._cond.notify_all()
            if answered > len(stream.taken):
                log.warning("learner %s acknowledged %d chunk(s) of a stream of %d", self.endpoint, answered,
                            len(stream.taken))
            elif rest:
                log.info("learner %s took %d of the stream's %d chunk(s) (it is stopping); %d to send again",
                         self.endpoint, answered, len(stream.taken), len(rest))

    def _chunks(self, stream: _Stream):
        """The request iterator of one stream (runs on gRPC's thread): resends first, then the queue."""
        started = time.monotonic()
        while True:
            with self._cond:
                if stream.dead or self._aborted:
                    return
                if self._resend:
                    chunk = self._resend.popleft()
                else:
                    if len(stream.taken) >= self._settings.stream_chunks:
                        return
                    if time.monotonic() - started > self._settings.stream_timeout_s / 4:
                        return  # leave the stream's deadline room for the learner to answer
                    self._cond.wait_for(lambda: self._queue or self._aborted or stream.dead,
                                        self._settings.stream_idle_s)
                    if stream.dead or self._aborted or not self._queue:
                        return
                    chunk = self._queue.popleft()
                    self._cond.notify_all()  # room in the queue for the producer
                stream.taken.append(chunk)
                self._note_held_locked()
            yield chunk

    # ---- internals -----------------------------------------------------------------------------------------

    def _stub_locked(self) -> league_pb2_grpc.LearnerServiceStub:
        if self._channel is None:
            self._channel = make_channel(self.endpoint, token=self._token, tls_ca=self._tls_ca,
                                         tls_server_name=self._tls_server_name,
                                         default_deadline_s=self._settings.stream_timeout_s,
                                         max_message_bytes=_CHANNEL_MAX_MESSAGE_BYTES)
        return league_pb2_grpc.LearnerServiceStub(self._channel)

    def _close_channel(self) -> None:
        with self._cond:
            channel, self._channel = self._channel, None
        if channel is not None:
            channel.close()

    def _fail(self, message: str) -> None:
        log.error("%s", message)
        with self._cond:
            self._failure = SenderError(message)
            self._cond.notify_all()

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _stopped_locked(self) -> bool:
        return self._stop.is_set() or self._aborted or self._failure is not None

    def _raise_if_failed_locked(self) -> None:
        if self._failure is not None:
            raise self._failure

    def _held_locked(self) -> int:
        taken = len(self._stream.taken) if self._stream is not None else 0
        return len(self._queue) + len(self._resend) + taken

    def _drained_locked(self) -> bool:
        return self._held_locked() == 0

    def _note_held_locked(self) -> None:
        self._counts["max_held"] = max(self._counts["max_held"], self._held_locked())
