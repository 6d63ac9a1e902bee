"""A coordinator process that did not run for a while (a pause): lease deadlines move on by the pause, also
after the wall clock stepped back. The real coordinator with its expiry thread, and a clock the test moves."""

from __future__ import annotations

from league_service.coordinator import Coordinator, CoordinatorSettings
from league_service.coordinator_messages import JobGrant
from league_service.coordinator_testing import small_league_config
from league_service.leases import WorkerRole


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def _coordinator(tmp_path, clock: Clock) -> Coordinator:
    cfg = small_league_config({"league": {"league_type": "solo", "active_players": {"solo_active_player": 1}},
                               "env": {"name": "CartPole-v1"}})
    coord = Coordinator(cfg, CoordinatorSettings(shared_root=tmp_path, lease_timeout_s=30.0, needs_learner=False,
                                                 rng_seed=0), clock=clock)
    coord.start()
    coord.register_worker("actor", WorkerRole.ACTOR, "host", "")
    return coord


def test_a_pause_longer_than_the_lease_keeps_the_lease_also_after_the_clock_stepped_back(tmp_path):
    clock = Clock()
    coord = _coordinator(tmp_path, clock)
    try:
        grant = coord.get_job("actor", WorkerRole.ACTOR, "", wait_s=10.0)
        assert isinstance(grant, JobGrant)
        for step_back in (0.0, 60.0):
            clock.now -= step_back  # a wall-clock correction, then a heartbeat on the new clock
            assert not coord.heartbeat("actor", [grant.job_id]).revoked_job_ids
            clock.now += 40.0  # then the process does not run for 40 s, longer than the 30 s lease
            assert not coord.heartbeat("actor", [grant.job_id]).revoked_job_ids
        assert coord.status().counters.jobs_expired == 0
    finally:
        coord.close()
