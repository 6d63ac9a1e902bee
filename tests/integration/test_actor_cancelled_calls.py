"""A coordinator that is stopping answers CANCELLED to calls it had received but not begun. The actor's
RegisterWorker and GetJob took that for a refusal (CoordinatorError, exit 2): a routine coordinator restart
could take actors down for good. They now back off and call again, as FinishJob and the heartbeat do."""

from __future__ import annotations

import grpc

from actor_service.backoff import BackoffSettings
from actor_service.coordinator_client import CoordinatorClient
from actor_service.stop import StopSignal
from common.proto.league.v1 import league_pb2, league_pb2_grpc
from common.rpc import ServerOptions, make_server


class CancelsFirstCalls(league_pb2_grpc.LeagueServiceServicer):
    """The first RegisterWorker and the first GetJob are cancelled; later ones are answered."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {"RegisterWorker": 0, "GetJob": 0}

    def RegisterWorker(self, request, context):  # noqa: N802 (the gRPC method's name)
        self.calls["RegisterWorker"] += 1
        if self.calls["RegisterWorker"] == 1:
            context.abort(grpc.StatusCode.CANCELLED, "the server is stopping")
        return league_pb2.RegisterWorkerResponse(worker_id=request.worker_id, heartbeat_interval_s=1.0,
                                                 lease_timeout_s=10.0, league_id="league-x")

    def GetJob(self, request, context):  # noqa: N802
        self.calls["GetJob"] += 1
        if self.calls["GetJob"] == 1:
            context.abort(grpc.StatusCode.CANCELLED, "the server is stopping")
        return league_pb2.GetJobResponse(job=league_pb2.Job(job_id="job-1"))


def test_register_and_get_job_answered_cancelled_are_called_again():
    servicer = CancelsFirstCalls()
    server = make_server(
        ServerOptions(host="127.0.0.1", port=0),
        lambda s: league_pb2_grpc.add_LeagueServiceServicer_to_server(servicer, s),
        ["league.v1.LeagueService"],
    )
    client = CoordinatorClient(server.address, "actor-0", stop=StopSignal(),
                               backoff=BackoffSettings(initial_s=0.01, max_s=0.02))
    try:
        assert client.register().league_id == "league-x"
        assert client.next_job(wait_s=0.5).job_id == "job-1"
        assert servicer.calls == {"RegisterWorker": 2, "GetJob": 2}
    finally:
        client.close()
        server.stop(0)
