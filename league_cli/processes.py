"""Start the league's processes and make sure none outlives us.

`league run` and the system tests both need the same thing: start several `league ...` commands with their
output in log files, notice when one dies, and stop all of them — politely (SIGTERM, so workers release jobs
and the coordinator flushes state), then firmly (SIGKILL) — whatever happened before. Each child gets its own
process group: SIGTERM goes to the child alone (it stops its env workers itself), the final SIGKILL to the
whole group so nothing it started outlives it.

Each child also follows its supervisor (`follow_supervisor`): if the supervisor dies without stopping it
(`kill -9`, the OOM killer), the kernel sends the child SIGTERM, so it stops as politely as if asked.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from common.durable_files import full_disk_note
from common.pids import pid_alive
from common.signal_flag import SignalFlag

SUPERVISOR_ENV_VAR = "LEAGUE_SUPERVISOR_PID"
HURRY_POLL_S = 0.1
"""How often a stop waiting out a process's grace looks whether it is asked to hurry (a second Ctrl-C)."""
"""Set by ProcessGroup in its children: the pid of the process that supervises them."""
_PR_SET_PDEATHSIG = 1
TAIL_READ_BYTES = 1 << 20
"""How much of the end of a log `ManagedProcess.log_tail` reads."""
LOG_LINE_START = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"
"""How a line in the league's log format (`common.cli_args.LOG_FORMAT`) begins."""
_LOG_LINE = re.compile(LOG_LINE_START)
_TRACEBACK = "Traceback (most recent call last):"
_GROUP_TRACEBACK = "  + Exception Group Traceback (most recent call last):"
"""How Python begins the traceback of an uncaught ExceptionGroup (an asyncio TaskGroup's failure)."""
_GROUP_MARGIN = "  | "
_MEMBER_MARGIN = "    | "
_MEMBER_END = "    +"
_EXCEPTION_LINE = re.compile(r"[A-Za-z_][\w.]*(:|$)")
"""The last line of a traceback: the exception's (dotted) class name, then its message."""


def _first_member_traceback(group: list[str]) -> list[str]:
    """The lines of the last traceback of a group's first member (those before it are its causes, printed
    first: "The above exception was the direct cause of the following exception"), margins removed."""
    member: list[str] = []
    for line in group:
        if line.startswith(_MEMBER_END):  # the next member's, or the group's end
            break
        if line.startswith(_MEMBER_MARGIN):
            member.append(line[len(_MEMBER_MARGIN):])
    starts = [i for i, line in enumerate(member) if line.startswith(_TRACEBACK)]
    return member[starts[-1] + 1:] if starts else member


def _exception_line(lines: Iterable[str]) -> str:
    """A traceback's exception line: its first unindented line (the frames are indented), if exception-shaped."""
    for line in lines:
        if line and not line[0].isspace() and not line.startswith(_TRACEBACK):
            return line if _EXCEPTION_LINE.match(line) else ""
    return ""


def follow_supervisor() -> None:
    """In a `league` command a ProcessGroup started: ask the kernel for SIGTERM when the supervisor dies.

    Why: children run in sessions of their own (a Ctrl-C reaches the supervisor, which stops them in order),
    so when the supervisor is killed outright nothing else would stop them: the coordinator, learners and
    actors of a `league run` killed with -9 ran on, orphaned, until killed by hand. Linux only; a child
    started through a wrapper that stays its parent is left as it was."""
    supervisor = os.environ.pop(SUPERVISOR_ENV_VAR, None)
    if supervisor is None or not sys.platform.startswith("linux"):
        return
    try:
        pid = int(supervisor)
    except ValueError:
        return
    if os.getppid() == pid:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            return
        if os.getppid() == pid:
            return
    elif pid_alive(pid):
        return
    # The supervisor died before the request took effect: nobody will stop or read this process.
    raise SystemExit(f"league: the process that started this one (pid {pid}) has exited; not starting")


PROJECT_PACKAGES = ("common", "league_service", "actor_service", "learner_service", "league_cli")
"""This project's top-level packages (pyproject.toml's `packages.find`)."""


def league_command(*args: str) -> list[str]:
    """The `league` CLI as a child process, with this interpreter (works without the console script on PATH),
    running this process's own code. Started as `python -m league_cli`, which puts the working directory first
    on the import path, `league run` started from a directory that holds a `league_cli` package (a checkout of
    another version of this project, say) ran that directory's code as its coordinator, learners and actors. So
    the children start with `-P` (no working directory on the path), and `league_cli.__main__` puts it back last
    (`working_directory_last`). When this process's code is the working directory's (`python -m league_cli` run
    from a checkout), the children are started plainly and find it there too."""
    if _code_is_the_working_directorys():
        return [sys.executable, "-m", "league_cli", *args]
    return [sys.executable, "-P", "-m", "league_cli", *args]


def working_directory_last() -> None:
    """Under `python -P` (see `league_command`): import this project's packages from where `league_cli` came
    from, then put the working directory last on the import path, where `league run`'s workers find an env module
    of the user's own (`python:<module>:<callable>`, README). Imported first: an editable install's finder comes
    after the path's, so a `common` package in the working directory would otherwise win."""
    if not sys.flags.safe_path:
        return
    import importlib

    packages = [importlib.import_module(package) for package in PROJECT_PACKAGES]
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.append(cwd)
    _project_ahead_of(cwd, packages)


def _project_ahead_of(cwd: str, packages: list[ModuleType]) -> None:
    """Put the directory the project's packages come from on the import path ahead of `cwd` where `cwd` holds a
    package of the same name. The processes this one spawns (the subprocess env manager's workers, started with
    multiprocessing's `spawn`) take this process's `sys.path` and import the project's packages anew, without
    `working_directory_last`: from an editable install, whose finder comes after the path's, they ran the working
    directory's `actor_service` and `common` (a checkout of another version) beside an actor running this code."""
    import importlib.machinery

    for module in packages:
        spec = importlib.machinery.PathFinder.find_spec(module.__name__, sys.path)
        if spec is None or (spec.origin is not None and _same_file(spec.origin, module.__file__)):
            continue  # what a fresh import finds on the path is this code (or the path has none: the finder's)
        root = str(Path(module.__file__).resolve().parents[1])
        with contextlib.suppress(ValueError):
            sys.path.remove(root)
        sys.path.insert(sys.path.index(cwd), root)


def _same_file(a: str, b: str | None) -> bool:
    try:
        return b is not None and os.path.samefile(a, b)
    except OSError:
        return False


def _code_is_the_working_directorys() -> bool:
    import league_cli

    root = Path(league_cli.__file__).resolve().parents[1]
    try:
        return root == Path.cwd().resolve()
    except OSError:  # a working directory removed meanwhile: nothing to import from there
        return False


@dataclass
class ManagedProcess:
    name: str
    argv: list[str]
    log_path: Path
    popen: subprocess.Popen
    started_at: float = field(default_factory=time.monotonic)
    log_offset: int = 0
    """Where this process's lines begin in its log: a resumed run appends to the same file."""

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def terminate(self) -> None:
        """SIGTERM to the process itself: it shuts its own children (env workers) down in order."""
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)

    def kill_group(self) -> None:
        """SIGKILL to the whole process group: the process and anything it started that is still there."""
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def log_tail(self, lines: int = 20) -> str:
        """The last `lines` lines this process wrote (none of an earlier run's, which the file also holds), from
        at most the last TAIL_READ_BYTES of its log: a log of days read whole cost a restart a second and
        hundreds of MB."""
        try:
            with open(self.log_path, "rb") as log:
                start = max(self.log_offset, log.seek(0, os.SEEK_END) - TAIL_READ_BYTES)
                log.seek(start)
                data = log.read()
        except OSError:
            return ""
        if start > self.log_offset:  # (the first line read may be the end of one cut short)
            data = data[data.find(b"\n") + 1:] if b"\n" in data else b""
        return "\n".join(data.decode(errors="replace").splitlines()[-lines:])

    def last_words(self) -> str:
        """`log_tail`, or where to look when it is empty: a process that died during its imports (a crash loop's
        sixth death) wrote nothing of its own, and "last log lines:" was followed by nothing (a review)."""
        return self.log_tail() or f"(nothing since it last started; earlier lines are in {self.log_path})"

    def exit_words(self) -> str:
        """"exited with CODE", and what it died of when its log ends in an uncaught traceback (`crash_line`);
        when the log's disk is full, that too (`full_disk_note`)."""
        crash = self.crash_line()
        return f"exited with {self.popen.returncode}" + (f" ({crash})" if crash else "") + self.full_disk_note()

    def full_disk_note(self) -> str:
        """`full_disk_note` of this process's log directory (the run directory's disk, in `league run`)."""
        note = full_disk_note(self.log_path.parent)
        return f"{note}, and the logs there may not say why" if note else ""

    def crash_line(self, max_chars: int = 200) -> str:
        """The exception an uncaught traceback at the end of this process's log names ("RuntimeError: ..."),
        or "" when it did not die of one: an exit code other than Python's 1 for an uncaught exception (a
        signal, an exit on purpose), or a log that does not end in a traceback. A traceback logged earlier by a
        process that went on (a failed job, logged with its traceback) is followed by later log lines, and
        is not what it died of."""
        if self.popen.returncode != 1:
            return ""
        lines = self.log_tail(60).splitlines()
        starts = [i for i, line in enumerate(lines)
                  if line.startswith(_TRACEBACK) or line == _GROUP_TRACEBACK]
        if not starts:
            return ""
        after = lines[starts[-1] + 1:]
        if any(_LOG_LINE.match(line) for line in after):
            return ""  # the process logged on after it: not the end of its life
        if lines[starts[-1]] == _GROUP_TRACEBACK:  # the group is drawn behind "  | ", its members behind "    | "
            line = _exception_line(line[len(_GROUP_MARGIN):] for line in after if line.startswith(_GROUP_MARGIN))
            member = _exception_line(_first_member_traceback(after))
            if line and member:
                line = f"{line}; the first: {member}"  # a TaskGroup's own message names none of its causes
        else:
            line = _exception_line(after)
        return line if len(line) <= max_chars else line[: max_chars - 1] + "…"


class ProcessGroup:
    """A set of child processes stopped together; use as a context manager so stopping always happens."""

    def __init__(self, log_dir: Path, env: dict[str, str] | None = None, pass_fds: tuple[int, ...] = ()) -> None:
        """`pass_fds`: descriptors every process inherits (a lock they share with this process)."""
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._env = {**os.environ, "PYTHONUNBUFFERED": "1", SUPERVISOR_ENV_VAR: str(os.getpid()), **(env or {})}
        self._pass_fds = pass_fds
        self.processes: list[ManagedProcess] = []

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> ManagedProcess:
        if any(p.name == name for p in self.processes):
            raise ValueError(f"a process named {name!r} was already started")
        log_path = self.log_dir / f"{name}.log"
        with open(log_path, "ab") as log:
            if os.fstat(log.fileno()).st_size:  # a resumed run or a restart: say where this process's lines begin
                stamp = time.strftime("%Y-%m-%d %H:%M:%S%z")  # the offset, as in the processes' own lines
                with contextlib.suppress(OSError):  # a full disk (what the process may have died of) costs the mark
                    os.write(log.fileno(),
                             f"---- {stamp}: {name} started again; the lines above are from before ----\n".encode())
            offset = os.fstat(log.fileno()).st_size
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**self._env, **(env or {})},
                start_new_session=True,
                pass_fds=self._pass_fds,
            )
        proc = ManagedProcess(name, argv, log_path, popen, log_offset=offset)
        self.processes.append(proc)
        return proc

    def get(self, name: str) -> ManagedProcess:
        for p in self.processes:
            if p.name == name:
                return p
        raise KeyError(name)

    def forget(self, proc: ManagedProcess) -> None:
        """Drop a process that has exited (so its name can be reused for a restart)."""
        if proc.alive():
            raise ValueError(f"{proc.name} is still running")
        self.processes.remove(proc)

    def dead(self) -> list[ManagedProcess]:
        return [p for p in self.processes if not p.alive()]

    def stop(self, procs: list[ManagedProcess] | None = None, grace_s: float = 10.0,
             hurry: threading.Event | SignalFlag | None = None) -> dict[str, int]:
        """SIGTERM, wait up to `grace_s` (or until `hurry` is set: a second Ctrl-C), then SIGKILL; returns each
        process's exit code."""
        targets = list(self.processes if procs is None else procs)
        for p in targets:
            p.terminate()
        deadline = time.monotonic() + grace_s
        for p in targets:
            while not (hurry is not None and hurry.is_set()):
                left = deadline - time.monotonic()
                try:
                    p.popen.wait(timeout=max(0.0, min(left, HURRY_POLL_S)))
                    break
                except subprocess.TimeoutExpired:
                    if left <= HURRY_POLL_S:
                        break
        for p in targets:
            # Whether the leader exited or not, its group may still hold env subprocesses.
            p.kill_group()
            p.popen.wait()
        return {p.name: p.popen.returncode for p in targets}

    def stop_in_order(self, groups: list[list[ManagedProcess]], grace_s: float = 10.0) -> dict[str, int]:
        """Stop groups one after another (actors, then learners, then the coordinator)."""
        codes: dict[str, int] = {}
        for group in groups:
            codes.update(self.stop(group, grace_s))
        codes.update(self.stop(grace_s=grace_s))  # anything not named in the groups
        return codes

    def __enter__(self) -> ProcessGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop(grace_s=5.0)
