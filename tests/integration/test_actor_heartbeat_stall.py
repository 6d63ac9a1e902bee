"""The job heartbeat against a real coordinator: it renews the lease while the rollout makes progress, stops
renewing while the env manager reports an env stuck past its timeout (a hang the manager cannot break), so the
lease expires and the job is issued again; when the env comes back the coordinator says the job is revoked.
Nothing here is timed: the lease is short only so that the test ends soon."""

from __future__ import annotations

import threading

from actor_service.coordinator_client import CoordinatorClient
from actor_service.heartbeat import JobHeartbeat
from actor_service.stop import StopSignal
from common.busy_clock import StallWatch
from common.proto.league.v1 import league_pb2 as pb
from league_service.coordinator_testing import league_stub, running_coordinator, small_league_config
from tests.polling import wait_until

LEASE_S = 2.0  # short so that the test ends soon; a few times a CI stall (GC, a busy core) so no lease lapses by accident


def test_a_stalled_env_lets_the_lease_expire_and_renewals_resume_with_the_revocation(tmp_path):
    stalled = {"s": 0.0}
    revoked: list[str] = []
    got_revoked = threading.Event()

    def on_revoked(reason: str) -> None:
        revoked.append(reason)
        got_revoked.set()

    with running_coordinator(small_league_config(), tmp_path, lease_timeout_s=LEASE_S, needs_learner=False) as server:
        channel, stub = league_stub(server.address)
        client = CoordinatorClient(server.address, "actor-0", stop=StopSignal())
        heartbeat = None
        try:
            registration = client.register()
            assert registration is not None
            job = client.next_job(wait_s=1.0)
            assert job is not None
            watch = StallWatch("its env has been stuck past its timeout for", lambda: stalled["s"], 1.0)
            heartbeat = JobHeartbeat(client, job.job_id, registration.heartbeat_interval_s, on_revoked,
                                     [watch]).start()

            # Renewed: the job outlives several leases.
            wait_until("a few renewals", lambda: heartbeat.beats >= 4, 30)
            assert stub.GetStatus(pb.GetStatusRequest()).counters.jobs_expired == 0
            assert heartbeat.withheld == 0

            # Stuck within the limit: still renewed.
            stalled["s"] = 0.5
            beats = heartbeat.beats
            wait_until("renewals while stuck within the limit", lambda: heartbeat.beats >= beats + 3, 30)
            assert heartbeat.withheld == 0

            # Stuck past the limit: renewals stop, the lease expires, the job goes back to the league.
            stalled["s"] = 5.0
            wait_until("the lease to expire", lambda: stub.GetStatus(pb.GetStatusRequest()).counters.jobs_expired >= 1,
                       30)
            assert heartbeat.withheld >= 1 and not got_revoked.is_set()
            in_flight = {j.job_id for j in stub.GetStatus(pb.GetStatusRequest()).jobs}
            assert job.job_id not in in_flight

            # The env comes back: the next renewal learns that the job is no longer this actor's.
            stalled["s"] = 0.0
            assert got_revoked.wait(30)
            assert "revoked" in revoked[0]
        finally:
            if heartbeat is not None:
                heartbeat.close()
            client.close()
            channel.close()
