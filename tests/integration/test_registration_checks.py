"""Workers check the timing a coordinator gives them at registration: a zero or NaN heartbeat interval or
lease (a server of another version, or not a league coordinator) is a clear error at once, not a crash of the
heartbeat thread later or a learner that never holds its lease."""

from __future__ import annotations

import math

import pytest

from actor_service.coordinator_client import CoordinatorClient
from actor_service.stop import StopSignal
from common.proto.league.v1 import league_pb2, league_pb2_grpc
from common.rpc import RegistrationError, ServerOptions, make_server
from learner_service.league_client import LeagueClient


class OddCoordinator(league_pb2_grpc.LeagueServiceServicer):
    def __init__(self, interval: float, lease: float) -> None:
        self._reply = league_pb2.RegisterWorkerResponse(heartbeat_interval_s=interval, lease_timeout_s=lease)

    def RegisterWorker(self, request, context):
        return self._reply


@pytest.mark.parametrize(("interval", "lease"), [(0.0, 30.0), (math.nan, 30.0), (5.0, 0.0), (5.0, 2.0)])
def test_workers_refuse_a_registration_they_cannot_time_heartbeats_by(interval, lease):
    server = make_server(
        ServerOptions(host="127.0.0.1", port=0),
        lambda s: league_pb2_grpc.add_LeagueServiceServicer_to_server(OddCoordinator(interval, lease), s),
        ["league.v1.LeagueService"],
    )
    actor = CoordinatorClient(server.address, "actor-0", stop=StopSignal())
    learner = LeagueClient(server.address, "learner-0")
    try:
        with pytest.raises(RegistrationError, match="heartbeat_interval_s="):
            actor.register()
        with pytest.raises(RegistrationError, match="is it a league coordinator"):
            learner.register("127.0.0.1:1")
    finally:
        actor.close()
        learner.close()
        server.stop(0)


def test_an_actor_given_a_registration_it_cannot_time_stops_with_one_line_and_exit_2(tmp_path):
    """The learner's CLI took RegistrationError as a setup error; the actor's died with a traceback, exit 1, which
    supervisors restart for ever (a review)."""
    import subprocess
    import sys

    server = make_server(
        ServerOptions(host="127.0.0.1", port=0),
        lambda s: league_pb2_grpc.add_LeagueServiceServicer_to_server(OddCoordinator(0.0, 30.0), s),
        ["league.v1.LeagueService"],
    )
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "league_cli", "actor", "--coordinator", server.address, "--shared-root",
             str(tmp_path)], capture_output=True, text=True, timeout=120,
        )
    finally:
        server.stop(0)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "heartbeat_interval_s=" in proc.stderr.strip().splitlines()[-1]
