"""The heartbeat thread of a running job: keeps its lease alive and notices when it was taken back.

A heartbeat that cannot reach the coordinator is tried again at the next interval (the lease may expire
meanwhile; the coordinator then says so once reachable). A heartbeat answer that names the job as revoked —
the lease expired and the job was issued again — calls `on_revoked`: the actor abandons the job without
FinishJob, since its results would not be counted.

A heartbeat thread runs even when the job is stuck. So it also asks what the job thread may be stuck in
(`StallWatch`es): how long the env manager's current operation has overrun its timeout (past the limit, the
manager has failed to break a hang: a serial manager cannot interrupt an env stuck in C code), and how long the
checkpoint read under way has taken (a hung network filesystem). Past a watch's limit the heartbeat stops
renewing the lease: the lease expires and the coordinator issues the job again, to a working actor. Renewals
resume if the job thread comes back; the coordinator's answer then says whether the job is still this actor's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

import grpc

from actor_service.backoff import status_code
from actor_service.coordinator_client import CoordinatorClient
from common.busy_clock import StallGate, StallWatch
from common.rpc import SERVER_FAULT_CODES, TRANSIENT_CODES, job_heartbeat_interval

log = logging.getLogger(__name__)



class JobHeartbeat:
    def __init__(
        self,
        client: CoordinatorClient,
        job_id: str,
        interval_s: float,
        on_revoked: Callable[[str], None],
        watches: Sequence[StallWatch] = (),
    ) -> None:
        """`watches`: past any of their limits, renewals stop (until it is over)."""
        if not interval_s > 0:
            raise ValueError(f"heartbeat interval must be > 0 s, got {interval_s}")
        self._client = client
        self._job_id = job_id
        self._base_interval_s = interval_s
        self._interval_s = interval_s
        self._on_revoked = on_revoked
        self._gate = StallGate(watches, f"job {job_id}", "the job expires and is issued again", log)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run_guarded, name=f"heartbeat-{job_id}", daemon=True)
        self.beats = 0
        self.withheld = 0
        """Renewals skipped because the job thread was stuck (past a watch's limit)."""

    def start(self) -> JobHeartbeat:
        self._thread.start()
        return self

    def close(self, wait_s: float | None = None, *, stop=None, stop_wait_s: float | None = None) -> None:
        """Stop beating; wait for a heartbeat in flight to end (at most `wait_s`: a stopping actor does not
        wait out a call to a coordinator that does not answer, whose reply then changes nothing). `stop` set
        during the wait cuts what is left of it to `stop_wait_s`. Closing again does not wait again."""
        if self._closed.is_set():
            return
        self._closed.set()
        if not self._thread.is_alive() or self._thread is threading.current_thread():
            return
        deadline = None if wait_s is None else time.monotonic() + wait_s
        while self._thread.is_alive():
            now = time.monotonic()
            if stop is not None and stop.is_set() and stop_wait_s is not None:
                stop_deadline = now + stop_wait_s
                deadline = stop_deadline if deadline is None else min(deadline, stop_deadline)
                stop = None
            if deadline is not None and now >= deadline:
                return
            self._thread.join(0.1 if deadline is None else min(0.1, deadline - now))

    def _run_guarded(self) -> None:
        """`_run`, whose death by an unexpected error (a bug, a reply it cannot read) abandons the job: else the
        job ran on unrenewed, its lease expired and it was issued again while this actor still played it."""
        try:
            self._run()
        except Exception as err:
            if self._closed.is_set():  # (the job ended meanwhile: a call on a channel closed under it, say)
                return
            log.exception("heartbeat of job %s failed; abandoning the job", self._job_id)
            self._on_revoked(f"heartbeat failed: {type(err).__name__}: {err}")

    def _run(self) -> None:
        while not self._closed.wait(self._interval_s):  # the interval is a timer, not a poll for a state
            if self._gate.stuck() is not None:
                self.withheld += 1
                continue
            try:
                # A deadline of the interval: the next beat goes out on time (a fixed 10 s let one call that
                # hung take a lease of 6 s, heartbeated every 2 s).
                reply = self._client.heartbeat([self._job_id], timeout_s=max(1.0, self._interval_s))
            except grpc.RpcError as err:
                code = status_code(err)
                if code in TRANSIENT_CODES:  # try again at the next interval
                    log.warning("heartbeat of job %s failed (%s); trying again in %.2f s", self._job_id,
                                code.name, self._interval_s)
                    continue
                if code in SERVER_FAULT_CODES:  # the coordinator failed the call: no word on the lease either way
                    log.error("heartbeat of job %s failed in the coordinator (%s: %s); trying again in %.2f s",
                              self._job_id, code.name, err.details() if hasattr(err, "details") else err,
                              self._interval_s)
                    continue
                log.error("heartbeat of job %s refused (%s: %s); abandoning the job", self._job_id,
                          code.name if code else code, err.details() if hasattr(err, "details") else err)
                self._on_revoked(f"heartbeat refused: {code.name if code else err}")
                return
            self.beats += 1
            if self._job_id in reply.revoked_job_ids:
                self._on_revoked("the coordinator revoked the lease (it expired and the job was issued again)")
                return
            # A coordinator restarted with a shorter lease says so here: keep to three beats per lease.
            interval_s = job_heartbeat_interval(self._base_interval_s, reply.lease_timeout_s)
            if interval_s != self._interval_s:
                log.info("job %s: the coordinator's lease is %.1f s; heartbeating every %.2f s", self._job_id,
                         reply.lease_timeout_s, interval_s)
                self._interval_s = interval_s
