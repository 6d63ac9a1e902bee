"""TrajectorySender: an error its thread does not expect fails the sender, so the job fails instead of hanging."""

from __future__ import annotations

import socket
import threading
import time

import numpy as np
import pytest

import actor_service.trajectory_sender as sender_module
from actor_service.stop import StopSignal
from actor_service.trajectory_sender import SenderError, SenderSettings, TrajectorySender
from common.tensor_codec import ChunkHeader
from common.trajectory import Trajectory


def _trajectory() -> Trajectory:
    steps = 4
    return Trajectory({
        "/observations": np.zeros((1, steps, 3), np.float32),
        "/next_observations": np.zeros((1, 3), np.float32),
        "/agents/agent/actions": np.zeros((1, steps), np.int64),
        "/rewards": np.zeros((1, steps), np.float32),
        "/terminals": np.zeros((1, steps), bool),
        "/truncations": np.zeros((1, steps), bool),
    })


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unexpected_error_in_the_sender_thread_fails_the_sender_instead_of_hanging(tmp_path):
    """The sender builds a channel for each new stream and reads its TLS CA file then. A CA file gone meanwhile
    (rotated, a share that went away) raises an OSError, not a gRPC error: the thread used to die quietly,
    and `flush` (and `write`, once the queue is full) waited for good while the job's heartbeat kept its lease."""
    sender = TrajectorySender(f"127.0.0.1:{_closed_port()}", ChunkHeader("job", "p", "actor", 0, 0),
                              stop=StopSignal(), settings=SenderSettings(), tls_ca=tmp_path / "gone-ca.pem")
    try:
        sender.write(_trajectory(), 0)
        with pytest.raises(SenderError, match="FileNotFoundError"):
            sender.flush(timeout=30)
        with pytest.raises(SenderError):
            sender.write(_trajectory(), 0)
    finally:
        sender.close()


def test_a_chunk_being_encoded_when_the_sender_is_aborted_is_dropped_and_counted(monkeypatch):
    """`write` encodes outside the lock; an abort (the job revoked, from the heartbeat thread) landing meanwhile
    used to be followed by the chunk being queued anyway: held by an aborted sender that never sends it, and
    missing from `chunks_dropped` (written 1, acked 0, dropped 0)."""
    encoding = threading.Event()
    real = sender_module.encode_chunk

    def slow_encode(*args, **kwargs):
        encoding.set()
        time.sleep(0.2)
        return real(*args, **kwargs)

    monkeypatch.setattr(sender_module, "encode_chunk", slow_encode)
    sender = TrajectorySender(f"127.0.0.1:{_closed_port()}", ChunkHeader("job", "p", "actor", 0, 0),
                              stop=StopSignal(), settings=SenderSettings())
    try:
        writer = threading.Thread(target=sender.write, args=(_trajectory(), 0))
        writer.start()
        assert encoding.wait(10)
        sender.abort()
        writer.join(10)
        stats = sender.stats
        assert sender.held == 0
        assert (stats.chunks_written, stats.chunks_acked, stats.chunks_dropped) == (0, 0, 1)
    finally:
        sender.close()


def test_retries_are_logged_at_info_for_a_moment_then_at_warning(monkeypatch, caplog):
    """A learner refuses a league's first chunks for a moment ("not bound to a player yet") in healthy runs:
    each retry logged a WARNING. Failures are warned about once they last QUIET_RETRY_S."""
    monkeypatch.setattr(sender_module, "QUIET_RETRY_S", 0.5)
    caplog.set_level("INFO", logger="actor_service.trajectory_sender")
    sender = TrajectorySender(f"127.0.0.1:{_closed_port()}", ChunkHeader("job", "p", "actor", 0, 0),
                              stop=StopSignal(), settings=SenderSettings())
    try:
        sender.write(_trajectory(), 0)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not any(r.levelname == "WARNING" for r in caplog.records):
            time.sleep(0.05)
    finally:
        sender.close()
    retries = [r for r in caplog.records if "chunk(s) to resend" in r.getMessage()]
    assert retries[0].levelname == "INFO"
    assert any(r.levelname == "WARNING" for r in retries)


def test_a_row_too_large_for_any_chunk_fails_the_write_at_once_naming_unroll_len(monkeypatch):
    """Chunks are cut between rows, so one row over the channel's 64 MiB went out whole: gRPC refused it on
    the client (RESOURCE_EXHAUSTED), which the sender retried as a learner's backpressure for two minutes, and
    the job then failed as "learner unreachable". (The limit is lowered here instead of writing 64 MiB.)"""
    monkeypatch.setattr(sender_module, "_CHANNEL_MAX_MESSAGE_BYTES", 200)
    sender = TrajectorySender(f"127.0.0.1:{_closed_port()}", ChunkHeader("job", "p", "actor", 0, 0),
                              stop=StopSignal(), settings=SenderSettings())
    try:
        with pytest.raises(SenderError, match=r"one trajectory row of 4 steps encodes to .* bytes, above the 200 "
                                              r"a chunk may carry to the learner: lower the player's "
                                              r"adder_kwargs.unroll_len"):
            sender.write(_trajectory(), 0)
    finally:
        sender.close()


def test_chunks_a_stream_was_answered_without_are_sent_again_not_counted_delivered():
    """A stopping learner answers a stream with the chunks it took (the rest go to the player's next learner).
    The sender counted every chunk of an answered stream as delivered: those beyond the answer were lost, and
    `flush` said all was delivered."""
    from actor_service.testing import ChunkRecords, serve_recording_learner

    records = ChunkRecords()
    server = serve_recording_learner(records, chunks_per_stream=2)
    sender = TrajectorySender(server.address, ChunkHeader("job", "p", "actor", 0, 0), stop=StopSignal(),
                              settings=SenderSettings(stream_idle_s=1.0))
    try:
        for _ in range(5):
            sender.write(_trajectory(), 0)
        assert sender.flush(timeout=60)
        assert sorted(c.header.seq for c in records.chunks) == [0, 1, 2, 3, 4]  # each once, none lost
        stats = sender.stats
        assert stats.chunks_acked == 5 and stats.chunks_resent >= 1 and records.duplicates == 0
    finally:
        sender.close()
        server.stop(0)


def _learner_answering_after(stall_s: list[float]):
    """A LearnerService that reads each stream's chunks, then waits the next of `stall_s` (for ever once they
    are used up) before it answers: a learner slow once, or wedged."""
    from concurrent import futures

    import grpc

    from common.proto.league.v1 import league_pb2, league_pb2_grpc

    class Stalling(league_pb2_grpc.LearnerServiceServicer):
        def PushTrajectories(self, request_iterator, context):
            taken = sum(1 for _ in request_iterator)
            stall = stall_s.pop(0) if stall_s else None
            started = time.monotonic()
            while context.is_active() and (stall is None or time.monotonic() - started < stall):
                time.sleep(0.05)
            return league_pb2.PushSummary(chunks_accepted=taken)

    server = grpc.server(futures.ThreadPoolExecutor(4))
    league_pb2_grpc.add_LearnerServiceServicer_to_server(Stalling(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port


def test_a_learner_that_never_answers_is_said_silent_since_its_first_streams_opening():
    """A frozen or wedged learner takes the stream and never answers: the error said unreachable_s while the job
    had been held stream_timeout_s longer (a review); it says how long the learner answered nothing."""
    from actor_service.backoff import BackoffSettings

    server, port = _learner_answering_after([])
    sender = TrajectorySender(f"127.0.0.1:{port}", ChunkHeader("job", "p", "actor", 0, 0), stop=StopSignal(),
                              settings=SenderSettings(stream_timeout_s=1.5, unreachable_s=1.0,
                                                      backoff=BackoffSettings(0.01, 0.02)))
    try:
        sender.write(_trajectory(), 0)
        with pytest.raises(SenderError, match="unreachable for 3 s"):  # two streams' deadlines, from the first's
            sender.flush(timeout=30)
        assert sender.stats.failed_streams == 2
    finally:
        sender.close()
        server.stop(0)


def test_a_learner_slow_once_past_a_streams_deadline_is_retried_whatever_unreachable_s():
    """With stream_timeout_s as long as unreachable_s (the defaults), counting from the stream's opening failed
    the sender at its first timed-out stream: a learner that paused once lost the job (a review of the change)."""
    from actor_service.backoff import BackoffSettings

    server, port = _learner_answering_after([2.0, 0.0])
    sender = TrajectorySender(f"127.0.0.1:{port}", ChunkHeader("job", "p", "actor", 0, 0), stop=StopSignal(),
                              settings=SenderSettings(stream_timeout_s=1.5, unreachable_s=1.5,
                                                      backoff=BackoffSettings(0.01, 0.02)))
    try:
        sender.write(_trajectory(), 0)
        sender.flush(timeout=30)
        assert (sender.stats.failed_streams, sender.stats.chunks_acked) == (1, 1)
    finally:
        sender.close()
        server.stop(0)
