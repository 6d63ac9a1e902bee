"""`league run` end to end: real coordinator, learner and actor processes on this machine.

Each test runs the solo CartPole league for a short budget and checks what a user would: processes start,
jobs flow, checkpoints publish, status shows progress, everything exits and nothing is left running — also
when an actor is killed mid-run (its lease expires, training goes on) and when the learner is killed (it is
restarted and resumes from its checkpoint: steps never go back), when the coordinator is killed (restarted
on its state), and when a second run resumes the first's league from the same run directory. The solo run
ends at its budget; the others end with Ctrl-C once they saw what they wait for (the other way a run ends,
and minutes less of CI than waiting out each budget).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SOLO = ROOT / "configs" / "solo_cartpole.yaml"


def _config(tmp_path: Path, seconds: float, env_name: str | None = None, model: dict | None = None,
            job_env_steps: int = 512, actors: int = 1) -> Path:
    """The solo CartPole league for a test, with one actor unless the test needs more: every league run here
    keeps both of CI's cores busy training, and each actor more is ~3 s of CPU to import torch and a share of
    the cores the other test worker's tests wait for."""
    cfg = yaml.safe_load(SOLO.read_text())
    if env_name is not None:
        cfg["env"]["name"] = env_name
    if model is not None:
        cfg["policy"]["model"] = model
    cfg["env"]["env_num"] = 4
    cfg["env"]["env_steps"] = job_env_steps
    cfg["coordinator"] = {**cfg.get("coordinator", {}), "lease_timeout_s": 4.0, "heartbeat_interval_s": 1.0}
    cfg["run"] = {"actors": actors, "seconds": seconds, "manager": "base", "status_interval_s": 1.0, "stop_grace_s": 20}
    path = tmp_path / "league.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _pids_mentioning(text: str) -> list[int]:
    """Processes whose command line mentions `text` (our run dir): what must be gone at the end."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            pids.append(int(entry.name))
    return pids


def _worker_pid(run_dir: Path, worker_id: str) -> int | None:
    for pid in _pids_mentioning(str(run_dir)):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--worker-id" in argv and argv[argv.index(b"--worker-id") + 1] == worker_id.encode():
            return pid
    return None


def _history(run_dir: Path) -> list[dict]:
    path = run_dir / "status_history.jsonl"
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            pass  # the line being written right now
    return records


def _counter(record: dict, name: str) -> int:
    return int(record.get("counters", {}).get(name, 0) or 0)


def _active(record: dict) -> dict:
    (player,) = [p for p in record["players"] if p.get("active")]
    return player


class LeagueRun:
    """`league run` as a subprocess in its own session; killed with everything under it at the end."""

    def __init__(self, tmp_path: Path, seconds: float, env_name: str | None = None, model: dict | None = None,
                 config: Path | None | bool = True, job_env_steps: int = 512, env: dict | None = None,
                 prefix: tuple[str, ...] = (), actors: int = 1) -> None:
        """`config`: True writes the solo test config, a path runs that file, None none (the run directory's);
        `prefix`: a command that runs it (`nohup`)."""
        self.run_dir = tmp_path / "run"
        if config is True:
            config = _config(tmp_path, seconds, env_name, model, job_env_steps, actors)
        argv = [*prefix, sys.executable, "-m", "league_cli", "run", *([str(config)] if config else []),
                "--run-dir", str(self.run_dir), "--seconds", str(seconds), "--quiet"]
        self.log = open(tmp_path / "league_run.log", "wb")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, cwd=tmp_path,
                                     start_new_session=True,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})

    def wait_for(self, predicate, timeout_s: float, what: str) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            history = _history(self.run_dir)
            if history and predicate(history[-1]):
                return history[-1]
            if self.proc.poll() is not None:
                break
            time.sleep(0.5)
        raise AssertionError(f"timed out waiting for {what}:\n{self.output()}")

    def finish(self, timeout_s: float) -> int:
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"league run did not stop by itself:\n{self.output()}") from None

    def output(self, tail: int | None = 6000) -> str:
        self.log.flush()
        text = Path(self.log.name).read_text(errors="replace")
        return text if tail is None else text[-tail:]

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        for pid in _pids_mentioning(str(self.run_dir)):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.log.close()


@pytest.fixture
def league_run(tmp_path):
    runs: list[LeagueRun] = []

    def start(seconds: float, env_name: str | None = None, model: dict | None = None,
              config: Path | None | bool = True, job_env_steps: int = 512, env: dict | None = None,
              prefix: tuple[str, ...] = (), actors: int = 1) -> LeagueRun:
        run = LeagueRun(tmp_path, seconds, env_name, model, config, job_env_steps, env, prefix, actors)
        runs.append(run)
        return run

    yield start
    for run in runs:
        run.close()


def _assert_nothing_left_running(run: LeagueRun) -> None:
    deadline = time.monotonic() + 10
    while _pids_mentioning(str(run.run_dir)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _pids_mentioning(str(run.run_dir)) == [], "processes of the run outlived it"


def _assert_clean_end(run: LeagueRun, *, interrupt: bool = False) -> None:
    """The run ends with exit 0 and everything stopped: at its budget, or on Ctrl-C (`interrupt`: SIGINT to
    `league run`, as a terminal sends it; its children run in sessions of their own and get none)."""
    if interrupt:
        run.proc.send_signal(signal.SIGINT)
    assert run.finish(timeout_s=120) == 0, run.output()
    if interrupt:
        assert "league run: stopped by SIGINT; every process stopped" in run.output(tail=None)
    _assert_nothing_left_running(run)
    out = run.output()
    for where in ("checkpoints:", "logs:", "state:"):
        assert where in out
    assert (run.run_dir / "league_state.sqlite").exists()
    assert not (run.run_dir / "coordinator.port").exists()  # `league status --run-dir`: no run going on here


def test_solo_league_runs_publishes_and_exits_cleanly(league_run):
    run = league_run(seconds=30)
    run.wait_for(lambda r: _counter(r, "jobs_finished") >= 2 and _active(r)["checkpoint_version"] >= 2,
                 timeout_s=120, what="finished jobs and published checkpoints")
    # One Ctrl-C while the budget's stop is under way is not the second Ctrl-C that kills: the stop goes on.
    deadline = time.monotonic() + 120
    while "league run: budget spent; stopping the actors" not in run.output(tail=None):
        assert time.monotonic() < deadline and run.proc.poll() is None, run.output()
        time.sleep(0.05)
    run.proc.send_signal(signal.SIGINT)
    _assert_clean_end(run)
    assert "killed" not in run.output(tail=None) and "=-9" not in run.output(tail=None)
    history = _history(run.run_dir)
    steps = [_counter(r, "env_steps") for r in history]
    assert steps == sorted(steps) and steps[-1] > 0
    player = _active(history[-1])
    versions = sorted((run.run_dir / "shared" / player["player_id"]).glob("v*.pt"))
    assert versions, "no checkpoint file published"
    assert player["agent_steps"] > 0 and player["train_iteration"] > 0
    # The history ends with the league as it stopped: after the workers' last results were counted.
    from league_service.store import LeagueStore

    store = LeagueStore(run.run_dir / "league_state.sqlite")
    try:
        counters = store.load().counters
    finally:
        store.close()
    assert (steps[-1], _counter(history[-1], "jobs_finished")) == (counters.env_steps, counters.jobs_finished)


def test_a_job_no_learner_can_set_up_stops_the_run_with_the_reason(league_run):
    """A learner that exits with a setup error (here: an env that does not exist) would fail the same way
    after every restart: the run stops at once, shows why, and leaves nothing running."""
    run = league_run(seconds=120, env_name="NoSuchEnv-v0")
    assert run.finish(timeout_s=90) == 2, run.output()  # a config error: running it again fails the same way
    out = run.output(tail=None)
    assert "cannot run this league (exit 2" in out and "NoSuchEnv" in out, out[-6000:]
    assert "restarted" not in out
    _assert_nothing_left_running(run)


def test_collect_jobs_that_every_actor_fails_stop_the_run_with_the_reason(league_run, tmp_path):
    """A solo league on a two-player game with no bots for the other seat: learners set up fine, but every
    collect job fails in the actors, is retried and given up. The run stops with the actors' error instead of
    spending its budget training nothing."""
    # Config load refuses that league named as openspiel:tic_tac_toe (league_service/env_fit.py); built through a
    # python: env, whose seats only building it tells, it still reaches the actors.
    env = "python:common.envs.openspiel_env:OpenSpielEnv"
    config = _config(tmp_path, 300, env, {"conv": [[8, 3, 1]], "hidden": [16]})
    data = yaml.safe_load(config.read_text())
    data["env"]["kwargs"] = {"game": "tic_tac_toe"}
    data["coordinator"]["job_retry_backoff_s"] = 1.0  # the default 5 s, then 10 s, were most of the test's time
    config.write_text(yaml.safe_dump(data))
    run = league_run(seconds=300, config=config)
    assert run.finish(timeout_s=120) == 1, run.output()
    out = run.output(tail=None)
    assert "collect jobs keep failing" in out and "seat 1 asks for an action" in out, out[-6000:]
    _assert_nothing_left_running(run)


def test_a_killed_actor_loses_its_lease_and_training_goes_on(league_run):
    # The kill must land while actor-0 holds a job: with jobs of ~0.2 s (512 env steps) it sometimes fell
    # between two, and then no lease was left to expire (CI, session 14). Jobs of 4,096 steps last seconds.
    run = league_run(seconds=60, job_env_steps=4096, actors=2)  # the other actor trains on
    first = run.wait_for(lambda r: _counter(r, "jobs_finished") >= 1
                         and any(j.get("worker_id") == "actor-0" for j in r.get("jobs", [])),
                         120, "a job of actor-0 in flight")
    killed = {j["job_id"] for j in first.get("jobs", []) if j.get("worker_id") == "actor-0"}
    pid = _worker_pid(run.run_dir, "actor-0")
    assert pid is not None
    os.killpg(os.getpgid(pid), signal.SIGKILL)  # the actor and its env processes, as a crash would
    # Its job ends uncounted: its lease expires, or (when the restarted actor-0 registers first) the coordinator
    # releases it at the takeover of the worker id, since the dead process can never finish it.
    after = run.wait_for(lambda r: killed and not killed & {j["job_id"] for j in r.get("jobs", [])}, 60,
                         "the dead actor's job to end (its lease expired, or released at the takeover)")
    run.wait_for(lambda r: _counter(r, "jobs_finished") > _counter(after, "jobs_finished"), 60,
                 "jobs to keep finishing after the kill")
    _assert_clean_end(run, interrupt=True)
    last = _history(run.run_dir)[-1]
    assert _active(last)["agent_steps"] > _active(first)["agent_steps"]
    c = last["counters"]
    assert _counter(last, "jobs_issued") >= c.get("jobs_finished", 0) + c.get("jobs_expired", 0)


def test_a_killed_learner_is_restarted_and_resumes(league_run):
    run = league_run(seconds=75)
    before = run.wait_for(lambda r: _active(r)["checkpoint_version"] >= 2, 120, "published checkpoints")
    pid = _worker_pid(run.run_dir, "learner-0")
    assert pid is not None
    os.killpg(os.getpgid(pid), signal.SIGKILL)
    run.wait_for(lambda r: _active(r)["checkpoint_version"] > _active(before)["checkpoint_version"] + 2,
                 90, "training to resume after the learner restart")
    _assert_clean_end(run, interrupt=True)
    history = _history(run.run_dir)
    steps = [_active(r)["agent_steps"] for r in history]
    versions = [_active(r)["checkpoint_version"] for r in history]
    assert steps == sorted(steps), "a player's steps went backwards"
    assert versions == sorted(versions), "checkpoint versions went backwards"
    assert "learner-0 exited" in run.output(tail=None)


def _coordinator_pid(run_dir: Path) -> int | None:
    for pid in _pids_mentioning(str(run_dir)):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"coordinator" in argv and any(a == b"--state" or a.startswith(b"--state=") for a in argv):
            return pid
    return None


def test_a_coordinator_killed_with_sigkill_is_restarted_on_its_state_and_the_run_goes_on(league_run):
    """README's faults table: a `kill -9` of the coordinator loses nothing it acknowledged. Under `league run`
    it comes back on the same state and port, the workers reconnect, and counters carry on from the state."""
    run = league_run(seconds=45)
    before = run.wait_for(lambda r: _counter(r, "jobs_finished") >= 2, 120, "finished jobs")
    pid = _coordinator_pid(run.run_dir)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    killed_at = before["elapsed_s"]  # on the run's clock; a coordinator started at elapsed_s - uptime_s
    after = run.wait_for(lambda r: r["elapsed_s"] - r.get("uptime_s", 0.0) > killed_at, 60,
                         "the restarted coordinator")
    assert _counter(after, "jobs_finished") >= _counter(before, "jobs_finished"), "the restart lost finished jobs"
    run.wait_for(lambda r: _counter(r, "jobs_finished") > _counter(after, "jobs_finished"), 90,
                 "jobs to keep finishing after the restart")
    _assert_clean_end(run, interrupt=True)
    history = _history(run.run_dir)
    assert len({r["league_id"] for r in history}) == 1
    for counter in ("jobs_finished", "matches"):
        values = [_counter(r, counter) for r in history]
        assert values == sorted(values), f"{counter} went backwards across the restart"
    assert "coordinator exited with -9; restarted on the same state and port (1)" in run.output(tail=None)


def test_a_second_run_in_the_same_run_dir_resumes_the_league(league_run):
    """`league run --run-dir D` again continues D's league from its state database and checkpoints:
    counters, steps and checkpoint versions carry on from where the first run stopped. With no config given
    it is D's own (it was the embedded connect-four league, which the solo state refused); a config the
    saved league refuses leaves D's config as it was (it was overwritten: D then described another league)."""
    first = league_run(seconds=120)  # stopped by Ctrl-C once it has something to resume (at once: CI's minutes)
    first.wait_for(lambda r: _counter(r, "env_steps") > 0 and _active(r)["checkpoint_version"] >= 1, 90,
                   "env steps and a first checkpoint")
    _assert_clean_end(first, interrupt=True)
    before = _history(first.run_dir)[-1]
    assert _counter(before, "env_steps") > 0 and _active(before)["checkpoint_version"] >= 1, first.output()
    saved = (first.run_dir / "config.yaml").read_text()
    wrong = league_run(seconds=20, config=ROOT / "configs" / "league_connect_four.yaml")
    assert wrong.finish(timeout_s=120) == 2 and "the saved league is 'solo'" in wrong.output(), wrong.output()
    assert (first.run_dir / "config.yaml").read_text() == saved
    assert not (first.run_dir / "config.pending.yaml").exists()
    second = league_run(seconds=30, config=None)
    second.wait_for(lambda r: _counter(r, "env_steps") > _counter(before, "env_steps")
                    and _active(r)["checkpoint_version"] > _active(before)["checkpoint_version"],
                    90, "the resumed league to train on")
    _assert_clean_end(second, interrupt=True)
    history = _history(second.run_dir)  # one file, appended by both runs
    assert history[0]["league_id"] == history[-1]["league_id"], "the second run started another league"
    for counter in ("env_steps", "jobs_issued", "matches"):
        values = [_counter(r, counter) for r in history]
        assert values == sorted(values), f"{counter} went backwards across the runs"
    steps = [_active(r)["agent_steps"] for r in history]
    assert steps == sorted(steps)


def test_the_run_directory_stays_locked_until_every_process_of_a_killed_run_is_gone(league_run):
    """`league run` killed: its children stop by themselves, which takes seconds (longer for one that is slow
    or frozen). A resumed run must not start beside them: two learners would publish to one player."""
    from common.exclusive_lock import ExclusiveLock, LockedError

    run = league_run(seconds=120)
    run.wait_for(lambda r: _counter(r, "env_steps") > 0, 120, "env steps")
    learner = _worker_pid(run.run_dir, "learner-0")
    assert learner is not None
    os.kill(learner, signal.SIGSTOP)  # a learner slow to stop
    try:
        os.kill(run.proc.pid, signal.SIGKILL)
        run.proc.wait(30)
        with pytest.raises(LockedError):
            ExclusiveLock(run.run_dir / "league_run.lock", "run directory")
    finally:
        os.kill(learner, signal.SIGCONT)
    _assert_nothing_left_running(run)

    def free() -> bool:  # a process in its last moments of exiting may hold it a little longer
        try:
            ExclusiveLock(run.run_dir / "league_run.lock", "run directory").release()
        except LockedError:
            return False
        return True

    deadline = time.monotonic() + 30
    while not free():
        assert time.monotonic() < deadline, "the run directory stayed locked after its processes were gone"
        time.sleep(0.2)


def _league_made_by(config: Path | None, run_dir: Path) -> None:
    """`run_dir` holding the league of `config` (None: the embedded default) as the real coordinator saves it,
    which it does as it starts (stopped once it listens), without its config.yaml: a run of another league type
    was refused before that was written, say, or the state was made with `league coordinator --state`."""
    (run_dir / "shared").mkdir(parents=True)
    port_file = run_dir / "coordinator.port"
    argv = [sys.executable, "-m", "league_cli", "coordinator", *(["--config", str(config)] if config else []),
            "--shared-root", str(run_dir / "shared"), "--state", str(run_dir / "league_state.sqlite"),
            "--host", "127.0.0.1", "--port", "0", "--port-file", str(port_file)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate(timeout=10)[0].decode()
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.stdout.close()
    port_file.unlink(missing_ok=True)


def _count_a_game(state: Path) -> None:
    """The league in `state` as one that has played: the coordinator's episode counter at 1."""
    conn = sqlite3.connect(state)
    try:
        with conn:
            (value,) = conn.execute("SELECT value FROM state_parts WHERE part = 'counters' AND key = ''").fetchone()
            conn.execute("UPDATE state_parts SET value = ? WHERE part = 'counters' AND key = ''",
                          (json.dumps({**json.loads(value), "episodes": 1}),))
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("made_by", "resumed_with", "saved", "given"),
    [
        (None, SOLO, "one_vs_one", "solo"),
        # No config.yaml there and no CONFIG: the league's config is asked for (the embedded default was taken).
        (SOLO, None, "solo", None),
    ],
)
def test_resuming_a_league_with_a_config_of_another_league_type_is_a_config_error(
        league_run, tmp_path, made_by, resumed_with, saved, given):
    """Refused before anything starts, with exit 2 as other config errors, naming both league types (it was
    the coordinator's refusal once started, which `league run` reported as a failed process: exit 1)."""
    _league_made_by(made_by, tmp_path / "run")
    state_before = (tmp_path / "run" / "league_state.sqlite").read_bytes()
    run = league_run(seconds=20, config=resumed_with)
    assert run.finish(timeout_s=60) == 2, run.output()
    out = " ".join(run.output().split())  # rich wraps long lines
    if given is None:
        assert "holds a league (its state" in out and "but not its config.yaml: give the league's config" in out, out
    else:
        assert f"league run: config error: league.league_type: the saved league is '{saved}'" in out, out
        assert f"says '{given}'" in out, out
    assert "coordinator listening" not in out and not (tmp_path / "run" / "logs").exists()
    assert not (tmp_path / "run" / "config.yaml").exists() and not (tmp_path / "run" / "config.pending.yaml").exists()
    assert (tmp_path / "run" / "league_state.sqlite").read_bytes() == state_before
    _assert_nothing_left_running(run)


def test_a_resume_the_coordinator_refuses_is_a_config_error_too(league_run, tmp_path):
    """A config the saved league refuses for another reason than its type (here: a reference bot dropped, and
    a league member cannot leave) is the coordinator's refusal (exit 2), which `league run` passes on as a
    config error (exit 2; it was reported as a failed process, exit 1), naming the coordinator's reason."""
    _league_made_by(None, tmp_path / "run")  # the embedded default, with its three reference bots
    fewer_bots = tmp_path / "fewer_bots.yaml"
    fewer_bots.write_text("league:\n  reference_bots: [random]\n")
    run = league_run(seconds=20, config=fewer_bots)
    assert run.finish(timeout_s=90) == 2, run.output()
    out = " ".join(run.output(tail=None).split())
    assert "the coordinator exited (2)" in out and "are in the saved league but not in league.reference_bots" in out
    assert "league run: the league cannot run as configured; every process stopped" in out, out[-3000:]
    assert not (tmp_path / "run" / "config.yaml").exists()  # the refused config is not the directory's
    _assert_nothing_left_running(run)


def test_a_run_with_league_token_in_its_environment_sees_its_league(league_run):
    """The processes inherit $LEAGUE_TOKEN, so the coordinator checks it; `league run`'s own status calls now
    carry it too. Without it every poll was refused: no progress, no history, and no env-step budget."""
    run = league_run(seconds=40, env={"LEAGUE_TOKEN": "s3cret-token"})
    run.wait_for(lambda r: _counter(r, "env_steps") > 0, 90, "the league's progress in the history")
    _assert_clean_end(run, interrupt=True)
    assert "token auth" in (run.run_dir / "logs" / "coordinator.log").read_text()
    assert "UNAUTHENTICATED" not in run.output(tail=None)


def test_ctrl_c_during_start_up_starts_no_worker_and_exits_130(league_run):
    """README: 130 for Ctrl-C during start-up. It exited 0, and started every learner and actor after the
    signal had arrived."""
    run = league_run(seconds=60)
    deadline = time.monotonic() + 60
    while "learner(s)" not in run.output() and time.monotonic() < deadline:  # the coordinator is starting
        time.sleep(0.05)
    run.proc.send_signal(signal.SIGINT)
    assert run.finish(timeout_s=60) == 130, run.output()
    assert "stopped by SIGINT during start-up" in run.output(tail=None)
    assert not [p.name for p in (run.run_dir / "logs").glob("*.log") if p.name != "coordinator.log"]
    _assert_nothing_left_running(run)


def test_a_reader_gone_during_start_up_stops_the_run_with_exit_0_not_130(tmp_path):
    """`league run | head -2`: the reader left during start-up, and the run exited 130, the Ctrl-C code, though no
    signal came (once every process started, the same exits 0: README). It stops as it would, exiting 0."""
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "league_cli", "run", str(_config(tmp_path, 60)), "--run-dir",
                             str(run_dir), "--seconds", "60", "--quiet"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, cwd=tmp_path, start_new_session=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        first = [proc.stdout.readline() for _ in range(2)]  # what `head -2` reads, then it is gone
        assert all(first), first
        proc.stdout.close()
        assert proc.wait(timeout=120) == 0
        deadline = time.monotonic() + 10
        while _pids_mentioning(str(run_dir)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _pids_mentioning(str(run_dir)) == [], "processes of the run outlived it"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for pid in _pids_mentioning(str(run_dir)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_resuming_with_a_model_the_checkpoints_do_not_fit_is_a_config_error(league_run, tmp_path):
    """The same league type, another model: only the learner found out, after the coordinator had accepted the
    config and the run directory's config.yaml had been replaced by it, so every later resume failed too."""
    run_dir = tmp_path / "run"
    _league_made_by(SOLO, run_dir)
    _count_a_game(run_dir / "league_state.sqlite")  # a league that never played could still take another model
    (run_dir / "config.yaml").write_text(SOLO.read_text())
    saved = (run_dir / "config.yaml").read_text()
    wider = yaml.safe_load(SOLO.read_text())
    wider["policy"].setdefault("model", {})["hidden"] = [48, 48]
    other = tmp_path / "wider.yaml"
    other.write_text(yaml.safe_dump(wider))
    run = league_run(seconds=20, config=other)
    assert run.finish(timeout_s=60) == 2, run.output()
    out = " ".join(run.output().split())
    assert "league run: config error: policy.model.hidden: the league in" in out and "says [48, 48]" in out, out
    assert "coordinator listening" not in out
    assert (run_dir / "config.yaml").read_text() == saved
    _assert_nothing_left_running(run)


def test_a_resume_whose_env_kwargs_the_checkpoints_do_not_fit_puts_the_saved_config_back(league_run, tmp_path):
    """Env kwargs that change a `python:` env's spaces pass every check at start (only OpenSpiel's game_params are
    compared): the learner found the checkpoints did not fit only once the run directory's config.yaml had been
    replaced, so a resume with no CONFIG failed for ever, and the next CONFIG tried replaced config.prev.yaml, the
    last config the league ran with (a review). The saved config is put back at such an exit 2."""
    from common.algorithms.registry import make_computation_task
    from common.checkpoint_store import CheckpointStore
    from common.envs.policy_view import policy_specs
    from common.envs.registry import make_env

    def config(map_name: str) -> dict:
        cfg = yaml.safe_load(_config(tmp_path, 20, env_name="python:tests.env_doubles:flat_frozen_lake").read_text())
        cfg["env"]["kwargs"] = {"map_name": map_name}
        return cfg

    run_dir = tmp_path / "run"
    small = tmp_path / "small.yaml"
    small.write_text(yaml.safe_dump(config("4x4")))
    _league_made_by(small, run_dir)
    _count_a_game(run_dir / "league_state.sqlite")
    (run_dir / "config.yaml").write_text(small.read_text())
    saved = small.read_text()
    env = make_env("python:tests.env_doubles:flat_frozen_lake", map_name="4x4")
    inputs, actions = policy_specs(env.info())
    env.close()
    policy = config("4x4")["policy"]
    weights = make_computation_task(policy, inputs, actions, "cpu", 0).get_weights()
    CheckpointStore(run_dir / "shared").publish("solo_active_player_default_0", weights, 1)  # the 16-cell network's
    large = tmp_path / "large.yaml"
    large.write_text(yaml.safe_dump(config("8x8")))
    run = league_run(seconds=20, config=large, env={"PYTHONPATH": str(ROOT)})  # (where tests.env_doubles is)
    assert run.finish(timeout_s=90) == 2, run.output()
    out = " ".join(run.output().split())
    assert "env.kwargs.map_name: 4x4 -> 8x8" in out and "!= model shape" in out, out
    assert "could not run with" in out, out
    assert (run_dir / "config.yaml").read_text() == saved
    assert (run_dir / "config.prev.yaml").read_text() == saved
    _assert_nothing_left_running(run)


def _errors(logs: str) -> list[str]:
    return [line for line in logs.splitlines() if " ERROR " in line]


def test_a_solo_league_with_a_box_action_trains_publishes_and_its_checkpoint_plays(league_run, tmp_path):
    """configs/solo_pendulum.yaml: a Gaussian policy end to end (actors clip the torque they send, the learner
    takes the float actions, `league eval` plays the checkpoint's mean), with no chunk or job refused."""
    cfg = yaml.safe_load((ROOT / "configs" / "solo_pendulum.yaml").read_text())
    cfg["env"]["env_steps"] = 800  # 4 envs x 200: whole episodes, so returns are reported
    cfg["env"]["env_num"] = 4
    cfg["learner"]["batch_size"] = 256
    config = tmp_path / "pendulum.yaml"
    config.write_text(yaml.safe_dump(cfg))
    run = league_run(seconds=120, config=config)  # stopped by Ctrl-C once it has published (CI's minutes)
    run.wait_for(lambda r: _counter(r, "jobs_finished") >= 2 and _active(r)["checkpoint_version"] >= 2,
                 timeout_s=120, what="finished jobs and published checkpoints")
    _assert_clean_end(run, interrupt=True)
    logs = "".join(p.read_text(errors="replace") for p in (run.run_dir / "logs").glob("*.log"))
    assert _errors(logs) == [] and "invalid chunk" not in logs.lower(), logs[-3000:]
    player = _active(_history(run.run_dir)[-1])
    assert player["agent_steps"] > 0 and player["episodes"] > 0
    played = subprocess.run(
        [sys.executable, "-m", "league_cli", "eval", "--checkpoint",
         str(run.run_dir / "shared" / player["player_id"]), "--games", "3", "--json"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert played.returncode == 0, played.stderr
    result = json.loads(played.stdout.strip().splitlines()[-1])
    assert result["episodes"] == 3 and -16.3 * 200 <= result["mean_return"] <= 0.0, result


def test_a_solo_league_with_a_multi_discrete_action_trains_and_learns_it(league_run, tmp_path):
    """tests.env_doubles.copy_digits (a MultiDiscrete([3, 4]) action, two points a step for copying both digits
    shown): the league trains it end to end, and its checkpoint copies more than a random policy's 7/12."""
    cfg = yaml.safe_load(SOLO.read_text())
    cfg["env"] = {"name": "python:tests.env_doubles:copy_digits", "kwargs": {}, "env_num": 8, "episode_num": 0,
                  "env_steps": 256}
    cfg["policy"]["ppo"]["gamma"] = 0.0
    config = tmp_path / "copy_digits.yaml"
    config.write_text(yaml.safe_dump(cfg))
    run = league_run(seconds=120, config=config, env={"PYTHONPATH": str(ROOT)})  # stopped once it has learned
    # (the training episodes' mean return near 2 within seconds of the first job, as measured)
    run.wait_for(lambda r: _counter(r, "jobs_finished") >= 4 and _active(r)["checkpoint_version"] >= 5
                 and _active(r)["mean_return"] >= 1.8, timeout_s=120, what="the league to learn the copying")
    _assert_clean_end(run, interrupt=True)
    logs = "".join(p.read_text(errors="replace") for p in (run.run_dir / "logs").glob("*.log"))
    assert _errors(logs) == [], logs[-3000:]
    player = _active(_history(run.run_dir)[-1])
    played = subprocess.run(
        [sys.executable, "-m", "league_cli", "eval", "--checkpoint",
         str(run.run_dir / "shared" / player["player_id"]), "--games", "50", "--json"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert played.returncode == 0, played.stderr
    result = json.loads(played.stdout.strip().splitlines()[-1])
    assert result["episodes"] == 50 and result["mean_return"] > 7 / 12 + 0.5, result


def test_an_unexpected_error_of_league_run_itself_stops_every_process_and_says_what_failed(league_run, tmp_path):
    """Only RuntimeError was caught: any other error (here the old config's copy cannot be written: a
    directory of its name; a full disk does the same) stopped the processes under a "budget spent" line and
    ended in a bare traceback with no summary."""
    config = _config(tmp_path, 60)
    run_dir = tmp_path / "run"
    _league_made_by(config, run_dir)  # (a config.yaml with no league beside it is refused before anything starts)
    saved = yaml.safe_load(config.read_text())
    saved["policy"]["ppo"]["learning_rate"] = 0.0001  # the directory's config differs: its copy is kept
    (run_dir / "config.yaml").write_text(yaml.safe_dump(saved))
    (run_dir / "config.prev.yaml").mkdir()
    run = league_run(seconds=60, config=config)
    assert run.finish(timeout_s=120) == 1, run.output()
    out = run.output(tail=None)
    assert "league run failed (IsADirectoryError); stopping" in out and "budget spent" not in out, out[-6000:]
    assert "state:" in out  # the summary still says where the results are
    _assert_nothing_left_running(run)


HANGUP_DEFAULT = ("import os, signal, sys; signal.signal(signal.SIGHUP, signal.SIG_DFL); "
                  "os.execv(sys.argv[1], sys.argv[1:])")
"""A prefix that runs the command after it with SIGHUP's default disposition (kept across exec)."""


def test_a_closed_terminal_sighup_stops_the_run_in_order(league_run):
    """SIGHUP (its terminal closed, an ssh session dropped) ended `league run` at once, and its children on the
    parent-death signal all together: no summary, exit -1, actors' last results racing a stopping coordinator.
    Now it stops in order, as for SIGTERM, writing nowhere."""
    # SIGHUP as a terminal leaves it, also when the tests run under `nohup` (which league run honours: the run then
    # went on to its budget, and this test passed after 127 s without a stop by SIGHUP).
    run = league_run(seconds=120, prefix=(sys.executable, "-c", HANGUP_DEFAULT))
    run.wait_for(lambda r: _counter(r, "jobs_finished") >= 1, 120, "a finished job")
    said = len(run.output(tail=None))
    run.proc.send_signal(signal.SIGHUP)
    assert run.finish(timeout_s=120) == 0, run.output()
    _assert_nothing_left_running(run)
    after = run.output(tail=None)[said:]
    assert "stopped by SIGHUP" not in after and "budget spent" not in after, after  # (nothing more written)
    history = _history(run.run_dir)
    assert history and history[-1].get("jobs", []) == []  # the last record taken once every worker stopped


def test_under_nohup_a_sighup_does_not_stop_the_run(league_run):
    """`nohup league run ...` ignores SIGHUP so that a closed terminal leaves the run going: handled as a stop
    regardless, it would have ended such a run."""
    run = league_run(seconds=120, prefix=("nohup",))
    run.wait_for(lambda r: _counter(r, "jobs_finished") >= 1, 120, "a finished job")
    run.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        assert run.proc.poll() is None, run.output()  # still running
        time.sleep(0.1)
    _assert_clean_end(run, interrupt=True)
