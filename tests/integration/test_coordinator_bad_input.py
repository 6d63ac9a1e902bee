"""Malformed and hostile requests against a real coordinator on 127.0.0.1: clear refusals, no damage."""

import contextlib
import dataclasses
import datetime
import math

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.proto.league.v1 import league_pb2 as pb
from league_service.coordinator_testing import (
    league_stub,
    outcomes_for,
    running_coordinator,
    small_league_config,
)

ACTOR, LEARNER = pb.WORKER_ROLE_ACTOR, pb.WORKER_ROLE_LEARNER
REFUSALS = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """One server for the refusal tests, which change nothing (the generated requests may hold its jobs)."""
    yield from _serve(tmp_path_factory.mktemp("shared"))


@pytest.fixture
def fresh(tmp_path):
    """A server of its own, for a test that needs free jobs."""
    yield from _serve(tmp_path)


def _serve(root):
    (root / "main_player_default_0").mkdir()
    (root / "main_player_default_0" / "ckpt.pt").write_bytes(b"w")
    (root / "loop").symlink_to(root / "loop")
    (root / "rootlink").symlink_to(root)
    with running_coordinator(small_league_config(), root, lease_timeout_s=60.0, needs_learner=False) as server:
        channel, stub = league_stub(server.address)
        try:
            stub.RegisterWorker(pb.RegisterWorkerRequest(worker_id="actor", role=ACTOR))
            yield server, stub
        finally:
            channel.close()


def refused(call, request):
    with pytest.raises(grpc.RpcError) as err:
        call(request)
    return err.value.code(), err.value.details()


def test_unknown_ids_are_not_found(served):
    _, stub = served
    assert refused(stub.Heartbeat, pb.HeartbeatRequest(worker_id="ghost"))[0] == grpc.StatusCode.NOT_FOUND
    code, details = refused(stub.GetJob, pb.GetJobRequest(worker_id="ghost", role=ACTOR))
    assert code == grpc.StatusCode.NOT_FOUND and "worker_id" in details
    code, details = refused(stub.FinishJob, pb.FinishJobRequest(worker_id="actor", job_id="nope", status=1))
    assert code == grpc.StatusCode.NOT_FOUND and "job_id" in details


@pytest.mark.parametrize(
    ("method", "request_", "field"),
    [
        ("RegisterWorker", pb.RegisterWorkerRequest(role=ACTOR), "worker_id"),
        ("RegisterWorker", pb.RegisterWorkerRequest(worker_id="w"), "role"),
        ("RegisterWorker", pb.RegisterWorkerRequest(worker_id="w", role=7), "role"),
        ("Heartbeat", pb.HeartbeatRequest(worker_id="actor", job_ids=[""]), "job_ids[0]"),
        # Refused before each is checked: 1.3M ids, or 68,000 episodes, held the event loop for seconds.
        ("Heartbeat", pb.HeartbeatRequest(worker_id="actor", job_ids=["j"] * 4097), "job_ids"),
        ("FinishJob", pb.FinishJobRequest(worker_id="actor", job_id="j", status=1,
                                          episodes=[pb.EpisodeResult()] * 5001), "episodes"),
        # (the same for one episode of 700,000 players, or as many unloadable ids: a review)
        ("FinishJob", pb.FinishJobRequest(worker_id="actor", job_id="j", status=1, episodes=[
            pb.EpisodeResult(players=[pb.PlayerOutcome(player_id="a")] * 65)]), "episodes[0].players"),
        ("FinishJob", pb.FinishJobRequest(worker_id="actor", job_id="j", status=1,
                                          unloadable_player_ids=["a"] * 65), "unloadable_player_ids"),
        # A reset numbers its checkpoint one above the player's: one above what is accepted back was never
        # acknowledged (a review). Versions are the store's ten digits.
        ("UpdatePlayer", pb.UpdatePlayerRequest(worker_id="actor", player_id="p", checkpoint_version=10**10 - 1),
         "checkpoint_version"),
        ("GetJob", pb.GetJobRequest(worker_id="actor", role=ACTOR, wait_s=math.nan), "wait_s"),
        ("GetJob", pb.GetJobRequest(worker_id="actor", role=ACTOR, wait_s=-1), "wait_s"),
        ("GetJob", pb.GetJobRequest(worker_id="actor", role=ACTOR, wait_s=math.inf), "wait_s"),
        ("FinishJob", pb.FinishJobRequest(worker_id="actor", job_id="j"), "status"),
        ("FinishJob", pb.FinishJobRequest(worker_id="actor", job_id="j", status=1, env_steps=-5), "env_steps"),
        ("FinishJob", pb.FinishJobRequest(worker_id="actor", job_id="j", status=1,
                                          episodes=[pb.EpisodeResult(length=-1, players=[pb.PlayerOutcome(player_id="p")])]),
         "episodes[0].length"),
        ("FinishJob", pb.FinishJobRequest(worker_id="actor", job_id="j", status=1,
                                          episodes=[pb.EpisodeResult(players=[pb.PlayerOutcome(player_id="p", episode_return=math.nan)])]),
         "episodes[0].players[0].episode_return"),
        ("FinishJob", pb.FinishJobRequest(worker_id="actor", job_id="j", status=1, episodes=[pb.EpisodeResult()]),
         "episodes[0].players"),
        ("UpdatePlayer", pb.UpdatePlayerRequest(worker_id="actor", player_id="p", checkpoint_version=-1), "checkpoint_version"),
        # Totals of such counts broke every status reply (int64), for good: the counters are durable.
        ("FinishJob", pb.FinishJobRequest(worker_id="actor", job_id="j", status=1, env_steps=2**63 - 1), "env_steps"),
        ("UpdatePlayer", pb.UpdatePlayerRequest(worker_id="actor", player_id="p", checkpoint_version=2**63 - 1),
         "checkpoint_version"),
        # A name too long to check came back UNKNOWN (OSError), a symlink loop too (RuntimeError).
        ("UpdatePlayer", pb.UpdatePlayerRequest(worker_id="actor", player_id="main_player_default_0",
                                                checkpoint_path="main_player_default_0/" + "x" * 300), "checkpoint_path"),
        ("UpdatePlayer", pb.UpdatePlayerRequest(worker_id="actor", player_id="main_player_default_0",
                                                checkpoint_path="loop/ckpt.pt"), "checkpoint_path"),
        # The shared root itself (a symlink to it) was accepted, and the snapshot copied the root into itself.
        ("UpdatePlayer", pb.UpdatePlayerRequest(worker_id="actor", player_id="main_player_default_0",
                                                checkpoint_path="rootlink"), "checkpoint_path"),
        ("UpdatePlayer", pb.UpdatePlayerRequest(worker_id="actor", agent_steps=1), "player_id"),
        ("UpdatePlayer", pb.UpdatePlayerRequest(worker_id="actor", player_id="main_player_default_0",
                                                checkpoint_path="a/../../x"), "checkpoint_path"),
        # A learner's endpoint with no port was stored, and actors retried "learner node-a: UNAVAILABLE" for good.
        ("RegisterWorker", pb.RegisterWorkerRequest(worker_id="l", role=LEARNER, data_endpoint="node-a"),
         "data_endpoint"),
        ("RegisterWorker", pb.RegisterWorkerRequest(worker_id="l", role=LEARNER, data_endpoint="node-a:0"),
         "data_endpoint"),
        ("RegisterWorker", pb.RegisterWorkerRequest(worker_id="l", role=LEARNER, data_endpoint=":7000"),
         "data_endpoint"),
        ("RegisterWorker", pb.RegisterWorkerRequest(worker_id="l", role=LEARNER, data_endpoint="dns:///node-a"),
         "data_endpoint"),
        ("GetJob", pb.GetJobRequest(worker_id="actor", role=LEARNER, data_endpoint="node-a"), "data_endpoint"),
        ("GetJob", pb.GetJobRequest(worker_id="actor", role=LEARNER, data_endpoint="node-a:99999"), "data_endpoint"),
    ],
)
def test_malformed_requests_name_the_field(served, method, request_, field):
    _, stub = served
    code, details = refused(getattr(stub, method), request_)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details.startswith(f"{field}:"), details


def test_a_learners_endpoint_must_be_host_and_port_and_a_refused_one_is_not_stored(fresh):
    _, stub = fresh
    code, details = refused(stub.RegisterWorker, pb.RegisterWorkerRequest(worker_id="learner-a", role=LEARNER,
                                                                          data_endpoint="node-a"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "HOST:PORT" in details and "'node-a'" in details, details
    assert "learner-a" not in {w.worker_id for w in stub.GetStatus(pb.GetStatusRequest()).workers}
    stub.RegisterWorker(pb.RegisterWorkerRequest(worker_id="learner-a", role=LEARNER, data_endpoint="node-a:7000"))
    stub.RegisterWorker(pb.RegisterWorkerRequest(worker_id="learner-b", role=LEARNER, data_endpoint="[::1]:7000"))
    # An actor's endpoint is shown in the status only, never dialled: taken as it is.
    stub.RegisterWorker(pb.RegisterWorkerRequest(worker_id="actor-b", role=ACTOR, data_endpoint="node-b"))
    code, details = refused(stub.GetJob, pb.GetJobRequest(worker_id="learner-a", role=LEARNER, data_endpoint="node-a"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("data_endpoint:"), details
    endpoints = {w.worker_id: w.data_endpoint for w in stub.GetStatus(pb.GetStatusRequest()).workers}
    assert endpoints["learner-a"] == "node-a:7000" and endpoints["actor-b"] == "node-b"


def test_results_naming_players_not_in_the_job_are_refused_and_the_job_still_counts_later(fresh):
    _, stub = fresh
    while True:  # a match of two different players (self-play jobs name one player twice)
        job = stub.GetJob(pb.GetJobRequest(worker_id="actor", role=ACTOR, wait_s=5)).job
        if job.players[0].player_id != job.players[1].player_id:
            break
        stub.FinishJob(pb.FinishJobRequest(worker_id="actor", job_id=job.job_id, status=pb.FINISH_STATUS_FAILED))
    bad = outcomes_for(job, [True])
    bad[0].players[1].player_id = "intruder"
    code, details = refused(stub.FinishJob, pb.FinishJobRequest(worker_id="actor", job_id=job.job_id, status=1, episodes=bad))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("episodes[0].players[1].player_id")
    swapped = outcomes_for(job, [True])
    swapped[0].players.reverse()
    code, details = refused(stub.FinishJob, pb.FinishJobRequest(worker_id="actor", job_id=job.job_id, status=1, episodes=swapped))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "seat order" in details
    before = stub.GetStatus(pb.GetStatusRequest()).counters.matches
    ack = stub.FinishJob(pb.FinishJobRequest(worker_id="actor", job_id=job.job_id, status=1, episodes=outcomes_for(job, [True])))
    assert ack.episodes_counted == 1
    assert stub.GetStatus(pb.GetStatusRequest()).counters.matches == before + 1


def test_more_episodes_than_the_job_asked_for_are_refused_and_nothing_is_counted(fresh):
    """A job asks for env.episode_num episodes and actors report exactly those: a finish with more (a broken or
    hostile client) would weigh one job as many in the payoff and ratings (it counted 5,000 for a job of 4)."""
    _, stub = fresh
    job = stub.GetJob(pb.GetJobRequest(worker_id="actor", role=ACTOR, wait_s=5)).job
    asked = job.episode_num
    assert asked > 0
    before = stub.GetStatus(pb.GetStatusRequest()).counters
    for status in (pb.FINISH_STATUS_COMPLETED, pb.FINISH_STATUS_RELEASED):
        code, details = refused(stub.FinishJob, pb.FinishJobRequest(
            worker_id="actor", job_id=job.job_id, status=status, episodes=outcomes_for(job, [True] * (asked + 1))))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("episodes:"), details
        assert f"asked for {asked} episodes, got {asked + 1}" in details, details
    after = stub.GetStatus(pb.GetStatusRequest()).counters
    assert (after.matches, after.jobs_finished) == (before.matches, before.jobs_finished)
    # The job is still held and still counts once reported right.
    ack = stub.FinishJob(pb.FinishJobRequest(worker_id="actor", job_id=job.job_id, status=pb.FINISH_STATUS_COMPLETED,
                                             episodes=outcomes_for(job, [True] * asked)))
    assert ack.episodes_counted == asked and not ack.duplicate
    assert stub.GetStatus(pb.GetStatusRequest()).counters.matches == before.matches + asked


def test_oversize_messages_are_resource_exhausted(served):
    _, stub = served
    code, _ = refused(stub.RegisterWorker, pb.RegisterWorkerRequest(worker_id="x" * (5 * 1024 * 1024), role=ACTOR))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert stub.GetStatus(pb.GetStatusRequest()).league_id  # still serving


# ---- generated garbage ---------------------------------------------------------------------------------------

ids = st.one_of(st.sampled_from(["actor", "main_player_default_0", "main_exploiter_default_0", "",
                                 "main_player_default_0/ckpt.pt"]),
                st.text(max_size=20), st.text(min_size=250, max_size=300))
numbers = st.one_of(st.integers(-(2**63), 2**63 - 1), st.sampled_from([0, 1, -1]))
floats = st.floats(allow_nan=True, allow_infinity=True)
enums = st.integers(-3, 9)
outcome = st.builds(pb.PlayerOutcome, player_id=ids, outcome=enums, episode_return=floats)
episode = st.builds(pb.EpisodeResult, length=numbers, players=st.lists(outcome, max_size=3))

requests = st.one_of(
    st.tuples(st.just("RegisterWorker"),
              st.builds(pb.RegisterWorkerRequest, worker_id=ids, role=enums, hostname=st.text(max_size=300),
                        data_endpoint=st.text(max_size=30))),
    st.tuples(st.just("Heartbeat"), st.builds(pb.HeartbeatRequest, worker_id=ids, job_ids=st.lists(ids, max_size=3))),
    st.tuples(st.just("GetJob"), st.builds(pb.GetJobRequest, worker_id=ids, role=enums, data_endpoint=ids,
                                           wait_s=st.one_of(floats, st.just(0.0)))),
    st.tuples(st.just("FinishJob"),
              st.builds(pb.FinishJobRequest, worker_id=ids, job_id=ids, status=enums,
                        episodes=st.lists(episode, max_size=3), env_steps=numbers, agent_steps=numbers)),
    st.tuples(st.just("UpdatePlayer"),
              st.builds(pb.UpdatePlayerRequest, worker_id=ids, player_id=ids, train_iteration=numbers,
                        agent_steps=numbers, checkpoint_path=st.one_of(ids, st.just("../x"), st.just("/abs")),
                        checkpoint_version=numbers)),
)


def _accounting(stub) -> tuple:
    """What results and reports change: the counters of finished work and each player's steps and version."""
    status = stub.GetStatus(pb.GetStatusRequest())
    c = status.counters
    return ((c.matches, c.jobs_finished, c.env_steps),
            tuple(sorted((p.player_id, p.agent_steps, p.checkpoint_version, p.episodes) for p in status.players)))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.lists(requests, min_size=1, max_size=5), real_job=st.booleans())
def test_generated_requests_are_answered_or_refused_cleanly(served, batch, real_job):
    server, stub = served
    job = None
    if real_job:
        job = stub.GetJob(pb.GetJobRequest(worker_id="actor", role=ACTOR, wait_s=0.0)).job
    for method, request in batch:
        if job is not None and job.job_id and method == "FinishJob":
            request.job_id = job.job_id  # garbage results for a job that exists
        if method == "GetJob":
            request.wait_s = min(request.wait_s, 0.0) if math.isfinite(request.wait_s) else request.wait_s
        before = _accounting(stub)
        try:
            getattr(stub, method)(request, timeout=10)
        except grpc.RpcError as err:
            assert err.code() in REFUSALS, (method, err.code(), err.details())
            # A refusal changes nothing: a FinishJob refused for its episodes that still added its env steps and a
            # finished job passed this test (a review).
            assert _accounting(stub) == before, (method, err.code(), err.details())
    status = stub.GetStatus(pb.GetStatusRequest())
    assert server.coordinator.failure is None
    for p in status.players:
        assert 0 <= p.slots_used <= p.slots_limit or not p.active
    assert len({j.job_id for j in status.jobs}) == len(status.jobs)
    assert all(j.worker_id for j in status.jobs)
    if job is not None and job.job_id:
        # Whatever garbage came before, the real result of a real job still counts (unless it was accepted).
        ack = stub.FinishJob(pb.FinishJobRequest(worker_id="actor", job_id=job.job_id, status=1,
                                                 episodes=outcomes_for(job, [False])))
        assert ack.episodes_counted in (0, 1)


def test_a_job_the_server_cannot_encode_fails_at_once_with_the_reason(tmp_path):
    """The config check keeps values a protobuf Struct cannot hold out of jobs; should one get through anyway,
    the job is failed with the reason at once (and retried or given up by the usual rules), not left leased
    to a worker that got only an error until the lease expires."""
    cfg = small_league_config()
    # (An env of the user's own: its kwargs are known only to it, so config load checks none of them.)
    cfg = dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, name="python:tests.env_doubles:CountingEnv",
                                                           kwargs={"when": datetime.date(2026, 1, 1)}))
    with running_coordinator(cfg, tmp_path, lease_timeout_s=60.0, needs_learner=False) as server:
        channel, stub = league_stub(server.address)
        with channel:
            stub.RegisterWorker(pb.RegisterWorkerRequest(worker_id="actor", role=ACTOR))
            code, details = refused(stub.GetJob, pb.GetJobRequest(worker_id="actor", role=ACTOR, wait_s=5))
            assert code == grpc.StatusCode.INTERNAL and "cannot encode this job" in details
            status = stub.GetStatus(pb.GetStatusRequest())
            assert status.counters.jobs_failed == 1
            assert not any(job.worker_id == "actor" for job in status.jobs)
            (player,) = [p for p in status.players if p.failed_attempts_in_a_row]
            assert "cannot encode this job" in player.last_job_error
            # The server keeps serving.
            stub.Heartbeat(pb.HeartbeatRequest(worker_id="actor"))


def test_a_job_that_cannot_be_encoded_after_its_lease_ended_is_still_answered_internal(tmp_path, monkeypatch):
    """The lease of a job the server cannot encode ended while the grant was committed (here the worker's
    leaving heartbeat released it): failing the job is refused (the worker left), and that refusal escaped the
    handler as UNKNOWN instead of the INTERNAL that says why (a review of session 41's left-open list)."""
    import league_service.server as server_module

    with running_coordinator(small_league_config(), tmp_path, lease_timeout_s=60.0, needs_learner=False) as server:
        def released_then_unencodable(found):
            server.coordinator.heartbeat("actor", (), leaving=True)
            raise ValueError("a value protobuf cannot hold")

        monkeypatch.setattr(server_module.wire, "get_job_reply", released_then_unencodable)
        channel, stub = league_stub(server.address)
        with channel:
            stub.RegisterWorker(pb.RegisterWorkerRequest(worker_id="actor", role=ACTOR))
            code, details = refused(stub.GetJob, pb.GetJobRequest(worker_id="actor", role=ACTOR, wait_s=5))
            assert code == grpc.StatusCode.INTERNAL and "cannot encode this job" in details, (code, details)
            monkeypatch.undo()
            assert server.coordinator.failure is None
            status = stub.GetStatus(pb.GetStatusRequest())
            assert not status.jobs  # released by the leaving heartbeat, not leased to anyone


def test_a_refusal_that_echoes_a_long_request_is_cut_not_resource_exhausted(served):
    """A checkpoint path of 4,000 non-ASCII characters, echoed in the refusal, made a status detail over gRPC's
    16 KiB metadata limit: the client saw RESOURCE_EXHAUSTED (which it retries), not INVALID_ARGUMENT (a
    review)."""
    _, stub = served
    code, details = refused(stub.UpdatePlayer, pb.UpdatePlayerRequest(
        worker_id="actor", player_id="main_player_default_0", checkpoint_path="\u00e9" * 4000 + "/.."))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("checkpoint_path:"), (code, details)
    assert len(details) < 1100 and "characters)" in details


def test_a_job_whose_getjob_reply_cannot_be_delivered_is_released_not_left_to_expire(tmp_path, monkeypatch):
    """The call's deadline passed while the grant was committed (a disk stall): the job stayed leased to a
    worker that never heard of it, and its lease expired as a failed attempt of the player, "worker went silent",
    though the worker was calling all along (a review). Released at once, with no failure counted."""
    import time

    with running_coordinator(small_league_config(), tmp_path, lease_timeout_s=60.0, needs_learner=False) as server:
        commit_until = server.coordinator.commit_until

        def stalled(*args, **kwargs):  # a commit on the loop that takes longer than the call has left
            time.sleep(1.0)
            return commit_until(*args, **kwargs)

        channel, stub = league_stub(server.address)
        with channel:
            stub.RegisterWorker(pb.RegisterWorkerRequest(worker_id="actor", role=ACTOR))
            monkeypatch.setattr(server.coordinator, "commit_until", stalled)
            with pytest.raises(grpc.RpcError) as late:
                stub.GetJob(pb.GetJobRequest(worker_id="actor", role=ACTOR, wait_s=5), timeout=0.5)
            assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            monkeypatch.undo()
            deadline = time.monotonic() + 10
            while (status := stub.GetStatus(pb.GetStatusRequest())).jobs and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not [job for job in status.jobs if job.worker_id == "actor"]
            assert not any(p.failed_attempts_in_a_row for p in status.players)
            assert status.counters.jobs_expired == 0
            # The worker's next call gets a job as usual.
            assert stub.GetJob(pb.GetJobRequest(worker_id="actor", role=ACTOR, wait_s=5), timeout=10).HasField("job")


def test_a_learners_getjob_that_cannot_be_delivered_leaves_the_binding_it_held(tmp_path):
    """A bound learner's GetJob hands its own binding back; that reply lost (a short deadline, a cancel) released
    the job it was training on: its player lost its learner, whose next heartbeat ended its session (a review)."""
    with running_coordinator(small_league_config(), tmp_path, lease_timeout_s=60.0) as server:
        channel, stub = league_stub(server.address)
        with channel:
            stub.RegisterWorker(pb.RegisterWorkerRequest(worker_id="L", role=pb.WORKER_ROLE_LEARNER,
                                                         data_endpoint="127.0.0.1:7000"))
            job = stub.GetJob(pb.GetJobRequest(worker_id="L", role=pb.WORKER_ROLE_LEARNER), timeout=10).job
            for _ in range(5):
                with contextlib.suppress(grpc.RpcError):
                    stub.GetJob(pb.GetJobRequest(worker_id="L", role=pb.WORKER_ROLE_LEARNER), timeout=0.002)
            beat = stub.Heartbeat(pb.HeartbeatRequest(worker_id="L", job_ids=[job.job_id]))
            assert list(beat.revoked_job_ids) == []
            bound = {p.player_id: p.learner_worker_id for p in stub.GetStatus(pb.GetStatusRequest()).players}
            assert bound[job.launch_player] == "L"


def test_a_call_stuck_in_a_thread_does_not_hold_the_stop_past_its_grace(tmp_path, monkeypatch):
    """A GetStatus (or a checkpoint check) stuck in a read of a hung filesystem held the stop for as long as the
    read, whatever the grace: the loop's executor shutdown joined every call thread (a review). The stop now
    takes the grace, and the stuck call's thread is named for the CLI, which exits without it."""
    import threading
    import time

    from league_service.coordinator_testing import small_league_config as config

    release = threading.Event()
    cm = running_coordinator(config(), tmp_path, needs_learner=False)
    server = cm.__enter__()
    try:
        status = server.coordinator.status

        def hung(*args, **kwargs):
            release.wait(60)
            return status(*args, **kwargs)

        monkeypatch.setattr(server.coordinator, "status", hung)
        channel, stub = league_stub(server.address)
        with channel:
            call = stub.GetStatus.future(pb.GetStatusRequest(), timeout=30)
            time.sleep(0.5)
            started = time.monotonic()
            server.stop(grace_s=0.5, drain_s=0.0)
            stopped_in = time.monotonic() - started
            with pytest.raises(grpc.RpcError):
                call.result()
        stuck = server.serving.stuck_calls(wait_s=1.0)  # (idle call threads end once they see the shutdown)
        assert len(stuck) == 1 and stuck[0].is_alive()
        assert stopped_in < 10, stopped_in  # (it was as long as the stuck call: 60 s here)
    finally:
        release.set()
        cm.__exit__(None, None, None)
    assert not server.serving.stuck_calls(wait_s=10)
