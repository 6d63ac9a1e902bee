"""`league coordinator` as a real process: the address line, the port file, a clean SIGTERM, and an exit when it
cannot write its state."""

import os
import signal
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from common.proto.league.v1 import league_pb2 as pb
from league_service.coordinator_testing import (
    coordinator_command,
    coordinator_process,
    league_stub,
    outcomes_for,
    server_process,
)


def last_seen(stub) -> float:
    (worker,) = stub.GetStatus(pb.GetStatusRequest()).workers
    return worker.last_heartbeat


def test_sigterm_drains_and_exits_zero(tmp_path):
    port_file = tmp_path / "run" / "port"
    argv = ["--shared-root", str(tmp_path), "--port", "0", "--port-file", str(port_file), "--grace", "2"]
    with coordinator_process(argv, tmp_path / "coordinator.log") as proc:
        host, port = proc.address.rsplit(":", 1)
        assert host == "127.0.0.1" and port_file.read_text().strip() == port

        channel, stub = league_stub(proc.address, default_deadline_s=30)
        with channel:
            stub.RegisterWorker(pb.RegisterWorkerRequest(worker_id="a", role=pb.WORKER_ROLE_ACTOR))
            health = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""))
            assert next(health).status == health_pb2.HealthCheckResponse.SERVING

            # A long poll in flight (no learner is bound, so no collect job comes) when SIGTERM arrives.
            answered = {}
            poll = threading.Thread(
                target=lambda: answered.update(
                    reply=stub.GetJob(pb.GetJobRequest(worker_id="a", role=pb.WORKER_ROLE_ACTOR, wait_s=25))
                )
            )
            registered_seen = last_seen(stub)
            poll.start()
            # The poll is inside the coordinator once it has touched the worker's last-seen time.
            deadline = time.monotonic() + 30
            while last_seen(stub) == registered_seen and time.monotonic() < deadline:
                time.sleep(0.02)
            assert proc.terminate(timeout_s=60) == 0
            assert not port_file.exists()  # nobody listens there any more
            poll.join(30)
            assert not answered["reply"].HasField("job") and "shutting down" in answered["reply"].reason

            statuses = []
            with pytest.raises(grpc.RpcError) as ended:  # the stream ends when the server goes away
                for update in health:
                    statuses.append(update.status)
            assert ended.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
            assert health_pb2.HealthCheckResponse.NOT_SERVING in statuses
        assert "shutting down" in proc.log_tail()


def test_during_the_drain_probes_see_not_serving_and_finishes_are_still_acknowledged(tmp_path):
    """Without a drain the port closed at SIGTERM, so a health `Check` (a load balancer's, `league health`)
    met a refused connection instead of NOT_SERVING, and an actor's FinishJob sent that moment had to wait for
    the restart. During `--drain` the coordinator answers: NOT_SERVING, no new jobs, the finish counted."""
    state = tmp_path / "state.sqlite"
    argv = ["--shared-root", str(tmp_path), "--state", str(state), "--port", "0", "--without-learners",
            "--grace", "1"]
    with coordinator_process([*argv, "--drain", "6"], tmp_path / "coordinator.log") as proc:
        channel, stub = league_stub(proc.address, default_deadline_s=30)
        with channel:
            health = health_pb2_grpc.HealthStub(channel)
            stub.RegisterWorker(pb.RegisterWorkerRequest(worker_id="a", role=pb.WORKER_ROLE_ACTOR))
            job = stub.GetJob(pb.GetJobRequest(worker_id="a", role=pb.WORKER_ROLE_ACTOR, wait_s=10)).job
            assert job.job_id
            os.kill(proc.popen.pid, signal.SIGTERM)
            deadline = time.monotonic() + 15
            while health.Check(health_pb2.HealthCheckRequest(service="")).status == \
                    health_pb2.HealthCheckResponse.SERVING:
                assert time.monotonic() < deadline, "health still SERVING 15 s after SIGTERM"
                time.sleep(0.02)
            assert health.Check(health_pb2.HealthCheckRequest(service="")).status == \
                health_pb2.HealthCheckResponse.NOT_SERVING
            assert proc.popen.poll() is None  # still draining

            stub.Heartbeat(pb.HeartbeatRequest(worker_id="a", job_ids=[job.job_id]))
            ack = stub.FinishJob(pb.FinishJobRequest(
                worker_id="a", job_id=job.job_id, status=pb.FINISH_STATUS_COMPLETED,
                episodes=outcomes_for(job, [True, False]), env_steps=14))
            assert ack.episodes_counted == 2 and not ack.duplicate
            reply = stub.GetJob(pb.GetJobRequest(worker_id="a", role=pb.WORKER_ROLE_ACTOR, wait_s=5))
            assert not reply.HasField("job") and "shutting down" in reply.reason
        assert proc.popen.wait(60) == 0
    with coordinator_process(argv, tmp_path / "restarted.log") as proc:
        channel, stub = league_stub(proc.address, default_deadline_s=30)
        with channel:
            counters = stub.GetStatus(pb.GetStatusRequest()).counters
            assert counters.jobs_finished == 1 and counters.matches == 2


def test_a_burst_of_signals_still_ends_in_a_clean_exit(tmp_path):
    """A supervisor killed outright sends one SIGTERM per thread it had, and people press Ctrl-C twice: a
    coordinator whose handler set a threading.Event hung in such bursts, about one run in three here (the
    handler waited for the event's lock, held by its own thread; or its wake-up was lost: common.signal_flag)."""
    argv = ["--shared-root", str(tmp_path), "--port", "0", "--grace", "1"]
    with coordinator_process(argv, tmp_path / "coordinator.log") as proc:
        for _ in range(50):
            for sig in (signal.SIGTERM, signal.SIGINT):
                try:
                    os.kill(proc.popen.pid, sig)
                except ProcessLookupError:
                    break
        assert proc.popen.wait(60) == 0
        assert "shutting down" in proc.log_tail()


def test_a_coordinator_that_cannot_write_its_state_exits_and_its_restart_has_all_it_acknowledged(tmp_path):
    """A commit that failed once (a full disk) used to leave the coordinator answering every change with
    UNKNOWN for good while its health said SERVING, so no supervisor restarted it. Now the call that met the
    failure gets UNAVAILABLE (worth retrying), the process exits 1, and a restart on the same state (space back)
    has every registration it acknowledged. The disk fills here by RLIMIT_FSIZE on the coordinator alone."""
    state = tmp_path / "state.sqlite"
    argv = ["--shared-root", str(tmp_path), "--state", str(state), "--port", "0", "--grace", "1"]
    limit = 400_000  # bytes per file: room to start, not for many more commits
    limited = [sys.executable, "-c", "import os, resource, sys; resource.setrlimit(resource.RLIMIT_FSIZE, "
               f"({limit}, {limit})); os.execv(sys.executable, [sys.executable, *sys.argv[1:]])",
               *coordinator_command(*argv)[1:]]
    acknowledged = []
    with server_process(limited, tmp_path / "full.log") as proc:
        channel, stub = league_stub(proc.address, default_deadline_s=30)
        with channel:
            with pytest.raises(grpc.RpcError) as failed:
                for i in range(100_000):
                    stub.RegisterWorker(pb.RegisterWorkerRequest(worker_id=f"w{i}", role=pb.WORKER_ROLE_ACTOR,
                                                                 hostname="h" * 250))
                    acknowledged.append(f"w{i}")
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE, failed.value
        assert proc.popen.wait(30) == 1
        assert "the coordinator cannot go on" in proc.log_tail(60)
    assert acknowledged
    with coordinator_process(argv, tmp_path / "restarted.log") as proc:
        channel, stub = league_stub(proc.address, default_deadline_s=30)
        with channel:
            workers = {w.worker_id for w in stub.GetStatus(pb.GetStatusRequest()).workers}
        assert set(acknowledged) <= workers


def test_a_paused_coordinator_keeps_the_leases_its_workers_could_not_renew(tmp_path):
    """SIGSTOP past a lease, then SIGCONT: every lease used to expire at once when it ran again (its workers'
    heartbeats could not be heard meanwhile), losing more than a crash, whose restart gives fresh deadlines."""
    argv = ["--shared-root", str(tmp_path), "--port", "0", "--lease-timeout", "2"]
    with coordinator_process(argv, tmp_path / "coordinator.log") as proc:
        channel, stub = league_stub(proc.address, default_deadline_s=30)
        with channel:
            stub.RegisterWorker(pb.RegisterWorkerRequest(worker_id="l", role=pb.WORKER_ROLE_LEARNER,
                                                         data_endpoint="127.0.0.1:1"))
            job = stub.GetJob(pb.GetJobRequest(worker_id="l", role=pb.WORKER_ROLE_LEARNER, wait_s=10)).job
            assert job.kind == pb.JOB_KIND_LEARN
            os.kill(proc.popen.pid, signal.SIGSTOP)
            try:
                time.sleep(7.0)  # past the lease and the pause threshold (5 s)
            finally:
                os.kill(proc.popen.pid, signal.SIGCONT)
            reply = stub.Heartbeat(pb.HeartbeatRequest(worker_id="l", job_ids=[job.job_id]))
            assert not reply.revoked_job_ids, proc.log_tail()
            assert stub.GetStatus(pb.GetStatusRequest()).counters.jobs_expired == 0
        assert proc.terminate(timeout_s=60) == 0
        assert "did not run for" in proc.log_tail()


def test_a_state_file_it_cannot_write_is_refused_at_start(tmp_path):
    """SQLite opens a file it may not write read-only without a word, and a restore writes nothing: the
    coordinator came up SERVING on a read-only state and exited 1 at the first call that had to commit (under a
    restart policy, a crash loop that looked healthy between calls). The start is refused now, exit 2."""
    import shutil
    import subprocess
    import tempfile

    as_root = os.geteuid() == 0
    # As root a file's mode does not stop writes: run the second start in a user namespace, as nobody, from a
    # folder nobody may enter (pytest's tmp_path is under a folder only its owner may enter).
    base = Path(tempfile.mkdtemp(prefix="league-ro-", dir="/tmp")) if as_root else tmp_path
    try:
        state, shared = base / "state.sqlite", base / "shared"
        shared.mkdir()
        argv = ["--shared-root", str(shared), "--state", str(state), "--port", "0", "--grace", "1"]
        with coordinator_process(argv, tmp_path / "first.log") as proc:
            assert proc.terminate(timeout_s=60) == 0
        state.chmod(0o444)
        command = coordinator_command(*argv)
        if as_root:
            for path in (base, shared):
                path.chmod(0o777)
            if shutil.which("unshare") is None or subprocess.run(
                    ["unshare", "--user", "true"], capture_output=True).returncode != 0:
                pytest.skip("running as root without user namespaces: a read-only file cannot be made")
            command = ["unshare", "--user", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, done.stderr
        assert "LISTENING" not in done.stdout
        assert f"cannot write {state} (a read-only file or filesystem)" in done.stderr
    finally:
        if as_root:
            shutil.rmtree(base, ignore_errors=True)
