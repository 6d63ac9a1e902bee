"""The learner's calls to the coordinator, with deadlines, retries where idempotent, and backoff while it is away.

Every call goes through a `common.rpc.make_channel` channel, so each has a deadline and carries the token.
Waiting calls (registering, asking for a job, backing off) end early when `interrupt` is called, so a
SIGTERM is acted on at once; a session's patient UpdatePlayer is cut short when the session ends (`stop`), and
the calls of an orderly shutdown (the stopping learner's one UpdatePlayer and FinishJob) are not interrupted.

While the coordinator is away, calls fail with UNAVAILABLE and the waiting loops back off exponentially (with
jitter, capped); the channel itself reconnects on gRPC's own backoff schedule.
"""

from __future__ import annotations

import logging
import math
import random
import socket
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from common.job_limits import STATUS_MAX_BYTES
from common.lease_clock import lease_now
from common.proto.league.v1 import league_pb2, league_pb2_grpc
from common.rpc import (
    SERVER_FAULT_CODES,
    TRANSIENT_CODES,
    FirstContactTlsCounter,
    RetryPolicy,
    call_idempotent,
    check_registration,
    make_channel,
    stoppable,
    tls_hint,
)
from common.struct_data import struct_to_dict
from learner_service.trainer import Progress

log = logging.getLogger(__name__)

# UpdatePlayer / FinishJob: a few quick retries; if the coordinator stays away the next report catches up.
REPORT_RETRY = RetryPolicy(attempts=4, initial_backoff_s=0.2, max_backoff_s=2.0, retry_codes=TRANSIENT_CODES)
BINDING_REFUSED = (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.ALREADY_EXISTS)
"""The coordinator says the player is not ours (any more): the lease went, or another process has our worker id."""
LAST_WORD_TIMEOUT_S = 3.0
"""Deadline of the one UpdatePlayer and FinishJob a stopping learner sends (and of the FinishJob of one that
exits without its stuck learner thread): a coordinator that does not answer must not hold up a stop."""
LEAVE_TIMEOUT_S = 1.0
"""The one try of a stopping learner's last Heartbeat(leaving): best effort, after its release (its own try of
LAST_WORD_TIMEOUT_S); a coordinator that is away finds out from the silence."""


def _attempts(patient: bool) -> dict[str, Any]:
    """call_idempotent's deadline and retries for a report: a few tries of 10 s, or one short one."""
    if patient:
        return {"timeout": 10.0, "policy": REPORT_RETRY}
    return {"timeout": LAST_WORD_TIMEOUT_S, "policy": RetryPolicy(attempts=1)}


class Interrupted(Exception):
    """A waiting call was cut short by `LeagueClient.interrupt` (the learner is stopping)."""


class BindingLost(Exception):
    """The coordinator says this worker no longer holds the learn job (lease expired, unknown worker)."""


@dataclass(frozen=True)
class Registration:
    heartbeat_interval_s: float
    lease_timeout_s: float
    shared_root_id: str = ""
    """The coordinator's shared-root marker id ("": not checked): see common/root_marker.py."""


@dataclass(frozen=True)
class Renewal:
    """A heartbeat's answer for a lease still held."""

    lease_timeout_s: float | None
    """The lease the renewal granted; None from a coordinator that does not say (older than the field)."""


@dataclass(frozen=True)
class LearnJob:
    """A learn job as the learner uses it (the proto's Structs already turned into plain mappings)."""

    job_id: str
    player_id: str
    checkpoint_path: str
    checkpoint_version: int
    env_name: str
    env_kwargs: Mapping[str, Any]
    policy: Mapping[str, Any]
    learner_kwargs: Mapping[str, Any]
    lease_timeout_s: float
    requested_at: float
    """`lease_now()` when the GetJob that granted it was sent: the lease runs from no earlier than this."""

    @classmethod
    def from_proto(cls, job: league_pb2.Job, requested_at: float) -> LearnJob:
        if job.kind != league_pb2.JOB_KIND_LEARN:
            raise ValueError(f"job {job.job_id}: kind {league_pb2.JobKind.Name(job.kind)} is not a learn job")
        if not job.players:
            raise ValueError(f"job {job.job_id}: players: a learn job names its player")
        player = job.players[0]
        return cls(
            job_id=job.job_id,
            player_id=player.player_id,
            checkpoint_path=player.checkpoint_path,
            checkpoint_version=player.checkpoint_version,
            env_name=job.env_name,
            env_kwargs=struct_to_dict(job.env_kwargs),
            policy=struct_to_dict(job.policy),
            learner_kwargs=struct_to_dict(job.learner_kwargs),
            lease_timeout_s=job.lease_timeout_s,
            requested_at=requested_at,
        )


class Backoff:
    """Exponential backoff with full jitter, reset after a success."""

    def __init__(self, initial_s: float = 0.2, max_s: float = 10.0) -> None:
        self.initial_s = initial_s
        self.max_s = max_s
        self._cap = initial_s
        self._rng = random.Random()

    def next_delay(self) -> float:
        delay = self._rng.uniform(self._cap / 2, self._cap)
        self._cap = min(self.max_s, self._cap * 2)
        return delay

    def reset(self) -> None:
        self._cap = self.initial_s


class LeagueClient:
    def __init__(
        self, address: str, worker_id: str, *, token: str | None = None, tls_ca: Path | None = None,
        tls_server_name: str | None = None, max_backoff_s: float = 10.0,
    ) -> None:
        self.address = address
        self.worker_id = worker_id
        self.max_backoff_s = max_backoff_s
        self._first_contact = FirstContactTlsCounter()
        # Replies up to the status's size: a learner binding a player reads the league's totals for it from
        # GetStatus, which outgrows gRPC's default 4 MB in a long league (~6,000 historical players), and every
        # bind then failed RESOURCE_EXHAUSTED, the learner exiting 1 (a review).
        self._channel = make_channel(address, token=token, tls_ca=tls_ca, tls_server_name=tls_server_name,
                                     max_message_bytes=STATUS_MAX_BYTES)
        self._stub = league_pb2_grpc.LeagueServiceStub(self._channel)
        self._cond = threading.Condition()
        self._interrupted = False
        self._stopped = threading.Event()  # set with `_interrupted`: cuts the backoff of retried calls short
        # player id -> reset_checkpoint_version of the latest reset the caller applied (`ack_reset`).
        self._resets_handed_out: dict[str, int] = {}
        self.registration: Registration | None = None
        """The latest registration's answer (`next_learn_job` registers again when the coordinator forgot this
        worker)."""

    def leave(self) -> None:
        """Tell the coordinator this learner exits (one short Heartbeat(leaving), no retry): the status stops
        counting it alive at once. A coordinator away misses it; the learner's silence says the same later."""
        request = league_pb2.HeartbeatRequest(worker_id=self.worker_id, leaving=True)
        try:
            self._stub.Heartbeat(request, timeout=LEAVE_TIMEOUT_S)
        except grpc.RpcError as err:
            log.debug("leaving: Heartbeat %s (the coordinator finds out from the silence)", err.code().name)

    def close(self) -> None:
        self._channel.close()

    def wait_interrupted(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s`; True once `interrupt` was called."""
        return self._stopped.wait(timeout_s)

    def interrupt(self) -> None:
        """End every waiting call (register, next_learn_job, backoff) now; they raise `Interrupted`."""
        with self._cond:
            self._interrupted = True
            self._cond.notify_all()
        self._stopped.set()

    # ---- waiting calls --------------------------------------------------------------------------------
    def register(self, data_endpoint: str) -> Registration:
        """RegisterWorker(role LEARNER), retried with backoff until the coordinator answers."""
        request = league_pb2.RegisterWorkerRequest(
            worker_id=self.worker_id, role=league_pb2.WORKER_ROLE_LEARNER, hostname=socket.gethostname(),
            data_endpoint=data_endpoint,
        )
        backoff = Backoff(max_s=self.max_backoff_s)
        while True:
            try:
                reply = self._call(self._stub.RegisterWorker, request, timeout=10.0)
                self._first_contact.answered = True
                check_registration(self.address, reply.heartbeat_interval_s, reply.lease_timeout_s)
                self.registration = Registration(reply.heartbeat_interval_s, reply.lease_timeout_s,
                                                 reply.shared_root_id)
                return self.registration
            except grpc.RpcError as err:
                if err.code() in TRANSIENT_CODES:  # (raises once TLS keeps failing before any answer)
                    self._first_contact.check("RegisterWorker", self.address, err.details())
                self._back_off_or_raise(backoff, "RegisterWorker", err)

    def next_learn_job(self, data_endpoint: str, wait_s: float) -> LearnJob:
        """GetJob(role LEARNER) until a learn job comes: long polls, the server's retry hints, backoff while
        the coordinator is away; re-registers if the coordinator forgot this worker."""
        request = league_pb2.GetJobRequest(
            worker_id=self.worker_id, role=league_pb2.WORKER_ROLE_LEARNER, data_endpoint=data_endpoint, wait_s=wait_s,
        )
        backoff = Backoff(max_s=self.max_backoff_s)
        said = None
        while True:
            requested_at = lease_now()
            try:
                reply = self._call(self._stub.GetJob, request, timeout=wait_s + 5.0)
            except grpc.RpcError as err:
                if err.code() == grpc.StatusCode.NOT_FOUND:
                    log.warning("the coordinator does not know worker %s: registering again", self.worker_id)
                    self.register(data_endpoint)
                    continue
                self._back_off_or_raise(backoff, "GetJob", err)
                continue
            backoff.reset()
            if reply.HasField("job"):
                return LearnJob.from_proto(reply.job, requested_at)
            # Why, once at INFO (and when it changes): a learner idle for ever (a spare one, one started against a
            # coordinator without learners) said so only at DEBUG.
            log.log(logging.DEBUG if reply.reason == said else logging.INFO, "no learn job (%s); asking again in "
                    "%.1fs", reply.reason, reply.retry_after_s)
            said = reply.reason
            self._wait(max(reply.retry_after_s, 0.05))

    # ---- session calls --------------------------------------------------------------------------------
    def heartbeat(self, job_id: str, timeout: float) -> Renewal | None:
        """The renewal of the job's lease; None when the coordinator revoked it (or forgot this worker)."""
        request = league_pb2.HeartbeatRequest(worker_id=self.worker_id, job_ids=[job_id])
        try:
            reply = self._stub.Heartbeat(request, timeout=timeout)
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise
        if job_id in reply.revoked_job_ids:
            return None
        lease_s = reply.lease_timeout_s
        return Renewal(lease_s if math.isfinite(lease_s) and lease_s > 0 else None)

    def update_player(
        self, player_id: str, progress: Progress, checkpoint_path: str, checkpoint_version: int, *,
        patient: bool = True, stop: threading.Event | None = None,
    ) -> league_pb2.UpdatePlayerResponse | None:
        """UpdatePlayer with a few retries; None if the coordinator stayed unreachable or failed the call itself
        (`SERVER_FAULT_CODES`: a learner exited 1 on one, a review): report again later.

        A reply that says `mutated` binds the caller to continue from that reset before it reports again
        (LearnSession._report does, in the same call): the next updates of the player acknowledge it
        (`reset_applied_version`). Until one does, the coordinator repeats the reset in every reply, so a reply
        lost here, or a learner that dies before it reloads, does not lose the reset.

        Raises `BindingLost` when the coordinator refuses it as not ours (FAILED_PRECONDITION, NOT_FOUND).
        Not `patient`: one short attempt (a stopping learner: its final checkpoint is published, and the next
        learner of the player resumes from it even if the league never heard of it). `stop` (set when the session
        ends): a patient report's attempt in flight is cancelled and no retry starts, so a stop is not held up by
        a coordinator that does not answer (it waited out the 10 s attempt under way); a stopping learner's one
        short report follows. A report that is not patient is the stopping learner's own: `stop` does not cut it.
        """
        request = league_pb2.UpdatePlayerRequest(
            worker_id=self.worker_id, player_id=player_id, train_iteration=progress.train_iteration,
            agent_steps=progress.agent_steps, checkpoint_path=checkpoint_path, checkpoint_version=checkpoint_version,
            reset_applied_version=self._resets_handed_out.get(player_id, 0),
        )
        method = self._stub.UpdatePlayer
        if patient and stop is not None:
            method = stoppable(method, stop)
        try:
            reply = call_idempotent(method, request, stop=stop if patient else None, **_attempts(patient))
        except grpc.RpcError as err:
            if err.code() in TRANSIENT_CODES:
                if patient and stop is not None and stop.is_set():
                    log.warning("UpdatePlayer %s v%d: cut short by the end of its session (%s)",
                                player_id, checkpoint_version, err.code().name)
                    return None
                log.warning("UpdatePlayer %s v%d: coordinator unreachable (%s); %s", player_id, checkpoint_version,
                            err.code().name, "will report again" if patient else
                            "not reported (the player's next learner resumes from this checkpoint)")
                return None
            if err.code() in BINDING_REFUSED:
                raise BindingLost(f"UpdatePlayer refused: {err.details()}") from err
            if err.code() in SERVER_FAULT_CODES:  # the coordinator failed the call: as if it had not answered
                log.error("UpdatePlayer %s v%d failed in the coordinator (%s: %s); %s", player_id, checkpoint_version,
                          err.code().name, err.details(), "will report again" if patient else
                          "not reported (the player's next learner resumes from this checkpoint)")
                return None
            raise
        return reply

    def ack_reset(self, player_id: str, version: int) -> None:
        """The caller continues from the league's reset of `player_id` numbered `version`: the next updates say so
        (`reset_applied_version`). Told by the caller once it loaded the reset, not on the reply that named it: a
        reset whose checkpoint could not be loaded was acknowledged anyway, and the league accepted checkpoints
        trained on from the weights it had thrown away (a review)."""
        latest = self._resets_handed_out.get(player_id, 0)
        self._resets_handed_out[player_id] = max(latest, version)

    def finish(self, job_id: str, status: int, error: str = "", *, patient: bool = True) -> bool:
        """FinishJob (idempotent by job id); False if the coordinator was unreachable or refused it. Not
        `patient`: one short attempt (a stopping learner; its lease expiring is the fallback)."""
        request = league_pb2.FinishJobRequest(worker_id=self.worker_id, job_id=job_id, status=status, error=error)
        try:
            call_idempotent(self._stub.FinishJob, request, **_attempts(patient))
            return True
        except grpc.RpcError as err:
            log.warning("FinishJob %s: %s: %s (its lease will expire instead)", job_id, err.code().name, err.details())
            return False

    def player_progress(self, player_id: str) -> Progress:
        """The league's totals for the player (agent steps, train iteration), so ours never go below them.

        A waiting call: `interrupt` ends it (`Interrupted`), so a learner told to stop while it binds is not held
        up by a coordinator that does not answer (4 tries of 10 s took it past its --stop-timeout)."""
        status = call_idempotent(lambda request, timeout: self._call(self._stub.GetStatus, request, timeout),
                                 league_pb2.GetStatusRequest(), timeout=10.0, policy=REPORT_RETRY,
                                 stop=self._stopped)
        for player in status.players:
            if player.player_id == player_id:
                return Progress(player.agent_steps, player.train_iteration)
        return Progress()

    # ---- internals ------------------------------------------------------------------------------------
    def _call(self, method, request, timeout: float):
        """A unary call that `interrupt` cancels."""
        future = method.future(request, timeout=timeout)
        future.add_done_callback(lambda _f: self._notify())
        with self._cond:
            self._cond.wait_for(lambda: self._interrupted or future.done())
            if not future.done():
                future.cancel()
                raise Interrupted()
        return future.result()

    def _notify(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _wait(self, seconds: float) -> None:
        with self._cond:
            if self._cond.wait_for(lambda: self._interrupted, seconds):
                raise Interrupted()

    def _back_off_or_raise(self, backoff: Backoff, what: str, err: grpc.RpcError) -> None:
        """After a failed call that asks for work: back off if the coordinator is away (`TRANSIENT_CODES`) or failed
        the call itself (`SERVER_FAULT_CODES`, logged as an error); raise `err` for a refusal."""
        if err.code() in SERVER_FAULT_CODES:
            delay = backoff.next_delay()
            log.error("%s at %s failed in the coordinator (%s: %s); asking again in %.1fs", what, self.address,
                      err.code().name, err.details(), delay)
            self._wait(delay)
        elif err.code() in TRANSIENT_CODES:
            hint = tls_hint(err.details())
            delay = backoff.next_delay()
            # (A handshake that fails again at every try is no outage: a warning, where INFO hid it.)
            log.log(logging.WARNING if hint else logging.INFO, "%s: %s: %s%s; coordinator %s unreachable, retrying "
                    "in %.1fs", what, err.code().name, err.details(), hint, self.address, delay)
            self._wait(delay)
        else:
            raise err
