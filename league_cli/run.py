"""`league run [CONFIG]`: a whole league on this machine, from one command, until its budget is spent.

The topology is the one every deployment uses — one coordinator, one learner per active player, N actors —
started as local processes with the same CLI commands docker compose and Kubernetes run. This file only
supervises: it starts them, restarts a worker that dies (as a cluster would), shows progress from GetStatus,
records the status history, and stops everything in order (actors, learners, coordinator) at the end.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import os
import shlex
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from common import cli_args
from common.closed_output import GuardedOutput
from common.config import ConfigError, from_dict
from common.durable_files import atomic_write
from common.exclusive_lock import ExclusiveLock, LockedError
from common.exit_codes import ADDRESS_IN_USE_EXIT, INTERRUPTED_EXIT, SETUP_ERROR_EXIT
from common.ports import restartable_port
from common.run_config import RunConfig
from common.signal_flag import SignalFlag
from league_cli.history import HistoryLog
from league_cli.log_errors import LogErrors
from league_cli.processes import ManagedProcess, ProcessGroup, league_command
from league_cli.run_monitor import RunMonitor, history_record
from league_service.cli import RUN_PORT_FILE

PORT_WAIT_S = 90.0
CONFIG_FILE = "config.yaml"  # the league a run directory holds (what resuming it uses)
PREVIOUS_CONFIG_FILE = "config.prev.yaml"  # what a resume with another file replaced
PENDING_CONFIG_FILE = "config.pending.yaml"  # the config of a run whose coordinator has not accepted it yet
STATE_FILE = "league_state.sqlite"  # the coordinator's state: the league itself
MAX_WORKER_RESTARTS = 5
SPACE_REMINDER_S = 300.0
"""How often a process waiting for space (`Supervisor._waits_for_space`) is said to wait again."""
RESTART_WINDOW_S = 600.0
"""A process restarted MAX_WORKER_RESTARTS times within this long and dying again ends the run (it keeps dying);
restarts further apart are forgiven. Counted over the whole run, five crashes in a week-long run ended it."""
FRESH_PORT_ATTEMPTS = 3  # free ports tried for the coordinator's first start (one can be taken before the bind)


class PortTakenError(RuntimeError):
    """The coordinator exited because its port was taken (exit 3)."""


class CannotRunLeague(RuntimeError):
    """A process exited with a setup error (exit 2): this league, as configured, cannot run (the coordinator
    refuses the config against the saved state, a learner cannot set up its player's job). `league run` then
    exits 2 as for any config error: a restart, or running it again, fails the same way."""


class StartupInterrupted(Exception):
    """Ctrl-C or SIGTERM before every process was started: `league run` stops what it started and exits 130 (143
    for SIGTERM), as a shell reports a command the signal ended."""


# What the coordinator's exit at start-up means, by its code (otherwise: RuntimeError, a failed start).
_COORDINATOR_START_ERRORS: dict[int, type[RuntimeError]] = {
    ADDRESS_IN_USE_EXIT: PortTakenError,
    SETUP_ERROR_EXIT: CannotRunLeague,
}

def _path_flag(flag: str, path: Path) -> str:
    """`--flag=PATH` as one argument: given as two, a relative path that begins with a dash (`league run
    --run-dir=-x` makes `-x/shared`) was taken by the child's parser for an option, and the coordinator exited
    with a usage error (exit 2: "the league cannot run as configured")."""
    return f"{flag}={path}"


def shell_path(path: Path) -> str:
    """`path` as one word a shell passes on as a file, not an option: quoted, and a relative path that begins
    with a dash made `./-x/...` (`fuser -v -x/league_run.lock` said "Invalid option x"; fuser takes no `--`)."""
    text = str(path)
    return shlex.quote(f"./{text}" if text.startswith("-") else text)


def run_dir_arg(run_dir: Path) -> str:
    """`--run-dir DIR` as a shell takes it, for the commands a message tells the user to run: a directory with a
    space or a quote in its name (`runs/my run`) is quoted, and one that begins with a dash goes after `=` (as two
    words argparse takes it for an option). Printed as they were, such hints failed when pasted."""
    text = shlex.quote(str(run_dir))
    return f"--run-dir={text}" if str(run_dir).startswith("-") else f"--run-dir {text}"


def run_dir_label(run_dir: Path, *, given: bool) -> str:
    """How a message names the run directory: `--run-dir D` when the user gave it, else `run directory D`. The
    default runs/<timestamp> was named `--run-dir` in refusals, a flag the user had not given."""
    return f"--run-dir {run_dir}" if given else f"run directory {run_dir}"


RUN_ENTRIES = frozenset({
    CONFIG_FILE, PREVIOUS_CONFIG_FILE, PENDING_CONFIG_FILE, STATE_FILE, f"{STATE_FILE}-wal", f"{STATE_FILE}-shm",
    f"{STATE_FILE}.lock", "league_run.lock", RUN_PORT_FILE, "shared", "logs", "plots", "status_history.jsonl",
})
"""What `league run` puts in a run directory (`shared` may be there first: a pretrained checkpoint)."""


def _foreign_entries(run_dir: Path) -> list[str]:
    """The entries of an existing `run_dir` that holds something and nothing of a run (hidden files aside, not
    hidden folders): a mistyped --run-dir (a run's `shared` folder, a project's; a home directory, whose `.ssh`
    and `.config` were all it held on a fresh account) started a new league inside it. Else []."""
    try:
        names = sorted(e.name for e in os.scandir(run_dir)
                       if not e.name.startswith(".") or e.is_dir(follow_symlinks=False))
    except OSError:
        return []  # new (made below), or an error the checks below word (a loop of links, a file)
    return [] if RUN_ENTRIES.intersection(names) else names


def _dangling_link(path: Path) -> Path | None:
    """`path` or the first folder above it that is a symlink to nothing (a `runs` link to a disk not mounted), or
    None: making the run directory through one said only "[Errno 17] File exists"."""
    for part in (path, *path.parents):
        if part.is_symlink():
            try:
                part.stat()
            except FileNotFoundError:
                return part
            except OSError:  # a loop of links (ELOOP), a folder it may not search: mkdir's own error says so
                return None
    return None


def learner_stop_timeout(stop_grace_s: float) -> float:
    """A learner's `--stop-timeout` under league run: inside the grace before the kill, with 3 s left for its
    main thread to hand the job back (half the grace when that is under 6 s): a learner killed mid-stop loses
    all it trained since its last checkpoint, and its job waits out a lease."""
    return stop_grace_s - 3.0 if stop_grace_s >= 6.0 else stop_grace_s / 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", nargs="?", type=cli_args.path, default=None,
                        help="league YAML (default: the run directory's own config.yaml when it has one, i.e. "
                             "when resuming; else the embedded connect-four league)")
    parser.add_argument("--run-dir", type=cli_args.path, default=None, help="where checkpoints, logs and state go "
                        "(default: a new runs/<timestamp>, with -2, -3, ... when another run took that one); an existing "
                        "run directory resumes its league")
    parser.add_argument("--actors", type=int, default=None, help="number of actor processes (overrides run.actors)")
    parser.add_argument("--seconds", type=cli_args.positive_seconds, default=None,
                        help="time budget, start-up included (overrides run.seconds; the default league's: 300)")
    parser.add_argument("--env-steps", type=cli_args.non_negative_int, default=None,
                        help="env-step budget (overrides run.env_steps; 0: no limit, the default)")
    parser.add_argument("--quiet", action="store_true",
                        help="no live table; one progress line per interval (the default when output is not a "
                             "terminal)")


def _load(args: argparse.Namespace) -> tuple[Any, RunConfig, dict[str, Any]]:
    from league_service.config import config_to_dict, load_config

    if args.config is not None and Path(args.config).is_dir():  # (the config file error said "Is a directory")
        hint = (f"; to resume the run in it: league run {run_dir_arg(Path(args.config))}"
                if (Path(args.config) / "config.yaml").is_file() else "")
        raise ConfigError("", f"{args.config}: a directory, not a config file{hint}")
    cfg = load_config(args.config)
    run_dict = dict(cfg.run)
    try:  # the file's own section first: it is saved in the run directory, and a resume reads it with no flags
        from_dict(RunConfig, run_dict, "run")
    except ConfigError as err:
        raise ConfigError(err.path, f"{err.message} (in {args.config})" if args.config else err.message) from None
    flags = {"actors": args.actors, "seconds": args.seconds, "env_steps": args.env_steps}
    given = {key: value for key, value in flags.items() if value is not None}
    run_dict.update(given)
    try:
        run_cfg = from_dict(RunConfig, run_dict, "run")
    except ConfigError as err:  # a flag's value: named as the user typed it
        key = err.path.removeprefix("run.")
        if key in given:
            raise ConfigError(f"--{key.replace('_', '-')} (run.{key})", err.message) from None
        raise
    return cfg, run_cfg, config_to_dict(cfg)


def spread_device(device: str, learner: int, gpu_count: Callable[[], int]) -> str:
    """Learner number `learner`'s `--device`: with `auto` or `cuda` on a machine of several GPUs, each learner
    its own in turn (`cuda:learner % gpus`; every learner trained on cuda:0 before, the others idle);
    otherwise `device` as given (cpu, cuda:N, or auto/cuda with at most one GPU). `gpu_count` is asked only for
    auto and cuda."""
    if device in ("auto", "cuda") and (gpus := gpu_count()) > 1:
        return f"cuda:{learner % gpus}"
    return device


@functools.cache
def gpu_count() -> int:
    """GPUs torch sees (CUDA_VISIBLE_DEVICES respected). Without an NVIDIA driver's or ROCm's device file there
    is none, and torch is not imported for nothing (~2 s of `league run`'s start on a CPU-only machine)."""
    if not any(os.path.exists(f) for f in ("/dev/nvidiactl", "/dev/kfd")):
        return 0
    import torch

    return torch.cuda.device_count()


def active_player_count(cfg: Any) -> int:
    return cfg.league.active_player_total


class Supervisor:
    """Starts the processes of one local league and keeps the workers running until told to stop."""

    def __init__(self, run_dir: Path, config_path: Path, run_cfg: RunConfig, learners: int,
                 run_lock: ExclusiveLock | None = None, stop: SignalFlag | threading.Event | None = None) -> None:
        """`run_lock`: the run directory's lock, which every process started shares, so that it is held until
        the last of them has exited: `league run` killed (its children then stop by themselves, which takes
        seconds) must not let a resumed run start beside them, or two learners publish to one player."""
        self.run_dir = run_dir
        self.shared_root = run_dir / "shared"
        self.state_path = run_dir / STATE_FILE
        self.config_path = config_path
        self.run_cfg = run_cfg
        self.learners = learners
        # Many torch processes share few cores here: one math thread each avoids oversubscription, which on
        # two cores costs more than any intra-op parallelism gains.
        self.group = ProcessGroup(run_dir / "logs", env={"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"},
                                  pass_fds=(run_lock.fd,) if run_lock is not None else ())
        self.address = ""
        self.restarts: dict[str, deque[float]] = {}
        """Each process's restarts (time.monotonic()) within the last RESTART_WINDOW_S."""
        self.waiting_for_space: dict[str, float] = {}
        """Processes that died while the run directory's disk was full, restarted once space is back: when it was
        last said (time.monotonic())."""
        self.learner_ports: dict[str, int] = {}
        self.stop_requested = stop
        """Set by Ctrl-C or SIGTERM: a coordinator still starting is not waited for."""
        self.hurry = SignalFlag()
        """Set by a second Ctrl-C while stopping: processes are killed instead of waited for. A SignalFlag, as
        `stop` is: with `threading.Event`, a third signal landing inside the second's `set()` waited for the
        event's lock in its own thread forever (a review hung `league run` so, and a burst of signals ended it
        in a RecursionError with nothing stopped in order)."""
        self.killed_at_stop = False
        """Whether a process was killed at a stop (a second Ctrl-C, a stop past its grace): `stop` then sweeps
        the shared memory its env managers left."""

    def start_coordinator(self, port: int | None = None) -> str:
        """Start the coordinator and wait until it listens; returns its address. On `port` (a restart: the
        workers know that address), else on a free port no outgoing connection can take meanwhile
        (common/ports.py), so that a restart finds it free; a port taken between the look and the bind is
        tried again elsewhere."""
        if port is not None:
            return self._start_coordinator_on(port)
        for _ in range(FRESH_PORT_ATTEMPTS - 1):
            try:
                return self._start_coordinator_on(restartable_port())
            except PortTakenError:
                self.group.forget(self.group.get("coordinator"))
        return self._start_coordinator_on(restartable_port())

    def _start_coordinator_on(self, port: int) -> str:
        port_file = self.run_dir / RUN_PORT_FILE  # what `league status --run-dir` reads
        port_file.unlink(missing_ok=True)
        proc = self.group.start("coordinator", self._coordinator_argv(port))
        deadline = time.monotonic() + PORT_WAIT_S
        while time.monotonic() < deadline:
            if self.stop_requested is not None and self.stop_requested.is_set():
                raise StartupInterrupted("stopped while the coordinator was starting")
            if port_file.exists() and port_file.read_text().strip():
                self.address = f"127.0.0.1:{int(port_file.read_text().strip())}"
                return self.address
            if not proc.alive():
                code = proc.popen.returncode
                full = proc.full_disk_note()
                # On a full disk SQLite cannot even open the state (exit 2, "disk I/O error"): not this league's
                # configuration, which a rerun with space back runs (league run's exit 2 says it would not).
                error = RuntimeError if full else _COORDINATOR_START_ERRORS.get(code, RuntimeError)
                raise error(f"the coordinator exited ({code}){full}:\n{proc.last_words()}")
            time.sleep(0.1)  # a child process's file: nothing to wait on but the file system
        raise RuntimeError(f"the coordinator did not report its port within {PORT_WAIT_S:.0f} s"
                           f"{proc.full_disk_note()}:\n{proc.last_words()}")

    def _coordinator_argv(self, port: int) -> list[str]:
        # No drain: the coordinator is stopped after every worker (`stop`), so nothing is left to answer, and
        # the default's second was a second of every stop.
        return league_command(
            "coordinator", _path_flag("--config", self.config_path), _path_flag("--shared-root", self.shared_root),
            _path_flag("--state", self.state_path), "--host", "127.0.0.1", "--port", str(port),
            _path_flag("--port-file", self.run_dir / RUN_PORT_FILE), "--drain", "0")

    def _worker_argv(self, name: str) -> list[str]:
        common = ["--coordinator", self.address, _path_flag("--shared-root", self.shared_root), "--worker-id", name]
        if name.startswith("learner"):
            # A restarted learner keeps its address, as a StatefulSet pod or a compose service would: collect
            # jobs already handed out name that endpoint.
            port = self.learner_ports.setdefault(name, restartable_port())
            device = spread_device(self.run_cfg.learner_device, int(name.removeprefix("learner-")), gpu_count)
            argv = league_command("learner", *common, "--host", "127.0.0.1", "--port", str(port), "--device", device,
                                  "--env-build-timeout", _seconds_arg(self.run_cfg.env_reset_timeout_s))
            stop_timeout = learner_stop_timeout(self.run_cfg.stop_grace_s)
            if stop_timeout > 0:  # `run.stop_grace_s: 0` kills at once: no backstop fits, and 0 is no --stop-timeout
                argv += ["--stop-timeout", f"{stop_timeout:g}"]
            return argv
        run_cfg = self.run_cfg
        argv = league_command("actor", *common, "--manager", run_cfg.manager,
                              "--env-max-retry", str(run_cfg.env_max_retry),
                              "--env-step-timeout", _seconds_arg(run_cfg.env_step_timeout_s),
                              "--env-reset-timeout", _seconds_arg(run_cfg.env_reset_timeout_s))
        if self.run_cfg.manager == "subprocess":
            argv += ["--env-cpus", str(self.env_cpus_per_actor())]
        if self.run_cfg.env_num_per_actor:
            argv += ["--env-num", str(self.run_cfg.env_num_per_actor)]
        return argv

    def env_cpus_per_actor(self) -> int:
        """Each actor's share of this machine's CPUs, what its subprocess env manager sizes itself for. Sized
        for the whole machine, every actor started CPUs - 1 env workers and busy-waited for them as if alone
        (2 actors on 2 CPUs, envs of 1 ms a step: 1,130-1,160 env steps/s, against 1,260-1,290 with a share)."""
        return max(1, len(os.sched_getaffinity(0)) // self.run_cfg.actors)

    def worker_names(self) -> list[str]:
        return [f"learner-{i}" for i in range(self.learners)] + [f"actor-{i}" for i in range(self.run_cfg.actors)]

    def start_workers(self, stop: SignalFlag | threading.Event | None = None) -> None:
        """Start every learner and actor; a stop meanwhile starts no more (`StartupInterrupted`)."""
        for name in self.worker_names():
            if stop is not None and stop.is_set():
                raise StartupInterrupted("stopped during start-up")
            self.group.start(name, self._worker_argv(name))

    def check(self) -> list[str]:
        """Restart processes that died (the coordinator too), or wait for space for them (`_waits_for_space`);
        raise for a setup error (exit 2) or too many restarts. Returns what happened, for the log."""
        events = []
        for proc in self.group.dead():
            if (waiting := self._waits_for_space(proc)) is not None:
                events += [waiting] if waiting else []
                continue
            if proc.name == "coordinator":
                events.append(self._restart_coordinator(proc))
                continue
            if proc.popen.returncode == SETUP_ERROR_EXIT and proc.name not in self.waiting_for_space:
                raise CannotRunLeague(f"{proc.name} cannot run this league (exit {SETUP_ERROR_EXIT}: bad arguments "
                                      f"or a job it cannot set up, which a restart does not fix); last log lines:\n"
                                      f"{proc.last_words()}")
            counted = self._count_restart(proc)
            moved = ""
            if proc.name.startswith("learner") and proc.popen.returncode == ADDRESS_IN_USE_EXIT:
                # Its port was taken meanwhile (by another program): on a free one, once it is bound again, the
                # coordinator revokes the collect jobs that stream to the old address and offers them again.
                # (Otherwise it keeps its port.)
                old_port = self.learner_ports[proc.name]
                self.learner_ports[proc.name] = restartable_port()
                moved = f" on port {self.learner_ports[proc.name]} (its port {old_port} was taken)"
            exited = proc.exit_words()  # (read before the restart writes its mark into the same log)
            proc.kill_group()  # env workers a crashed actor left behind
            self.group.forget(proc)
            self.group.start(proc.name, self._worker_argv(proc.name))
            events.append(f"{proc.name} {exited}; restarted{moved} {counted}")
        return events

    def _waits_for_space(self, proc: ManagedProcess) -> str | None:
        """None when `proc` (dead) is to be restarted now. A process that died while the run directory's disk is
        full (or its quota spent) waits instead: restarted at once, it died the same way (a coordinator at its
        first commit), and five such restarts ended the run, while the learners wait a full disk out and the
        budget goes on. Restarted once space is back, uncounted. Returns the event to show ("": said already)."""
        full = proc.full_disk_note()
        if not full:
            return None
        now = time.monotonic()
        said = self.waiting_for_space.get(proc.name)
        if said is None:
            self.waiting_for_space[proc.name] = now
            return f"{proc.name} {proc.exit_words()}: restarted once space is free again"
        if now - said < SPACE_REMINDER_S:
            return ""
        self.waiting_for_space[proc.name] = now  # (a disk that stays full: said again now and then, not once)
        return f"{proc.name} still waits for space{full}"

    def _count_restart(self, proc: ManagedProcess) -> str:
        """Count a restart of `proc` (none after a wait for space); raise when it keeps dying. Returns what to
        say of it: "(N)", its restarts within the window, this one included."""
        recent = self.restarts.setdefault(proc.name, deque())
        if proc.name in self.waiting_for_space:  # it died of the full disk
            del self.waiting_for_space[proc.name]
            return "(space is free again)"
        now = time.monotonic()
        while recent and now - recent[0] > RESTART_WINDOW_S:
            recent.popleft()
        if len(recent) >= MAX_WORKER_RESTARTS:
            who = "the coordinator" if proc.name == "coordinator" else proc.name
            raise RuntimeError(f"{who} died {len(recent) + 1} times in {RESTART_WINDOW_S / 60:.0f} minutes"
                               f"{proc.full_disk_note()}; last log lines:\n{proc.last_words()}")
        recent.append(now)
        return f"({len(recent)})"

    def _restart_coordinator(self, proc: ManagedProcess) -> str:
        """A crashed coordinator comes back on the same state and port: it loses nothing it acknowledged
        (README: faults it survives), and the workers, which keep retrying that address, carry on."""
        code = proc.popen.returncode
        # (Not after a wait for space: SQLite says "disk I/O error" where it cannot make its files, exit 2.)
        if code == SETUP_ERROR_EXIT and proc.name not in self.waiting_for_space:
            raise CannotRunLeague(f"the coordinator cannot run this league (exit {code}):\n{proc.last_words()}")
        counted = self._count_restart(proc)
        exited = proc.exit_words()  # (read before the restart writes its mark into the same log)
        proc.kill_group()
        self.group.forget(proc)
        try:
            self.start_coordinator(port=int(self.address.rpartition(":")[2]))
        except RuntimeError:  # (CannotRunLeague too)
            restarted = self.group.get("coordinator")
            if restarted.alive() or not restarted.full_disk_note():
                raise
            # (Dead, in the group: `check` restarts it with space back.)
            self.waiting_for_space["coordinator"] = time.monotonic()
            return f"coordinator {exited}; its restart {restarted.exit_words()}: restarted once space is free again"
        return f"coordinator {exited}; restarted on the same state and port {counted}"

    def wait_for_setup_errors(self, grace_s: float, stop: SignalFlag | threading.Event) -> list[str]:
        """Keep checking the workers for up to `grace_s`, so a setup-error exit on its way raises from `check`."""
        events: list[str] = []
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and not stop.is_set():
            events += self.check()
            stop.wait(0.2)
        return events + self.check()

    def stop_workers(self) -> dict[str, int]:
        """Stop the actors, then the learners (their last results and checkpoints reach the coordinator). The
        group forgets them once stopped: a process group stopped and reaped is not signalled again (its id may
        belong to another one by then)."""
        codes: dict[str, int] = {}
        for kind in ("actor", "learner"):
            procs = [p for p in self.group.processes if p.name.split("-")[0] == kind]
            codes.update(self.group.stop(procs, self.run_cfg.stop_grace_s, self.hurry))
            for p in procs:
                self.group.forget(p)
        self.killed_at_stop |= -signal.SIGKILL in codes.values()
        return codes

    def stop(self) -> dict[str, int]:
        """Stop everything: the workers, then the coordinator. An actor killed (a second Ctrl-C, a stop past its
        grace) died with its resource tracker, and its env managers' shared-memory blocks stayed in /dev/shm
        until some later subprocess env manager's start-up swept them: swept here, every owner being gone (also
        when the workers were stopped before, by `stop_workers`: only the coordinator's code was looked at)."""
        codes = self.stop_workers()
        codes.update(self.group.stop(grace_s=self.run_cfg.stop_grace_s, hurry=self.hurry))
        if self.killed_at_stop or -signal.SIGKILL in codes.values():
            from actor_service.envs.env_manager.shm_blocks import remove_orphaned_blocks

            remove_orphaned_blocks()
        return codes


def _final_status(address: str, token: str | None, history_path: Path, start: float, last: Any) -> Any:
    """The league's status after its workers stopped (their last results, snapshots and checkpoints counted),
    appended to the history, so that plots and `league eval --run-dir` see where the run ended; `last` if the
    coordinator does not answer."""
    import grpc

    from common.proto.league.v1 import league_pb2, league_pb2_grpc
    from common.rpc import make_channel
    from league_service.status import STATUS_MAX_BYTES

    channel = make_channel(address, token=token, max_message_bytes=STATUS_MAX_BYTES)
    try:
        status = league_pb2_grpc.LeagueServiceStub(channel).GetStatus(league_pb2.GetStatusRequest(), timeout=5.0)
    except grpc.RpcError:
        return last
    finally:
        channel.close()
    now = time.monotonic()
    with HistoryLog(history_path) as history:
        history.offer(functools.partial(history_record, status, now - start), now)
    return status


def run_main(args: argparse.Namespace) -> int:

    from league_service.status_view import status_console

    console = status_console()
    console.file = GuardedOutput(console.file)  # (guarded from its first line: see stop_on_closed_output)
    loaded = None
    fresh = args.run_dir is None  # a new directory of its own under runs/ (made below, once the config is read)
    run_dir = args.run_dir or Path("runs") / datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    pending = run_dir / PENDING_CONFIG_FILE
    from_pending = not fresh and _uses_pending_config(args, run_dir)
    if from_pending:
        if pending.stat().st_size == 0:  # (once written in place, and cut short by a full disk)
            console.print(f"league run: {pending} is empty (the run that created {run_dir} could not write its "
                          f"config): give the config again, `league run CONFIG {run_dir_arg(run_dir)}`",
                          style="red", markup=False, soft_wrap=True)
            return 2
        args.config = pending
    if args.config is not None or fresh or not (run_dir / CONFIG_FILE).is_file():
        # Checked before anything is created: a typo (in the file or a flag) makes no run directory. A directory
        # that holds a league is resumed with its own config, read below under its lock.
        try:
            loaded = _load(args)
        except ConfigError as err:
            console.print(f"league run: config error: {err}", style="red", markup=False, soft_wrap=True)
            return 2
    from common.rpc import load_token

    try:
        # The processes inherit the environment: with $LEAGUE_TOKEN set the coordinator checks it, so this
        # process's own status calls carry it too. A malformed one was a traceback once the directory existed.
        token = load_token(None)
    except ValueError as err:
        console.print(f"league run: {err}", style="red", markup=False, soft_wrap=True)
        return 2
    where = run_dir_label(run_dir, given=not fresh)
    if not fresh and (foreign := _foreign_entries(run_dir)):
        listed = ", ".join(foreign[:4]) + (f" and {len(foreign) - 4} more" if len(foreign) > 4 else "")
        console.print(f"league run: {where} holds no league run but other things ({listed}): not used, so that "
                      "nothing of a run is written among them; give the directory of a run to resume, or a new or "
                      "empty one", style="red", markup=False, soft_wrap=True)
        return 2
    # (mkdir said only "[Errno 17] File exists"; `shared` too: a link to a checkpoint disk not mounted)
    if (link := _dangling_link(run_dir / "shared")) is not None:
        console.print(f"league run: {where}{'' if link == run_dir else f': {link}'} is a link to "
                      f"{os.readlink(link)}, which does not exist", style="red", markup=False, soft_wrap=True)
        return 2
    try:
        if fresh:
            run_dir = _make_fresh_run_dir(run_dir)
        (run_dir / "shared").mkdir(parents=True, exist_ok=True)
        # One run per directory: a second would overwrite this one's config, checkpoints and history.
        run_lock = ExclusiveLock(run_dir / "league_run.lock", f"run directory {run_dir}")
    except LockedError as err:
        console.print(f"league run: {err} (or, if that `league run` is gone, the processes it "
                      f"started are still stopping: try again in a few seconds; `fuser -v "
                      f"{shell_path(run_dir / 'league_run.lock')}` lists them)", style="red", markup=False, soft_wrap=True)
        return 2
    except OSError as err:
        # A file where a folder goes: said so (errno 17 said "File exists", errno 20 named the path below it).
        bad = run_dir / "shared" if run_dir.is_dir() else run_dir
        if isinstance(err, FileExistsError | NotADirectoryError) and bad.exists() and not bad.is_dir():
            err = OSError(f"{bad} is a file, not a directory" + (": a run keeps its checkpoints there"
                                                                  if bad != run_dir else ""))
        console.print(f"league run: {where}: {err}", style="red", markup=False, soft_wrap=True)
        return 2
    with run_lock:
        if from_pending:
            console.print(f"league run: {run_dir} holds no league yet; starting with {pending}, the config of the "
                          "run that created the directory (it stopped before its coordinator was up)", markup=False, soft_wrap=True)
        if (half := _half_a_league(run_dir, given_config=args.config is not None)) is not None:
            console.print(f"league run: {half}", style="red", markup=False, soft_wrap=True)
            return 2
        saved = run_dir / CONFIG_FILE
        if args.config is None and saved.is_file():
            args.config = saved  # resuming: the league this directory holds, not the embedded default
            console.print(f"league run: resuming with {saved}", markup=False, soft_wrap=True)
            if taken := defaults_taken(saved):
                console.print(f"league run: {saved} does not set {taken}: this version's defaults apply (keys "
                              "added since an earlier version wrote it)", markup=False, soft_wrap=True)
            loaded = None
        if loaded is None:
            try:
                loaded = _load(args)
            except ConfigError as err:
                console.print(f"league run: config error: {err}", style="red", markup=False, soft_wrap=True)
                return 2
        mismatch = (_saved_league_mismatch(run_dir, args.config, loaded[0])
                    or _saved_model_mismatch(run_dir, args.config, loaded[0]))
        if mismatch is not None:
            console.print(f"league run: config error: {mismatch}", style="red", markup=False, soft_wrap=True)
            return 2
        return _run(args, console, *loaded, run_dir, run_lock, token)


FRESH_RUN_DIR_ATTEMPTS = 100


def _make_fresh_run_dir(base: Path) -> Path:
    """Make and return a directory no other run uses: `base` (runs/<timestamp>), else `base-2`, `base-3`, ...

    Why: the default run directory is named after the second a run starts, and two `league run`s without
    --run-dir started in the same second (a script starting two leagues) both chose it: the second was refused
    with "run directory runs/... is in use", a directory it had not been given. `mkdir` either makes a directory or
    finds it there, so two runs never get the same one."""
    base.parent.mkdir(parents=True, exist_ok=True)
    for attempt in range(1, FRESH_RUN_DIR_ATTEMPTS + 1):
        candidate = base if attempt == 1 else base.with_name(f"{base.name}-{attempt}")
        try:
            candidate.mkdir()
        except FileExistsError:
            continue
        return candidate
    raise FileExistsError(f"{base} and {FRESH_RUN_DIR_ATTEMPTS - 1} directories named after it exist already: "
                          "give --run-dir")


def _uses_pending_config(args: argparse.Namespace, run_dir: Path) -> bool:
    """Whether `run_dir` is to start with its pending config: its first run was killed (kill -9, a power cut) or
    interrupted before its coordinator was up and had taken the config, so no league trained and the config is
    still pending. Going on without it started the embedded league in its place, unsaid. A state there that
    played a game or holds a checkpoint decides instead, as for any resume (the pending file may be another
    league's); one made in that last instant of the start-up (no game, no checkpoint) takes the pending config."""
    if args.config is not None or not (run_dir / PENDING_CONFIG_FILE).is_file() or (run_dir / CONFIG_FILE).is_file():
        return False
    state = run_dir / STATE_FILE
    if not state.exists():
        return True
    import sqlite3

    from league_service.store import stored_league_trained, stored_league_type

    try:
        if stored_league_type(state) is None:  # no league in it yet (killed as the coordinator created the file)
            return True
    except (sqlite3.DatabaseError, OSError):
        return False  # no league state at all: the coordinator's refusal says so
    return not stored_league_trained(state)


def _half_a_league(run_dir: Path, given_config: bool) -> str | None:
    """Why `run_dir` holds half a league, which a run must not take for a whole one; None when it does not.

    - Its config.yaml (written once a coordinator took the config, so the directory held a league) without a
      league in its state (deleted, emptied): the run started a new league over the old one's checkpoints and
      history, said only in the coordinator's log, and said "resuming" for an emptied file (a review).
    - A league in its state without its config.yaml, and no CONFIG: the run went on with the embedded default's
      settings (learning, snapshot and PFSP rules: what the state does not hold), unsaid, and wrote them as the
      directory's config.yaml (a review)."""
    import sqlite3

    from league_service.store import stored_league_type

    state, own = run_dir / STATE_FILE, run_dir / CONFIG_FILE
    try:
        league_type = stored_league_type(state)
    except (sqlite3.DatabaseError, OSError, ValueError):
        return None  # not a state file the coordinator can use: it says what is wrong with it
    if own.is_file() and league_type is None:
        what = "missing" if not state.exists() else "empty" if state.stat().st_size == 0 else "without a league"
        return (f"{run_dir} held a league (it has its {CONFIG_FILE}), but its state {state} is {what}: its payoff, "
                f"ratings and historical players are gone, and this run would start a new league over its "
                f"checkpoints and history. To do that anyway, move its {CONFIG_FILE} aside and give it as CONFIG: `mv "
                f"{shell_path(own)} {shell_path(own.with_name('config.old.yaml'))} && league run "
                f"{shell_path(own.with_name('config.old.yaml'))} {run_dir_arg(run_dir)}`; or use a new --run-dir")
    if league_type is not None and not own.is_file() and not given_config:
        others = [name for name in (PENDING_CONFIG_FILE, PREVIOUS_CONFIG_FILE) if (run_dir / name).is_file()]
        where = f" ({' or '.join(str(run_dir / n) for n in others)} may be it)" if others else ""
        return (f"{run_dir} holds a league (its state {state}) but not its {CONFIG_FILE}: give the league's config "
                f"as CONFIG{where}, `league run CONFIG {run_dir_arg(run_dir)}`; without it the run would go on with "
                "the embedded league's settings")
    return None


def _saved_league_mismatch(run_dir: Path, config: Path | None, cfg: Any) -> str | None:
    """Why the league saved in `run_dir` cannot go on with `cfg` (read from `config`, None: the embedded
    default): it is of another league type. None when it can, or when there is no league there yet. The
    coordinator refuses such a state too, but only once started, and its exit looked like a crash (exit 1)."""
    import sqlite3

    from league_service.store import stored_league_type

    state = run_dir / STATE_FILE
    try:
        saved = stored_league_type(state)
    except (sqlite3.DatabaseError, OSError, ValueError):
        return None  # not a state file the coordinator can use: it says what is wrong with it
    given = cfg.league.league_type
    if saved is None or saved == given:
        return None
    own = run_dir / CONFIG_FILE
    hint = (f"`league run {run_dir_arg(run_dir)}` and no CONFIG (it resumes with its own {own})"
            if own.is_file() and config != own else "the config the league was made with")
    return (f"league.league_type: the saved league is {saved!r} (in {state}), the config "
            f"({config or 'the embedded default'}) says {given!r}: resume it with {hint}, or start another league "
            "in a new --run-dir")


def _saved_model_mismatch(run_dir: Path, config: Path | None, cfg: Any) -> str | None:
    """Why the league saved in `run_dir` cannot go on with `cfg` (read from `config`, another file than the
    directory's own config.yaml): another env, other active players, a reference bot gone, or a model its
    checkpoints do not fit. Only the learners found
    out, after the coordinator had accepted the config and the directory's config.yaml had been replaced by it,
    so running the directory again failed the same way. Settings that shape no weights (activation, obs_scale,
    value_bound, the algorithm's hyperparameters) may change."""
    from league_service.config import load_config, reference_bot_id
    from league_service.league_identity import LeagueIdentity
    from league_service.store import stored_league_trained

    own = run_dir / CONFIG_FILE
    if config is None or not own.is_file() or not (run_dir / STATE_FILE).is_file():
        return None
    try:
        if Path(config).resolve() == own.resolve():
            return None
        saved = load_config(own)
        change = LeagueIdentity.of(saved).first_change(LeagueIdentity.of(cfg))
    except (ConfigError, OSError, ValueError):
        return None  # not a config to compare with: the coordinator and learners say what is wrong
    if change is not None and not stored_league_trained(run_dir / STATE_FILE):
        change = None  # no game, no checkpoint (its env did not build, say): nothing is bound to the old one
    resume = (f"resume it with `league run {run_dir_arg(run_dir)}` (its own {own}), or start another league in a new "
              "--run-dir")
    if change is not None and change[0] == "env.name":
        return (f"env.name: the league in {run_dir} was trained on {saved.env.name!r}, the config ({config}) says "
                f"{cfg.env.name!r}: {resume}")
    old_league, new_league = saved.league, cfg.league
    for key in ("player_category", "active_players"):  # which active players exist: fixed when a league starts
        old, new = getattr(old_league, key), getattr(new_league, key)
        # (A player type with a count of 0 adds no player: `naive_sp_player: 0` written out is the same league,
        # which the coordinator takes; it was refused here.)
        if (sorted(old) if key == "player_category" else {t: n for t, n in old.items() if n}) != (
                sorted(new) if key == "player_category" else {t: n for t, n in new.items() if n}):
            return (f"league.{key}: the league in {run_dir} has {old!r}, the config ({config}) says {new!r}; a "
                    f"league's active players are fixed when it starts: {resume}")
    # By the bot each names, as the coordinator compares them: `mcts:025` is `mcts:25`, `mcts` is `mcts:100`
    # (compared as text, the same bot respelled was refused as "gone"; a review).
    kept = {reference_bot_id(bot) for bot in new_league.reference_bots}
    dropped = [bot for bot in old_league.reference_bots if reference_bot_id(bot) not in kept]
    if dropped:
        return (f"league.reference_bots: {dropped} play in the league in {run_dir} but not in the config "
                f"({config}); a league member cannot leave (bots may be added): {resume}")
    if change is not None:
        key, old, new = change
        which = ("another game than its checkpoints' and payoff's" if "game_params" in key
                 else "which its checkpoints do not fit")
        return f"{key}: the league in {run_dir} was trained with {old!r}, the config ({config}) says {new!r}, {which}: {resume}"
    return None


def job_size_note(job_env_steps: int, budget_env_steps: int) -> str | None:
    """What to say when one collect job may play more env steps than the run's whole env-step budget: env steps
    count as jobs finish, so the run cannot stop before the first ones end."""
    if not budget_env_steps or job_env_steps <= budget_env_steps:
        return None
    return (f"a collect job plays up to {job_env_steps:,} env steps (env.env_steps) and env steps count as jobs "
            f"finish: the first jobs overshoot the budget of {budget_env_steps:,}")


def config_changes(saved: Path, new: dict[str, Any], shown: int = 8) -> str:
    """What `new` changes of the config saved at `saved`, as "key: old -> new" (dotted keys, the first `shown`);
    "" when nothing (or nothing readable is saved).

    The saved file is read as this version loads it, so a key it lacks has this version's default: a key a
    newer version added (run.learner_device, say) is no change unless `new` sets another value, and a key the
    user added (`env.kwargs.max_episode_steps`) is one. Read raw, every key the saved file lacked was skipped,
    so an added kwarg replaced config.yaml silently. A saved file this version cannot load is read raw, its
    missing keys skipped as before."""
    try:
        old = yaml.safe_load(saved.read_text())
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return ""
    if not isinstance(old, dict):
        return ""
    loaded = _loaded_config_dict(saved)
    before, after = _flat(loaded if loaded is not None else old), _flat(new)
    unset = "(unset)"
    keys = [k for k in sorted(before.keys() | after.keys())
            if before.get(k, unset) != after.get(k, unset) and (loaded is not None or k in before)
            and not _map_filled_or_emptied(k, before, after)]
    text = ", ".join(f"{k}: {before.get(k, unset)} -> {after.get(k, unset)}" for k in keys[:shown])
    return text + (f" and {len(keys) - shown} more" if len(keys) > shown else "")


def defaults_taken(saved: Path, shown: int = 8) -> str:
    """The keys the config saved at `saved` lacks, as "key (value)" with this version's default (the first
    `shown`); "" for none. `league run` writes every key into a run directory's config.yaml, so a key missing there
    was added by a later version: its default changes the league resumed without a word otherwise (reference bots
    joining the league's opponents, weight averaging starting; an upgrade review)."""
    try:
        raw = yaml.safe_load(saved.read_text())
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return ""
    loaded = _loaded_config_dict(saved)
    if not isinstance(raw, dict) or loaded is None:
        return ""
    given, defaults = _flat(raw), _flat(loaded)
    keys = [k for k in defaults if k not in given and not any(k.startswith(g + ".") for g in given)]
    text = ", ".join(f"{k} ({defaults[k]})" for k in keys[:shown])
    return text + (f" and {len(keys) - shown} more" if len(keys) > shown else "")


def _loaded_config_dict(path: Path) -> dict[str, Any] | None:
    """The config at `path` as this version loads it (defaults filled in), or None if it does not load."""
    from league_service.config import config_to_dict, load_config

    try:
        return config_to_dict(load_config(path))
    except (ConfigError, OSError, ValueError):
        return None


def _map_filled_or_emptied(key: str, before: dict[str, Any], after: dict[str, Any]) -> bool:
    """Whether `key` is an empty map on one side whose entries the other side names as keys of their own
    (`env.kwargs: {}` against `env.kwargs.max_episode_steps: 400`): the entries say the change, not a
    "{} -> (unset)" line."""
    prefix = key + "."
    for mine, other in ((before, after), (after, before)):
        if mine.get(key) == {} and key not in other and any(k.startswith(prefix) for k in other):
            return True
    return False


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _seconds_arg(seconds: float | None) -> str:
    """A timeout as the workers' flags take it: 'none' for no limit."""
    return "none" if seconds is None else repr(float(seconds))


def stop_on_closed_output(console: Any, on_closed: Callable[[], None]) -> None:
    """When the console's reader goes away (`league run | tee` at a Ctrl-C, `| head`) or its terminal does (EIO),
    write nowhere from then on and call `on_closed` (the run stops in order, as at SIGHUP); a full disk under a
    redirected output loses lines, not the run (`GuardedOutput`). Rich's default raised SystemExit(1) from the
    next print, and any other write error escaped it: from the print saying the workers are stopping, it skipped
    their ordered stop, the last status record and the summary (every process got the parent-death signal at
    once; reviews)."""
    output = console.file
    if not isinstance(output, GuardedOutput):
        output = console.file = GuardedOutput(output)
    output.on_closed(on_closed)


def _run(args: argparse.Namespace, console: Any, cfg: Any, run_cfg: RunConfig, cfg_dict: dict[str, Any],
         run_dir: Path, run_lock: ExclusiveLock, token: str | None) -> int:
    """`token`: $LEAGUE_TOKEN, which the coordinator checks (it inherits the environment): without it on this
    process's own status calls every poll was refused and the run went blind (no progress, no history, no
    env-step budget)."""
    from common.proto.league.v1 import league_pb2_grpc
    from common.rpc import make_channel
    from league_service.status import STATUS_MAX_BYTES

    # The run directory's config.yaml is replaced only once the coordinator has accepted this config: one it
    # refuses (another league type than the saved state's) must not make the directory describe another league.
    config_path = run_dir / CONFIG_FILE
    pending_path = run_dir / PENDING_CONFIG_FILE
    changes = config_changes(config_path, cfg_dict)
    if changes:  # a resume with another file: it printed nothing, and the old config was gone (a review)
        console.print(f"league run: resuming the league in {run_dir} with {args.config}, which changes its "
                      f"{CONFIG_FILE}: {changes}; once the coordinator takes it, the old file is kept as "
                      f"{PREVIOUS_CONFIG_FILE}", markup=False,
                      soft_wrap=True)
    try:  # (atomic: a full disk left an empty file, which the next run took for a config)
        atomic_write(pending_path, yaml.safe_dump(cfg_dict, sort_keys=False).encode())
    except OSError as err:
        console.print(f"league run: {run_dir_label(run_dir, given=args.run_dir is not None)}: cannot write "
                      f"{PENDING_CONFIG_FILE}: {err}", style="red", markup=False, soft_wrap=True)
        return 2
    if not (run_dir / STATE_FILE).exists():  # said as resuming is: a mistyped resume started afresh unsaid
        source = args.config if args.config is not None else f"the embedded {cfg.env.name} league"
        console.print(f"league run: a new league in {run_dir}, from {source}", markup=False, soft_wrap=True)
    history_path = run_dir / "status_history.jsonl"
    quiet = args.quiet or not console.is_terminal  # a live table piped to a file shows only at the end

    stop = SignalFlag()
    reason = ["budget spent"]
    previous_config: bytes | None = None  # config.yaml as it was, once a CONFIG that changes it replaced it

    signals: list[int] = []
    stopping = [False]

    def on_signal(signum: int, _frame: object) -> None:
        if signum == signal.SIGHUP:
            # Its terminal is gone (a closed window, a dropped ssh session): the run stops in order as for
            # SIGTERM, writing nowhere (writes to a hung-up terminal fail, and would end the stop half way).
            # Unhandled, it ended `league run` at once and its children on the parent-death signal, all together:
            # actors' last results could reach a coordinator already gone.
            console.file = open(os.devnull, "w")  # noqa: SIM115 (held until the process exits)
        if signals:  # a second Ctrl-C (or SIGTERM): what is still stopping is killed instead of waited for
            sup.hurry.set()
        elif not stopping[0]:  # (one during a stop for the budget or an error leaves the reason as it is)
            reason[0] = f"stopped by {signal.Signals(signum).name}"
        signals.append(signum)
        stop.set()

    output_closed = [False]

    def on_output_closed() -> None:
        output_closed[0] = True
        if not signals and not stopping[0]:
            reason[0] = "stopped: its output was closed"
        stop.set()

    stop_on_closed_output(console, on_output_closed)
    try:
        sup = Supervisor(run_dir, pending_path, run_cfg, learners=active_player_count(cfg), run_lock=run_lock,
                         stop=stop)
    except OSError as err:  # (its logs directory: `logs` a file, no room, no permission) nothing started yet
        console.print(f"league run: {run_dir_label(run_dir, given=args.run_dir is not None)}: cannot make its logs "
                      f"directory: {err}", style="red", markup=False, soft_wrap=True)
        pending_path.unlink(missing_ok=True)
        return 2
    # (Put back only once the summary is printed: a Ctrl-C during it ended the run with exit 130, no plots and
    # no lines saying where the results are.)
    # (SIGHUP only where it is not ignored: under `nohup` a closed terminal must not stop the run.)
    handled = [signal.SIGINT, signal.SIGTERM] + ([signal.SIGHUP] if signal.getsignal(signal.SIGHUP) is not
                                                  signal.SIG_IGN else [])
    previous = {s: signal.signal(s, on_signal) for s in handled}
    try:
        status = None
        start: float | None = None
        started_all = False  # every process started once: from then on a stop is a stop, not an interrupted start
        log_errors = LogErrors()
        exit_code = 0
        try:
            console.print(f"league run: {run_dir} · {sup.learners} learner(s), {run_cfg.actors} actor(s), "
                          f"budget {run_cfg.seconds:.0f} s" + (f" / {run_cfg.env_steps:,} env steps" if run_cfg.env_steps else ""), markup=False, soft_wrap=True)
            if (note := job_size_note(cfg.env.env_steps, run_cfg.env_steps)) is not None:
                console.print(f"league run: {note}", style="yellow", markup=False, soft_wrap=True)
            from league_service.config import battle_only_note, greedy_dqn_note
            from league_service.env_fit import cut_episodes_note

            for note in (greedy_dqn_note(cfg), cut_episodes_note(cfg), battle_only_note(cfg)):
                if note is not None:
                    console.print(f"league run: {note}", style="yellow", markup=False, soft_wrap=True)
            launched = time.monotonic()  # the budget counts start-up too
            address = sup.start_coordinator()
            if changes:
                previous_config = config_path.read_bytes()
                atomic_write(run_dir / PREVIOUS_CONFIG_FILE, previous_config)
            os.replace(pending_path, config_path)
            sup.config_path = config_path
            start = launched  # (None until the coordinator is up: then there is a final status to record)
            console.print(f"coordinator listening on {address} (league status {run_dir_arg(run_dir)})", markup=False, soft_wrap=True)
            sup.start_workers(stop)
            started_all = True
            channel = make_channel(address, token=token, max_message_bytes=STATUS_MAX_BYTES)
            monitor = RunMonitor(sup, league_pb2_grpc.LeagueServiceStub(channel), console, run_cfg, history_path,
                                 start, quiet, log_errors)
            try:
                early = monitor.run(stop)
            finally:
                status = monitor.status
                channel.close()
            if early is not None:
                reason[0], exit_code = early.reason, early.exit_code
        except StartupInterrupted:
            if not started_all:
                reason[0] += " during start-up"
                # 130 for Ctrl-C, 143 for SIGTERM; a reader gone (`league run | head -2`) is no interrupt: 0, as
                # once every process started (it exited 130, the Ctrl-C code, with no signal; a review)
                exit_code = 128 + signals[0] if signals else 0 if output_closed[0] else INTERRUPTED_EXIT
            else:  # while a crashed coordinator was restarted: a stop like any other once the league ran
                reason[0] += " while the coordinator restarted"
        except RuntimeError as err:
            console.print(f"league run: {err}", style="red", markup=False, soft_wrap=True)  # (log lines may hold [brackets])
            setup_error = isinstance(err, CannotRunLeague)
            reason[0] = "the league cannot run as configured" if setup_error else "a process failed"
            exit_code = 2 if setup_error else 1
        except Exception as err:  # (a full disk under the run directory, say): every process still stops in order,
            # the summary still says where the results are, and the stop line does not say "budget spent"
            import traceback

            console.print(f"league run: {type(err).__name__}: {err}\n{traceback.format_exc().rstrip()}", style="red",
                          markup=False, soft_wrap=True)
            reason[0] = f"league run failed ({type(err).__name__})"
            exit_code = 1
        finally:
            stopping[0] = True
            if sup.group.processes:  # (each stage can take up to its grace: say what is going on)
                kill = "Ctrl-C again kills them at once" if signals else "Ctrl-C twice kills them at once"
                console.print(f"league run: {reason[0]}; stopping the actors, then the learners, then the coordinator "
                              f"(each up to {run_cfg.stop_grace_s:g} s; {kill})", markup=False, soft_wrap=True)
            stopped = list(sup.group.processes)  # (stop_workers forgets the actors and learners it stops)
            codes = sup.stop_workers()
            try:
                if start is not None:  # the league's state once every worker stopped: the history's last record
                    status = _final_status(sup.address, token, history_path, start, status)
            except Exception as err:  # (a full disk, say) it must not keep the coordinator from stopping
                console.print(f"league run: the final status was not recorded: {err}", style="yellow", markup=False, soft_wrap=True)
            codes.update(sup.stop())
            if started_all:  # what they said while they stopped (a failed start's error quotes its log)
                for line in log_errors.check(stopped, to_end=True):
                    console.print(line, style="red", markup=False, soft_wrap=True)
            if config_path.is_file():  # a resume's config the coordinator did not take: the saved one stays
                pending_path.unlink(missing_ok=True)
            # (Else the directory's first run stopped before its config was taken: running it again starts it.)
            # `league status --run-dir` then says no run is going on, instead of dialling a port another program
            # may have taken since.
            (run_dir / RUN_PORT_FILE).unlink(missing_ok=True)
        exit_code = _summary(console, reason[0], exit_code, codes, status, sup, history_path)
        if exit_code == SETUP_ERROR_EXIT and previous_config is not None:
            _put_back_config(console, config_path, previous_config, args.config)
        return exit_code
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _put_back_config(console: Any, config_path: Path, previous: bytes, given: Path | None) -> None:
    """A resume whose CONFIG the league could not run with (exit 2: a worker's setup error, as checkpoints that do
    not fit an env whose kwargs changed its spaces, which no check at start can see) left that CONFIG as the
    directory's config.yaml: a resume with no CONFIG failed alike for ever, and the next one with another CONFIG
    replaced config.prev.yaml, the last config the league ran with (a review). The directory's config is put back."""
    try:
        atomic_write(config_path, previous)
    except OSError as err:
        console.print(f"league run: {config_path} could not be put back as it was ({err}); {PREVIOUS_CONFIG_FILE} "
                      "beside it holds it", style="red", markup=False, soft_wrap=True)
        return
    console.print(f"league run: the league could not run with {given}: {config_path.name} is back to the config "
                  f"it ran with (`league run {run_dir_arg(config_path.parent)}` resumes that one)", style="yellow",
                  markup=False, soft_wrap=True)


def _summary(console: Any, reason: str, exit_code: int, codes: dict[str, int], status: Any, sup: Supervisor,
             history_path: Path) -> int:
    """What the run ends with: how the processes stopped, the league's last status, plots, and where the results
    are. Returns the run's exit code: 2 when a process exited with a setup error the run had not seen yet, 1 when
    one exited non-zero otherwise at the stop (the coordinator failing to write its state on a full disk, a process
    killed past its grace), whose last results may be lost."""
    if sup.hurry.is_set() and -signal.SIGKILL in codes.values():
        reason += "; the processes still stopping were killed at the second Ctrl-C"
    console.print(f"\nleague run: {reason}; every process stopped "
                  f"({', '.join(f'{k}={v}' for k, v in sorted(codes.items()))})", markup=False, soft_wrap=True)
    # A worker ended by SIGTERM itself (-15) was still starting (importing) and had no handler yet: nothing of it
    # to lose. (A short run ended that way in exit 1.)
    waiting = sorted(sup.waiting_for_space)  # dead before the stop (their codes are of then), not stopped badly
    # A setup error (exit 2) the run's last poll did not see (a short budget): the league cannot run as configured,
    # as when the run sees it (it said "did not exit cleanly at the stop", exit 1, or exit 0; a review).
    unrunnable = sorted(name for name, code in codes.items() if code == SETUP_ERROR_EXIT and name not in waiting)
    if unrunnable and exit_code == 0:
        exit_code = SETUP_ERROR_EXIT
        console.print(f"league run: {', '.join(unrunnable)} cannot run this league (exit {SETUP_ERROR_EXIT}: bad "
                      "arguments or a job it cannot set up, which a restart does not fix; their logs in "
                      f"{sup.group.log_dir} say why)", style="red", markup=False, soft_wrap=True)
    failed = sorted(name for name, code in codes.items()
                    if code not in (0, -signal.SIGTERM) and name not in waiting and name not in unrunnable)
    if waiting and exit_code == 0:
        exit_code = 1
        console.print(f"league run: {', '.join(waiting)} died while the run directory's disk was full and still "
                      "waited for space at the stop: their last results may not be saved", style="red", markup=False,
                      soft_wrap=True)
    if failed and exit_code == 0:
        exit_code = 1
        console.print(f"league run: {', '.join(failed)} did not exit cleanly at the stop: their last results may "
                      f"not be saved (their logs in {sup.group.log_dir} say why)", style="red", markup=False, soft_wrap=True)
    if status is not None:
        from league_service.status_view import render_status

        console.print("the league's last status before it stopped:", markup=False, soft_wrap=True)
        console.print(render_status(status, workers=False))  # (all stopped, whatever their last heartbeat says)
    plots = sup.run_dir / "plots"
    try:
        from league_cli.plot import write_plots

        written = write_plots(history_path, plots) if history_path.exists() else []
    except Exception as err:  # plotting must not hide where the results are
        console.print(f"plots: not written ({err})", style="yellow", markup=False, soft_wrap=True)
        written = []
    where = [("checkpoints", sup.shared_root), ("logs", sup.group.log_dir), ("state", sup.state_path),
             ("history", history_path)]
    for label, path in where:  # a league stopped at start-up may not have made them all
        console.print(f"{label + ':':<12} {path}" + ("" if Path(path).exists() else " (not created)"), markup=False, soft_wrap=True)
    if written:
        console.print(f"plots:       {plots} ({', '.join(p.name for p in written)})", markup=False, soft_wrap=True)
    return exit_code
