"""The actor's FinishJob retries are visible to an operator: the first failed attempt, and every few after it,
are logged at WARNING with the job id, the gRPC status and that it will be retried (they were DEBUG only, so a
coordinator away showed nothing for the ~2 minutes of retries)."""

from __future__ import annotations

import logging
import threading

import grpc
import pytest

from actor_service import coordinator_client
from actor_service.coordinator_client import FINISH_WARN_EVERY, CoordinatorClient
from actor_service.stop import StopSignal
from common.proto.league.v1 import league_pb2
from common.rpc import RetryPolicy


class Failure(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class FlakyStub:
    """A LeagueService stub whose FinishJob fails `failures` times (UNAVAILABLE), then acknowledges."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    def FinishJob(self, request, timeout):  # noqa: N802 (the gRPC method's name)
        self.calls += 1
        if self.calls <= self.failures:
            raise Failure(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses")
        return league_pb2.FinishJobResponse()


ATTEMPTS = 12


@pytest.fixture
def client(monkeypatch):
    monkeypatch.setattr(coordinator_client, "FINISH_RETRY",
                        RetryPolicy(attempts=ATTEMPTS, initial_backoff_s=0.001, max_backoff_s=0.002))
    client = CoordinatorClient("127.0.0.1:1", "actor-0", stop=StopSignal())
    yield client
    client.close()


def _finish(client: CoordinatorClient, stub: FlakyStub, **kwargs):
    client._stub_now = lambda: stub
    return client.finish_job(league_pb2.FinishJobRequest(worker_id="actor-0", job_id="job-42"), **kwargs)


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and r.name == coordinator_client.__name__]


def test_the_first_failed_finish_and_every_few_after_it_are_warnings(client, caplog):
    caplog.set_level(logging.DEBUG)
    stub = FlakyStub(failures=2 * FINISH_WARN_EVERY + 1)
    assert _finish(client, stub) is not None
    warnings = _warnings(caplog)
    assert len(warnings) == 3, warnings  # attempts 1, FINISH_WARN_EVERY and 2 * FINISH_WARN_EVERY
    first = warnings[0]
    for part in ("FinishJob of job-42", "UNAVAILABLE", "failed to connect to all addresses",
                 f"attempt 1 of {ATTEMPTS}", "retrying"):
        assert part in first, first
    assert f"attempt {FINISH_WARN_EVERY} of {ATTEMPTS}" in warnings[1]


def test_one_failed_attempt_then_an_answer_warns_once(client, caplog):
    caplog.set_level(logging.WARNING)
    assert _finish(client, FlakyStub(failures=1)) is not None
    assert len(_warnings(caplog)) == 1


def test_retries_that_give_up_raise_as_before(client, caplog):
    """The actor logs the give-up itself (an error: the lease will expire and the job be issued again)."""
    caplog.set_level(logging.WARNING)
    stub = FlakyStub(failures=100)
    with pytest.raises(Failure):
        _finish(client, stub)
    assert stub.calls == ATTEMPTS
    assert all("retrying" in w for w in _warnings(caplog))
    assert len(_warnings(caplog)) == 1 + (ATTEMPTS - 1) // FINISH_WARN_EVERY


def test_a_stopping_actors_single_attempt_is_not_called_a_retry(client, caplog):
    caplog.set_level(logging.WARNING)
    with pytest.raises(Failure):
        _finish(client, FlakyStub(failures=1), once_within_s=0.5)
    assert _warnings(caplog) == []


def test_the_default_policy_retries_until_the_coordinator_answers(monkeypatch, caplog):
    """A coordinator restarted on its state counts a finish however long it was away (its leases get a fresh
    deadline): the retries do not give up after a count (12 attempts gave up after ~13 s of refused
    connections), and a stop still ends them."""
    caplog.set_level(logging.WARNING)
    policy = coordinator_client.FINISH_RETRY
    assert policy.attempts is None
    monkeypatch.setattr(coordinator_client, "FINISH_RETRY",
                        RetryPolicy(attempts=None, initial_backoff_s=0.0001, max_backoff_s=0.0002))
    client = CoordinatorClient("127.0.0.1:1", "actor-0", stop=StopSignal())
    try:
        stub = FlakyStub(failures=500)
        assert _finish(client, stub) is not None and stub.calls == 501
        assert "attempt 4;" in _warnings(caplog)[1]
    finally:
        client.close()

    stop = StopSignal()
    client = CoordinatorClient("127.0.0.1:1", "actor-0", stop=stop)
    try:
        stub = FlakyStub(failures=10**9)
        original = stub.FinishJob

        def failing_then_stopped(request, timeout):
            if stub.calls == 50:
                stop.set()
            return original(request, timeout)

        client._stub_now = lambda: type("Stub", (), {"FinishJob": staticmethod(failing_then_stopped)})()
        with pytest.raises(Failure):
            client.finish_job(league_pb2.FinishJobRequest(worker_id="actor-0", job_id="job-42"))
        assert stub.calls == 51
    finally:
        client.close()


def test_a_finish_the_stopping_coordinator_cancelled_is_retried(monkeypatch):
    """A coordinator stopping with a grace period cancels the calls it received but had not begun: 4 of 576
    finishes in a SIGTERM-and-restart run were dropped as unreported."""
    assert grpc.StatusCode.CANCELLED in coordinator_client.FINISH_RETRY.retry_codes
    monkeypatch.setattr(coordinator_client, "FINISH_RETRY",
                        RetryPolicy(attempts=None, initial_backoff_s=0.0001, max_backoff_s=0.0002,
                                    retry_codes=coordinator_client.FINISH_RETRY.retry_codes))

    class CancelledOnce(FlakyStub):
        def FinishJob(self, request, timeout):  # noqa: N802
            self.calls += 1
            if self.calls == 1:
                raise Failure(grpc.StatusCode.CANCELLED, "Cancelled")
            return league_pb2.FinishJobResponse()

    client = CoordinatorClient("127.0.0.1:1", "actor-0", stop=StopSignal())
    try:
        stub = CancelledOnce(failures=0)
        assert _finish(client, stub) is not None and stub.calls == 2
    finally:
        client.close()


def test_a_stop_cuts_short_a_finish_job_a_hung_coordinator_holds():
    """A coordinator that is hung (not gone) held a stopping actor's FinishJob for the call's whole deadline
    (10 s), past `league run`'s 15 s with the heartbeat's wait: a stop now leaves the call `stop_grace_s`."""
    from concurrent import futures

    from common.proto.league.v1 import league_pb2_grpc

    arrived, release = threading.Event(), threading.Event()

    class Hung(league_pb2_grpc.LeagueServiceServicer):
        def FinishJob(self, request, context):  # noqa: N802 (the gRPC method's name)
            arrived.set()
            release.wait(60)
            return league_pb2.FinishJobResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    league_pb2_grpc.add_LeagueServiceServicer_to_server(Hung(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    stop = StopSignal()
    client = CoordinatorClient(f"127.0.0.1:{port}", "actor-0", stop=stop, call_timeout_s=60.0)
    outcome: list[BaseException | object] = []

    def finish() -> None:
        try:
            outcome.append(client.finish_job(league_pb2.FinishJobRequest(worker_id="actor-0", job_id="job-42"),
                                             stop_grace_s=0.5))
        except BaseException as err:  # noqa: BLE001 (checked below)
            outcome.append(err)

    caller = threading.Thread(target=finish)
    try:
        caller.start()
        assert arrived.wait(30)
        stop.set()
        caller.join(30)  # the call's own deadline is 60 s
        assert not caller.is_alive()
        assert isinstance(outcome[0], grpc.RpcError) and outcome[0].code() is grpc.StatusCode.CANCELLED
    finally:
        release.set()
        caller.join(60)
        client.close()
        server.stop(0)


def test_a_stop_during_the_wait_for_a_heartbeat_in_flight_cuts_that_wait_short():
    """A job's end waits for a heartbeat already sent (no heartbeat may name the job after its FinishJob). To a
    hung coordinator that wait was the call's whole deadline even once the actor was told to stop."""
    from actor_service.heartbeat import JobHeartbeat

    sent, release = threading.Event(), threading.Event()

    class HungClient:
        def heartbeat(self, job_ids, timeout_s=None):
            sent.set()
            release.wait(60)
            return league_pb2.HeartbeatResponse()

    stop = StopSignal()
    heartbeat = JobHeartbeat(HungClient(), "job-42", interval_s=0.01, on_revoked=lambda _job: None).start()
    try:
        assert sent.wait(30)
        closer = threading.Thread(target=lambda: heartbeat.close(None, stop=stop, stop_wait_s=0.2))
        closer.start()
        stop.set()
        closer.join(30)  # without the stop it waits for the heartbeat (60 s here)
        assert not closer.is_alive()
    finally:
        release.set()
