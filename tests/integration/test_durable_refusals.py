"""Refusals over gRPC wait for their commit like replies do.

A FinishJob refused because its lease expired makes the actor drop its results. The expiry may be the refused
call's own change: sent before it was committed, a crash took the expiry back, and the restarted coordinator
would have counted the results the worker had dropped (a review).
"""

from __future__ import annotations

import grpc

from common.proto.league.v1 import league_pb2 as pb
from common.rpc import ServerOptions
from league_service.coordinator import Coordinator, CoordinatorSettings
from league_service.coordinator_testing import league_stub, outcomes_for, small_league_config
from league_service.server import serve_coordinator
from tests.manual_clock import ManualClock

ACTOR, COMPLETED = pb.WORKER_ROLE_ACTOR, pb.FINISH_STATUS_COMPLETED


def test_a_finish_refused_for_an_expired_lease_is_not_sent_before_the_expiry_is_committed(tmp_path):
    clock = ManualClock()
    coordinator = Coordinator(small_league_config(),
                              CoordinatorSettings(shared_root=tmp_path, lease_timeout_s=60.0, needs_learner=False),
                              clock=clock, expiry_thread=False)
    server = serve_coordinator(coordinator, ServerOptions(host="127.0.0.1", port=0))
    channel, stub = league_stub(server.address)
    try:
        stub.RegisterWorker(pb.RegisterWorkerRequest(worker_id="a", role=ACTOR, hostname="h"))
        job = stub.GetJob(pb.GetJobRequest(worker_id="a", role=ACTOR, wait_s=5)).job
        clock.now += 61.0  # past the lease: this finish finds it expired and records the expiry itself
        request = pb.FinishJobRequest(worker_id="a", job_id=job.job_id, status=COMPLETED,
                                      episodes=outcomes_for(job, [True]), env_steps=5)
        with coordinator._store._lock:  # a stalled disk: no commit can finish
            call = stub.FinishJob.future(request, timeout=30)
            try:
                call.result(timeout=0.5)
            except grpc.FutureTimeoutError:
                pass  # still waiting for the commit: right
            except grpc.RpcError as err:
                raise AssertionError(f"refused before the expiry it rests on was committed: {err.details()}") from None
            else:
                raise AssertionError("a late finish was accepted")
        try:
            call.result(timeout=20)
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and "expired" in err.details(), err
        else:
            raise AssertionError("a late finish was accepted")
        assert stub.GetStatus(pb.GetStatusRequest()).counters.jobs_expired == 1
    finally:
        channel.close()
        server.stop(grace_s=1.0)
