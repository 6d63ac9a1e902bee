"""A recording LearnerService for tests of actors: a real gRPC server that decodes, checks and keeps every chunk.

Not the learner: it trains nothing. It implements the data-plane contract an actor relies on — decode with
`common.tensor_codec`, drop a chunk already seen (same worker, job and seq), acknowledge once per stream — and
can be made slow (`delay_s` per chunk) to exercise backpressure, or stopped and started again on the same port
(sharing its records) to exercise reconnects.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import grpc

from common.proto.league.v1 import league_pb2, league_pb2_grpc
from common.rpc import ServerOptions, ServingServer, make_server
from common.tensor_codec import DecodedChunk, decode_chunk

SERVICE_NAME = league_pb2.DESCRIPTOR.services_by_name["LearnerService"].full_name


@dataclass
class ChunkRecords:
    """Everything received, shared by the servers of one test (a learner restarted on the same port)."""

    chunks: list[DecodedChunk] = field(default_factory=list)
    duplicates: int = 0
    streams: int = 0
    lock: threading.Condition = field(default_factory=threading.Condition)

    def keys(self) -> set[tuple[str, str, int]]:
        with self.lock:
            return {(c.header.worker_id, c.header.job_id, c.header.seq) for c in self.chunks}

    def of_job(self, job_id: str) -> list[DecodedChunk]:
        with self.lock:
            return sorted((c for c in self.chunks if c.header.job_id == job_id), key=lambda c: c.header.seq)

    def wait_for(self, count: int, timeout_s: float) -> bool:
        """Wait until at least `count` distinct chunks arrived."""
        with self.lock:
            return self.lock.wait_for(lambda: len(self.chunks) >= count, timeout_s)


class RecordingLearnerServicer(league_pb2_grpc.LearnerServiceServicer):
    def __init__(self, records: ChunkRecords, delay_s: float = 0.0, learner_version: int = 0,
                 chunks_per_stream: int | None = None) -> None:
        """`chunks_per_stream`: a stream is answered after this many chunks, the rest of it unread (as a
        stopping learner answers with what it took)."""
        self.records = records
        self.delay_s = delay_s
        self.learner_version = learner_version
        self.chunks_per_stream = chunks_per_stream
        self._pause = threading.Event()  # never set: its wait() is the per-chunk delay

    def PushTrajectories(self, request_iterator: Iterator[league_pb2.TrajectoryChunk], context):
        accepted = duplicate = samples = 0
        with self.records.lock:
            self.records.streams += 1
        for message in request_iterator:
            if self.chunks_per_stream is not None and accepted + duplicate >= self.chunks_per_stream:
                break
            if self.delay_s:
                self._pause.wait(self.delay_s)
            try:
                chunk = decode_chunk(message)
            except ValueError as err:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
            key = (chunk.header.worker_id, chunk.header.job_id, chunk.header.seq)
            with self.records.lock:
                if key in {(c.header.worker_id, c.header.job_id, c.header.seq) for c in self.records.chunks}:
                    self.records.duplicates += 1
                    duplicate += 1
                    continue
                self.records.chunks.append(chunk)
                self.records.lock.notify_all()
            accepted += 1
            samples += chunk.trajectory.num_steps
        return league_pb2.PushSummary(
            chunks_accepted=accepted, chunks_duplicate=duplicate, samples_accepted=samples,
            learner_version=self.learner_version,
        )


def serve_recording_learner(
    records: ChunkRecords, *, port: int = 0, delay_s: float = 0.0, max_receive_bytes: int = 64 * 2**20,
    chunks_per_stream: int | None = None,
) -> ServingServer:
    """A started LearnerService on 127.0.0.1:`port` (0: a free one) recording into `records`."""
    servicer = RecordingLearnerServicer(records, delay_s, chunks_per_stream=chunks_per_stream)
    return make_server(
        ServerOptions(host="127.0.0.1", port=port, max_workers=8, max_receive_bytes=max_receive_bytes),
        lambda server: league_pb2_grpc.add_LearnerServiceServicer_to_server(servicer, server),
        [SERVICE_NAME],
    )
