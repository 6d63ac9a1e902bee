"""A coordinator restarted on its state with a shorter lease than the one its workers registered with.

Workers register once and kept heartbeating at the old pace (here every 3 s against the new lease of 2.4 s), so
the restarted coordinator let every lease in flight expire, and a learner went on counting its lease as held by
the old length (publishing when another learner may have had its player). The heartbeat answer now carries the
lease the coordinator grants; workers heartbeat at least three times per it, and the learner counts by it.
Nothing here is timed: the leases are short only so that the test ends soon.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

from actor_service.coordinator_client import CoordinatorClient
from actor_service.heartbeat import JobHeartbeat
from actor_service.stop import StopSignal
from common.ports import restartable_port
from common.proto.league.v1 import league_pb2 as pb
from common.rpc import ServerOptions, job_heartbeat_interval
from league_service.config import Config
from league_service.coordinator import Coordinator, CoordinatorSettings
from league_service.coordinator_testing import league_stub, small_league_config
from league_service.server import serve_coordinator
from learner_service.league_client import LeagueClient
from learner_service.session import LeaseKeeper
from tests.polling import wait_until

LONG_S = 9.0  # registration: a heartbeat every 3 s
SHORT_S = 2.4  # after the restart: a heartbeat every 0.8 s, if the workers learn of it


@contextlib.contextmanager
def coordinator_on(port: int, cfg: Config, root: Path, lease_s: float, needs_learner: bool):
    coordinator = Coordinator(cfg, CoordinatorSettings(shared_root=root, state_path=root / "state.sqlite",
                                                       lease_timeout_s=lease_s, needs_learner=needs_learner))
    server = serve_coordinator(coordinator, ServerOptions(host="127.0.0.1", port=port))
    try:
        yield server
    finally:
        server.stop(grace_s=0.5)


def expired(address: str) -> int:
    channel, stub = league_stub(address)
    with channel:
        return stub.GetStatus(pb.GetStatusRequest()).counters.jobs_expired


def test_an_actor_keeps_its_job_through_a_restart_that_shortens_the_lease(tmp_path):
    port = restartable_port()
    revoked: list[str] = []
    cfg = small_league_config()
    with coordinator_on(port, cfg, tmp_path, LONG_S, needs_learner=False) as server:
        client = CoordinatorClient(server.address, "actor-0", stop=StopSignal())
        registration = client.register()
        assert registration is not None and registration.heartbeat_interval_s == LONG_S / 3
        job = client.next_job(wait_s=1.0)
        assert job is not None
        interval = job_heartbeat_interval(registration.heartbeat_interval_s, job.lease_timeout_s)
        heartbeat = JobHeartbeat(client, job.job_id, interval, revoked.append).start()
    try:
        with coordinator_on(port, cfg, tmp_path, SHORT_S, needs_learner=False) as server:
            beats = heartbeat.beats
            wait_until("a renewal by the restarted coordinator", lambda: heartbeat.beats > beats, 30)
            time.sleep(3 * SHORT_S)  # several of the new leases
            assert not revoked and expired(server.address) == 0
            assert heartbeat.beats >= beats + 5
    finally:
        heartbeat.close()
        client.close()


def test_a_learner_keeps_its_player_through_a_restart_that_shortens_the_lease(tmp_path):
    port = restartable_port()
    cfg = small_league_config()
    client = LeagueClient(f"127.0.0.1:{port}", "learner-0")
    try:
        with coordinator_on(port, cfg, tmp_path, LONG_S, needs_learner=True):
            registration = client.register("127.0.0.1:1")
            job = client.next_learn_job("127.0.0.1:1", wait_s=10)
            lease = LeaseKeeper(client, job, registration).start()
        lost = []
        lease.attach(lost.append)
        try:
            with coordinator_on(port, cfg, tmp_path, SHORT_S, needs_learner=True) as server:
                wait_until("the learner to learn the new lease", lambda: lease.held and lease.lease_timeout_s == SHORT_S,
                           30)
                time.sleep(3 * SHORT_S)
                assert lease.held and not lost and expired(server.address) == 0
        finally:
            lease.close()
        # Gone for longer than the new lease: no longer held (by the old lease's count it still would be).
        time.sleep(SHORT_S)
        assert not lease.held
    finally:
        client.close()
