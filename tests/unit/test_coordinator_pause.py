"""A coordinator process that did not run for a while (a pause): lease deadlines move on by the pause, also
after the wall clock stepped back. The real coordinator with its expiry thread, and a clock the test moves."""

from __future__ import annotations

import subprocess
import sys

from league_service.coordinator import Coordinator, CoordinatorSettings
from league_service.coordinator_messages import JobGrant
from league_service.coordinator_testing import small_league_config
from league_service.leases import WorkerRole
from tests.manual_clock import ManualClock


def _coordinator(tmp_path, clock: ManualClock) -> Coordinator:
    cfg = small_league_config({"league": {"league_type": "solo", "active_players": {"solo_active_player": 1}},
                               "env": {"name": "CartPole-v1"}})
    coord = Coordinator(cfg, CoordinatorSettings(shared_root=tmp_path, lease_timeout_s=30.0, needs_learner=False,
                                                 rng_seed=0), clock=clock)
    coord.start()
    coord.register_worker("actor", WorkerRole.ACTOR, "host", "")
    return coord


def test_a_pause_longer_than_the_lease_keeps_the_lease_also_after_the_clock_stepped_back(tmp_path):
    clock = ManualClock(1_000_000.0)
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


# The step is made in a process of its own, before the coordinator is imported: a clock bound at import (a default
# argument) reads the stepped wall clock as a clock that reads time.time() when called does.
_STEP_BACK = """
import sys, time
real = time.time
step = [0.0]
time.time = lambda: real() + step[0]
from pathlib import Path
from league_service.coordinator import Coordinator, CoordinatorSettings
from league_service.coordinator_messages import JobGrant
from league_service.coordinator_testing import small_league_config
from league_service.leases import WorkerRole
cfg = small_league_config({"league": {"league_type": "solo", "active_players": {"solo_active_player": 1}},
                           "env": {"name": "CartPole-v1"}})
coord = Coordinator(cfg, CoordinatorSettings(shared_root=Path(sys.argv[1]), lease_timeout_s=0.3, needs_learner=False,
                                             rng_seed=0), expiry_thread=False)
coord.start()
coord.register_worker("actor", WorkerRole.ACTOR, "host", "")
assert isinstance(coord.get_job("actor", WorkerRole.ACTOR, "", wait_s=1.0), JobGrant)
step[0] = -3600.0  # the wall clock steps back an hour; the worker goes silent
time.sleep(0.5)
coord.expire_due()
status = coord.status()
print(status.counters.jobs_expired, min(status.now - w.last_heartbeat for w in status.workers))
coord.close()
"""


def test_a_lease_of_a_silent_worker_expires_on_time_after_the_wall_clock_stepped_back(tmp_path):
    """The coordinator's own clock (no fake one): the wall clock steps back an hour just after a grant, and the
    worker goes silent. Its lease expires after the lease timeout, not an hour later, and the worker's silence
    does not count as negative."""
    done = subprocess.run([sys.executable, "-c", _STEP_BACK, str(tmp_path)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    expired, silent_s = done.stdout.split()
    assert int(expired) == 1
    assert float(silent_s) >= 0.0


def test_a_pause_during_a_stalled_write_moves_the_leases_on_once(tmp_path):
    """A coordinator stopped (SIGSTOP) while it wrote its state saw both a pause and a stalled write over the same
    seconds: the leases moved on by twice the time, and dead workers' leases lived that much longer (a review)."""
    clock = ManualClock(1_000_000.0)
    coord = _coordinator(tmp_path, clock)
    try:
        grant = coord.get_job("actor", WorkerRole.ACTOR, "", wait_s=10.0)
        assert isinstance(grant, JobGrant)
        assert not coord.heartbeat("actor", [grant.job_id]).revoked_job_ids
        (before,) = [j.lease_deadline for j in coord.status().jobs if j.job_id == grant.job_id]
        with coord._lock:  # the 40 s the process did not run were spent in a write (as the committer counts it)
            coord._commits._stalled_s += 40.0 - 1.0
        clock.now += 40.0
        coord.status()  # any call runs the expiry check
        (after,) = [j.lease_deadline for j in coord.status().jobs if j.job_id == grant.job_id]
        assert after - before == 40.0  # moved on by the pause once, not by the pause and the stall
    finally:
        coord.close()
