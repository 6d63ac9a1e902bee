"""Env faults: an env that crashes or hangs every so often is rebuilt within the actor's retry budget and its
jobs complete; a job whose env always crashes is given up after `max_job_attempts`, its player backs off
instead of being retried forever, and the actor and the coordinator stay up. Invariants checked at the end.

Env doubles: `tests.env_doubles.FlakyEnv`, named in the league config as `python:tests.env_doubles:FlakyEnv`
(built by that name inside every env worker process). Short versions run by default; the long ones (a league
of real processes for a minute) are `slow`.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from actor_service.actor import Actor, ActorSettings, JobReport
from actor_service.policy_pool import PolicySettings
from common.algorithms.registry import make_computation_task
from common.checkpoint_store import CheckpointStore
from common.envs.policy_view import policy_specs
from common.envs.registry import make_env
from common.job_limits import MAX_EPISODES_PER_JOB
from common.proto.league.v1 import league_pb2 as pb
from league_cli.processes import ManagedProcess, ProcessGroup, league_command
from league_service.config import config_from_dict
from league_service.coordinator_testing import league_stub, running_coordinator
from tests.chaos.invariants import assert_invariants, fetch_status, read_ledger
from tests.env_doubles import HANGS_RELEASED, FlakyEnv
from tests.polling import wait_until

FLAKY = "python:tests.env_doubles:FlakyEnv"
# Episodes of exactly 10 steps, so where the faults fall is known in advance.
TEN_STEP_EPISODES = {"inner": "python:tests.env_doubles:CountingEnv", "inner_kwargs": {"length": 10}}
STATE_FILE = "league_state.sqlite"
PLAYER = "solo_active_player_default_0"
POLICY = {"algorithm": "ppo"}


def solo_league(faults: dict[str, Any], *, env_num: int = 1, episode_num: int = 6,
                coordinator: dict[str, Any] | None = None) -> dict[str, Any]:
    """A solo league (one player, one job at a time) on FlakyEnvs with ten-step episodes."""
    return {
        "league": {"league_type": "solo", "active_players": {"solo_active_player": 1}, "max_active_player_job": 1},
        "env": {"name": FLAKY, "kwargs": {**TEN_STEP_EPISODES, **faults}, "env_num": env_num,
                "episode_num": episode_num},
        "policy": POLICY,
        "coordinator": coordinator or {},
    }


def publish_first_checkpoint(shared_root: Path, config: dict[str, Any]) -> None:
    """The player's version 1, as its learner would have published it: actors start playing at once."""
    policy = config_from_dict(config).policy  # the league's policy section, merged over the defaults
    inputs, actions = policy_specs(make_env(FLAKY, **TEN_STEP_EPISODES).info())
    task = make_computation_task(policy, inputs, actions, "cpu", seed=1)
    CheckpointStore(shared_root).publish(PLAYER, task.get_weights(), 1)


def job_failures(state_path: Path) -> dict[str, dict[str, Any]]:
    """The coordinator's durable failure books, by player (read-only, beside the running coordinator)."""
    conn = sqlite3.connect(f"file:{state_path}?mode=ro", uri=True, timeout=30.0)
    try:
        conn.row_factory = sqlite3.Row
        return {row["player_id"]: dict(row) for row in conn.execute("SELECT * FROM job_failures")}
    finally:
        conn.close()


# ---- occasional faults: an actor in this process, env workers, a coordinator on gRPC --------------------------


def play(tmp_path: Path, env_kwargs: dict[str, Any], jobs: int, manager: str = "subprocess",
         **actor) -> tuple[list[JobReport], pb.LeagueStatus]:
    """`jobs` jobs of the flaky solo league played by one actor (in this thread); returns the reports and the
    final status, after checking the invariants against what the actor was told."""
    cfg = config_from_dict(solo_league(env_kwargs))
    with running_coordinator(cfg, tmp_path, needs_learner=False) as server:
        settings = ActorSettings(
            coordinator=server.address, shared_root=tmp_path, worker_id="actor-0", manager=manager,
            get_job_wait_s=1.0, max_jobs=jobs, policies=PolicySettings(first_checkpoint_wait_s=0.0, seed=0),
            **actor,
        )
        reports = Actor(settings).run()
        accepted = {r.job_id: r.episodes for r in reports if r.status == "completed"}
        status = assert_invariants(server.address, state_path=tmp_path / STATE_FILE, accepted=accepted,
                                   accepted_complete=True)
    assert multiprocessing.active_children() == [], "env worker processes left behind"
    assert status is not None
    return reports, status


def test_an_env_that_crashes_or_hangs_now_and_then_is_rebuilt_and_its_jobs_complete(tmp_path, caplog):
    """One env in a worker process, six 10-step episodes a job. It raises at step 40 of its worker and hangs
    at step 70 (caught by a 1 s step timeout; the worker is killed and started again, the count with it), so
    each job meets one crash and one hang: two failures, within the default budget (env_max_retry=2) of each
    job, because every job starts with a fresh budget."""
    caplog.set_level(logging.WARNING)
    reports, status = play(tmp_path, {"crash_every": 40, "hang_every": 70}, jobs=2, env_step_timeout_s=1.0)
    assert [r.status for r in reports] == ["completed"] * 2, reports
    assert [r.env_failures for r in reports] == [2, 2]
    assert "InjectedEnvFault" in caplog.text  # the env's own exception, from its worker process
    assert "hung" in caplog.text
    c = status.counters
    assert (c.jobs_finished, c.jobs_failed, c.jobs_expired) == (2, 0, 0)
    assert c.matches == sum(r.episodes for r in reports) == 12


@pytest.fixture
def flaky_envs_in_this_process():
    """FlakyEnvs built in this process (serial manager) count steps from 0 and hang until released."""
    FlakyEnv._process_steps = 0
    HANGS_RELEASED.clear()
    yield
    HANGS_RELEASED.set()
    FlakyEnv._process_steps = 0


def test_the_serial_manager_interrupts_a_hung_env_and_its_jobs_complete(tmp_path, caplog, flaky_envs_in_this_process):
    """The serial manager, driven from the main thread, interrupts an env blocked at every 45th step of this
    process (a signal from its watchdog after a 1 s step timeout): each job loses one episode to the hang and
    completes; no lease expires."""
    caplog.set_level(logging.WARNING)
    reports, status = play(tmp_path, {"hang_every": 45}, jobs=2, manager="base", env_step_timeout_s=1.0)
    assert [r.status for r in reports] == ["completed"] * 2, reports
    assert [r.env_failures for r in reports] == [1, 1]
    assert "signalled the main thread" in caplog.text and "hung" in caplog.text
    c = status.counters
    assert (c.jobs_finished, c.jobs_failed, c.jobs_expired) == (2, 0, 0)
    assert c.matches == 12


def test_an_actor_stuck_in_an_env_it_cannot_interrupt_lets_its_lease_expire(tmp_path, caplog, flaky_envs_in_this_process):
    """An actor in a thread of its own, serial env manager, env blocked in a lock wait: out of any interrupt's
    reach. Its heartbeat thread would keep the lease alive forever; instead it stops renewing once the env has
    overrun its step timeout by as much again, the lease expires and the coordinator offers the job again (a
    probe actor gets it). Once the env returns, the actor hears that the job was revoked and abandons it."""
    caplog.set_level(logging.WARNING)
    config = solo_league({"hang_every": 25}, episode_num=MAX_EPISODES_PER_JOB)
    cfg = config_from_dict(config)
    publish_first_checkpoint(tmp_path, config)
    with running_coordinator(cfg, tmp_path, needs_learner=False, lease_timeout_s=1.5) as server:
        settings = ActorSettings(
            coordinator=server.address, shared_root=tmp_path, worker_id="actor-stuck", manager="base",
            get_job_wait_s=1.0, max_jobs=1, env_step_timeout_s=0.5,
            policies=PolicySettings(first_checkpoint_wait_s=0.0, seed=0),
        )
        actor = Actor(settings)
        reports: list[JobReport] = []
        thread = threading.Thread(target=lambda: reports.extend(actor.run()), name="actor-stuck", daemon=True)
        thread.start()
        try:
            wait_until("the heartbeat to let the lease go", lambda: "no longer renewing the lease" in caplog.text,
                       60, lambda: caplog.text)
            wait_until("the lease to expire", lambda: fetch_status(server.address).counters.jobs_expired >= 1, 60,
                       lambda: caplog.text)
            assert not [j for j in fetch_status(server.address).jobs if j.worker_id == "actor-stuck"]
            offered = probe_get_job(server.address)
            assert offered.HasField("job"), offered  # the job is issued again, to another actor
            assert thread.is_alive()  # the actor itself is still stuck in the env
            HANGS_RELEASED.set()
            thread.join(60)  # the env returns; the next heartbeat hears the job was revoked: abandoned
        finally:
            HANGS_RELEASED.set()
            if thread.is_alive():
                actor.request_stop()
                thread.join(60)
        assert not thread.is_alive()
    (report,) = reports
    assert report.status == "abandoned" and report.env_failures >= 1, report
    assert offered.job.job_id != report.job_id
    assert "revoked" in caplog.text


# ---- a league of real processes -------------------------------------------------------------------------------


class ProcessLeague:
    """A `league coordinator` and `league actor` processes on one flaky league config."""

    def __init__(self, root: Path, config: dict[str, Any]) -> None:
        self.root = root
        self.shared_root = root / "shared"
        self.shared_root.mkdir()
        self.state_path = root / STATE_FILE
        self.config_path = root / "league.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.port_file = root / "coordinator.port"
        self.group = ProcessGroup(root / "logs", env={"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
        self.address = ""

    def start_coordinator(self) -> ManagedProcess:
        proc = self.group.start("coordinator", league_command(
            "coordinator", "--config", str(self.config_path), "--shared-root", str(self.shared_root),
            "--state", str(self.state_path), "--host", "127.0.0.1", "--port", "0",
            "--port-file", str(self.port_file), "--without-learners", "--seed", "0"))
        port = wait_until("the coordinator's port", lambda: self.port_file.exists() and self.port_file.read_text(),
                          90, self.logs)
        self.address = f"127.0.0.1:{int(port)}"
        return proc

    def start_actor(self, name: str, *args: str) -> ManagedProcess:
        return self.group.start(name, league_command(
            "actor", "--coordinator", self.address, "--shared-root", str(self.shared_root), "--worker-id", name,
            *args))

    def status(self) -> pb.LeagueStatus:
        return fetch_status(self.address)

    def log(self, name: str) -> str:
        return (self.group.log_dir / f"{name}.log").read_text(errors="replace")

    def logs(self) -> str:
        return "\n".join(f"--- {p.name} ---\n{p.log_tail(15)}" for p in self.group.processes)

    def stop(self, name: str) -> int:
        """SIGTERM one process and wait for its exit code."""
        proc = self.group.get(name)
        proc.terminate()
        return proc.popen.wait(60)


@pytest.fixture
def process_league(tmp_path) -> Iterator[Callable[[dict[str, Any]], ProcessLeague]]:
    leagues: list[ProcessLeague] = []

    def make(config: dict[str, Any]) -> ProcessLeague:
        league = ProcessLeague(tmp_path, config)
        leagues.append(league)
        return league

    try:
        yield make
    finally:
        for league in leagues:
            league.group.stop(grace_s=5.0)  # SIGTERM, then SIGKILL to each whole process group


def probe_get_job(address: str) -> pb.GetJobResponse:
    """GetJob as a second actor would ask it: does the coordinator hand the job to anybody?"""
    channel, stub = league_stub(address)
    with contextlib.closing(channel):
        stub.RegisterWorker(pb.RegisterWorkerRequest(worker_id="probe", role=pb.WORKER_ROLE_ACTOR))
        return stub.GetJob(pb.GetJobRequest(worker_id="probe", role=pb.WORKER_ROLE_ACTOR, wait_s=0.0))


def test_a_job_whose_env_always_crashes_is_given_up_and_not_retried_forever(process_league):
    # Every step crashes; the actor (envs in its own process) gives each job up at the first failure
    # (--env-max-retry 0). Two attempts per job, then the player's jobs wait out a backoff longer than the test.
    config = solo_league(
        {"crash_every": 1},
        coordinator={"max_job_attempts": 2, "job_retry_backoff_s": 3600.0, "max_job_retry_backoff_s": 3600.0,
                     "lease_timeout_s": 10.0, "heartbeat_interval_s": 1.0},
    )
    league = process_league(config)
    publish_first_checkpoint(league.shared_root, config)
    coordinator = league.start_coordinator()
    actor = league.start_actor("actor-0", "--manager", "base", "--env-max-retry", "0")

    status = wait_until("two failed attempts", lambda: (s := league.status()).counters.jobs_failed >= 2 and s,
                        120, league.logs)
    wait_until("the job to be given up", lambda: "given up" in league.log("coordinator"), 30, league.logs)
    # Nobody gets the job now: not the actor (it keeps asking), not a second actor.
    held = probe_get_job(league.address)
    assert not held.HasField("job") and "held back after repeated failures" in held.reason, held
    status = league.status()
    c = status.counters
    assert (c.jobs_issued, c.jobs_failed, c.jobs_finished, c.matches) == (2, 2, 0, 0), c
    assert read_ledger(league.state_path).counters["jobs_given_up"] == 1
    (books,) = job_failures(league.state_path).values()
    assert books["failures_in_a_row"] == 2 and books["jobs_given_up"] == 1 and books["held_until"] > 0
    # The same books on the wire, for `league status`.
    assert c.jobs_given_up == 1
    (player,) = [p for p in status.players if p.active]
    assert (player.failed_attempts_in_a_row, player.jobs_given_up) == (2, 1)
    assert player.jobs_held_until > status.now and "InjectedEnvFault" in player.last_job_error
    # What the actor reported: the env's exception with its traceback.
    assert "InjectedEnvFault" in books["last_error"] and "Traceback" in books["last_error"], books["last_error"]

    # Both processes are up and well; the actor stops cleanly when asked, and so does the coordinator.
    assert actor.alive() and coordinator.alive(), league.logs()
    assert "job" in league.log("actor-0") and "failed" in league.log("actor-0")
    assert_invariants(status=status, state_path=league.state_path)
    assert league.stop("actor-0") == 0, league.logs()
    final = league.status()
    assert league.stop("coordinator") == 0, league.logs()
    assert_invariants(status=final, state_path=league.state_path, coordinator_stopped=True)


# ---- long versions -------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_league_of_processes_rides_out_envs_that_crash_and_hang(process_league):
    """Two actor processes for a minute on a connect-four league whose env workers crash at every 150th step
    and hang at every 400th: every job completes, every accepted result is counted once."""
    config = {
        "league": {"league_type": "one_vs_one", "active_players": {"main_player": 1}, "max_active_player_job": 2,
                   "payoff": {"decay": 1.0}},
        "env": {"name": FLAKY, "kwargs": {"inner": "connect_four", "crash_every": 150, "hang_every": 400},
                "env_num": 2, "episode_num": 6},
        "policy": {"algorithm": "ppo", "model": {"conv": [[8, 3, 1]], "hidden": [32]}},
        "coordinator": {"lease_timeout_s": 10.0, "heartbeat_interval_s": 1.0},
    }
    league = process_league(config)
    league.start_coordinator()
    actors = [league.start_actor(f"actor-{i}", "--env-max-retry", "4", "--env-step-timeout", "1")
              for i in range(2)]  # subprocess env manager (the default): it catches hangs
    earlier = None
    deadline = time.monotonic() + 60.0
    pause = threading.Event()
    while time.monotonic() < deadline:
        pause.wait(5.0)
        earlier = assert_invariants(league.address, state_path=league.state_path, earlier=earlier,
                                    payoff_decay=1.0)
        assert all(a.alive() for a in actors), league.logs()
    status = league.status()
    c = status.counters
    assert c.jobs_finished >= 4 and c.matches >= 4 * 6, (c, league.logs())
    assert c.jobs_failed == 0 and c.jobs_expired == 0, (c, league.logs())
    text = league.log("actor-0") + league.log("actor-1")
    assert "InjectedEnvFault" in text and "hung" in text
    for name in ("actor-0", "actor-1"):
        assert league.stop(name) == 0, league.logs()
    final = league.status()
    assert league.stop("coordinator") == 0, league.logs()
    assert_invariants(status=final, state_path=league.state_path, coordinator_stopped=True, payoff_decay=1.0)


@pytest.mark.slow
def test_an_always_crashing_env_is_retried_at_a_backed_off_pace(process_league):
    """With a short backoff (0.5 s doubling to 2 s) the failing player's attempts go on, but paced: in 30 s
    at most the first attempts plus one per backoff period, never the actor's full speed."""
    config = solo_league(
        {"crash_every": 1},
        coordinator={"max_job_attempts": 3, "job_retry_backoff_s": 0.5, "max_job_retry_backoff_s": 2.0,
                     "lease_timeout_s": 10.0, "heartbeat_interval_s": 1.0},
    )
    league = process_league(config)
    publish_first_checkpoint(league.shared_root, config)
    coordinator = league.start_coordinator()
    actor = league.start_actor("actor-0", "--manager", "base", "--env-max-retry", "0")
    wait_until("the first job given up", lambda: "given up" in league.log("coordinator"), 120, league.logs)
    start = league.status().counters.jobs_issued
    started = time.monotonic()
    threading.Event().wait(30.0)
    elapsed = time.monotonic() - started
    status = league.status()
    issued = status.counters.jobs_issued - start
    # After the cap is reached, one attempt per 2 s; +3 for the ramp (0.5 + 1 s) and an attempt in flight.
    assert 1 <= issued <= elapsed / 2.0 + 3, (issued, elapsed)
    assert read_ledger(league.state_path).counters["jobs_given_up"] >= 2
    assert actor.alive() and coordinator.alive(), league.logs()
    assert_invariants(status=status, state_path=league.state_path)
    assert league.stop("actor-0") == 0, league.logs()
