"""SubprocessEnvManager faults that happen in a worker around the envs rather than in their step: a build
failure in a worker of several envs, observations of the wrong dtype or None, errors in `info()` and in pickling
what an env returned, a program that never closes its manager, and a parent killed outright.

Real worker processes throughout; every test checks that no worker process and no shared-memory block is left
behind, also when it fails.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from functools import partial

import cloudpickle
import numpy as np
import pytest

from actor_service.envs import EnvError, SubprocessEnvManager
from actor_service.envs.env_manager.pipe import MessagePipe
from actor_service.envs.env_manager.shm_blocks import SHM_DIR, _pid_namespace
from actor_service.envs.env_manager.worker import worker_main
from common.envs import NO_INFO, ArraySpec, DiscreteSpec, Env, EnvInfo, StepInfo, TimeStep
from tests.env_manager_launcher import launched_managers
from tests.polling import wait_until

ROOT = pathlib.Path(__file__).resolve().parents[2]


class PlainEnv(Env):
    """Observation [t] (or [`value`]) of float32, or of `obs_dtype` from step `bad_from` on (0: the reset on);
    endless episodes.
    `lock_at`: at that step its info carries a lock, which cannot be pickled (and an entry that can);
    `reward_lock_at`: at that step its reward is a lock. `obs_none`: no observations at all."""

    def __init__(self, obs_dtype: str = "float32", value: float | None = None, bad_from: int = 0, lock_at: int = 0,
                 obs_none: bool = False, reward_lock_at: int = 0) -> None:
        self._obs_dtype = np.dtype(obs_dtype)
        self._value = value
        self._bad_from = bad_from
        self._lock_at = lock_at
        self._reward_lock_at = reward_lock_at
        self._obs_none = obs_none
        self._t = 0

    def info(self) -> EnvInfo:
        return EnvInfo("plain", None if self._obs_none else ArraySpec((1,), np.float32), DiscreteSpec(2))

    def seed(self, seed: int) -> None:
        pass

    def reset(self) -> np.ndarray | None:
        self._t = 0
        return self._obs()

    def step(self, action: int) -> TimeStep:
        self._t += 1
        info = StepInfo(extra={"lock": threading.Lock(), "kept": 7}) if self._t == self._lock_at else NO_INFO
        reward = threading.Lock() if self._t == self._reward_lock_at else 1.0
        return TimeStep(self._obs(), reward, False, False, info)

    def _obs(self) -> np.ndarray | None:
        if self._obs_none:
            return None
        dtype = self._obs_dtype if self._t >= self._bad_from else np.float32
        return np.full((1,), self._t if self._value is None else self._value, dtype)


class UnknownSpec(LookupError):
    pass


class InfoRaises(PlainEnv):
    def info(self) -> EnvInfo:
        return lookup_spec()


def lookup_spec() -> EnvInfo:
    raise UnknownSpec("no spec for this env")


def unbuildable() -> Env:
    raise OSError("no such game")


class HangsInStep(PlainEnv):
    """Hangs (in a lock wait, for ever) at its first step, after writing its pid to `marker`."""

    def __init__(self, marker: str) -> None:
        super().__init__()
        self._marker = marker

    def step(self, action: int) -> TimeStep:
        pathlib.Path(self._marker).write_text(str(os.getpid()))
        threading.Event().wait()
        raise AssertionError("unreachable")


def _running(pids) -> list[int]:
    """Pids of processes that still run (a zombie has exited: nobody may be left to reap it once orphaned)."""
    running = []
    for pid in pids:
        try:
            state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            continue
        if state != "Z":
            running.append(pid)
    return running


def _blocks_of(pid: int) -> list[str]:
    prefix = f"lg{_pid_namespace()}_{pid}_"
    return [name for name in os.listdir(SHM_DIR) if name.startswith(prefix)]


def _env_workers() -> list[multiprocessing.process.BaseProcess]:
    """This process's env workers not yet reaped and closed (a closed manager leaves none)."""
    return [p for p in multiprocessing.active_children() if p.name.startswith("env-worker")]


@pytest.fixture
def launched():
    """Launches managers; closes them at the end and checks that no worker process or shared-memory block of
    theirs is left behind (what was there before the test is not its doing)."""
    workers_before = set(_env_workers())
    blocks_before = set(_blocks_of(os.getpid()))
    with launched_managers() as launch:
        yield launch
    assert set(_env_workers()) <= workers_before, "worker processes left behind"
    assert set(_blocks_of(os.getpid())) <= blocks_before, "shared-memory blocks left behind"


def _step(manager: SubprocessEnvManager) -> dict[int, TimeStep]:
    return manager.step(dict.fromkeys(manager.ready_env, 0))


# ---- 1. a build failure in a worker of several envs ------------------------------------------------------
def test_a_build_failure_is_charged_to_the_env_that_failed_not_the_first_of_its_worker(launched):
    """Env 1 shares worker 0 with env 0. Its build failure was charged to env 0 first, so the error raised
    named env 0, as a worker failure, without env 1's exception or traceback."""
    with pytest.raises(EnvError) as raised:
        launched([PlainEnv, unbuildable, PlainEnv], num_workers=1, max_retry=0)
    error = raised.value
    assert error.env_id == 1, str(error)
    assert str(error).startswith("env 1 failed") and "during build" in str(error)
    assert isinstance(error.__cause__, OSError) and "no such game" in str(error.__cause__)
    assert "--- env traceback ---" in str(error) and "in unbuildable" in str(error)


# ---- 2. observations of the wrong dtype ----------------------------------------------------------------
@pytest.mark.parametrize("bad_from", [0, 2], ids=["reset", "step"])
def test_an_observation_that_does_not_fit_the_spec_dtype_is_the_env_failure_not_cast(launched, bad_from):
    """Not every int64 is a float32 (nor 300 a uint8: it became 44 without a word): an observation numpy cannot
    cast safely is refused, whether it comes from a reset or a step (two code paths in the worker)."""
    with pytest.raises(EnvError) as raised:
        manager = launched([PlainEnv, partial(PlainEnv, "int64", 300, bad_from)], num_workers=1, max_retry=0,
                           wait_num=2)
        for _ in range(3):
            _step(manager)
    message = str(raised.value)
    assert raised.value.env_id == 1 and isinstance(raised.value.__cause__, ValueError)
    assert "env 1: observation has dtype int64, but the env's spec says float32" in message
    assert ("during reset" if bad_from == 0 else "during step") in message


def test_float64_observations_for_a_float32_spec_are_taken(launched):
    """gymnasium envs often return float64 for a float32 space: precision is all a cast loses there."""
    manager = launched([partial(PlainEnv, "float64", 0.1)] * 2, num_workers=1, max_retry=0)
    assert all(obs.dtype == np.float32 and obs[0] == np.float32(0.1) for obs in manager.next_obs.values())
    out = _step(manager)
    assert all(ts.obs.dtype == np.float32 and ts.obs[0] == np.float32(0.1) for ts in out.values())
    assert manager.failure_counts == {0: 0, 1: 0}


# ---- 3. errors outside an env's step: info(), and pickling what it returned -------------------------------
def test_an_exception_from_env_info_is_the_env_failure_with_its_traceback(launched):
    """It used to kill the worker: the caller saw only "exited with code 1" on env 0."""
    with pytest.raises(EnvError) as raised:
        launched([PlainEnv, InfoRaises], num_workers=1, max_retry=0)
    error = raised.value
    assert error.env_id == 1 and isinstance(error.__cause__, UnknownSpec), str(error)
    assert "in lookup_spec" in str(error)


def test_a_step_result_that_cannot_be_pickled_is_the_env_failure_and_its_worker_lives_on(launched):
    """A step reply that failed to pickle killed the worker (SIGKILL-like: its siblings lost their episodes)
    without a word about why. Now it is env 1's failure alone, with the pickling error's traceback; env 1 is
    rebuilt in the same worker."""
    manager = launched([PlainEnv, partial(PlainEnv, reward_lock_at=2), PlainEnv], num_workers=1, max_retry=1,
                       wait_num=3)
    pids = manager.worker_pids
    _step(manager)
    out = _step(manager)
    failure = out[1].info.failure
    assert out[1].truncated and "step reward cannot be pickled" in failure and "lock" in failure, out[1]
    assert not out[0].info.failure and not out[2].info.failure and out[0].obs[0] == 2.0
    while manager.ready_env != [0, 1, 2]:
        _step(manager)
    assert manager.failure_counts == {0: 0, 1: 1, 2: 0} and manager.worker_pids == pids
    _step(manager)
    with pytest.raises(EnvError) as raised:  # the rebuilt env 1 does it again at its 2nd step: retries spent
        _step(manager)
    assert raised.value.env_id == 1 and isinstance(raised.value.__cause__, TypeError)
    assert "Traceback" in str(raised.value) and "pickle" in str(raised.value)


def test_a_step_info_entry_that_cannot_be_pickled_is_dropped_and_the_env_steps_on(launched):
    """The env's own info dict (`StepInfo.extra`) with a lock in it failed the env at every step under this
    manager, while the in-process one ran it (a review): now that entry alone is left out."""
    manager = launched([PlainEnv, partial(PlainEnv, lock_at=2)], num_workers=1, max_retry=0, wait_num=2)
    _step(manager)
    out = _step(manager)
    assert not out[1].info.failure and not out[1].truncated and dict(out[1].info.extra) == {"kept": 7}, out[1]
    _step(manager)
    assert manager.failure_counts == {0: 0, 1: 0}


class NeedsTwoArguments(Exception):
    """Pickles, but cannot be built again from its pickle (`__init__` takes two arguments, `args` holds one)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(f"{message} (code {code})")


class UnpicklableInfoAt(PlainEnv):
    """At step `at` its info carries an object that pickles but does not unpickle."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self._at = at

    def step(self, action: int) -> TimeStep:
        step = super().step(action)
        if self._t == self._at:
            return dataclasses.replace(step, info=StepInfo(extra={"last_error": NeedsTwoArguments("said no", 42)}))
        return step


def test_a_step_reply_that_cannot_be_unpickled_fails_its_worker_at_once_not_at_a_hang(launched):
    """The reply was read and lost (a raw TypeError out of step), its envs stayed in flight, and the next call
    killed the worker as hung at the step timeout, or, with none, waited for ever (a review). Now its worker is
    failed at once, naming why."""
    manager = launched([PlainEnv, partial(UnpicklableInfoAt, 2)], num_workers=1, max_retry=1, wait_num=2,
                       step_timeout=None)
    _step(manager)
    out = _step(manager)
    assert set(out) == {0, 1} and all(step.truncated for step in out.values()), out
    assert "cannot be unpickled" in out[1].info.failure and "NeedsTwoArguments" in out[1].info.failure
    assert manager.failure_counts == {0: 1, 1: 1}
    while manager.ready_env != [0, 1]:
        _step(manager)
    _step(manager)  # its rebuilt envs step on


def test_an_action_that_pickles_but_cannot_be_unpickled_is_refused_before_it_is_sent(launched):
    """It crashed the worker as it read the command, and the worker's other envs were charged with a failure
    that did not name the action (a review)."""
    manager = launched([PlainEnv, PlainEnv], num_workers=1, wait_num=2)
    pids = manager.worker_pids
    with pytest.raises(ValueError, match="action of env 1 cannot be sent .*NeedsTwoArguments"):
        manager.step({0: 0, 1: NeedsTwoArguments("an action", 1)})
    assert manager.ready_env == [0, 1] and manager.worker_pids == pids
    with pytest.raises(ValueError, match="reset_params of env 0 cannot be sent"):
        manager.reset({0: {"hint": NeedsTwoArguments("a reset argument", 2)}})
    _step(manager)
    assert manager.failure_counts == {0: 0, 1: 0}


class StartsAServerThenHangs(PlainEnv):
    """Starts a process of its own (a game server) when built, writes its pid to `marker`, and hangs at its
    first step."""

    def __init__(self, marker: str) -> None:
        super().__init__()
        self._server = subprocess.Popen(["sleep", "1000"])
        pathlib.Path(marker).write_text(str(self._server.pid))

    def step(self, action: int) -> TimeStep:
        threading.Event().wait()
        raise AssertionError("unreachable")

    def close(self) -> None:
        self._server.kill()
        self._server.wait()


def test_the_processes_of_a_worker_killed_as_hung_are_killed_with_it(launched, tmp_path):
    """A worker killed at a hang never ran its envs' close: the processes they had started (a game server, a
    simulator) outlived it, reparented, one more at each hang of a long run (a review)."""
    marker = tmp_path / "server.pid"
    manager = launched([partial(StartsAServerThenHangs, str(marker))], num_workers=1, max_retry=1, step_timeout=1.0)
    server = int(marker.read_text())
    assert _running([server]) == [server]
    try:
        out = _step(manager)
        assert "hung" in out[0].info.failure
        wait_until("the hung env's server to be killed with its worker", lambda: not _running([server]), 10)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(server, signal.SIGKILL)


# ---- 7. observations that are None ---------------------------------------------------------------------
def test_an_env_without_observations_steps(launched):
    """Spec None, observations None: no shared memory. `obs is None` meant "in shared memory" to the worker,
    and the parent crashed with an AttributeError reading a buffer it did not have."""
    manager = launched([partial(PlainEnv, obs_none=True)] * 2, num_workers=1, wait_num=2)
    assert manager.next_obs == {0: None, 1: None}
    for _ in range(2):
        out = _step(manager)
        assert set(out) == {0, 1} and all(ts.obs is None and ts.reward == 1.0 for ts in out.values()), out


class ExitsAfterClosingItsPipe(PlainEnv):
    """At its first step the process closes its files (the pipe to the manager: EOF there), then exits with 3."""

    def step(self, action: int) -> TimeStep:
        os.closerange(3, 65536)
        time.sleep(0.3)
        os._exit(3)


def test_a_worker_that_exits_on_its_own_is_reported_with_its_exit_code(launched):
    """The manager read EOF on the pipe before the exit was done and killed the exiting process: the failure
    said "killed by signal 9", not the worker's own code."""
    manager = launched([ExitsAfterClosingItsPipe], num_workers=1, max_retry=0)
    with pytest.raises(EnvError, match=r"exited with code 3$"):
        _step(manager)


# ---- 4, 5, 6. processes: a manager never closed, a parent killed outright ---------------------------------
@contextlib.contextmanager
def _child(script: str, *args: str) -> Iterator[subprocess.Popen]:
    """A Python process running `script` in a session of its own; at the end it and everything left in its
    process group (its workers, orphaned or not) are killed, and its shared-memory blocks removed."""
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(script), str(ROOT), *args],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        yield child
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        child.communicate(timeout=30)
        for name in _blocks_of(child.pid):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(SHM_DIR, name))


FORGETS_CLOSE = """
    import sys
    sys.path.insert(0, sys.argv[1])
    from actor_service.envs import SubprocessEnvManager, SubprocessEnvManagerConfig
    from tests.env_doubles import CountingEnv

    def main():
        manager = SubprocessEnvManager([CountingEnv] * 2, SubprocessEnvManagerConfig(num_workers=1))
        manager.launch()
        print(*manager.worker_pids, flush=True)
        if sys.argv[2] == "raises":  # the traceback keeps the manager alive until the interpreter exits
            raise RuntimeError("a bug in the caller, before it could close the manager")
        return manager

    kept = main()
"""


@pytest.mark.parametrize("ending", ["returns", "raises"])
def test_a_program_that_never_closes_its_manager_still_exits(ending):
    """multiprocessing's exit hook SIGTERMs daemon processes and joins them without a timeout; env workers ignore
    SIGTERM and, with their pipes still open here, never read EOF: the program hung at exit for ever. Now the
    manager's own exit hook, which runs first, closes it."""
    with _child(FORGETS_CLOSE, ending) as child:
        workers = [int(pid) for pid in child.stdout.readline().split()]
        assert workers, child.stderr.read()
        try:
            code = child.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pytest.fail("the program did not exit within 20 s of its end")
        assert code == (0 if ending == "returns" else 1)
        wait_until("the workers to be reaped", lambda: not _running(workers), 5)
        assert _blocks_of(child.pid) == [], "close() did not run: its shared memory is left"


PARENT_KILLED = """
    import sys
    from functools import partial
    sys.path.insert(0, sys.argv[1])
    from actor_service.envs import SubprocessEnvManager, SubprocessEnvManagerConfig
    from tests.integration.test_env_manager_worker_faults import HangsInStep, PlainEnv

    if __name__ == "__main__":
        manager = SubprocessEnvManager([partial(HangsInStep, sys.argv[3]), PlainEnv], SubprocessEnvManagerConfig(
            num_workers=2, start_method=sys.argv[2], spin_s=0, step_timeout=600))
        manager.launch()
        print(*manager.worker_pids, flush=True)
        manager.step({0: 0, 1: 0})  # env 0 hangs; env 1's worker waits for its next command
"""


@pytest.mark.parametrize("start_method", ["spawn", "fork"])
def test_workers_die_with_a_parent_killed_outright(start_method, tmp_path):
    """The manager's process alone is SIGKILLed (OOM killer, kill -9 of the actor) while env 0 hangs in its step
    and env 1's worker is idle. The hung worker never read its pipe again, so never saw EOF, and ignores
    SIGTERM; with `fork` every worker also holds the parent's ends of the pipes, so even the idle one never saw
    EOF. They lived on as orphans. Now the kernel kills them with their parent."""
    marker = tmp_path / "hung"
    with _child(PARENT_KILLED, start_method, str(marker)) as child:
        workers = [int(pid) for pid in child.stdout.readline().split()]
        assert len(workers) == 2, child.stderr.read()
        wait_until("env 0 to hang in its step", marker.exists, 30)
        os.kill(child.pid, signal.SIGKILL)  # the parent only, not its process group
        child.wait(timeout=30)
        wait_until(f"the workers {workers} to die with their parent", lambda: not _running(workers), 10,
                   lambda: f"still running: {_running(workers)}")


def test_a_worker_whose_parent_died_before_it_started_exits_at_once():
    """The parent may die before the worker asks for its parent-death signal (the kernel then sends none): the
    worker compares its parent with the one it was started by, and serves nobody."""
    ctx = multiprocessing.get_context("spawn")
    (reader, writer), child_ends = MessagePipe.channel(ctx)
    factories = cloudpickle.dumps({0: PlainEnv})
    not_my_parent = os.getppid()  # a live process, but not the worker's parent (that is this process)
    process = ctx.Process(target=worker_main, args=(child_ends, (0,), factories, None, None, not_my_parent),
                          daemon=True)
    process.start()
    try:
        for end in child_ends:
            end.close()
        process.join(30)
        assert process.exitcode == 0
        conn = MessagePipe(reader, writer)
        with pytest.raises(EOFError):  # it sent nothing: no ready reply
            conn.recv()
    finally:
        if process.is_alive():
            process.kill()
        process.join()
        reader.close()
        writer.close()


def test_a_worker_that_died_between_jobs_is_replaced_by_the_reset_and_charged_to_no_env(launched):
    """Killed while idle (the OOM killer between two jobs), a worker was found only by the next reset's command
    and charged to the new job's fresh budget: with max_retry 0 the job failed before its first step."""
    manager = launched([partial(PlainEnv) for _ in range(3)], max_retry=0, num_workers=2)
    _step(manager)
    dead = manager.worker_pids[0]
    os.kill(dead, signal.SIGKILL)
    # Dead to waitpid (a killed leader is a zombie while its other threads still exit: not yet dead to it).
    wait_until("the worker's death", lambda: not manager._workers[0].process.is_alive(), 10)
    manager.reset()  # the next job
    assert manager.failure_counts == {0: 0, 1: 0, 2: 0}
    assert dead not in manager.worker_pids
    stepped: set[int] = set()
    for _ in range(50):
        steps = _step(manager)
        assert all(ts.info.failure is None for ts in steps.values()), steps
        stepped |= set(steps)
        if stepped == {0, 1, 2}:
            break
    assert stepped == {0, 1, 2} and manager.failure_counts == {0: 0, 1: 0, 2: 0}



# ---- 8. an exception class of the user's own script --------------------------------------------------------
_MAIN_EXCEPTION_SCRIPT = """
import sys
sys.path.insert(0, sys.argv[1])
from actor_service.envs import EnvError, SubprocessEnvManager, SubprocessEnvManagerConfig
from actor_service.envs.env_manager.failure import RemoteTraceback
from tests.env_doubles import CountingEnv


class MyEnvError(RuntimeError):
    pass


class RaisingEnv(CountingEnv):
    def step(self, action):
        raise MyEnvError("raised by the env of the script")


if __name__ == "__main__":
    with SubprocessEnvManager([RaisingEnv], SubprocessEnvManagerConfig(num_workers=1, max_retry=0)) as manager:
        manager.launch()
        try:
            manager.step({0: 0})
        except EnvError as error:
            cause = error.__cause__
            print("cause", type(cause).__name__, isinstance(cause, MyEnvError), str(cause))
            print("remote", isinstance(getattr(cause, "__cause__", None), RemoteTraceback))
"""


def test_an_exception_class_of_the_main_script_is_the_errors_cause(tmp_path):
    """The env's exception reaches the caller as the EnvError's `__cause__`, also when its class is defined in
    the user's script: the worker's `__main__` is not the parent's, so plain pickle could not send it, and the
    cause was None (only the traceback text was left)."""
    script = tmp_path / "main_exception.py"
    script.write_text(_MAIN_EXCEPTION_SCRIPT)
    done = subprocess.run([sys.executable, str(script), str(ROOT)], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "cause MyEnvError True raised by the env of the script" in done.stdout, done.stdout + done.stderr
    assert "remote True" in done.stdout, done.stdout
