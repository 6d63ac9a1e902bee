"""A player's learner comes back at another address (restarted on another port, or another learner took the
player over): the collect jobs in flight that stream to the old address are revoked and the same matches offered
again with the new address, at once, instead of their actors retrying a dead address for minutes. The real
coordinator (league core, lease table, SQLite store; no gRPC) with a fake clock."""

from __future__ import annotations

import pytest

from league_service.coordinator import Coordinator, CoordinatorSettings
from league_service.coordinator_messages import FinishReport, JobGrant
from league_service.coordinator_testing import FakeClock, small_league_config
from league_service.errors import FailedPreconditionError
from league_service.leases import JobEndStatus, JobKind, WorkerRole

OLD, NEW = "127.0.0.1:7001", "127.0.0.1:7002"


def _grant(coord: Coordinator, worker: str, role: WorkerRole, endpoint: str = "") -> JobGrant:
    grant = coord.get_job(worker, role, endpoint, wait_s=1.0)
    assert isinstance(grant, JobGrant), grant
    return grant


@pytest.mark.parametrize("same_learner", [True, False], ids=["restarted-on-another-port", "another-learner"])
def test_collect_jobs_streaming_to_the_old_address_are_offered_again_with_the_new_one(tmp_path, same_learner):
    cfg = small_league_config({"league": {"active_players": {"main_player": 1}, "max_active_player_job": 2}})
    clock = FakeClock()
    coord = Coordinator(cfg, CoordinatorSettings(shared_root=tmp_path, lease_timeout_s=30.0, rng_seed=0),
                        clock=clock, expiry_thread=False)
    coord.start()
    try:
        coord.register_worker("learner-a", WorkerRole.LEARNER, "host", OLD)
        learn = _grant(coord, "learner-a", WorkerRole.LEARNER, OLD)
        assert learn.kind is JobKind.LEARN
        jobs = {}
        for actor in ("actor-1", "actor-2"):
            coord.register_worker(actor, WorkerRole.ACTOR, "host", "")
            jobs[actor] = _grant(coord, actor, WorkerRole.ACTOR)
            assert jobs[actor].learner_endpoint == OLD

        if same_learner:  # the same worker asks again from its new port
            coord.register_worker("learner-a", WorkerRole.LEARNER, "host", NEW)
            assert _grant(coord, "learner-a", WorkerRole.LEARNER, NEW).job_id == learn.job_id
        else:  # the old learner went silent; once its lease expired another one binds to the player
            for _ in range(2):  # the actors heartbeat, the learner does not
                clock.now += 16.0
                for actor, job in jobs.items():
                    assert not coord.heartbeat(actor, [job.job_id]).revoked_job_ids
            coord.register_worker("learner-b", WorkerRole.LEARNER, "host", NEW)
            assert _grant(coord, "learner-b", WorkerRole.LEARNER, NEW).launch_player == learn.launch_player

        for actor, job in jobs.items():
            assert coord.heartbeat(actor, [job.job_id]).revoked_job_ids == (job.job_id,)
            with pytest.raises(FailedPreconditionError):
                coord.finish_job(FinishReport(actor, job.job_id, JobEndStatus.COMPLETED, (), 0, 0, ""))
        again = {actor: _grant(coord, actor, WorkerRole.ACTOR) for actor in jobs}
        assert {job.learner_endpoint for job in again.values()} == {NEW}
        assert sorted(tuple(p.player_id for p in j.players) for j in again.values()) == sorted(
            tuple(p.player_id for p in j.players) for j in jobs.values())  # the same matches
        status = coord.status()
        assert not status.job_failures  # not the player's failure: no retry count, no backoff
        c = status.counters
        assert c.jobs_issued == c.jobs_finished + c.jobs_expired + c.jobs_failed + len(status.jobs)
    finally:
        coord.close()
