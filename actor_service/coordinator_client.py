"""The actor's side of LeagueService: register, pull jobs, heartbeat, finish — resilient to a coordinator away.

Register and GetJob retry forever (until the stop signal) with exponential backoff while the coordinator is
unreachable, and build a fresh channel for each retry: a gRPC channel that failed to connect backs off on its
own, up to two minutes, and would keep failing fast after the coordinator is back. FinishJob is idempotent by
job id, so it is retried on UNAVAILABLE / DEADLINE_EXCEEDED until the coordinator answers (or the actor stops).
"""

from __future__ import annotations

import logging
import socket
import threading
from dataclasses import dataclass
from pathlib import Path

import grpc

from actor_service.backoff import Backoff, BackoffSettings, status_code
from actor_service.stop import StopSignal
from common.job_limits import STATUS_MAX_BYTES
from common.proto.league.v1 import league_pb2, league_pb2_grpc
from common.rpc import (
    SERVER_FAULT_CODES,
    TRANSIENT_CODES,
    FirstContactTlsCounter,
    RetryPolicy,
    call_idempotent,
    check_registration,
    make_channel,
    not_a_coordinator_hint,
    tls_hint,
)

log = logging.getLogger(__name__)

# Extra time a GetJob call gets beyond its long poll, so the server's answer arrives before the deadline.
_LONG_POLL_MARGIN_S = 5.0
FINISH_RETRY = RetryPolicy(
    attempts=None, initial_backoff_s=0.2, max_backoff_s=3.0,
    retry_codes=frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}),
)
"""FinishJob is retried until the coordinator answers (or the actor stops), however long it is away: a
coordinator restarted on its state gives every lease in flight a fresh deadline (LEASES.md), so it counts a
finish that arrives minutes late. Twelve attempts used to give up after ~13 s of refused connections, and the
job's results were lost to a restart that took longer (a crash loop, a rescheduled pod). CANCELLED too: a
coordinator that stops cancels the calls it had received but not yet begun (idempotent by job id: a retry of
one it did count is answered as a duplicate)."""
FINISH_WARN_EVERY = 4
LEAVE_TIMEOUT_S = 1.0
"""The one try of a leaving worker's last Heartbeat: a stop must not wait for a coordinator that is away (a frozen
one answers nothing; the README's stop bounds leave room for this second)."""
"""A FinishJob's first failed attempt is a warning, and then every this many (attempts 1, 4, 8, ...): the
retries can go on for minutes, which must not pass in silence, nor fill the log when many jobs finish at once."""


@dataclass(frozen=True)
class Registration:
    worker_id: str
    heartbeat_interval_s: float
    lease_timeout_s: float
    league_id: str
    shared_root_id: str = ""
    """The coordinator's shared-root marker id ("": not checked): see common/root_marker.py."""


class CoordinatorError(RuntimeError):
    """The coordinator refused the actor in a way retrying cannot fix (bad token, wrong role, bad request)."""


class CoordinatorClient:
    def __init__(
        self,
        address: str,
        worker_id: str,
        *,
        stop: StopSignal,
        token: str | None = None,
        tls_ca: Path | None = None,
        tls_server_name: str | None = None,
        backoff: BackoffSettings | None = None,
        call_timeout_s: float = 10.0,
    ) -> None:
        if not address:
            raise ValueError("coordinator address is empty (give --coordinator or $LEAGUE_COORDINATOR)")
        self.address = address
        self.worker_id = worker_id
        self._stop = stop
        self._token = token
        self._tls_ca = tls_ca
        self._tls_server_name = tls_server_name
        self._backoff = Backoff(backoff)
        self._first_contact = FirstContactTlsCounter()
        self._call_timeout_s = call_timeout_s
        self._lock = threading.Lock()
        self._channel: grpc.Channel | None = None
        self._stub: league_pb2_grpc.LeagueServiceStub | None = None
        self.registration: Registration | None = None

    # ---- calls -------------------------------------------------------------------------------------------

    def register(self) -> Registration | None:
        """RegisterWorker(ACTOR), retried until it succeeds; None when stopped first."""
        request = league_pb2.RegisterWorkerRequest(
            worker_id=self.worker_id, role=league_pb2.WORKER_ROLE_ACTOR, hostname=socket.gethostname()
        )
        while not self._stop.is_set():
            try:
                reply = self._stub_now().RegisterWorker(request, timeout=self._call_timeout_s)
            except grpc.RpcError as err:
                self._on_failure("RegisterWorker", err)
                continue
            self._backoff.reset()
            self._first_contact.answered = True
            check_registration(self.address, reply.heartbeat_interval_s, reply.lease_timeout_s)
            self.registration = Registration(
                reply.worker_id or self.worker_id, reply.heartbeat_interval_s, reply.lease_timeout_s, reply.league_id,
                reply.shared_root_id,
            )
            log.info(
                "registered %s with league %s at %s (heartbeat every %.2f s, lease %.2f s)",
                self.worker_id, reply.league_id, self.address, reply.heartbeat_interval_s, reply.lease_timeout_s,
            )
            return self.registration
        return None

    def next_job(self, wait_s: float) -> league_pb2.Job | None:
        """Long-poll GetJob until a job comes (following the server's retry hint); None when stopped first."""
        request = league_pb2.GetJobRequest(worker_id=self.worker_id, role=league_pb2.WORKER_ROLE_ACTOR, wait_s=wait_s)
        while not self._stop.is_set():
            future = self._stub_now().GetJob.future(request, timeout=wait_s + _LONG_POLL_MARGIN_S)
            if not self._stop.wait_for_future(future):
                future.cancel()
                return None
            try:
                reply = future.result()
            except grpc.RpcError as err:
                if status_code(err) is grpc.StatusCode.CANCELLED and self._stop.is_set():
                    return None
                if status_code(err) is grpc.StatusCode.NOT_FOUND:
                    log.warning("the coordinator does not know worker %s (%s); registering again", self.worker_id,
                                err.details())
                    if self.register() is None:
                        return None
                    continue
                self._on_failure("GetJob", err)
                continue
            self._backoff.reset()
            if reply.HasField("job"):
                return reply.job
            log.debug("no job: %s (retry in %.2f s)", reply.reason, reply.retry_after_s)
            if self._stop.wait(max(0.0, reply.retry_after_s)):
                return None
        return None

    def heartbeat(self, job_ids: list[str], timeout_s: float | None = None) -> league_pb2.HeartbeatResponse:
        """One Heartbeat call (the heartbeat thread decides what a failure means); `timeout_s` (at most the
        client's call timeout): the job heartbeat's interval, so one call that hangs does not cost the lease."""
        request = league_pb2.HeartbeatRequest(worker_id=self.worker_id, job_ids=job_ids)
        timeout = self._call_timeout_s if timeout_s is None else min(self._call_timeout_s, timeout_s)
        return self._stub_now().Heartbeat(request, timeout=timeout)

    def finish_job(
        self, request: league_pb2.FinishJobRequest, *, once_within_s: float | None = None,
        stop_grace_s: float | None = None,
    ) -> league_pb2.FinishJobResponse | None:
        """FinishJob, retried while the coordinator is unreachable; None when the coordinator no longer
        holds the job for us (its lease expired or was re-issued: FAILED_PRECONDITION / NOT_FOUND).
        `once_within_s`: one call with that deadline and no retry (a stopping actor: its lease expiring is
        the fallback, and a stop must not wait for a coordinator that does not answer)."""
        timeout, policy = self._call_timeout_s, FINISH_RETRY
        if once_within_s is not None:
            timeout, policy = min(timeout, once_within_s), RetryPolicy(attempts=1)

        def on_retry(failed: int, err: grpc.RpcError, delay: float) -> None:
            if failed == 1 or failed % FINISH_WARN_EVERY == 0:
                code = status_code(err)
                details = err.details() if callable(getattr(err, "details", None)) else str(err)
                of = f" of {policy.attempts}" if policy.attempts is not None else ""
                log.warning("FinishJob of %s at %s failed (%s: %s), attempt %d%s; retrying in %.2f s",
                            request.job_id, self.address, code.name if code else type(err).__name__, details,
                            failed, of, delay)

        stub = self._stub_now()

        def attempt(req: league_pb2.FinishJobRequest, timeout: float) -> league_pb2.FinishJobResponse:
            """One call; a stop while it is in flight leaves it at most `stop_grace_s` more (`timeout` is the
            deadline of a call to a coordinator that is hung, not gone: 10 s, uninterruptible before)."""
            if stop_grace_s is None:
                return stub.FinishJob(req, timeout=timeout)
            future = stub.FinishJob.future(req, timeout=timeout)
            if not self._stop.wait_for_future(future):
                try:
                    return future.result(timeout=stop_grace_s)
                except grpc.FutureTimeoutError:
                    future.cancel()
                    raise future from None  # the call itself is the RpcError (CANCELLED)
            return future.result()

        try:
            # A stop while retrying ends the retries (the lease expiring is the fallback).
            return call_idempotent(attempt, request, timeout=timeout, policy=policy,
                                   stop=self._stop, on_retry=on_retry)
        except grpc.RpcError as err:
            if status_code(err) in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND):
                log.warning("FinishJob of %s refused, results not counted: %s", request.job_id, err.details())
                return None
            raise

    def leave(self, timeout_s: float = LEAVE_TIMEOUT_S) -> None:
        """Tell the coordinator this worker exits (one short Heartbeat(leaving), no retry): the status stops
        counting it alive at once. A coordinator away misses it; the worker's silence says the same later."""
        if self.registration is None:
            return
        request = league_pb2.HeartbeatRequest(worker_id=self.worker_id, leaving=True)
        try:
            self._stub_now().Heartbeat(request, timeout=min(timeout_s, self._call_timeout_s))
        except grpc.RpcError as err:
            log.debug("leaving: Heartbeat %s (the coordinator finds out from the silence)", err.code().name)

    def close(self) -> None:
        with self._lock:
            if self._channel is not None:
                self._channel.close()
            self._channel = self._stub = None

    # ---- internals ---------------------------------------------------------------------------------------

    def _stub_now(self) -> league_pb2_grpc.LeagueServiceStub:
        with self._lock:
            if self._stub is None:
                # Replies up to what the coordinator sends (a job whose env kwargs run to megabytes): at gRPC's
                # default 4 MiB such a job was RESOURCE_EXHAUSTED, the actor exited 2 and its lease stayed held.
                self._channel = make_channel(self.address, token=self._token, tls_ca=self._tls_ca,
                                             tls_server_name=self._tls_server_name,
                                             max_message_bytes=STATUS_MAX_BYTES)
                self._stub = league_pb2_grpc.LeagueServiceStub(self._channel)
            return self._stub

    def _on_failure(self, what: str, err: grpc.RpcError) -> None:
        """A transient failure: back off (a fresh channel for the next try); the coordinator failing the call
        itself (`SERVER_FAULT_CODES`): logged as an error, back off; anything else raises."""
        code = status_code(err)
        if code in SERVER_FAULT_CODES:
            delay = self._backoff.next_delay()
            log.error("%s at %s failed in the coordinator (%s: %s); asking again in %.2f s", what, self.address,
                      code.name, err.details() if hasattr(err, "details") else err, delay)
            self._stop.wait(delay)
            return
        if code not in TRANSIENT_CODES:
            raise CoordinatorError(f"{what} at {self.address} failed: {code.name if code else code}: "
                                   f"{err.details() if hasattr(err, 'details') else err}"
                                   f"{not_a_coordinator_hint(code, self.address)}") from err
        details = err.details() if hasattr(err, "details") else str(err)
        self._first_contact.check(what, self.address, details)  # (raises once TLS keeps failing before any answer)
        delay = self._backoff.next_delay()
        log.warning("%s: coordinator %s unreachable (%s: %s%s); retry %d in %.2f s", what, self.address,
                    code.name, details, tls_hint(details), self._backoff.failures, delay)
        self.close()
        self._stop.wait(delay)
