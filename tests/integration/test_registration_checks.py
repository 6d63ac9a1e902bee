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
