"""`league run`'s supervisor with real child processes standing in for workers."""

import signal
import sys
import threading
import time
from collections import deque
from pathlib import Path

import pytest

from common.config import ConfigError
from common.ports import ephemeral_range
from league_cli.run import RunConfig, Supervisor, learner_stop_timeout
from tests.full_disk import pretend_full_disk


@pytest.fixture
def supervisor(tmp_path):
    # A worker the supervisor restarts is a real one (`league actor ...`): with no shared root it exited 2 at
    # once, and a later check() of the test raised CannotRunLeague for it when it came after that exit (a CI
    # race). With one, it waits for the coordinator these tests never start, until the teardown stops it.
    sup = Supervisor(tmp_path, tmp_path / "league.yaml", RunConfig(), learners=1)
    sup.shared_root.mkdir()
    yield sup
    sup.group.stop(grace_s=5.0)


def test_a_learner_setup_error_that_lands_during_the_grace_is_what_the_run_reports(supervisor):
    """The CI race of session 7: every actor failed the job, the run saw it given up, and the learner's own
    setup-error exit (the root cause) came a moment later and was never reported."""
    supervisor.group.start("learner-0", [sys.executable, "-c", "import sys, time; time.sleep(0.5); "
                                         "print('no such env'); sys.exit(2)"])
    with pytest.raises(RuntimeError, match=r"(?s)learner-0 cannot run this league \(exit 2.*no such env"):
        supervisor.wait_for_setup_errors(10.0, threading.Event())


def test_healthy_workers_only_cost_the_grace(supervisor):
    supervisor.group.start("learner-0", [sys.executable, "-c", "import time; time.sleep(60)"])
    assert supervisor.wait_for_setup_errors(0.5, threading.Event()) == []
    stop = threading.Event()
    stop.set()
    assert supervisor.wait_for_setup_errors(60.0, stop) == []  # a stop request ends the wait at once


def test_actors_with_env_processes_get_their_share_of_the_cpus(tmp_path, monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(8)))
    sup = Supervisor(tmp_path, tmp_path / "league.yaml", RunConfig(actors=3), learners=1)
    sup.address = "127.0.0.1:1"
    argv = sup._worker_argv("actor-0")
    assert argv[argv.index("--env-cpus") + 1] == "2"
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0})
    argv = sup._worker_argv("actor-1")
    assert argv[argv.index("--env-cpus") + 1] == "1"  # never below one
    in_process = Supervisor(tmp_path, tmp_path / "league.yaml", RunConfig(manager="base"), learners=1)
    assert "--env-cpus" not in in_process._worker_argv("actor-0")


def test_actors_get_the_runs_env_max_retry(tmp_path):
    """A flaky env (a step that raises now and then) stopped `league run` with "collect jobs keep failing": only
    `league actor --env-max-retry` could allow it more, and `league run` gave no way to set it."""
    from league_cli.main import build_parser

    sup = Supervisor(tmp_path, tmp_path / "league.yaml", RunConfig(env_max_retry=50), learners=1)
    sup.address = "127.0.0.1:1"
    argv = sup._worker_argv("actor-0")
    assert argv[argv.index("--env-max-retry") + 1] == "50"
    args = build_parser().parse_args(argv[argv.index("actor"):])
    assert args.env_max_retry == 50
    with pytest.raises(ConfigError, match=r"env_max_retry: must be within \[0, 1000000\], got -1"):
        RunConfig(env_max_retry=-1)


def test_learners_train_on_the_runs_learner_device(tmp_path):
    """`league run` had no way to keep its learners off a GPU (`auto` picks it), where the default league's small
    network made 0.82x the env steps of CPU learners (BENCHMARKS.md)."""
    from league_cli.main import build_parser

    for device in ("auto", "cpu", "cuda:1"):
        sup = Supervisor(tmp_path, tmp_path / "league.yaml", RunConfig(learner_device=device), learners=1)
        sup.address = "127.0.0.1:1"
        argv = sup._worker_argv("learner-0")
        assert build_parser().parse_args(argv[argv.index("learner"):]).device == device


def test_learners_spread_over_several_gpus(tmp_path, monkeypatch):
    """With `auto` (or `cuda`) every learner of a machine of several GPUs trained on cuda:0, the others idle."""
    from league_cli import run as run_module
    from league_cli.main import build_parser

    def devices(device: str, gpus: int) -> list[str]:
        monkeypatch.setattr(run_module, "gpu_count", lambda: gpus)
        sup = Supervisor(tmp_path, tmp_path / "league.yaml", RunConfig(learner_device=device), learners=3)
        sup.address = "127.0.0.1:1"
        argvs = [sup._worker_argv(f"learner-{i}") for i in range(3)]
        return [build_parser().parse_args(argv[argv.index("learner"):]).device for argv in argvs]

    assert devices("auto", 2) == devices("cuda", 2) == ["cuda:0", "cuda:1", "cuda:0"]
    assert devices("auto", 4) == ["cuda:0", "cuda:1", "cuda:2"]
    assert devices("auto", 1) == ["auto"] * 3 and devices("auto", 0) == ["auto"] * 3
    assert devices("cpu", 4) == ["cpu"] * 3 and devices("cuda:1", 4) == ["cuda:1"] * 3  # as the user set it


def test_a_learner_under_a_grace_of_zero_gets_arguments_it_accepts(tmp_path):
    """`run.stop_grace_s: 0` is a valid config (kill at once), but its learners were given `--stop-timeout 0`,
    which `league learner` refuses (> 0): every learner exited 2 and the run stopped as misconfigured."""
    from league_cli.main import build_parser
    from learner_service.cli import DEFAULT_STOP_TIMEOUT_S

    for grace in (0.0, 4.0, 15.0):
        sup = Supervisor(tmp_path, tmp_path / "league.yaml", RunConfig(stop_grace_s=grace), learners=1)
        sup.address = "127.0.0.1:1"
        argv = sup._worker_argv("learner-0")
        args = build_parser().parse_args(argv[argv.index("learner"):])  # exits 2 on an argument it refuses
        assert args.stop_timeout == (learner_stop_timeout(grace) or DEFAULT_STOP_TIMEOUT_S)  # 0: its own default


def test_a_worker_that_crashed_is_restarted_and_the_event_names_what_it_died_of(supervisor):
    """An uncaught exception is written as a traceback, not as a logged ERROR line: the restart event names it,
    so `league run`'s output says why, not only that, a process died."""
    supervisor.address = "127.0.0.1:1"
    supervisor.group.start("actor-0", [sys.executable, "-c", "print('starting'); import json; "
                                       "json.loads('{broken')"])
    supervisor.group.get("actor-0").popen.wait(30)
    (event,) = supervisor.check()
    assert event.startswith("actor-0 exited with 1 (json.decoder.JSONDecodeError: Expecting property name"), event
    assert event.endswith("; restarted (1)")
    supervisor.group.start("actor-1", [sys.executable, "-c", "print('bye'); import os; os.kill(os.getpid(), 9)"])
    supervisor.group.get("actor-1").popen.wait(30)
    assert supervisor.check() == ["actor-1 exited with -9; restarted (1)"]  # no traceback: nothing more to say


def test_a_worker_that_died_of_an_exception_group_is_named_by_the_group(supervisor):
    """An asyncio TaskGroup's failure is an ExceptionGroup, whose traceback Python draws behind "  | " margins."""
    supervisor.address = "127.0.0.1:1"
    script = ("import asyncio\n"  # raised from a cause, which Python prints first
              "async def fail():\n    try:\n        open('/nonexistent/x')\n    except OSError as err:\n"
              "        raise ConnectionError('learner unreachable') from err\n"
              "async def main():\n    async with asyncio.TaskGroup() as tasks:\n        tasks.create_task(fail())\n"
              "asyncio.run(main())\n")
    supervisor.group.start("actor-0", [sys.executable, "-c", script])
    supervisor.group.get("actor-0").popen.wait(30)
    (event,) = supervisor.check()
    assert event == ("actor-0 exited with 1 (ExceptionGroup: unhandled errors in a TaskGroup (1 sub-exception); "
                     "the first: ConnectionError: learner unreachable); restarted (1)"), event


@pytest.mark.parametrize("end", ["os.kill(os.getpid(), 9)", "os._exit(1)"], ids=["killed", "exits-1"])
def test_a_traceback_logged_by_a_process_that_went_on_is_not_what_it_died_of(supervisor, end):
    """An actor logs a failed job with its traceback and plays on; killed later (the OOM killer), or exiting 1
    on purpose, it did not die of that exception, and the restart line must not say it did."""
    supervisor.address = "127.0.0.1:1"
    script = ("import logging, os\n"
              "logging.basicConfig(level='INFO', format='%(asctime)s %(levelname)s %(name)s: %(message)s')\n"
              "log = logging.getLogger('actor_service.actor')\n"
              "try:\n    raise ConnectionError('learner unreachable')\n"
              "except ConnectionError as err:\n    log.error('job j-17 failed', exc_info=err)\n"
              "log.info('job j-18: 1,000 env steps')\n" + end + "\n")
    supervisor.group.start("actor-0", [sys.executable, "-c", script])
    proc = supervisor.group.get("actor-0")
    proc.popen.wait(30)
    assert "ConnectionError" in proc.log_tail()
    (event,) = supervisor.check()
    assert event == f"actor-0 exited with {proc.popen.returncode}; restarted (1)"


def test_a_learner_whose_old_port_was_taken_is_restarted_on_a_free_one(supervisor):
    """A restarted learner keeps its port so that jobs already handed out reach it; when another process took
    the port meanwhile (exit 3), the run moves it to a free port instead of stopping."""
    supervisor.address = "127.0.0.1:1"
    supervisor.learner_ports["learner-0"] = 40001
    supervisor.group.start("learner-0", [sys.executable, "-c", "import sys; sys.exit(3)"])
    supervisor.group.get("learner-0").popen.wait(30)
    (event,) = supervisor.check()
    port = supervisor.learner_ports["learner-0"]
    assert event == f"learner-0 exited with 3; restarted on port {port} (its port 40001 was taken) (1)"
    argv = supervisor.group.get("learner-0").argv
    assert argv[argv.index("--port") + 1] == str(port)


def test_servers_get_ports_no_outgoing_connection_can_take(supervisor):
    """Ports the OS picks come from the range it also gives outgoing connections: a learner or coordinator
    restarted on such a port could find it taken by one (an actor's channel lives as long as the actor)."""
    low, _ = ephemeral_range()
    supervisor.address = "127.0.0.1:1"
    argv = supervisor._worker_argv("learner-0")
    port = int(argv[argv.index("--port") + 1])
    assert 0 < port < low and supervisor._worker_argv("learner-0") == argv  # and kept for its restarts
    # Its stop fits inside league run's grace, with time for its main thread to hand the job back.
    assert float(argv[argv.index("--stop-timeout") + 1]) == supervisor.run_cfg.stop_grace_s - 3
    assert [learner_stop_timeout(g) for g in (15.0, 6.0, 4.0, 0.0)] == [12.0, 3.0, 2.0, 0.0]
    supervisor.config_path.write_text("{}\n")  # the embedded league (the fixture made the shared root)
    address = supervisor.start_coordinator()
    assert 0 < int(address.rpartition(":")[2]) < low


IGNORES_SIGTERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"


def test_a_second_ctrl_c_kills_what_is_still_stopping_instead_of_waiting_out_its_grace(tmp_path):
    sup = Supervisor(tmp_path, tmp_path / "league.yaml", RunConfig(stop_grace_s=30.0), learners=1)
    proc = sup.group.start("actor-0", [sys.executable, "-c", IGNORES_SIGTERM])
    deadline = time.monotonic() + 30
    while "up" not in proc.log_tail() and time.monotonic() < deadline:  # its handler is in place
        time.sleep(0.05)
    threading.Timer(0.5, sup.hurry.set).start()
    began = time.monotonic()
    codes = sup.stop()
    assert codes == {"actor-0": -9}
    assert time.monotonic() - began < 10  # not the 30 s grace


def test_a_stop_requested_while_the_coordinator_starts_is_not_kept_waiting(tmp_path):
    """The wait for the coordinator's port (up to 90 s) did not look at Ctrl-C: a coordinator slow to start
    (or frozen) kept the run deaf to it."""
    from league_cli.run import StartupInterrupted

    stop = threading.Event()
    stop.set()
    sup = Supervisor(tmp_path, tmp_path / "league.yaml", RunConfig(), learners=1, stop=stop)
    try:
        began = time.monotonic()
        with pytest.raises(StartupInterrupted):
            sup.start_coordinator()
        assert time.monotonic() - began < 5
    finally:
        sup.stop()


def test_a_process_that_exits_non_zero_at_the_stop_fails_the_run(tmp_path):
    """A coordinator that could not write its state at the stop (a full disk) exited 1, and the run said exit 0
    ("everything saved")."""
    import io

    from rich.console import Console

    from league_cli.run import _summary

    sup = Supervisor(tmp_path, tmp_path / "league.yaml", RunConfig(), learners=1)
    out = io.StringIO()
    console = Console(file=out, width=200)
    code = _summary(console, "budget spent", 0, {"actor-0": 0, "coordinator": 1}, None, sup,
                    tmp_path / "status_history.jsonl")
    assert code == 1
    assert "coordinator did not exit cleanly at the stop" in out.getvalue()
    assert _summary(Console(file=io.StringIO()), "budget spent", 0, {"actor-0": 0, "coordinator": 0}, None, sup,
                    tmp_path / "status_history.jsonl") == 0
    # A learner's setup error (exit 2) the run's last poll missed, a budget of seconds ending first: exit 2, as when
    # the run sees it, not "did not exit cleanly at the stop", exit 1 (a review).
    out = io.StringIO()
    assert _summary(Console(file=out, width=300), "budget spent", 0, {"learner-0": 2, "learner-1": 2, "coordinator": 0},
                    None, sup, tmp_path / "status_history.jsonl") == 2
    text = out.getvalue()
    assert "learner-0, learner-1 cannot run this league (exit 2" in text and "did not exit cleanly" not in text, text


def test_a_run_dir_that_begins_with_a_dash_reaches_every_process_as_a_path(tmp_path, monkeypatch):
    """`league run --run-dir=-x` (relative) gave its children `--shared-root -x/shared`, which their parser took
    for an unknown option: the coordinator exited 2 and the run said "the league cannot run as configured"."""
    from league_cli.main import build_parser

    monkeypatch.chdir(tmp_path)
    run_dir = Path("-x")
    sup = Supervisor(run_dir, run_dir / "config.yaml", RunConfig(), learners=1)
    sup.address = "127.0.0.1:1"
    parser = build_parser()
    argv = sup._coordinator_argv(5)
    coordinator = parser.parse_args(argv[argv.index("coordinator"):])
    assert (coordinator.config, coordinator.shared_root, coordinator.state, coordinator.port_file) == (
        run_dir / "config.yaml", run_dir / "shared", run_dir / "league_state.sqlite", run_dir / "coordinator.port")
    for name, command in (("learner-0", "learner"), ("actor-0", "actor")):
        argv = sup._worker_argv(name)
        assert parser.parse_args(argv[argv.index(command):]).shared_root == run_dir / "shared"


def test_the_processes_run_this_code_not_a_league_cli_in_the_working_directory(tmp_path, monkeypatch):
    """`league run` started in a directory that holds a `league_cli` package (a checkout of another version of the
    project) ran that package as its coordinator, learners and actors: `python -m` puts the working directory
    first on the import path."""
    import subprocess

    from league_cli.processes import league_command

    (tmp_path / "league_cli").mkdir()
    (tmp_path / "league_cli" / "__init__.py").write_text("")
    (tmp_path / "league_cli" / "__main__.py").write_text("print('another league_cli')\n")
    monkeypatch.chdir(tmp_path)
    done = subprocess.run(league_command("--help"), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "usage: league" in done.stdout and "another" not in done.stdout
    # An env module of the user's own there (`python:myenv:make`) is still found, as README says of `league run`,
    # and this project's packages are not taken from there either.
    (tmp_path / "myenv.py").write_text("X = 'the users env'\n")
    (tmp_path / "common").mkdir()
    (tmp_path / "common" / "__init__.py").write_text("raise RuntimeError('another common')\n")
    assert league_command()[1:] == ["-P", "-m", "league_cli"]
    probe = ("from league_cli.processes import working_directory_last; working_directory_last(); "
             "import myenv, common, common.config; print(myenv.X, common.__file__)")
    done = subprocess.run([sys.executable, "-P", "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    users, code = done.stdout.strip().split(" /", 1)
    assert users == "the users env" and not ("/" + code).startswith(str(tmp_path))
    main = (Path(__file__).parents[2] / "league_cli" / "__main__.py").read_text()
    assert main.index("working_directory_last()") < main.index("from league_cli.main import main")



# The child of `league run` (under -P), as an editable install has it: the project's packages come from the
# install's finder, after every entry of sys.path (the test's PYTHONPATH entry for the code is taken out).
_SPAWN_PROBE = """
import multiprocessing, os, sys
from pathlib import Path
import league_cli.processes as processes
root = Path(processes.__file__).resolve().parents[1]
sys.path = [p for p in sys.path if not p or Path(p).resolve() != root]
processes.working_directory_last()
import myenv
child = multiprocessing.get_context("spawn").Process(target=__import__, args=("common.config",))
child.start()
child.join(60)
print(myenv.X, child.exitcode)
"""


def test_env_workers_spawned_by_a_child_do_not_import_the_working_directorys_packages(tmp_path):
    """The subprocess env manager's workers (multiprocessing's spawn) take the actor's sys.path, the working
    directory last on it, and import the project's packages anew: from an editable install, whose finder comes
    after the path's, they imported a `common` in the working directory (a checkout of another version) while
    the actor itself ran this code."""
    import subprocess

    (tmp_path / "myenv.py").write_text("X = 'the users env'\n")
    (tmp_path / "common").mkdir()
    (tmp_path / "common" / "__init__.py").write_text("raise RuntimeError('another common')\n")
    done = subprocess.run([sys.executable, "-P", "-c", _SPAWN_PROBE], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["the", "users", "env", "0"], done.stderr


def _dead(sup: Supervisor, name: str, code: int) -> None:
    """Start `name` as a process that exits with `code` at once, and wait until it has."""
    sup.group.start(name, [sys.executable, "-c", f"import sys; sys.exit({code})"])
    deadline = time.monotonic() + 30
    while sup.group.get(name).alive() and time.monotonic() < deadline:
        time.sleep(0.05)


def test_a_process_that_dies_on_a_full_disk_waits_for_space_uncounted(tmp_path, monkeypatch):
    """A reviewer filled the run directory's disk for 100 s: the coordinator, restarted at once, died at its first
    commit each time, and its fifth restart ended the run 37 s into the fill, while the learners waited the disk
    out. A process that dies while the disk is full now waits for space, said once, then comes back, its
    restart not counted; a coordinator refusing its state there (SQLite's "disk I/O error", exit 2) is no setup
    error (league run's exit 2 said a rerun fails the same way)."""
    from league_cli.run import MAX_WORKER_RESTARTS, SPACE_REMINDER_S

    sup = Supervisor(tmp_path, tmp_path / "league.yaml", RunConfig(), learners=1)
    try:
        sup.address = "127.0.0.1:1"
        _dead(sup, "learner-0", 2)  # (a setup error's code: of the full disk here, as the coordinator's)
        _dead(sup, "coordinator", 2)
        now = time.monotonic()
        sup.restarts["learner-0"] = deque([now] * MAX_WORKER_RESTARTS)  # one more counted would end the run
        with monkeypatch.context() as patch:
            pretend_full_disk(patch)
            events = sup.check()
            full = f"the disk of {tmp_path / 'logs'} is full (0 bytes free), and the logs there may not say why"
            assert sorted(events) == [f"coordinator exited with 2; {full}: restarted once space is free again",
                                      f"learner-0 exited with 2; {full}: restarted once space is free again"], events
            assert sup.check() == [] and not sup.group.get("learner-0").alive()  # waiting, said once
            sup.waiting_for_space["learner-0"] -= SPACE_REMINDER_S  # ... and again now and then
            assert sup.check() == [f"learner-0 still waits for space; {full}"]
        restarted_on: list[int | None] = []
        sup.start_coordinator = lambda port=None: restarted_on.append(port) or sup.address  # (no real one here)
        events = sup.check()  # space is back: its exit 2 was the full disk's, no setup error
        assert sorted(events) == ["coordinator exited with 2; restarted on the same state and port (space is free "
                                  "again)", "learner-0 exited with 2; restarted (space is free again)"], events
        assert restarted_on == [1] and not sup.waiting_for_space
        assert sup.group.get("learner-0").alive() and len(sup.restarts["learner-0"]) == MAX_WORKER_RESTARTS
    finally:
        sup.group.stop(grace_s=5.0)


def test_a_process_still_waiting_for_space_at_the_stop_is_said_so_not_an_unclean_stop(tmp_path, monkeypatch):
    """A worker that died on the full disk and still waited for space when the budget ended was reported as "did
    not exit cleanly at the stop" (its exit code of before; a review): said as what happened, exit 1 still."""
    import io

    from rich.console import Console

    from league_cli.run import _summary

    sup = Supervisor(tmp_path, tmp_path / "league.yaml", RunConfig(), learners=1)
    try:
        _dead(sup, "actor-0", 1)
        with monkeypatch.context() as patch:
            pretend_full_disk(patch)
            sup.check()
        codes = sup.stop()
        out = io.StringIO()
        assert _summary(Console(file=out, width=300), "budget spent", 0, codes, None, sup,
                        tmp_path / "history.jsonl") == 1
        text = out.getvalue()
        assert ("actor-0 died while the run directory's disk was full and still waited for space at the stop" in text
                and "did not exit cleanly" not in text), text
    finally:
        sup.group.stop(grace_s=5.0)


def test_restarts_are_forgiven_after_the_window_and_a_process_dying_fast_ends_the_run(tmp_path, monkeypatch):
    """Counted over the whole run, a worker's sixth crash ended a week-long run however far apart the crashes
    were: restarts older than RESTART_WINDOW_S no longer count."""
    from league_cli.run import MAX_WORKER_RESTARTS, RESTART_WINDOW_S

    sup = Supervisor(tmp_path, tmp_path / "league.yaml", RunConfig(), learners=1)
    try:
        _dead(sup, "learner-0", 1)
        now = time.monotonic()
        sup.restarts["learner-0"] = deque([now - RESTART_WINDOW_S - 1] * MAX_WORKER_RESTARTS)
        assert sup.check() == ["learner-0 exited with 1; restarted (1)"]
        sup.group.stop(grace_s=5.0)
        sup.group.forget(sup.group.get("learner-0"))
        _dead(sup, "learner-0", 1)
        sup.restarts["learner-0"] = deque([now] * MAX_WORKER_RESTARTS)
        with pytest.raises(RuntimeError, match=r"^learner-0 died 6 times in 10 minutes; last log lines"):
            sup.check()
    finally:
        sup.group.stop(grace_s=5.0)


def test_a_stop_that_kills_sweeps_the_shared_memory_its_processes_left(supervisor, tmp_path):
    """An actor killed at the stop (a second Ctrl-C, past its grace) dies with its resource tracker: its env
    managers' /dev/shm blocks stayed until a later subprocess env manager's start swept them (a review)."""
    from actor_service.envs.env_manager import shm_blocks

    ignores = supervisor.group.start("actor-0", [sys.executable, "-c",
                                                 "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                                                 "print('up', flush=True); time.sleep(60)"])
    deadline = time.monotonic() + 10
    while "up" not in ignores.log_tail() and time.monotonic() < deadline:
        time.sleep(0.05)
    swept: list[bool] = []
    real = shm_blocks.remove_orphaned_blocks
    shm_blocks.remove_orphaned_blocks = lambda *a: swept.append(True) or real(*a)
    try:
        supervisor.run_cfg = RunConfig(stop_grace_s=0.5)
        # As `league run` stops: the workers first (their codes then), then everything left. The sweep looked
        # at the second call's codes only, which no longer held the killed actor's.
        codes = supervisor.stop_workers()
        codes.update(supervisor.stop())
    finally:
        shm_blocks.remove_orphaned_blocks = real
    assert codes["actor-0"] == -signal.SIGKILL and swept == [True]
    assert supervisor.hurry.__class__.__name__ == "SignalFlag"  # safe to set from a signal handler


def test_actors_get_the_runs_env_timeouts(tmp_path):
    """An env whose steps rightly take over a minute was killed at every step under `league run`: only `league
    actor --env-step-timeout` could allow it more (a review)."""
    from common.config import from_dict
    from league_cli.main import build_parser

    run_cfg = from_dict(RunConfig, {"env_step_timeout_s": 120, "env_reset_timeout_s": None}, "run")
    sup = Supervisor(tmp_path, tmp_path / "league.yaml", run_cfg, learners=1)
    sup.address = "127.0.0.1:1"
    argv = sup._worker_argv("actor-0")
    args = build_parser().parse_args(argv[argv.index("actor"):])
    assert args.env_step_timeout == 120.0 and args.env_reset_timeout is None
    default = build_parser().parse_args(Supervisor(tmp_path, tmp_path / "l.yaml", RunConfig(), learners=1)
                                        ._worker_argv("actor-0")[argv.index("actor"):])
    assert default.env_step_timeout == 60.0 and default.env_reset_timeout == 300.0  # the actors' own defaults
    with pytest.raises(ConfigError, match=r"run.env_step_timeout_s: must be > 0"):
        from_dict(RunConfig, {"env_step_timeout_s": 0}, "run")
