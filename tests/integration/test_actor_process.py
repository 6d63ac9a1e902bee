"""`python -m actor_service.cli actor` as a real process: SIGTERM releases the job and leaves no env process
behind, also while its envs take long to build or hang, or its job thread is stuck elsewhere; a lease that expired while the actor was frozen
(SIGSTOP) makes it abandon the job without FinishJob."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from common.algorithms.registry import make_computation_task
from common.checkpoint_store import CheckpointStore
from common.envs.policy_view import policy_specs
from common.envs.registry import make_env
from common.job_limits import MAX_EPISODES_PER_JOB
from common.proto.league.v1 import league_pb2 as pb
from league_service.config import config_from_dict, load_config
from league_service.coordinator_testing import coordinator_process, league_stub, running_coordinator
from tests.polling import wait_until

REPO = Path(__file__).resolve().parents[2]
PLAYER = "solo_active_player_default_0"
POLICY = {"algorithm": "ppo"}


def long_solo_config(env_name: str = "CartPole-v1", env_kwargs: dict | None = None):
    """A solo CartPole league whose jobs last far longer than the test (so they are cut short)."""
    cfg = config_from_dict({
        "league": {"league_type": "solo", "active_players": {"solo_active_player": 1}, "max_active_player_job": 1},
        "env": {"name": env_name, "kwargs": env_kwargs or {}, "env_num": 2, "episode_num": MAX_EPISODES_PER_JOB},
    })
    return dataclasses.replace(cfg, policy=POLICY)


FLAKY = "python:tests.env_doubles:FlakyEnv"  # CartPole inside, so the CartPole checkpoint plays it


def publish_first_checkpoint(root: Path, policy=POLICY) -> None:
    """The player's learner published version 1 already, so the actor starts playing at once."""
    info = make_env("CartPole-v1").info()
    inputs, actions = policy_specs(info)
    task = make_computation_task(policy, inputs, actions, "cpu", seed=1)
    CheckpointStore(root).publish(PLAYER, task.get_weights(), 1)


def playing(log: Path, job_id: str) -> bool:
    """The actor logs this line once its policies are loaded and the rollout starts."""
    return f"job {job_id}: {PLAYER} v1" in log.read_text()


def children(pid: int) -> set[int]:
    """Direct children of `pid` (from /proc)."""
    found = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            found.update(int(c) for c in (task / "children").read_text().split())
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


@contextlib.contextmanager
def actor_process(address: str, root: Path, log: Path, *args: str, script: str | None = None,
                  env: dict[str, str] | None = None):
    """`python -m actor_service.cli actor ...`; `script`: Python code that runs the same CLI (`python -c`).
    At DEBUG, so that the log has every job's start and end (the tests wait for them)."""
    launch = ["-m", "actor_service.cli", "actor"] if script is None else ["-c", script]
    command = [sys.executable, *launch, "--coordinator", address, "--shared-root", str(root), "--log-level", "DEBUG",
               *args]
    with open(log, "w") as out:
        proc = subprocess.Popen(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env=None if env is None else {**os.environ, **env})
    try:
        yield proc
    finally:
        # The group whether or not the actor still runs: its env workers may outlive it (a review).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGCONT)
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


def job_of(stub, worker_id: str):
    jobs = [j for j in stub.GetStatus(pb.GetStatusRequest()).jobs if j.worker_id == worker_id]
    return jobs[0] if jobs else None


def test_sigterm_releases_the_job_and_leaves_no_env_process(tmp_path):
    log = tmp_path / "actor.log"
    publish_first_checkpoint(tmp_path)
    with running_coordinator(long_solo_config(), tmp_path, needs_learner=False) as server:
        channel, stub = league_stub(server.address)
        try:
            with actor_process(server.address, tmp_path, log, "--manager", "subprocess", "--worker-id", "actor-t") as proc:
                job = wait_until("the actor's job", lambda: job_of(stub, "actor-t"), 60)
                wait_until("the job to play", lambda: playing(log, job.job_id), 60, log.read_text)
                workers = children(proc.pid)  # the env workers (and multiprocessing's resource tracker)
                assert len(workers) >= 2
                # Random CartPole episodes last ~20 steps: dozens finish in these 2 s, two are running at the stop.
                time.sleep(2.0)
                proc.send_signal(signal.SIGTERM)
                assert proc.wait(60) == 0, log.read_text()
            status = stub.GetStatus(pb.GetStatusRequest())
        finally:
            channel.close()
    text = log.read_text()
    assert "SIGTERM" in text and f"job {job.job_id} released: 0 episodes" in text, text
    # The job was cut short: the episodes it finished were the short ones, and are not reported.
    cut = re.search(rf"job {job.job_id} was cut short: its (\d+) finished episode\(s\) are not reported", text)
    assert cut and int(cut.group(1)) > 0, text
    assert status.counters.jobs_finished == 1 and status.counters.jobs_expired == 0
    assert status.players[0].episodes == 0
    assert not [j for j in status.jobs if j.job_id == job.job_id]
    wait_until("env workers to be gone", lambda: not any(alive(pid) for pid in workers), 10)


def test_a_burst_of_stop_signals_still_exits_0(tmp_path):
    """Ctrl-C twice (or a supervisor's SIGTERM per thread): a repeat that came after the stop had put the default
    handlers back killed the actor in its interpreter's shutdown, exit -2 after a clean stop (a review)."""
    with actor_with_its_job(tmp_path, long_solo_config(), "actor-b", "--manager", "base") as (_, proc, job, log):
        wait_until("the job to play", lambda: playing(log, job.job_id), 60, log.read_text)
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGINT)
            time.sleep(0.005)
        assert proc.wait(10) == 0, log.read_text()
    assert f"job {job.job_id} released" in log.read_text()


def finished_job(stub, log: Path, job_id: str) -> tuple[int, int]:
    """(episodes the actor says it released the job with, episodes the coordinator counted); the job is done."""
    text = log.read_text()
    released = re.search(rf"job {job_id} released: (\d+) episodes", text)
    assert released, text
    status = stub.GetStatus(pb.GetStatusRequest())
    assert status.counters.jobs_finished == 1 and status.counters.jobs_expired == 0, text
    assert not [j for j in status.jobs if j.job_id == job_id]
    return int(released.group(1)), status.players[0].episodes


def actor_playing_flaky_envs(tmp_path: Path, env_kwargs: dict, worker_id: str, *args: str,
                             lease_timeout_s: float = 30.0):
    """`actor_with_its_job` of a long solo league on FlakyEnv(**env_kwargs)."""
    return actor_with_its_job(tmp_path, long_solo_config(FLAKY, env_kwargs), worker_id, *args,
                              lease_timeout_s=lease_timeout_s)


@contextlib.contextmanager
def actor_with_its_job(tmp_path: Path, config, worker_id: str, *args: str, lease_timeout_s: float = 30.0):
    """A coordinator of `config` (a league whose first checkpoint is published) and an actor process that took its
    job; yields (coordinator stub, actor process, job, actor log)."""
    log = tmp_path / "actor.log"
    publish_first_checkpoint(tmp_path)
    with running_coordinator(config, tmp_path, needs_learner=False, lease_timeout_s=lease_timeout_s) as server:
        channel, stub = league_stub(server.address)
        try:
            with actor_process(server.address, tmp_path, log, "--worker-id", worker_id, *args) as proc:
                yield stub, proc, wait_until("the actor's job", lambda: job_of(stub, worker_id), 60), log
        finally:
            channel.close()


def test_sigterm_during_a_slow_env_start_up_releases_the_job_at_once(tmp_path):
    """Envs that take ten minutes to build: the stop cuts the launch short (it waited for the build before)."""
    with actor_playing_flaky_envs(tmp_path, {"build_s": 600.0}, "actor-s", "--manager", "subprocess") as (
            stub, proc, job, log):
        # The env worker (and multiprocessing's resource tracker): the envs are being built.
        workers = wait_until("the env worker", lambda: (found := children(proc.pid)) and len(found) >= 2 and found,
                             60, log.read_text)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()
        assert finished_job(stub, log, job.job_id) == (0, 0)
    said = [line for line in log.read_text().splitlines() if "cut short by the stop (EnvManagerInterrupted" in line]
    assert said and " INFO " in said[0], said  # the stop itself cut the envs short: no WARNING
    wait_until("env workers to be gone", lambda: not any(alive(pid) for pid in workers), 10)


def test_sigterm_cuts_short_an_in_process_env_hanging_in_python_code(tmp_path):
    marker = tmp_path / "hung"
    flaky = {"hang_every": 50, "hang_kind": "spin", "hang_marker": str(marker)}
    with actor_playing_flaky_envs(tmp_path, flaky, "actor-h", "--manager", "base") as (stub, proc, job, log):
        wait_until("the env to hang", marker.exists, 60, log.read_text)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()
        released, counted = finished_job(stub, log, job.job_id)
        assert released == counted
    assert "cut short (the manager was interrupted)" in log.read_text()


def test_sigterm_with_an_in_process_env_stuck_where_no_interrupt_gets_in_releases_the_job_and_exits(tmp_path):
    """A lock wait outside the main thread (as C code would be): the job thread cannot be got back, so the process
    releases the job from its main thread and exits 1; before, it waited for the env for ever."""
    flaky = {"hang_every": 50, "hang_kind": "wait", "hang_marker": str(tmp_path / "hung")}
    with actor_playing_flaky_envs(tmp_path, flaky, "actor-c", "--manager", "base", "--env-step-timeout", "1") as (
            stub, proc, job, log):
        # The watchdog's own report that its interrupt (at the 1 s timeout) did not get in.
        wait_until("the env to be stuck", lambda: "blocked where no interrupt gets in" in log.read_text(), 60,
                   log.read_text)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 1, log.read_text()
        text = log.read_text()
        assert "still in an env call" in text and "releasing it from outside its stuck thread" in text, text
        status = stub.GetStatus(pb.GetStatusRequest())
        assert status.counters.jobs_finished == 1 and status.counters.jobs_expired == 0, text
        assert not [j for j in status.jobs if j.job_id == job.job_id]


def test_an_in_process_env_stuck_where_no_interrupt_gets_in_ends_the_actor_two_leases_later(tmp_path):
    """With no stop, an env blocked in a wait (`--manager base`, the job thread) let its job's lease expire and
    then held the actor for good, playing nothing, alive: nothing restarted it (a review). Two leases past the
    env's timeout it exits 1, as a job stuck in a checkpoint read does."""
    flaky = {"hang_every": 50, "hang_kind": "wait", "hang_marker": str(tmp_path / "hung")}
    with actor_playing_flaky_envs(tmp_path, flaky, "actor-w", "--manager", "base", "--env-step-timeout", "1",
                                  lease_timeout_s=3.0) as (stub, proc, job, log):
        assert proc.wait(60) == 1, log.read_text()  # 1 s + two leases of 3 s into the step
        text = log.read_text()
        assert "stuck in an env call" in text and "use --manager subprocess" in text, text
        status = stub.GetStatus(pb.GetStatusRequest())
        assert not [j for j in status.jobs if j.job_id == job.job_id]


ON_ANOTHER_HOST = """
import socket, sys
socket.gethostname = lambda: "another-host"  # what names this process to the coordinator (common.rpc.process_id)
import argparse
from actor_service.cli import add_arguments, main
parser = argparse.ArgumentParser()
add_arguments(parser)
sys.exit(main(parser.parse_args(sys.argv[1:])))
"""


HUNG_FILESYSTEM = """
import os, sys, threading
marker, stuck = os.environ["HANG_MARKER"], os.environ["HANG_STUCK"]
real_open = os.open
def hung_open(path, *args, **kwargs):
    # Once the marker exists, a read of a checkpoint's latest.json never returns, as on an NFS mount whose
    # server went away (hard mount): the thread waits in the kernel, where no interrupt gets in.
    if str(path).endswith("latest.json") and os.path.exists(marker):
        os.close(real_open(stuck, os.O_WRONLY | os.O_CREAT, 0o644))
        threading.Event().wait()
    return real_open(path, *args, **kwargs)
os.open = hung_open
import argparse
from actor_service.cli import add_arguments, main
parser = argparse.ArgumentParser()
add_arguments(parser)
sys.exit(main(parser.parse_args(sys.argv[1:])))
"""


@contextlib.contextmanager
def actor_stuck_in_a_checkpoint_read(tmp_path: Path, worker_id: str, *args: str, lease_timeout_s: float = 30.0,
                                     coordinator_leaves: bool = False):
    """A coordinator of a long solo league and an actor process (`HUNG_FILESYSTEM`) whose job thread is stuck in
    its reload check's read of latest.json; yields (coordinator stub, actor process, job, actor log).
    `coordinator_leaves`: the coordinator is stopped once the read hangs (the same outage, say)."""
    log = tmp_path / "actor.log"
    marker, stuck = tmp_path / "hang", tmp_path / "stuck"
    publish_first_checkpoint(tmp_path)
    with running_coordinator(long_solo_config(), tmp_path, needs_learner=False,
                             lease_timeout_s=lease_timeout_s) as server:
        channel, stub = league_stub(server.address)
        try:
            with actor_process(server.address, tmp_path, log, "--manager", "base", "--worker-id", worker_id, *args,
                               script=HUNG_FILESYSTEM,
                               env={"HANG_MARKER": str(marker), "HANG_STUCK": str(stuck)}) as proc:
                job = wait_until("the actor's job", lambda: job_of(stub, worker_id), 60)
                wait_until("the job to play", lambda: playing(log, job.job_id), 60, log.read_text)
                marker.touch()
                wait_until("the reload check to hang", stuck.exists, 60, log.read_text)
                if coordinator_leaves:
                    server.stop(grace_s=0.5)
                yield stub, proc, job, log
        finally:
            channel.close()


def test_sigterm_with_the_job_thread_stuck_in_a_checkpoint_read_gives_up_after_the_stop_timeout(tmp_path):
    """A stop that is stuck outside any env call (here the launch policy's reload check reading from a hung
    filesystem) used to keep the actor alive until its supervisor's SIGKILL, and its job until its lease ran
    out. After --stop-timeout the main thread releases the job, logs where the job thread is, and exits 1."""
    with actor_stuck_in_a_checkpoint_read(tmp_path, "actor-n", "--stop-timeout", "2") as (stub, proc, job, log):
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 1, log.read_text()
        text = log.read_text()
        assert "still setting up or playing its job" in text and "--stop-timeout" in text, text
        assert "maybe_reload" in text, text
        assert "releasing it from outside its stuck thread" in text, text
        status = stub.GetStatus(pb.GetStatusRequest())
        assert status.counters.jobs_finished == 1 and status.counters.jobs_expired == 0, text
        assert not [j for j in status.jobs if j.job_id == job.job_id]


def test_a_job_stuck_in_a_checkpoint_read_lets_its_lease_expire_then_the_actor_exits(tmp_path):
    """Before, the heartbeat thread renewed the lease of a job whose thread waited for a hung filesystem, so the
    job (and its player's launch slot) was held for as long as the mount stayed hung; then (session 21) the job
    went back, but the actor waited on in silence, of no use. Two leases later it now exits 1."""
    with actor_stuck_in_a_checkpoint_read(tmp_path, "actor-r", "--checkpoint-read-timeout", "1",
                                          lease_timeout_s=3.0) as (stub, proc, job, log):
        wait_until("the lease to expire", lambda: stub.GetStatus(pb.GetStatusRequest()).counters.jobs_expired == 1,
                   60, log.read_text)
        assert "a checkpoint read has taken over 1 s" in log.read_text()
        assert proc.wait(60) == 1, log.read_text()  # 1 s + two leases of 3 s into the read
        text = log.read_text()
        assert "stuck in a checkpoint read for" in text and "maybe_reload" in text, text
        status = stub.GetStatus(pb.GetStatusRequest())
        assert status.counters.jobs_expired == 1 and status.counters.jobs_finished == 0  # released too late
        assert not [j for j in status.jobs if j.job_id == job.job_id]


def test_a_job_stuck_in_a_checkpoint_read_with_the_coordinator_away_still_ends_the_actor(tmp_path):
    """The release from outside the stuck thread retried its FinishJob for as long as the coordinator stayed
    away (no stop is set on that path), so the actor never exited. It now tries once and exits 1."""
    with actor_stuck_in_a_checkpoint_read(tmp_path, "actor-g", "--checkpoint-read-timeout", "1",
                                          lease_timeout_s=3.0, coordinator_leaves=True) as (_, proc, _, log):
        assert proc.wait(60) == 1, log.read_text()  # 1 s + two leases of 3 s into the read, + one try
        text = log.read_text()
        assert "stuck in a checkpoint read for" in text and "releasing it from outside its stuck thread" in text
        assert "its lease will expire" in text, text


def test_revoked_lease_abandons_the_job_without_finishing_it(tmp_path):
    log = tmp_path / "actor.log"
    publish_first_checkpoint(tmp_path)
    with running_coordinator(long_solo_config(), tmp_path, needs_learner=False, lease_timeout_s=1.0) as server:
        channel, stub = league_stub(server.address)
        try:
            with actor_process(server.address, tmp_path, log, "--manager", "base", "--worker-id", "actor-r",
                               "--max-jobs", "1") as proc:
                job = wait_until("the actor's job", lambda: job_of(stub, "actor-r"), 60)
                wait_until("the job to play", lambda: playing(log, job.job_id), 60, log.read_text)
                os.kill(proc.pid, signal.SIGSTOP)  # no heartbeats while frozen ...
                wait_until("the lease to expire",
                           lambda: stub.GetStatus(pb.GetStatusRequest()).counters.jobs_expired >= 1, 60)
                os.kill(proc.pid, signal.SIGCONT)  # ... and the next one hears the job was revoked
                assert proc.wait(60) == 0, log.read_text()
            status = stub.GetStatus(pb.GetStatusRequest())
        finally:
            channel.close()
    text = log.read_text()
    assert f"job {job.job_id} revoked" in text and f"job {job.job_id} abandoned" in text, text
    assert status.counters.jobs_finished == 0  # no FinishJob for a job the coordinator took back


def test_sigterm_is_quick_while_the_coordinator_does_not_answer(tmp_path):
    """A frozen coordinator (or a partition that drops packets): the stopping actor tries its release once,
    briefly, and exits; before, it retried FinishJob for about 90 s, past any stop grace period."""
    config = tmp_path / "league.yaml"
    config.write_text(yaml.safe_dump({
        "league": {"league_type": "solo", "active_players": {"solo_active_player": 1}, "max_active_player_job": 1},
        "env": {"name": "CartPole-v1", "env_num": 2, "episode_num": MAX_EPISODES_PER_JOB},
    }))
    publish_first_checkpoint(tmp_path, load_config(config).policy)
    argv = ["--config", str(config), "--shared-root", str(tmp_path), "--port", "0", "--without-learners"]
    log = tmp_path / "actor.log"
    with coordinator_process(argv, tmp_path / "coordinator.log") as coordinator:
        channel, stub = league_stub(coordinator.address)
        with channel, actor_process(coordinator.address, tmp_path, log, "--manager", "base",
                                    "--worker-id", "actor-f") as proc:
            job = wait_until("the actor's job", lambda: job_of(stub, "actor-f"), 60)
            wait_until("the job to play", lambda: playing(log, job.job_id), 60, log.read_text)
            os.kill(coordinator.popen.pid, signal.SIGSTOP)
            try:
                proc.send_signal(signal.SIGTERM)
                assert proc.wait(40) == 0, log.read_text()
            finally:
                os.kill(coordinator.popen.pid, signal.SIGCONT)
    text = log.read_text()
    assert f"FinishJob of {job.job_id} failed" in text and f"job {job.job_id} unreported" in text, text


@pytest.mark.parametrize("argv", [
    ["--coordinator", ""], ["--coordinator", "127.0.0.1:99999"],
    ["--coordinator", "127.0.0.1:1", "--shared-root", "/nonexistent"],
    ["--coordinator", "127.0.0.1:1", "--env-step-timeout", "-1"],
    ["--coordinator", "127.0.0.1:1", "--checkpoint-read-timeout", "0"],
    ["--coordinator", "127.0.0.1:1", "--stop-timeout", "nan"],
])
def test_bad_arguments_exit_with_a_message(argv, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "actor_service.cli", "actor", *argv], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "LEAGUE_SHARED_ROOT": str(tmp_path)})
    assert proc.returncode == 2
    flag = next((a for a in argv if a.endswith("timeout")), None)
    if flag is None:
        assert "league actor:" in proc.stderr
    else:  # argparse's usage error, naming the flag as the user wrote it (not a settings field)
        assert f"actor: error: argument {flag}:" in proc.stderr, proc.stderr


@contextlib.contextmanager
def _an_actor_with_a_job(tmp_path: Path, worker_id: str):
    """A coordinator of a long solo league and an actor process holding a job as `worker_id`; yields (coordinator
    address, stub, the actor process, its job)."""
    publish_first_checkpoint(tmp_path)
    with running_coordinator(long_solo_config(), tmp_path, needs_learner=False, lease_timeout_s=5.0) as server:
        channel, stub = league_stub(server.address)
        try:
            with actor_process(server.address, tmp_path, tmp_path / "actor-1.log", "--manager", "base",
                               "--worker-id", worker_id) as first:
                job = wait_until("the first actor's job", lambda: job_of(stub, worker_id), 60)
                yield server.address, stub, first, job
        finally:
            channel.close()


def test_a_second_actor_with_the_same_worker_id_makes_the_first_stop_naming_it(tmp_path):
    """Two processes given one --worker-id on one host (a restart, or a mistake): the newer registration owns it,
    the older one stops (exit 2) with a message that says so, rather than both heartbeating, finishing and
    releasing each other's jobs."""
    with _an_actor_with_a_job(tmp_path, "actor-d") as (address, stub, first, job):
        with actor_process(address, tmp_path, tmp_path / "actor-2.log", "--manager", "base",
                           "--worker-id", "actor-d") as second:
            assert first.wait(60) == 2, (tmp_path / "actor-1.log").read_text()
            text = (tmp_path / "actor-1.log").read_text()
            assert "is used by another process now" in text and "--worker-id" in text, text
            wait_until("the second actor's job", lambda: (j := job_of(stub, "actor-d")) and
                       j.job_id != job.job_id and j, 60)
            assert second.poll() is None


def test_an_actor_on_another_host_with_a_live_workers_id_is_refused_and_the_first_works_on(tmp_path):
    """One .env copied to two hosts under compose's restart policy: the newest registration used to win, so
    each restart of the refused container took the id back and the two knocked each other out for ever. From
    another host, a live worker's id is not taken over: the newcomer stops (exit 2) saying so, the first plays
    on."""
    with _an_actor_with_a_job(tmp_path, "actor-d") as (address, stub, first, _job):
        for attempt in range(2):  # refused again when restarted
            log = tmp_path / f"actor-2-{attempt}.log"
            with actor_process(address, tmp_path, log, "--manager", "base", "--worker-id", "actor-d",
                               script=ON_ANOTHER_HOST) as second:
                assert second.wait(60) == 2, log.read_text()
            text = log.read_text()
            assert "used by a live process on another host" in text and "--worker-id" in text, text
        assert first.poll() is None, (tmp_path / "actor-1.log").read_text()
        assert "used by another process" not in (tmp_path / "actor-1.log").read_text()
        assert job_of(stub, "actor-d") is not None  # (its job, or its next one: it plays on)
