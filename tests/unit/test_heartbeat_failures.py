"""A heartbeat thread that dies of an unexpected error (a bug, a reply it cannot read) ends what it keeps alive.
Before, the thread died with a traceback on stderr and nothing else: an actor played its job on unrenewed (the
lease expired and the job was issued again meanwhile); a learner trained on with no lease, publishing nothing,
and never heard that its job had been revoked."""

from __future__ import annotations

import logging
import threading

from actor_service.heartbeat import JobHeartbeat
from learner_service.league_client import LearnJob, Registration
from learner_service.session import LeaseKeeper, SessionEnd


class _BrokenClient:
    def heartbeat(self, *args):
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
    import time

    job = LearnJob("job-1", "p", "", 0, "CartPole-v1", {}, {}, {}, 30.0, time.monotonic())
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
