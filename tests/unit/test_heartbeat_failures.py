"""A heartbeat thread that dies of an unexpected error (a bug, a reply it cannot read) ends what it keeps alive.
Before, the thread died with a traceback on stderr and nothing else: an actor played its job on unrenewed (the
lease expired and the job was issued again meanwhile); a learner trained on with no lease, publishing nothing,
and never heard that its job had been revoked."""

from __future__ import annotations

import logging
import threading
import time

import grpc

from actor_service.heartbeat import JobHeartbeat
from common.lease_clock import lease_now
from common.proto.league.v1 import league_pb2
from learner_service.league_client import LearnJob, Registration, Renewal
from learner_service.session import LeaseKeeper, SessionEnd
from tests.unit.test_actor_finish_retries import Failure


class _BrokenClient:
    def heartbeat(self, *args, **kwargs):
        raise KeyError("a field the reply lacks")


def test_an_actor_job_whose_heartbeat_breaks_is_abandoned(caplog):
    revoked: list[str] = []
    called = threading.Event()

    def on_revoked(reason: str) -> None:
        revoked.append(reason)
        called.set()

    heartbeat = JobHeartbeat(_BrokenClient(), "job-7", interval_s=0.01, on_revoked=on_revoked).start()
    try:
        assert called.wait(30)
    finally:
        heartbeat.close(5)
    assert revoked == ["heartbeat failed: KeyError: 'a field the reply lacks'"]
    (record,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert record.getMessage() == "heartbeat of job job-7 failed; abandoning the job" and record.exc_info


def test_a_learn_session_whose_heartbeat_breaks_ends_as_lost(caplog):
    job = LearnJob("job-1", "p", "", 0, "CartPole-v1", {}, {}, {}, 30.0, lease_now())
    lease = LeaseKeeper(_BrokenClient(), job, Registration(heartbeat_interval_s=0.01, lease_timeout_s=30.0))
    ended: list[SessionEnd] = []
    called = threading.Event()
    lease.attach(lambda reason: (ended.append(reason), called.set()))
    lease.start()
    try:
        assert called.wait(30)
    finally:
        lease.close(5)
    assert ended == [SessionEnd.LOST] and not lease.held
    (record,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert record.getMessage() == "heartbeat of learn job job-1 (p) failed; asking for a job again"



class _FaultThenAnswer:
    """Heartbeat fails in the coordinator (INTERNAL, then UNKNOWN), then answers `reply`."""

    def __init__(self, reply) -> None:
        self.calls = 0
        self.reply = reply
        self.answered = threading.Event()

    def heartbeat(self, *args, **kwargs):
        self.calls += 1
        if self.calls <= 2:
            code = grpc.StatusCode.INTERNAL if self.calls == 1 else grpc.StatusCode.UNKNOWN
            raise Failure(code, "a bug in the coordinator's handler")
        self.answered.set()
        return self.reply


def test_a_heartbeat_the_coordinator_fails_is_tried_again_not_taken_for_a_revocation(caplog):
    """INTERNAL or UNKNOWN (an exception in the coordinator's handler) abandoned an actor's job and ended a learn
    session at once: the coordinator said nothing about the lease, which runs on; the next beat may get through."""
    revoked: list[str] = []
    client = _FaultThenAnswer(league_pb2.HeartbeatResponse())
    heartbeat = JobHeartbeat(client, "job-7", interval_s=0.01, on_revoked=revoked.append).start()
    try:
        assert client.answered.wait(30)
    finally:
        heartbeat.close(5)
    assert revoked == [] and client.calls >= 3
    assert "failed in the coordinator (INTERNAL: a bug in the coordinator's handler)" in caplog.text

    job = LearnJob("job-1", "p", "", 0, "CartPole-v1", {}, {}, {}, 30.0, lease_now())
    client = _FaultThenAnswer(Renewal(None))
    lease = LeaseKeeper(client, job, Registration(heartbeat_interval_s=0.01, lease_timeout_s=30.0))
    ended: list[SessionEnd] = []
    lease.attach(ended.append)
    lease.start()
    try:
        assert client.answered.wait(30)
    finally:
        lease.close(5)
    assert ended == [] and client.calls >= 3 and lease.held


def test_a_job_heartbeats_deadline_is_its_interval_not_the_clients_call_timeout():
    """A fixed 10 s deadline let one hung call take a lease of 6 s (heartbeated every 2 s): the next beat waited
    for it. With the interval as the deadline, the next beat goes out on time."""
    from actor_service.coordinator_client import CoordinatorClient
    from actor_service.heartbeat import JobHeartbeat

    asked: list[float | None] = []
    answered = threading.Event()

    class Recording:
        def heartbeat(self, job_ids, timeout_s=None):
            asked.append(timeout_s)
            answered.set()
            return league_pb2.HeartbeatResponse(lease_timeout_s=6.0)

    beat = JobHeartbeat(Recording(), "job-1", interval_s=2.0, on_revoked=lambda _r: None)
    beat._interval_s = 0.01  # (the first beat at once; the deadline is taken from the interval in force)
    beat.start()
    try:
        assert answered.wait(30)
    finally:
        beat.close(5)
    assert asked[0] == 1.0  # max(1 s, the interval)

    client = CoordinatorClient.__new__(CoordinatorClient)  # the client keeps its own call timeout as the cap
    client.worker_id, client._call_timeout_s = "a", 10.0
    seen: list[float] = []
    client._stub_now = lambda: type("Stub", (), {"Heartbeat": staticmethod(
        lambda request, timeout: seen.append(timeout) or league_pb2.HeartbeatResponse())})()
    client.heartbeat(["job-1"], timeout_s=2.0)
    client.heartbeat(["job-1"], timeout_s=60.0)
    client.heartbeat(["job-1"])
    assert seen == [2.0, 10.0, 10.0]


class _AnswersAfterTheFinish:
    """The heartbeat under way when the learner finishes its job itself: answered "revoked" after the finish."""

    def __init__(self) -> None:
        self.sent = threading.Event()
        self.finished = threading.Event()

    def heartbeat(self, *args, **kwargs):
        self.sent.set()
        self.finished.wait(30)
        return None  # the job is no longer leased: "revoked"


def test_a_revoked_answer_to_a_heartbeat_sent_before_the_learner_released_its_job_is_no_news(caplog):
    """A stopping learner's release finishes its learn job; a heartbeat already under way was answered "revoked"
    and logged as a WARNING at the end of an ordinary `league run` (a default run, session 51)."""
    job = LearnJob("job-1", "p", "", 0, "CartPole-v1", {}, {}, {}, 30.0, lease_now())
    client = _AnswersAfterTheFinish()
    lease = LeaseKeeper(client, job, Registration(heartbeat_interval_s=0.01, lease_timeout_s=30.0))
    ended: list[SessionEnd] = []
    lease.attach(ended.append)
    lease.start()
    assert client.sent.wait(30)
    lease.close(wait_s=0)  # what the release does before its FinishJob
    client.finished.set()
    lease.close(5)
    assert ended == [] and not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_learners_lease_counts_the_time_its_machine_was_suspended(monkeypatch):
    """CLOCK_MONOTONIC stands still in a suspend: a learner resumed after one longer than its lease counted the
    lease as held and published, though the coordinator had expired it (a review). The lease clock goes on."""
    import common.lease_clock as lease_clock

    if hasattr(time, "CLOCK_BOOTTIME"):
        assert lease_clock.lease_now is lease_clock._boottime
        assert abs(lease_now() - time.clock_gettime(time.CLOCK_BOOTTIME)) < 1.0
    now = [1000.0]
    monkeypatch.setattr("learner_service.session.lease_now", lambda: now[0])
    job = LearnJob("job-1", "p", "", 0, "CartPole-v1", {}, {}, {}, 30.0, now[0])
    lease = LeaseKeeper(_BrokenClient(), job, Registration(heartbeat_interval_s=60.0, lease_timeout_s=30.0))
    assert lease.held
    now[0] += 3600.0  # a suspend: the boot-time clock moved on, the monotonic one did not
    assert not lease.held


def test_a_lapsed_lease_is_a_warning_not_an_error(monkeypatch, caplog):
    """A coordinator restarted (by league run, say) restores its leases and the learner goes on: the lapse it sees
    meanwhile put one ERROR line per learner in the run's output at every restart (a review)."""
    now = [1000.0]
    monkeypatch.setattr("learner_service.session.lease_now", lambda: now[0])
    job = LearnJob("job-1", "p", "", 0, "CartPole-v1", {}, {}, {}, 30.0, now[0])
    lease = LeaseKeeper(_BrokenClient(), job, Registration(heartbeat_interval_s=0.01, lease_timeout_s=30.0))
    now[0] += 60.0  # no heartbeat confirmed for two leases
    ended = threading.Event()
    lease.attach(lambda reason: ended.set())
    lease.start()
    try:
        assert ended.wait(30)  # (the broken client ends it after the lapse is said)
    finally:
        lease.close(5)
    (lapse,) = [r for r in caplog.records if "no heartbeat of learn job job-1" in r.getMessage()]
    assert lapse.levelno == logging.WARNING
