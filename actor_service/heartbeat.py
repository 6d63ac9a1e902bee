"""The heartbeat thread of a running job: keeps its lease alive and notices when it was taken back.

A heartbeat that cannot reach the coordinator is tried again at the next interval (the lease may expire
meanwhile; the coordinator then says so once reachable). A heartbeat answer that names the job as revoked —
the lease expired and the job was issued again — calls `on_revoked`: the actor abandons the job without
FinishJob, since its results would not be counted.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import grpc

from actor_service.backoff import status_code
from actor_service.coordinator_client import CoordinatorClient

log = logging.getLogger(__name__)

# Heartbeat failures that mean "try again at the next interval".
_RETRY_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED})


class JobHeartbeat:
    def __init__(
        self,
        client: CoordinatorClient,
        job_id: str,
        interval_s: float,
        on_revoked: Callable[[str], None],
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"heartbeat interval must be > 0 s, got {interval_s}")
        self._client = client
        self._job_id = job_id
        self._interval_s = interval_s
        self._on_revoked = on_revoked
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{job_id}", daemon=True)
        self.beats = 0

    def start(self) -> JobHeartbeat:
        self._thread.start()
        return self

    def close(self) -> None:
        self._closed.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self) -> None:
        while not self._closed.wait(self._interval_s):  # the interval is a timer, not a poll for a state
            try:
                reply = self._client.heartbeat([self._job_id])
            except grpc.RpcError as err:
                code = status_code(err)
                if code in _RETRY_CODES:
                    log.warning("heartbeat of job %s failed (%s); trying again in %.2f s", self._job_id,
                                code.name, self._interval_s)
                    continue
                log.error("heartbeat of job %s refused (%s: %s); abandoning the job", self._job_id,
                          code.name if code else code, err.details() if hasattr(err, "details") else err)
                self._on_revoked(f"heartbeat refused: {code.name if code else err}")
                return
            self.beats += 1
            if self._job_id in reply.revoked_job_ids:
                self._on_revoked("the coordinator revoked the lease (it expired and the job was issued again)")
                return
