"""SubprocessEnvManager faults with real processes: env exceptions, hangs, SIGKILL, retries, closing.

Fault envs fail a fixed number of times in total, counted in a file, so a rebuilt env (in a new process or
not) knows whether it should fail again.
"""

from __future__ import annotations

import contextlib
import math
import os
import pathlib
import resource
import signal
import threading
import time
from collections.abc import Iterator
from functools import partial

import numpy as np
import pytest

from actor_service.envs import (
    EnvError,
    EnvManagerClosedError,
    EnvState,
    SubprocessEnvManager,
)
from actor_service.envs.env_manager import doorbell
from actor_service.envs.env_manager.failure import RemoteTraceback
from common.envs import NO_INFO, ArraySpec, DiscreteSpec, Env, EnvInfo, TimeStep
from tests.env_manager_launcher import alive, launched_managers


class FaultyEnv(Env):
    """Observation [t]; endless episodes. At step `fail_at` it fails in `mode` ("raise", "hang", "kill"),
    while fewer than `failures` failures are recorded in `budget_file`."""

    def __init__(
        self, mode: str = "", budget_file: pathlib.Path | None = None, failures: int = 0, fail_at: int = 2
    ):
        self._mode = mode
        self._budget_file = budget_file
        self._failures = failures
        self._fail_at = fail_at
        self._t = 0

    def info(self) -> EnvInfo:
        return EnvInfo("faulty", ArraySpec((1,), np.float32), DiscreteSpec(2))

    def seed(self, seed: int) -> None:
        pass

    def reset(self) -> np.ndarray:
        self._t = 0
        return np.array([0.0], np.float32)

    def step(self, action: int) -> TimeStep:
        self._t += 1
        if self._t == self._fail_at and self._mode and self._spend_failure():
            if self._mode == "raise":
                explode_in_env()
            elif self._mode == "hang":
                threading.Event().wait()
            elif self._mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
        return TimeStep(np.array([self._t], np.float32), 1.0, False, False, NO_INFO)

    def _spend_failure(self) -> bool:
        spent = len(self._budget_file.read_text()) if self._budget_file.exists() else 0
        if spent >= self._failures:
            return False
        self._budget_file.write_text("x" * (spent + 1))
        return True


def explode_in_env() -> None:
    raise ValueError("boom from inside the env")


def unbuildable() -> Env:
    raise OSError("no such game")


def built_after_failures(budget_file: pathlib.Path, failures: int) -> Env:
    """A FaultyEnv whose construction fails the first `failures` times (counted in `budget_file`)."""
    if FaultyEnv(budget_file=budget_file, failures=failures)._spend_failure():
        raise OSError("the game server is not up yet")
    return FaultyEnv()


@pytest.fixture
def launched():
    """Launches managers (lockstep: each step returns every env stepped); closes them at the end and checks that
    no worker process is left behind."""
    with launched_managers(lockstep=True) as launch:
        yield launch


def _step_all(manager: SubprocessEnvManager) -> dict[int, TimeStep]:
    return manager.step(dict.fromkeys(manager.ready_env, 0))


def _until_ready(manager: SubprocessEnvManager) -> None:
    """Step whatever is ready until every env is (rebuilt envs come back asynchronously)."""
    while manager.ready_env != list(range(manager.env_num)):
        _step_all(manager)


def test_env_exception_is_raised_in_the_parent_with_the_env_traceback(launched, tmp_path):
    manager = launched([partial(FaultyEnv, "raise", tmp_path / "budget", 1), FaultyEnv], num_workers=2)
    pids = manager.worker_pids
    _step_all(manager)
    with pytest.raises(EnvError) as raised:
        _step_all(manager)
    error = raised.value
    assert error.env_id == 0 and "max_retry=0" in str(error)
    assert "explode_in_env" in str(error)  # the env's own traceback, in the message
    assert isinstance(error.__cause__, ValueError) and "boom from inside the env" in str(error.__cause__)
    assert isinstance(error.__cause__.__cause__, RemoteTraceback)
    assert "explode_in_env" in str(error.__cause__.__cause__)
    assert manager.closed and alive(pids) == []
    with pytest.raises(EnvManagerClosedError, match="closed"):
        manager.step({1: 0})
    manager.close()  # idempotent


def test_failed_env_is_rebuilt_in_its_worker_and_siblings_play_on(launched, tmp_path):
    manager = launched(
        [partial(FaultyEnv, "raise", tmp_path / "budget", 2), FaultyEnv], num_workers=1, max_retry=2
    )
    pid = manager.worker_pids
    for _ in range(2):  # env 0 fails at its 2nd step, twice in a row; each time it is rebuilt
        _step_all(manager)
        out = _step_all(manager)
        assert out[0].truncated and "boom from inside the env" in out[0].info.failure
        assert not out[1].done and out[1].info is NO_INFO  # the sibling in the same worker is untouched
        assert manager.env_states[0] in (EnvState.ERROR, EnvState.RUN)  # being rebuilt, or already back
        _until_ready(manager)
    assert manager.failure_counts == {0: 2, 1: 0}
    assert manager.worker_pids == pid  # an exception does not cost the worker process
    for _ in range(3):
        assert not any(ts.done for ts in _step_all(manager).values())


def test_hung_env_is_killed_and_rebuilt(launched, tmp_path, monkeypatch):
    # As on a machine with CPUs to spare, the parent busy-waits on doorbells: the hang must be found the same.
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    manager = launched(
        [partial(FaultyEnv, "hang", tmp_path / "budget", 1), FaultyEnv, FaultyEnv],
        num_workers=2,  # env 0 shares worker 0 with env 1
        step_timeout=1.0,
        max_retry=1,
    )
    assert manager.parent_spin_s > 0
    old_pids = manager.worker_pids
    _step_all(manager)
    out = _step_all(manager)  # env 0 hangs: worker 0 is killed after step_timeout
    assert "hung" in out[0].info.failure and out[0].truncated
    assert out[1].truncated and "hung" in out[1].info.failure  # its sibling lost its episode too
    assert not out[2].done
    assert alive([old_pids[0]]) == []  # the hung worker was killed and reaped
    _until_ready(manager)  # the new worker comes up while env 2 plays on
    assert manager.worker_pids[0] != old_pids[0] and manager.worker_pids[1] == old_pids[1]
    assert manager.failure_counts == {0: 1, 1: 1, 2: 0}
    assert all(ts.obs[0] == 1.0 for ts in manager.step({0: 0, 1: 0}).values())  # fresh episodes


@pytest.mark.parametrize("spin_s", [0.0, 200e-6], ids=["sleeping", "spinning"])
def test_killed_env_process_is_detected_and_replaced(launched, tmp_path, monkeypatch, spin_s):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))  # CPUs to spare: all may spin
    manager = launched(
        [partial(FaultyEnv, "kill", tmp_path / "budget", 1), FaultyEnv],
        num_workers=2,
        max_retry=1,
        spin_s=spin_s,
    )
    assert manager.parent_spin_s == manager.worker_spin_s == spin_s
    old_pids = manager.worker_pids
    _step_all(manager)
    out = _step_all(manager)  # env 0 SIGKILLs its own process
    assert "signal 9" in out[0].info.failure
    assert alive([old_pids[0]]) == []

    # A worker killed from outside while idle is noticed at the next step, too.
    _until_ready(manager)
    os.kill(manager.worker_pids[1], signal.SIGKILL)
    out = {}
    while 1 not in out:
        out = _step_all(manager)
    assert out[1].truncated and "signal 9" in out[1].info.failure
    assert manager.failure_counts == {0: 1, 1: 1}


@pytest.mark.parametrize("fault", ["killed", "hung"])
def test_a_worker_lost_while_the_others_keep_answering_is_found_and_reaped_at_once(
    launched, tmp_path, monkeypatch, fault
):
    """Stepping asynchronously (each step returns the first reply) with a parent that busy-waits on doorbells,
    and a pause between steps (an actor's inference): every wait found the other worker's reply already there
    and polled nothing, so a worker SIGKILLed by the test (or the OOM killer) stayed a zombie with its envs in
    flight until a reset (an actor's next job) or its step deadline (60 s by default; none here) had to wait
    for it. Now the manager looks every `_SWEEP_S`: it reports the envs of the dead worker as failed and has
    reaped the process by the time that step returns. A hung worker was killed late the same way (0.7-5 s
    past its deadline, measured; too uneven to assert on): here it must go through the same path."""
    # As with CPUs to spare: the parent is never preempted mid-spin, and spins long enough to hear the survivor.
    monkeypatch.setattr(doorbell, "_PREEMPTED_S", math.inf)
    hung = fault == "hung"
    first = partial(FaultyEnv, "hang", tmp_path / "budget", 1) if hung else FaultyEnv
    manager = launched([first] + [FaultyEnv] * 3, num_workers=2, cpus=8, spin_s=1.0, wait_num=1, max_retry=1,
                       step_timeout=0.5 if hung else None)  # env 0 hangs at its 2nd step
    assert manager.parent_spin_s > 0 and manager.num_splits == 2
    victim = manager.worker_pids[0]  # envs 0 and 1
    _step_all(manager)
    if not hung:
        os.kill(victim, signal.SIGKILL)
    pause = threading.Event()  # never set: its wait() is the pause between steps
    failed: dict[int, TimeStep] = {}
    deadline = time.monotonic() + 5.0  # generous: found within about 0.05 s (after the 0.5 s step timeout if hung)
    while not failed and time.monotonic() < deadline:
        out = _step_all(manager)
        failed = {env_id: ts for env_id, ts in out.items() if ts.info.failure}
        assert set(failed) <= {0, 1}, failed
        pause.wait(0.005)
    assert failed, f"the {fault} worker was not found while the other one kept answering"
    assert alive([victim]) == [], "the lost worker was left a zombie"
    expected = "hung" if hung else "signal 9"
    assert all(ts.truncated and expected in ts.info.failure for ts in failed.values()), failed
    assert manager.worker_pids[0] != victim
    back: dict[int, TimeStep] = {}
    while len(back) < 2:  # the replacement worker plays envs 0 and 1 from fresh episodes
        out = _step_all(manager)
        back.update({env_id: out[env_id] for env_id in (0, 1) if env_id in out and env_id not in back})
    assert all(ts.obs[0] == 1.0 and not ts.info.failure for ts in back.values()), back
    assert manager.failure_counts == {0: 1, 1: 1, 2: 0, 3: 0}


def test_a_caller_pausing_longer_than_the_step_timeout_kills_no_worker_that_answered(launched):
    """The step deadline runs from the command's sending. An actor that does not step for longer than the step
    timeout while steps are in flight (the first reply taken, the others left for later; then inference,
    backpressure, or the wait for its next job) must find the replies waiting, not kill their workers as hung:
    the sweep for dead and hung workers did, charging each of their envs a failure (and with max_retry 0
    failing the next step or reset)."""
    manager = launched([FaultyEnv] * 4, num_workers=2, wait_num=1, step_timeout=0.5, max_retry=0, spin_s=0.0)
    pids = manager.worker_pids
    for _ in range(4):
        out = _step_all(manager)
        assert not any(ts.info.failure for ts in out.values()), out
        time.sleep(0.8)  # past the step timeout, with the other worker's step in flight (answered long ago)
    time.sleep(0.8)
    manager.reset()  # an actor's next job
    assert manager.failure_counts == {0: 0, 1: 0, 2: 0, 3: 0} and manager.worker_pids == pids


class SlowResetEnv(FaultyEnv):
    """Episodes of 2 steps whose reset takes 10 ms (a level to load: slow enough for its worker to reset it
    after the step's reply), and `reset_s` seconds after an episode while `budget_file` holds fewer than
    `failures` marks (each such reset spends one)."""

    def __init__(self, reset_s: float, budget_file: pathlib.Path, failures: int) -> None:
        super().__init__(budget_file=budget_file, failures=failures)
        self._reset_s = reset_s
        self._resets = 0

    def reset(self) -> np.ndarray:
        self._resets += 1
        time.sleep(self._reset_s if self._resets > 1 and self._spend_failure() else 0.01)
        return super().reset()

    def step(self, action: int) -> TimeStep:
        ts = super().step(action)
        return TimeStep(ts.obs, 1.0, self._t >= 2, False, NO_INFO)


def test_the_automatic_reset_is_timed_by_the_reset_timeout_not_the_step_timeout(launched, tmp_path):
    """An env whose reset takes longer than a step may (a level to load) plays on: the reset after an episode
    ends runs after the step's reply, under `reset_timeout`. It used to run inside the step command, so a
    worker whose reset outlasted `step_timeout` was killed as hung and the episode's last timestep lost."""
    manager = launched([partial(SlowResetEnv, 1.5, tmp_path / "budget", 2), FaultyEnv], num_workers=1,
                       step_timeout=0.5, reset_timeout=30.0, max_retry=0)
    pids = manager.worker_pids
    for _episode in range(3):
        assert not _step_all(manager)[0].done
        last = _step_all(manager)  # env 0's episode ends; its (slow) reset follows the reply
        assert last[0].terminated and last[0].info.failure is None and last[0].obs[0] == 2.0
        _until_ready(manager)
        assert manager.next_obs[0][0] == 0.0  # a new episode
    assert manager.failure_counts == {0: 0, 1: 0} and manager.worker_pids == pids
    assert manager.episode_counts[0] == 3


def test_a_hung_automatic_reset_keeps_the_finished_episode_and_rebuilds(launched, tmp_path):
    # reset_timeout also bounds a worker's start (spawning Python, building the env). It was 1 s: under CPU load
    # (2 cores, load average ~15) the launch itself failed twice, "gave no reply to start within 1.0 s (hung)".
    manager = launched([partial(SlowResetEnv, 3600.0, tmp_path / "budget", 1)], step_timeout=30.0,
                       reset_timeout=10.0, max_retry=1)
    old = manager.worker_pids
    _step_all(manager)
    last = _step_all(manager)
    assert last[0].terminated and last[0].obs[0] == 2.0 and last[0].info.failure is None  # returned before the reset
    _until_ready(manager)  # the reset hangs: its worker is killed after reset_timeout, and the env rebuilt
    assert manager.failure_counts == {0: 1} and alive(old) == [] and manager.worker_pids != old
    assert manager.next_obs[0][0] == 0.0 and manager.env_states[0] is EnvState.RUN


def test_retries_spent_on_a_hang_raise_and_clean_up(launched, tmp_path):
    manager = launched([partial(FaultyEnv, "hang", tmp_path / "budget", 5)], step_timeout=1.0, max_retry=0)
    pids = manager.worker_pids
    _step_all(manager)
    with pytest.raises(EnvError, match="hung"):
        _step_all(manager)
    assert manager.closed and alive(pids) == []


@contextlib.contextmanager
def _no_new_file_descriptors() -> Iterator[None]:
    """While inside, this process can open no file descriptor: every number up to the highest in use is taken
    (the kernel hands out the lowest free one) and RLIMIT_NOFILE stops just above it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    fillers: list[int] = []
    try:
        highest = max(int(name) for name in os.listdir("/proc/self/fd"))
        while not fillers or fillers[-1] < highest:
            fillers.append(os.open(os.devnull, os.O_RDONLY))
        resource.setrlimit(resource.RLIMIT_NOFILE, (fillers[-1] + 1, hard))
        with pytest.raises(OSError):
            os.open(os.devnull, os.O_RDONLY)
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        for fd in fillers:
            os.close(fd)


def test_a_worker_that_cannot_be_replaced_closes_the_manager(launched):
    """The OS refuses a replacement process (here: no file descriptor for its pipes). The manager used to stay
    open with no worker in the slot, and every later call failed with an AttributeError; an actor keeps an open
    manager for its next job. Now it closes, so the next job builds a new one."""
    manager = launched([FaultyEnv], max_retry=3)
    pids = manager.worker_pids
    _step_all(manager)
    os.kill(pids[0], signal.SIGKILL)
    with _no_new_file_descriptors(), pytest.raises(OSError):
        while True:
            _step_all(manager)
    assert manager.closed and alive(pids) == []
    with pytest.raises(EnvManagerClosedError):
        _step_all(manager)


def test_env_that_cannot_be_built_fails_launch(launched):
    with pytest.raises(EnvError, match="no such game") as raised:
        launched([FaultyEnv, unbuildable], num_workers=2)
    assert isinstance(raised.value.__cause__, OSError)


def test_an_env_that_fails_to_build_is_the_only_one_charged(launched, tmp_path):
    """Its worker gives up and is replaced, but the siblings never ran in it: charging them too (as for a worker
    that dies) used up their max_retry, so one later failure of their own ended the run."""
    manager = launched(
        [partial(built_after_failures, tmp_path / "build", 1),
         partial(FaultyEnv, "raise", tmp_path / "step", failures=1, fail_at=2)],
        num_workers=1, max_retry=1,
    )
    assert manager.failure_counts == {0: 1, 1: 0}
    for _ in range(6):
        _step_all(manager)  # env 1 fails once: its one retry
    assert manager.failure_counts == {0: 1, 1: 1} and not manager.closed


class SlowThenUnbuildable(FaultyEnv):
    """Its first step takes 0.5 s and raises, and from then on it cannot be built again (the marker file)."""

    def __init__(self, marker: pathlib.Path):
        if marker.exists():
            raise OSError("cannot be built any more")
        super().__init__()
        self._marker = marker

    def step(self, action: int) -> TimeStep:
        time.sleep(0.5)
        self._marker.write_text("x")
        raise ValueError("boom, and broken for good")


def test_a_reset_waiting_for_a_step_whose_env_breaks_for_good_raises_instead_of_looping(launched, tmp_path):
    """Failures found while a reset waits for the last job's steps were never counted: an env whose rebuild kept
    failing kept the reset waiting for ever (thousands of rebuilds, a review). One is let go; the next count."""
    manager = launched([FaultyEnv, partial(SlowThenUnbuildable, tmp_path / "broken")], num_workers=1, num_splits=2,
                       wait_num=1, max_retry=2)
    out = manager.step({0: 0, 1: 0})
    assert list(out) == [0]  # env 1 still stepping
    with pytest.raises(EnvError, match="max_retry=2"):
        manager.reset()
    assert manager.closed


class EndsAtOnce(FaultyEnv):
    def step(self, action: int) -> TimeStep:
        return TimeStep(np.array([1.0], np.float32), 1.0, True, False, NO_INFO)


def test_a_timestep_received_before_its_worker_died_is_returned_not_replaced(launched, tmp_path):
    """Env 0 ended its episode in the worker's first split, env 1 killed the worker in the second: env 0's real
    last step (reward, terminated) was replaced by a failure's, with the next episode's first observation (a
    review). It is returned as it was; env 1's is the failure."""
    manager = launched([EndsAtOnce, partial(FaultyEnv, "kill", tmp_path / "budget", 1, fail_at=1)],
                       num_workers=1, num_splits=2, max_retry=1)
    out = manager.step({0: 0, 1: 0})
    assert out[0].terminated and out[0].reward == 1.0 and out[0].info.failure is None, out[0]
    assert out[1].truncated and out[1].info.failure is not None


def test_an_action_that_cannot_be_pickled_is_refused_and_leaves_the_envs_ready(launched):
    """It failed inside the send, after the command counted as sent: the envs stayed in flight, and the next call
    killed the healthy worker as hung (a review)."""
    manager = launched([FaultyEnv, FaultyEnv], num_workers=1, step_timeout=2.0)
    pids = manager.worker_pids
    with pytest.raises(ValueError, match="action of env 0 cannot be sent"):
        manager.step({1: 0, 0: threading.Lock()})
    assert manager.ready_env == [0, 1]
    assert set(_step_all(manager)) == {0, 1} and manager.worker_pids == pids
    with pytest.raises(ValueError, match="reset_params of env 1 cannot be sent"):
        manager.reset({1: {"lock": threading.Lock()}})
    assert manager.ready_env == [0, 1]
