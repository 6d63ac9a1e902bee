"""The coordinator served on 127.0.0.1: the pull protocol, leases, snapshots, status and metrics over real gRPC."""

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from common.proto.league.v1 import league_pb2 as pb
from league_service.coordinator_testing import (
    league_stub,
    outcomes_for,
    running_coordinator,
    small_league_config,
)
from tests.polling import wait_until

ACTOR, LEARNER = pb.WORKER_ROLE_ACTOR, pb.WORKER_ROLE_LEARNER
COMPLETED, FAILED = pb.FINISH_STATUS_COMPLETED, pb.FINISH_STATUS_FAILED


@pytest.fixture
def league(tmp_path):
    cfg = small_league_config(
        {
            "league": {"main_player": {"one_phase_step": 100, "strong_win_rate": None}},
            "policy": {"algorithm": "ppo", "model": {"hidden": [8]}},
            "learner": {"batch_size": 64},
        }
    )
    with running_coordinator(cfg, tmp_path, lease_timeout_s=30.0, metrics_port=0) as server:
        channel, stub = league_stub(server.address)
        try:
            yield server, stub, tmp_path
        finally:
            channel.close()


def register(stub, worker_id, role, endpoint=""):
    return stub.RegisterWorker(pb.RegisterWorkerRequest(worker_id=worker_id, role=role, hostname="h", data_endpoint=endpoint))


def bind_learners(stub):
    """Register one learner per active player and bind each; returns {player_id: (worker_id, job)}."""
    bound = {}
    for i in range(2):
        register(stub, f"learner-{i}", LEARNER, f"127.0.0.1:{7000 + i}")
        job = stub.GetJob(pb.GetJobRequest(worker_id=f"learner-{i}", role=LEARNER)).job
        assert job.kind == pb.JOB_KIND_LEARN
        bound[job.launch_player] = (f"learner-{i}", job)
    return bound


def test_health_and_reflection_are_served(league):
    server, _, _ = league
    channel = grpc.insecure_channel(server.address)
    try:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "league.v1.LeagueService"):
            reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        replies = reflection.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5)
        names = {s.name for r in replies for s in r.list_services_response.service}
        assert {"league.v1.LeagueService", "grpc.health.v1.Health"} <= names
    finally:
        channel.close()


def test_collect_jobs_wait_for_the_learner_then_carry_its_endpoint(league):
    _, stub, _ = league
    reply = register(stub, "actor-1", ACTOR)
    assert reply.lease_timeout_s == 30.0 and 0 < reply.heartbeat_interval_s < 30.0 and reply.league_id
    nothing = stub.GetJob(pb.GetJobRequest(worker_id="actor-1", role=ACTOR, wait_s=0.2))
    assert not nothing.HasField("job") and "learner" in nothing.reason and nothing.retry_after_s > 0

    bound = bind_learners(stub)
    assert set(bound) == {"main_player_default_0", "main_exploiter_default_0"}
    learn = bound["main_player_default_0"][1]
    assert learn.learner_kwargs["batch_size"] == 64 and learn.policy["algorithm"] == "ppo"
    assert [p.player_id for p in learn.players] == ["main_player_default_0"]

    job = stub.GetJob(pb.GetJobRequest(worker_id="actor-1", role=ACTOR, wait_s=5)).job
    assert job.kind == pb.JOB_KIND_COLLECT and job.players[0].player_id == job.launch_player
    learner_id = bound[job.launch_player][0]
    assert job.learner_endpoint == f"127.0.0.1:{7000 + int(learner_id[-1])}"
    assert job.env_name == "connect_four" and job.env_num == 2 and job.episode_num == 4
    assert job.policy["model"]["hidden"] == [8.0]
    assert job.players[0].active and job.lease_timeout_s == 30.0 and job.lease_deadline > time.time()

    ack = stub.FinishJob(
        pb.FinishJobRequest(worker_id="actor-1", job_id=job.job_id, status=COMPLETED,
                            episodes=outcomes_for(job, [True, True, False]), env_steps=50)
    )
    assert not ack.duplicate and ack.episodes_counted == 3
    again = stub.FinishJob(
        pb.FinishJobRequest(worker_id="actor-1", job_id=job.job_id, status=COMPLETED,
                            episodes=outcomes_for(job, [True, True, False]), env_steps=50)
    )
    assert again.duplicate and again.episodes_counted == 3

    status = stub.GetStatus(pb.GetStatusRequest())
    assert status.counters.matches == 3 and status.counters.jobs_finished == 1 and status.counters.env_steps == 50
    assert {p.player_id: p.learner_worker_id for p in status.players if p.active} == {
        pid: worker for pid, (worker, _) in bound.items()
    }
    assert {w.worker_id for w in status.workers} == {"actor-1", "learner-0", "learner-1"}
    assert len(status.jobs) == 2  # the two learn jobs


def test_unloadable_players_named_by_a_finish_are_checked_over_grpc(league):
    _, stub, _ = league
    register(stub, "actor-1", ACTOR)
    bind_learners(stub)
    job = stub.GetJob(pb.GetJobRequest(worker_id="actor-1", role=ACTOR, wait_s=5)).job
    for ids, field in ((["nobody"], "unloadable_player_ids[0]"), ([""], "unloadable_player_ids[0]")):
        with pytest.raises(grpc.RpcError) as err:
            stub.FinishJob(pb.FinishJobRequest(worker_id="actor-1", job_id=job.job_id, status=FAILED, error="x",
                                               unloadable_player_ids=ids))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and field in err.value.details()
    error = "boom \x1b]0;PWNED\x07\x1b[2J\x1b[31mred"  # what would drive the terminal of `league status`
    ack = stub.FinishJob(pb.FinishJobRequest(worker_id="actor-1", job_id=job.job_id, status=FAILED, error=error))
    assert not ack.duplicate  # the refusals left the job as it was
    (player,) = [p for p in stub.GetStatus(pb.GetStatusRequest()).players if p.last_job_error]
    assert player.last_job_error == "boom \\x1b]0;PWNED\\x07\\x1b[2J\\x1b[31mred"  # escaped, not sent on


def test_an_expired_lease_frees_the_slot_and_a_late_finish_is_refused(tmp_path):
    cfg = small_league_config({"league": {"active_players": {"main_player": 1}, "max_active_player_job": 1}})
    with running_coordinator(cfg, tmp_path, lease_timeout_s=0.5, needs_learner=False) as server:
        channel, stub = league_stub(server.address)
        try:
            register(stub, "slow", ACTOR)
            register(stub, "fast", ACTOR)
            first = stub.GetJob(pb.GetJobRequest(worker_id="slow", role=ACTOR, wait_s=5)).job
            # The only slot is held; the next job appears only when the lease expires (the timer thread).
            second = stub.GetJob(pb.GetJobRequest(worker_id="fast", role=ACTOR, wait_s=10)).job
            assert second.job_id and second.job_id != first.job_id
            beat = stub.Heartbeat(pb.HeartbeatRequest(worker_id="slow", job_ids=[first.job_id]))
            assert list(beat.revoked_job_ids) == [first.job_id]
            with pytest.raises(grpc.RpcError) as err:
                stub.FinishJob(pb.FinishJobRequest(worker_id="slow", job_id=first.job_id, status=COMPLETED,
                                                   episodes=outcomes_for(first, [True])))
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "expired" in err.value.details()
            status = stub.GetStatus(pb.GetStatusRequest())
            assert status.counters.jobs_expired >= 1 and status.counters.matches == 0
        finally:
            channel.close()


def test_status_shows_only_committed_state_and_says_unavailable_once_writing_it_failed(tmp_path):
    """GetStatus answered from memory without waiting for the commit: it showed an expiry (a match, a snapshot)
    that a crash could take back, and went on answering after a failed write, where every other call said
    UNAVAILABLE."""
    import errno

    from league_service.errors import StateWriteError

    cfg = small_league_config({"league": {"active_players": {"main_player": 1}, "max_active_player_job": 1}})
    failed = False
    league = running_coordinator(cfg, tmp_path, lease_timeout_s=0.5, needs_learner=False)
    server = league.__enter__()
    try:
        channel, stub = league_stub(server.address)
        with channel:
            register(stub, "a", ACTOR)
            assert stub.GetJob(pb.GetJobRequest(worker_id="a", role=ACTOR, wait_s=5)).job.job_id
            assert stub.GetStatus(pb.GetStatusRequest()).counters.jobs_expired == 0

            def full_disk(*args, **kwargs):
                raise OSError(errno.ENOSPC, "No space left on device")

            server.coordinator._commits._write = full_disk  # the disk fills up; the lease then expires unattended
            failed = True
            wait_until("the lease to expire", lambda: server.coordinator.status().counters.jobs_expired == 1, 30)
            with pytest.raises(grpc.RpcError) as err:
                stub.GetStatus(pb.GetStatusRequest(), timeout=30)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        try:
            league.__exit__(None, None, None)
        except StateWriteError:
            assert failed  # the close says the state could not be written, as it should


def test_a_slow_write_of_the_state_expires_no_lease_of_a_worker_heartbeating_through_it(tmp_path):
    """The server's replies wait for the state's write, heartbeats included: during a write longer than a lease
    the heartbeats queued unread, while the expiry thread (the lock let go for the write) expired the leases as
    "the worker went silent", counted as the player's failed attempts (a review: a 5 s write, 3 s leases)."""
    cfg = small_league_config({"league": {"active_players": {"main_player": 1}, "max_active_player_job": 1}})
    with running_coordinator(cfg, tmp_path, lease_timeout_s=3.0, needs_learner=False) as server:
        channel, stub = league_stub(server.address)
        try:
            register(stub, "a", ACTOR)
            job = stub.GetJob(pb.GetJobRequest(worker_id="a", role=ACTOR, wait_s=5)).job
            commits = server.coordinator._commits
            real_write, stalled = commits._write, threading.Event()

            def stalling_write(*args, **kwargs):
                if not stalled.is_set():
                    stalled.set()
                    time.sleep(6.0)  # a disk that stalls past the 3 s lease (and past SLOW_WRITE_S)
                return real_write(*args, **kwargs)

            revoked: list[str] = []
            stop = threading.Event()

            def heartbeat() -> None:
                while not stop.wait(0.5):
                    beat = stub.Heartbeat(pb.HeartbeatRequest(worker_id="a", job_ids=[job.job_id]), timeout=30)
                    revoked.extend(beat.revoked_job_ids)

            beating = threading.Thread(target=heartbeat, daemon=True)
            beating.start()
            commits._write = stalling_write
            register(stub, "b", ACTOR)  # a change to write: the write stalls
            assert stalled.is_set()
            time.sleep(1.5)  # a few heartbeats after the stall
            stop.set()
            beating.join(30)
            assert revoked == [] and stub.GetStatus(pb.GetStatusRequest()).counters.jobs_expired == 0
        finally:
            channel.close()


def test_heartbeats_keep_a_lease_alive_past_its_timeout(tmp_path):
    cfg = small_league_config({"league": {"active_players": {"main_player": 1}, "max_active_player_job": 1}})
    # A lease short enough to outlive several times over, long enough that a CI stall between beats is no lapse.
    with running_coordinator(cfg, tmp_path, lease_timeout_s=2.0, needs_learner=False) as server:
        channel, stub = league_stub(server.address)
        try:
            register(stub, "a", ACTOR)
            job = stub.GetJob(pb.GetJobRequest(worker_id="a", role=ACTOR, wait_s=5)).job
            stop = threading.Event()
            for _ in range(12):  # ~4 s, twice the lease
                beat = stub.Heartbeat(pb.HeartbeatRequest(worker_id="a", job_ids=[job.job_id]))
                assert not beat.revoked_job_ids
                stop.wait(0.33)
            ack = stub.FinishJob(pb.FinishJobRequest(worker_id="a", job_id=job.job_id, status=COMPLETED,
                                                     episodes=outcomes_for(job, [True])))
            assert ack.episodes_counted == 1 and not ack.duplicate
        finally:
            channel.close()


def test_update_player_snapshots_a_plain_file_checkpoint_as_a_copy(league):
    _, stub, root = league
    bound = bind_learners(stub)
    learner, _ = bound["main_player_default_0"]
    ckpt = root / "main_player_default_0" / "ckpt.pt"
    ckpt.parent.mkdir()
    ckpt.write_bytes(b"weights")
    reply = stub.UpdatePlayer(pb.UpdatePlayerRequest(
        worker_id=learner, player_id="main_player_default_0", train_iteration=3, agent_steps=150,
        checkpoint_path="main_player_default_0/ckpt.pt", checkpoint_version=3))
    assert not reply.mutated

    def historical():
        return [p for p in stub.GetStatus(pb.GetStatusRequest()).players if not p.active]

    wait_until("a snapshot", historical, 20)
    (snap,) = historical()
    assert snap.parent_id == "main_player_default_0" and snap.checkpoint_version == 3
    assert snap.category == "default"  # a snapshot keeps its parent's category
    frozen = root / snap.checkpoint_path
    assert frozen.read_bytes() == b"weights" and frozen != ckpt
    assert os.stat(frozen).st_ino != os.stat(ckpt).st_ino  # a copy: its writer may rewrite ckpt.pt in place
    main = next(p for p in stub.GetStatus(pb.GetStatusRequest()).players if p.player_id == "main_player_default_0")
    assert main.agent_steps == 150 and main.train_iteration == 3 and main.snapshots == 1


def test_update_player_refusals(league):
    _, stub, root = league
    bound = bind_learners(stub)
    learner, _ = bound["main_player_default_0"]
    other, _ = bound["main_exploiter_default_0"]

    def update(**kw):
        args = dict(worker_id=learner, player_id="main_player_default_0", agent_steps=10)
        args.update(kw)
        with pytest.raises(grpc.RpcError) as err:
            stub.UpdatePlayer(pb.UpdatePlayerRequest(**args))
        return err.value

    err = update(checkpoint_path="../outside.pt")
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "checkpoint_path" in err.details()
    err = update(checkpoint_path="/etc/passwd")
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "checkpoint_path" in err.details()
    err = update(worker_id=other)
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and "worker_id" in err.details()
    err = update(checkpoint_path="main_player_default_0/v0000000009.pt")  # not there
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "does not exist" in err.details()
    # A directory or a FIFO is no checkpoint: the snapshot thread's copy failed on one and hung on the other.
    (root / "main_player_default_0" / "v0000000010.pt").mkdir(parents=True)
    os.mkfifo(root / "main_player_default_0" / "v0000000011.pt")
    for name in ("v0000000010.pt", "v0000000011.pt"):
        err = update(checkpoint_path=f"main_player_default_0/{name}")
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "is not a regular file" in err.details()
    # Files the league keeps beside checkpoints are no checkpoints: snapshotted, the league's own database was
    # copied as a historical player's weights (a hostile-input review).
    assert (root / "league_state.sqlite").is_file()
    for name in ("ckpt.pt.json", "ckpt.pt.train", ".ckpt.pt.1234.tmp"):
        (root / "main_player_default_0" / name).write_bytes(b"{}")
    for path, what in (("league_state.sqlite", "the coordinator's state database"),
                       ("main_player_default_0/ckpt.pt.json", "manifest, training state or pin"),
                       ("main_player_default_0/ckpt.pt.train", "manifest, training state or pin"),
                       ("main_player_default_0/.ckpt.pt.1234.tmp", "a hidden file")):
        err = update(checkpoint_path=path)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and what in err.details(), err.details()
    # A learner that lost the player, reporting a version its successor's retention removed, is told it is not
    # bound (which it handles by leaving the player), not that its path is bad (which stopped it with an error).
    err = update(worker_id=other, checkpoint_path="main_player_default_0/v0000000009.pt")
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and "holds no learn job" in err.details()
    err = update(player_id="nobody")
    assert err.code() == grpc.StatusCode.NOT_FOUND and "player_id" in err.details()
    err = update(worker_id="ghost")
    assert err.code() == grpc.StatusCode.NOT_FOUND and "worker_id" in err.details()
    err = update(agent_steps=-1)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "agent_steps" in err.details()
    stub.UpdatePlayer(pb.UpdatePlayerRequest(worker_id=learner, player_id="main_player_default_0", agent_steps=50))
    err = update(agent_steps=40)  # steps never go backwards
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_a_released_learn_job_goes_to_the_next_learner(league):
    _, stub, _ = league
    bound = bind_learners(stub)
    worker, job = bound["main_player_default_0"]
    register(stub, "learner-new", LEARNER, "127.0.0.1:7999")
    ack = stub.FinishJob(pb.FinishJobRequest(worker_id=worker, job_id=job.job_id, status=pb.FINISH_STATUS_RELEASED))
    assert not ack.duplicate
    new = stub.GetJob(pb.GetJobRequest(worker_id="learner-new", role=LEARNER, wait_s=5)).job
    assert new.launch_player == "main_player_default_0" and new.job_id != job.job_id
    # A learner asking again gets its own binding back (a restarted learner reconnects).
    again = stub.GetJob(pb.GetJobRequest(worker_id="learner-new", role=LEARNER, data_endpoint="127.0.0.1:7999")).job
    assert again.job_id == new.job_id


def test_long_poll_returns_when_a_job_frees_up(league):
    _, stub, _ = league
    bind_learners(stub)
    register(stub, "a", ACTOR)
    jobs = [stub.GetJob(pb.GetJobRequest(worker_id="a", role=ACTOR, wait_s=5)).job for _ in range(4)]
    assert all(j.job_id for j in jobs)  # 2 players x 2 slots
    result = {}
    waiter = threading.Thread(
        target=lambda: result.update(reply=stub.GetJob(pb.GetJobRequest(worker_id="a", role=ACTOR, wait_s=20), timeout=30))
    )
    waiter.start()
    stub.FinishJob(pb.FinishJobRequest(worker_id="a", job_id=jobs[0].job_id, status=FAILED))
    waiter.join(30)
    assert result["reply"].job.launch_player == jobs[0].launch_player
    status = stub.GetStatus(pb.GetStatusRequest())
    assert status.counters.jobs_failed == 1 and status.counters.matches == 0
    assert all(p.slots_used <= p.slots_limit for p in status.players)


def test_hundreds_of_long_polls_wait_at_once_and_each_gets_its_answer(league):
    """A long poll holds no thread (the server is grpc.aio): 300 actors waiting at once, more than a threaded
    server's pool, each get the 4 free jobs or a 'nothing ready' answer within their deadline (a server with a
    thread per poll would answer them in waves of its pool, 3 s each, past it); and a job freed while they all
    wait goes to one of them."""
    _, stub, _ = league
    actors = [f"a{i}" for i in range(300)]
    for worker_id in actors:
        register(stub, worker_id, ACTOR)
    # The learners hold their 30 s leases without heartbeats, so bind them last. Bound before the 300
    # registrations, under CPU load (2 cores, load average ~30) no poll got a job in 120 s: their leases had
    # run out before the polls came, and no collect job was offered.
    bind_learners(stub)
    # The server cuts each wait to 3 s; the deadline only bounds a starved server. It was 20 s: under the same
    # load 300 polls in this one process went past it, DEADLINE_EXCEEDED with no bug.
    polls = [stub.GetJob.future(pb.GetJobRequest(worker_id=w, role=ACTOR, wait_s=3.0), timeout=120) for w in actors]
    def granted():
        done = [p for p in polls if p.done() and p.result().job.job_id]
        return done if len(done) >= 4 else None

    granted = wait_until("the four free jobs", granted, timeout_s=120,
                         context=lambda: str(stub.GetStatus(pb.GetStatusRequest()).counters))
    assert len(granted) == 4
    freed = granted[0].result().job
    owner = actors[next(i for i, p in enumerate(polls) if p is granted[0])]
    stub.FinishJob(pb.FinishJobRequest(worker_id=owner, job_id=freed.job_id, status=FAILED))
    replies = [p.result() for p in polls]  # raises on a deadline or any other error
    jobs = [r.job for r in replies if r.job.job_id]
    assert len(jobs) == 5 and len({j.job_id for j in jobs}) == 5, "a freed job went to no waiter, or to two"
    assert all(r.reason for r in replies if not r.job.job_id)


def test_metrics_expose_counters_and_rpc_latency(league):
    server, stub, _ = league
    register(stub, "a", ACTOR)
    stub.GetStatus(pb.GetStatusRequest())
    text = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics.port}/metrics", timeout=5).read().decode()
    for name in ("league_jobs_issued_total", "league_jobs_finished_total", "league_jobs_expired_total",
                 "league_matches_total", "league_snapshots_total", 'league_players{state="active"} 2.0',
                 'league_rpc_latency_seconds_count{method="RegisterWorker"} 1.0'):
        assert name in text, name
    # It counts self-play episodes, which the payoff leaves out: its help said "counted into the payoff" (a default
    # league's 2,205 matches stood beside 1,789 games played in its payoff).
    help_line = next(line for line in text.splitlines() if line.startswith("# HELP league_matches_total "))
    assert "self-play included" in help_line and "counted into the payoff" not in help_line


def test_league_status_cli_prints_tables_and_json(league, capsys, monkeypatch):
    import argparse

    from league_service.cli import add_status_arguments, status_main

    server, stub, _ = league
    bind_learners(stub)
    parser = argparse.ArgumentParser()
    add_status_arguments(parser)
    assert status_main(parser.parse_args(["--addr", server.address, "--json"])) == 0
    data = json.loads(capsys.readouterr().out)
    assert {p["player_id"] for p in data["players"]} == {"main_player_default_0", "main_exploiter_default_0"}
    assert {p["category"] for p in data["players"]} == {"default"}
    assert data["counters"]["jobs_issued"] == 2
    monkeypatch.delenv("COLUMNS", raising=False)
    assert status_main(parser.parse_args(["--addr", server.address])) == 0
    out = capsys.readouterr().out
    assert "main_player_default_0" in out and "workers (2, 2 alive)" in out
    # Piped (not a terminal): laid out wide, so no column is squeezed to nothing as at rich's 80 columns.
    header = next(line for line in out.splitlines() if "player" in line and "type" in line)
    for column in ("steps", "iter", "checkpoint", "elo", "trueskill", "slots", "learner"):
        assert column in header, (column, header)
    assert status_main(parser.parse_args(["--addr", "127.0.0.1:1", "--timeout", "0.5"])) == 1


def test_league_status_watch_refreshes_until_interrupted(league):
    server, _, _ = league
    proc = subprocess.Popen(
        [sys.executable, "-m", "league_service.cli", "status", "--addr", server.address, "--watch", "0.2", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    try:
        frames = []
        while len(frames) < 2:  # refreshed at least once; JSON Lines: every line is a whole status
            frames.append(json.loads(lines.get(timeout=30)))
        assert all(f["league_id"] == frames[0]["league_id"] and f["players"] for f in frames)
        # Ctrl-C pressed again and again: a repeat after the stop was a KeyboardInterrupt in the shutdown (as the
        # actor's, a review); each is ignored once the watch stops.
        deadline = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGINT)
            time.sleep(0.005)
        assert proc.wait(30) == 0
        rest = []
        while not lines.empty():
            rest.append(lines.get())
        assert "Traceback" not in "".join(rest), rest
    finally:
        proc.kill()
        proc.wait(30)


def test_league_status_watch_stops_at_once_while_the_coordinator_does_not_answer(tmp_path):
    """A coordinator that takes the connection and never answers (stopped, or swamped): Ctrl-C ended the watch
    only once the status call's deadline (--timeout, up to an hour) ran out; now at once."""
    import socket

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        listener.settimeout(30)
        proc = subprocess.Popen(
            [sys.executable, "-m", "league_service.cli", "status", "--addr", f"127.0.0.1:{listener.getsockname()[1]}",
             "--watch", "0.2", "--json", "--timeout", "60"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        try:
            conn, _ = listener.accept()  # the watch is in its first status call (its signal handlers are set)
            with conn:
                proc.send_signal(signal.SIGINT)
                assert proc.wait(5) == 0
            assert proc.stderr.read() == ""
        finally:
            proc.kill()
            proc.wait(30)


def _watch_run_dir(run_dir: Path) -> tuple[subprocess.Popen[str], queue.Queue[str], queue.Queue[str]]:
    """`league status --run-dir RUN_DIR --watch 0.2 --json` as a process: it, its stdout lines, its stderr lines."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "league_service.cli", "status", "--run-dir", str(run_dir), "--watch", "0.2", "--json",
         "--timeout", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    errors: queue.Queue[str] = queue.Queue()
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [errors.put(line) for line in proc.stderr], daemon=True).start()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    return proc, lines, errors


def test_league_status_watch_of_a_run_dir_follows_the_coordinator_to_its_new_port(league, tmp_path):
    """`league run` run again in a directory serves on another port: a watch started before kept calling the old
    one for ever."""
    from common.ports import restartable_port
    from league_service.cli import RUN_PORT_FILE

    server, _, _ = league
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / RUN_PORT_FILE).write_text(f"{restartable_port()}\n")  # the run before: nothing listens there
    proc, lines, errors = _watch_run_dir(run_dir)
    try:
        first = errors.get(timeout=30)
        assert "UNAVAILABLE" in first and "(retrying)" in first
        time.sleep(1.5)  # several intervals: the same line is said once (at every interval, ~43k lines a day)
        assert first not in list(errors.queue), list(errors.queue)
        (run_dir / RUN_PORT_FILE).unlink()  # the run ended: said so, not the old port's UNAVAILABLE again
        deadline = time.monotonic() + 30
        while "no `league run` is going on" not in (line := errors.get(timeout=30)):
            assert time.monotonic() < deadline, line
        assert "waiting for one" in line
        time.sleep(1.0)
        assert line not in list(errors.queue)
        (run_dir / RUN_PORT_FILE).write_text(f"{server.address.rsplit(':', 1)[1]}\n")  # the league run again
        assert json.loads(lines.get(timeout=30))["players"]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
    finally:
        proc.kill()
        proc.wait(30)


def test_league_status_watch_of_a_run_dir_whose_coordinator_is_not_up_yet_waits_for_it(league, tmp_path):
    """A watch opened in the first seconds of a `league run` (no port file yet) exited 2 at once, the usage
    code, where one already watching waits for the run (a review); a single call exits 1, as for an address
    that does not answer: a matter of timing."""
    from league_service.cli import RUN_PORT_FILE

    server, _, _ = league
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    once = subprocess.run([sys.executable, "-m", "league_service.cli", "status", "--run-dir", str(run_dir)],
                          capture_output=True, text=True, timeout=60)
    assert once.returncode == 1 and "is a `league run` going on there?" in once.stderr, once.stderr
    proc, lines, errors = _watch_run_dir(run_dir)
    try:
        line = errors.get(timeout=30)
        assert "no `league run` is going on" in line and "waiting for one" in line, line
        run_dir.rmdir()  # (gone meanwhile: a ValueError of its own escaped the watch in a traceback; a review)
        time.sleep(1.0)
        run_dir.mkdir()
        (run_dir / RUN_PORT_FILE).write_text(f"{server.address.rsplit(':', 1)[1]}\n")  # its coordinator is up
        assert json.loads(lines.get(timeout=30))["players"]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
        assert not [line for line in list(errors.queue) if "Traceback" in line]
    finally:
        proc.kill()
        proc.wait(30)


def test_league_status_of_a_run_dir_refuses_another_leagues_coordinator_on_its_port(league, tmp_path):
    """A run killed outright leaves its port file; another league's coordinator serving on that port later was
    shown as the run's, exit 0 (a review). The run's league is its status history's newest record's."""
    from league_service.cli import RUN_PORT_FILE

    server, _, _ = league
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / RUN_PORT_FILE).write_text(f"{server.address.rsplit(':', 1)[1]}\n")
    history = run_dir / "status_history.jsonl"

    def status() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "league_service.cli", "status", "--run-dir", str(run_dir),
                               "--json"], capture_output=True, text=True, timeout=60)

    history.write_text(json.dumps({"league_id": "0" * 32, "players": []}) + "\n")
    refused = status()
    assert refused.returncode == 1 and not refused.stdout, refused.stdout
    assert (f"serves league {server.coordinator.league_id}, not this run directory's league {'0' * 32}"
            in refused.stderr), refused.stderr
    history.write_text(json.dumps({"league_id": server.coordinator.league_id, "players": []}) + "\n")
    shown = status()
    assert shown.returncode == 0 and json.loads(shown.stdout)["league_id"] == server.coordinator.league_id
    # A run whose state was lost started a new league in the same directory, its history appended to: the
    # newest record's league is the run's (the first record's refused the live run; a review).
    history.write_text(json.dumps({"league_id": "0" * 32, "players": []}) + "\n"
                       + json.dumps({"league_id": server.coordinator.league_id, "players": []}) + "\n")
    assert status().returncode == 0
    history.unlink()  # (a run whose history has not begun: nothing to tell its league by)
    assert status().returncode == 0


@pytest.mark.parametrize("flags", [["--json"], [], ["--watch", "0.2", "--json"], ["--watch", "0.2"]])
def test_league_status_into_a_closed_pipe_ends_quietly(league, flags):
    """`league status --json | head -1` died with a BrokenPipeError traceback (exit 1, or 120 from the final
    flush). A reader that is gone ends the command: no traceback, exit 0. Here stdout is a pipe whose read end
    is closed before anything is written, so every write fails."""
    server, _, _ = league
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "league_service.cli", "status", "--addr", server.address, *flags],
            stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60,
        )
    finally:
        os.close(write_end)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


def test_league_status_watch_into_head_ends_when_head_does(league):
    server, _, _ = league
    status = subprocess.Popen(
        [sys.executable, "-m", "league_service.cli", "status", "--addr", server.address, "--watch", "0.2", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        head = subprocess.run(["head", "-1"], stdin=status.stdout, capture_output=True, text=True, timeout=60)
        status.stdout.close()  # head alone reads the pipe: once it is gone, the pipe is closed
        assert json.loads(head.stdout)["league_id"]
        assert status.wait(30) == 0
        assert status.stderr.read() == ""
    finally:
        status.kill()
        status.wait(30)


def test_a_solo_league_counts_returns(tmp_path):
    cfg = small_league_config({"league": {"league_type": "solo", "active_players": {"solo_active_player": 1}},
                               "env": {"name": "CartPole-v1"}})
    with running_coordinator(cfg, tmp_path, needs_learner=False) as server:
        channel, stub = league_stub(server.address)
        with channel:
            register(stub, "a", ACTOR)
            job = stub.GetJob(pb.GetJobRequest(worker_id="a", role=ACTOR, wait_s=5)).job
            assert [p.player_id for p in job.players] == [job.launch_player] and job.env_name == "CartPole-v1"
            ack = stub.FinishJob(pb.FinishJobRequest(worker_id="a", job_id=job.job_id, status=COMPLETED,
                                                     episodes=outcomes_for(job, [True, False, True])))
            assert ack.episodes_counted == 3
            status = stub.GetStatus(pb.GetStatusRequest())
            (player,) = status.players
            assert status.league_type == "solo" and player.episodes == 3
            assert player.mean_return == pytest.approx(2 / 3)
