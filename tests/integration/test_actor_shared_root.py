"""An actor whose --shared-root is not the coordinator's stops with one line (exit 2 in the CLI): it played an old
version found there, or failed every job, and nothing said why (a review)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from actor_service.actor import Actor, ActorSettings
from common.proto.league.v1 import league_pb2 as pb
from common.root_marker import ROOT_MARKER, ensure_root_id, read_root_id
from common.rpc import RegistrationError
from league_service.coordinator_testing import league_stub, running_coordinator, small_league_config
from learner_service.config import LearnerSettings
from learner_service.learner import Learner


def test_a_root_is_marked_once_and_a_damaged_marker_reads_as_none(tmp_path):
    first = ensure_root_id(tmp_path)
    assert ensure_root_id(tmp_path) == first == read_root_id(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == [ROOT_MARKER]  # (its temporary file removed)
    (tmp_path / ROOT_MARKER).write_text("[1, 2]")
    assert read_root_id(tmp_path) is None
    assert read_root_id(tmp_path / "missing") is None


def test_the_marker_is_readable_by_workers_running_as_another_user(tmp_path):
    """mkstemp's 0o600 kept them out: they waited 30 s and said the root had no marker (a review)."""
    umask = os.umask(0o022)
    try:
        ensure_root_id(tmp_path)
    finally:
        os.umask(umask)
    assert stat.S_IMODE((tmp_path / ROOT_MARKER).stat().st_mode) == 0o644


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the check as another user")
def test_a_marker_a_worker_may_not_read_is_named_at_once_not_waited_for():
    root = Path(tempfile.mkdtemp(prefix="marker-", dir="/tmp"))  # (pytest's tmp_path is closed to other users)
    try:
        root.chmod(0o755)
        root_id = ensure_root_id(root)
        (root / ROOT_MARKER).chmod(0o600)  # as an older coordinator wrote it
        script = ("import os, sys\n"
                  "from pathlib import Path\n"
                  "from common.root_marker import check_shared_root\n"
                  "os.setgid(65534); os.setuid(65534)\n"
                  "try:\n"
                  f"    check_shared_root(Path({str(root)!r}), {root_id!r}, lambda s: False, wait_s=60.0)\n"
                  "except Exception as err:\n"
                  "    print(type(err).__name__, err); sys.exit(0)\n"
                  "print('accepted')\n")
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
        assert time.monotonic() - started < 30  # not the 60 s wait for a marker to show
        assert done.stdout.startswith("RegistrationError") and "cannot be read (Permission denied)" in done.stdout, (
            done.stdout, done.stderr)
        assert "uid 65534" in done.stdout
    finally:
        shutil.rmtree(root)


@pytest.mark.parametrize("other_root", ["empty", "another league's"])
def test_an_actor_whose_shared_root_is_not_the_coordinators_stops_naming_it(tmp_path, monkeypatch, other_root):
    monkeypatch.setattr("actor_service.actor.ROOT_MARKER_WAIT_S", 0.5)
    league_root, actor_root = tmp_path / "league", tmp_path / "elsewhere"
    league_root.mkdir()
    actor_root.mkdir()
    if other_root != "empty":
        (actor_root / ROOT_MARKER).write_text(json.dumps({"root_id": "another"}))
    with running_coordinator(small_league_config(), league_root, needs_learner=False) as server:
        actor = Actor(ActorSettings(coordinator=server.address, shared_root=actor_root, worker_id="actor-x",
                                    manager="base", max_jobs=1, get_job_wait_s=1.0))
        with pytest.raises(RegistrationError, match="is not the coordinator's shared root") as refused:
            actor.run()
        assert str(actor_root) in str(refused.value)
        assert ("has no" if other_root == "empty" else "holds id another") in str(refused.value)
        # The id it checks against is the league root's marker (every other test runs actors on their league's root).
        channel, stub = league_stub(server.address)
        with channel:
            reply = stub.RegisterWorker(pb.RegisterWorkerRequest(worker_id="probe", role=pb.WORKER_ROLE_ACTOR))
        assert reply.shared_root_id == read_root_id(league_root) != "another"


def test_a_learner_whose_shared_root_is_not_the_coordinators_stops_before_binding(tmp_path, monkeypatch):
    """It resumed its player from no checkpoint (or an old one found there) and trained until its first publish
    was refused."""
    monkeypatch.setattr("learner_service.learner.ROOT_MARKER_WAIT_S", 0.5)
    league_root, learner_root = tmp_path / "league", tmp_path / "elsewhere"
    league_root.mkdir()
    learner_root.mkdir()
    (learner_root / ROOT_MARKER).write_text(json.dumps({"root_id": "another"}))
    with running_coordinator(small_league_config(), league_root) as server:
        learner = Learner(LearnerSettings(coordinator=server.address, shared_root=learner_root, worker_id="learner-x",
                                          device="cpu", get_job_wait_s=1.0, max_backoff_s=1.0))
        try:
            learner.start()
            with pytest.raises(RegistrationError, match="holds id another") as refused:
                learner.run()
        finally:
            learner.close(grace_s=1.0)
        assert str(learner_root) in str(refused.value)
        channel, stub = league_stub(server.address)
        with channel:
            status = stub.GetStatus(pb.GetStatusRequest())
        assert status.counters.jobs_issued == 0 and not status.jobs  # no learn job was taken


def _serve(cfg, root, port: int = 0, needs_learner: bool = True):
    from common.rpc import ServerOptions
    from league_service.coordinator import Coordinator, CoordinatorSettings
    from league_service.server import serve_coordinator

    coordinator = Coordinator(cfg, CoordinatorSettings(shared_root=root, needs_learner=needs_learner, rng_seed=0))
    return serve_coordinator(coordinator, ServerOptions(host="127.0.0.1", port=port))


def _started(run) -> tuple[threading.Thread, list[BaseException]]:
    """`run` on a daemon thread, and the exception it raises, if any."""
    failure: list[BaseException] = []

    def body() -> None:
        try:
            run()
        except BaseException as err:
            failure.append(err)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread, failure


def _wait_registered(client) -> None:
    deadline = time.monotonic() + 30
    while client.registration is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert client.registration is not None


def test_an_actor_registered_again_by_a_coordinator_on_another_root_stops_naming_it(tmp_path):
    """The root was checked at the first registration only: a coordinator that did not know the actor (a new one
    at the address, on another state and root) registered it again, and the actor played its jobs (a review)."""
    first_root, second_root = tmp_path / "first", tmp_path / "second"
    first_root.mkdir()
    second_root.mkdir()
    first = _serve(small_league_config(), first_root)  # no learner: no job, the actor waits in GetJob
    port = first.port
    actor = Actor(ActorSettings(coordinator=f"127.0.0.1:{port}", shared_root=first_root, worker_id="actor-x",
                                manager="base", max_jobs=1, get_job_wait_s=0.5))
    second = None
    thread, failure = _started(actor.run)
    try:
        _wait_registered(actor._client)
        first.stop(grace_s=0.5)
        second = _serve(small_league_config(), second_root, port=port, needs_learner=False)  # jobs at once
        thread.join(60)
        assert not thread.is_alive()
    finally:
        actor.request_stop()
        thread.join(30)
        first.stop(grace_s=0.5)
        if second is not None:
            second.stop(grace_s=0.5)
    (refused,) = failure
    assert isinstance(refused, RegistrationError) and "is not the coordinator's shared root" in str(refused)
    assert actor.jobs_run == 0


def test_a_learner_registered_again_by_a_coordinator_on_another_root_hands_the_job_back_and_stops(tmp_path):
    """As an actor: `next_learn_job` registers again with a coordinator that does not know the learner, whose
    root was not checked."""
    first_root, second_root = tmp_path / "first", tmp_path / "second"
    first_root.mkdir()
    second_root.mkdir()
    first = _serve(small_league_config(), first_root)
    port = first.port
    channel, stub = league_stub(first.address)
    with channel:  # other learners hold both players: ours waits in GetJob
        for other in ("other-0", "other-1"):
            stub.RegisterWorker(pb.RegisterWorkerRequest(worker_id=other, role=pb.WORKER_ROLE_LEARNER,
                                                         data_endpoint="127.0.0.1:1"))
            assert stub.GetJob(pb.GetJobRequest(worker_id=other, role=pb.WORKER_ROLE_LEARNER,
                                                data_endpoint="127.0.0.1:1")).HasField("job")
    learner = Learner(LearnerSettings(coordinator=f"127.0.0.1:{port}", shared_root=first_root, worker_id="learner-x",
                                      device="cpu", get_job_wait_s=0.5, max_backoff_s=0.5))
    second = None
    learner.start()
    thread, failure = _started(learner.run)
    try:
        _wait_registered(learner.client)
        first.stop(grace_s=0.5)
        second = _serve(small_league_config(), second_root, port=port)
        thread.join(60)
        assert not thread.is_alive()
        (refused,) = failure
        assert isinstance(refused, RegistrationError) and "is not the coordinator's shared root" in str(refused)
        channel, stub = league_stub(second.address)
        with channel:
            status = stub.GetStatus(pb.GetStatusRequest())
        assert status.counters.jobs_issued == 1 and not status.jobs  # handed back at once
    finally:
        learner.request_stop()
        thread.join(30)
        learner.close(grace_s=1.0)
        first.stop(grace_s=0.5)
        if second is not None:
            second.stop(grace_s=0.5)
