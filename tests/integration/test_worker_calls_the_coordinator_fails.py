"""A coordinator that is stopping answers CANCELLED to calls it had received but not begun. The actor's
RegisterWorker and GetJob took that for a refusal (CoordinatorError, exit 2): a routine coordinator restart
could take actors down for good. They now back off and call again, as FinishJob and the heartbeat do.

The same for a coordinator that fails the call itself (INTERNAL, UNKNOWN): a job it could not encode was answered
INTERNAL and issued again, and took down one actor per attempt (a review); learners exited on it too."""

from __future__ import annotations

import dataclasses
import datetime
import logging
import threading
import time

import grpc
import pytest

from actor_service.backoff import BackoffSettings
from actor_service.coordinator_client import CoordinatorClient, CoordinatorError
from actor_service.stop import StopSignal
from common.proto.league.v1 import league_pb2, league_pb2_grpc
from common.rpc import ServerOptions, make_server
from league_service.coordinator_testing import league_stub, running_coordinator, small_league_config
from learner_service.league_client import LeagueClient


class FirstCallsFail(league_pb2_grpc.LeagueServiceServicer):
    """The first calls of RegisterWorker and GetJob fail, one per entry of `failures[method]`: a status code the
    handler aborts with, or an exception it raises (UNKNOWN to the client); later calls are answered. `refuse`:
    every GetJob is aborted with that code."""

    def __init__(self, failures: dict[str, list], refuse: grpc.StatusCode | None = None) -> None:
        self.failures = failures
        self.refuse = refuse
        self.calls: dict[str, int] = {"RegisterWorker": 0, "GetJob": 0}

    def _fail_first(self, method: str, context) -> None:
        self.calls[method] += 1
        failures = self.failures.get(method, [])
        if self.calls[method] <= len(failures):
            failure = failures[self.calls[method] - 1]
            if isinstance(failure, Exception):
                raise failure
            context.abort(failure, "the server is stopping" if failure is grpc.StatusCode.CANCELLED
                          else "the coordinator cannot encode this job")

    def RegisterWorker(self, request, context):  # noqa: N802 (the gRPC method's name)
        self._fail_first("RegisterWorker", context)
        return league_pb2.RegisterWorkerResponse(worker_id=request.worker_id, heartbeat_interval_s=1.0,
                                                 lease_timeout_s=10.0, league_id="league-x")

    def UpdatePlayer(self, request, context):  # noqa: N802
        context.abort(grpc.StatusCode.INTERNAL, "a bug in the handler")

    def GetStatus(self, request, context):  # noqa: N802
        context.abort(grpc.StatusCode.INTERNAL, "a bug in the status")

    def GetJob(self, request, context):  # noqa: N802
        if self.refuse is not None:
            context.abort(self.refuse, "not for you")
        self._fail_first("GetJob", context)
        learn = request.role == league_pb2.WORKER_ROLE_LEARNER
        return league_pb2.GetJobResponse(job=league_pb2.Job(
            job_id="job-1", kind=league_pb2.JOB_KIND_LEARN if learn else league_pb2.JOB_KIND_COLLECT,
            players=[league_pb2.PlayerRef(player_id="p")]))


def test_register_and_get_job_answered_cancelled_are_called_again():
    cancelled = [grpc.StatusCode.CANCELLED]
    servicer = FirstCallsFail({"RegisterWorker": cancelled, "GetJob": cancelled})
    server = _serve(servicer)
    client = CoordinatorClient(server.address, "actor-0", stop=StopSignal(),
                               backoff=BackoffSettings(initial_s=0.01, max_s=0.02))
    try:
        assert client.register().league_id == "league-x"
        assert client.next_job(wait_s=0.5).job_id == "job-1"
        assert servicer.calls == {"RegisterWorker": 2, "GetJob": 2}
    finally:
        client.close()
        server.stop(0)


def _serve(servicer):
    return make_server(ServerOptions(host="127.0.0.1", port=0),
                       lambda s: league_pb2_grpc.add_LeagueServiceServicer_to_server(servicer, s),
                       ["league.v1.LeagueService"])


def test_register_and_get_job_failed_in_the_coordinator_are_logged_and_called_again(caplog):
    faults = {"RegisterWorker": [grpc.StatusCode.INTERNAL],
              "GetJob": [RuntimeError("a bug in the handler"), grpc.StatusCode.INTERNAL]}
    servicer = FirstCallsFail(faults)
    server = _serve(servicer)
    actor = CoordinatorClient(server.address, "actor-0", stop=StopSignal(),
                              backoff=BackoffSettings(initial_s=0.01, max_s=0.02))
    learner = LeagueClient(server.address, "learner-0", max_backoff_s=0.02)
    try:
        with caplog.at_level(logging.ERROR):
            assert actor.register().league_id == "league-x"
            assert actor.next_job(wait_s=0.5).job_id == "job-1"
        assert servicer.calls == {"RegisterWorker": 2, "GetJob": 3}
        assert "cannot encode this job" in caplog.text and "a bug in the handler" in caplog.text
        servicer.calls = {"RegisterWorker": 0, "GetJob": 0}
        learner.register("127.0.0.1:1")
        assert learner.next_learn_job("127.0.0.1:1", wait_s=0.5).job_id == "job-1"
        assert servicer.calls == {"RegisterWorker": 2, "GetJob": 3}
    finally:
        actor.close()
        learner.close()
        server.stop(0)


def test_a_refusal_still_ends_the_asking():
    """PERMISSION_DENIED (the wrong role, say) is no fault of the coordinator: retrying cannot fix it."""
    server = _serve(FirstCallsFail({}, refuse=grpc.StatusCode.PERMISSION_DENIED))
    actor = CoordinatorClient(server.address, "actor-0", stop=StopSignal(),
                              backoff=BackoffSettings(initial_s=0.01, max_s=0.02))
    learner = LeagueClient(server.address, "learner-0", max_backoff_s=0.02)
    try:
        with pytest.raises(CoordinatorError, match="PERMISSION_DENIED"):
            actor.next_job(wait_s=0.5)
        with pytest.raises(grpc.RpcError) as raised:
            learner.next_learn_job("127.0.0.1:1", wait_s=0.5)
        assert raised.value.code() is grpc.StatusCode.PERMISSION_DENIED
    finally:
        actor.close()
        learner.close()
        server.stop(0)


def test_an_actor_keeps_asking_while_the_coordinator_cannot_encode_its_jobs(tmp_path):
    """The real coordinator and a job it cannot encode (a value a protobuf Struct cannot hold, in the kwargs of a
    user's own env, which config load does not check): every attempt is failed and answered INTERNAL; the actor
    asks again each time instead of exiting."""
    cfg = small_league_config()
    cfg = dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, name="python:tests.env_doubles:CountingEnv",
                                                           kwargs={"when": datetime.date(2026, 1, 1)}))
    with running_coordinator(cfg, tmp_path, lease_timeout_s=60.0, needs_learner=False) as server:
        stop = StopSignal()
        client = CoordinatorClient(server.address, "actor-0", stop=stop,
                                   backoff=BackoffSettings(initial_s=0.01, max_s=0.05))
        asked: list[object] = []
        thread = threading.Thread(target=lambda: asked.append(_next_job(client)), daemon=True)
        try:
            client.register()
            thread.start()
            channel, stub = league_stub(server.address)
            with channel:
                deadline = time.monotonic() + 30
                while stub.GetStatus(league_pb2.GetStatusRequest()).counters.jobs_failed < 3:
                    assert time.monotonic() < deadline and thread.is_alive(), asked
                    time.sleep(0.05)
            assert thread.is_alive() and not asked  # still asking: no job came, and it did not give up
        finally:
            stop.set()
            thread.join(10)
            client.close()
        assert not thread.is_alive() and asked == [None]


def _next_job(client: CoordinatorClient):
    try:
        return client.next_job(wait_s=0.5)
    except Exception as err:  # noqa: BLE001 (the test asserts there is none)
        return err



def test_an_update_player_the_coordinator_fails_is_reported_again_later(caplog):
    """A learner exited 1 on an INTERNAL answer to UpdatePlayer (while training, and at its stop before its
    release): the report is as good as unanswered, and the next one catches up (a review)."""
    from learner_service.trainer import Progress

    server = _serve(FirstCallsFail({}))
    learner = LeagueClient(server.address, "learner-0", max_backoff_s=0.02)
    try:
        with caplog.at_level(logging.ERROR):
            for patient in (True, False):
                assert learner.update_player("p", Progress(10, 1), "p/v0000000001.pt", 1, patient=patient) is None
        assert "UpdatePlayer p v1 failed in the coordinator (INTERNAL: a bug in the handler)" in caplog.text
    finally:
        learner.close()
        server.stop(0)



def test_a_status_the_coordinator_fails_while_a_learner_binds_sends_it_asking_again(tmp_path, caplog):
    """Binding a player reads the league's totals for it (GetStatus); an INTERNAL answer there made the learner
    exit 1 without handing its learn job back (a review). It asks for a job again; the lease runs out."""
    from learner_service.league_client import LearnJob
    from learner_service.learner import Learner, LearnerSettings

    class Held:
        held = True

    server = _serve(FirstCallsFail({}))
    learner = Learner(LearnerSettings(coordinator=server.address, shared_root=tmp_path, worker_id="l", device="cpu"))
    try:
        job = LearnJob("job-1", "p", "", 0, "CartPole-v1", {}, {}, {}, 30.0, 0.0)
        with caplog.at_level(logging.ERROR):
            assert learner._serve_job(job, Held(), tmp_path) is None
        assert "p: the coordinator failed a call while binding (INTERNAL: a bug in the status)" in caplog.text
    finally:
        learner.close()
        server.stop(0)


def test_an_actor_takes_a_job_larger_than_grpcs_default_message_limit(tmp_path):
    """The coordinator sends replies up to 256 MiB; the actor's channel kept gRPC's 4 MiB: a job whose env
    kwargs ran to megabytes was RESOURCE_EXHAUSTED, the actor exited 2 and the lease stayed held (a review)."""
    from actor_service.coordinator_client import CoordinatorClient
    from actor_service.stop import StopSignal
    from league_service.coordinator_testing import running_coordinator, small_league_config

    cfg = small_league_config({"league": {"league_type": "solo", "active_players": {"solo_active_player": 1}},
                               "env": {"name": "python:tests.env_doubles:CountingEnv",
                                       "kwargs": {"note": "x" * 5_000_000}}})
    with running_coordinator(cfg, tmp_path, needs_learner=False) as server:
        client = CoordinatorClient(server.address, "actor-1", stop=StopSignal())
        try:
            assert client.register() is not None
            job = client.next_job(wait_s=5.0)
            assert job is not None and job.ByteSize() > 4 * 2**20
        finally:
            client.close()
