"""`interrupt()`: a caller that is stopping cuts the manager's call under way short (a launch of envs that take
long to build, a step that hangs) instead of waiting for its envs or their timeouts; every later call but
`close` is refused, and nothing of the manager is left after `close`. Real worker processes, real threads and
signals. The envs here take ten minutes or hang for ever: a call that returns at all was cut short."""

from __future__ import annotations

import linecache
import logging
import sys
import threading
from functools import partial

import pytest

from actor_service.env_managers import EnvManagers
from actor_service.envs import BaseEnvManager, EnvManagerConfig, EnvManagerInterrupted
from tests.env_doubles import HANGS_RELEASED, FlakyEnv, HangingCloseEnv
from tests.env_manager_launcher import alive
from tests.polling import wait_until

SLOW_BUILD = {"inner": "python:tests.env_doubles:CountingEnv", "build_s": 600.0}
NO_TIMEOUTS = {"step_timeout": 600.0, "reset_timeout": 600.0}
# The serial manager's timeouts: far away, or none at all (its watchdog still takes the interrupt).
SERIAL_TIMEOUTS = pytest.mark.parametrize("timeouts", [NO_TIMEOUTS, {"step_timeout": None, "reset_timeout": None}],
                                          ids=["600s", "none"])


@pytest.fixture(autouse=True)
def fresh_flaky_envs():
    FlakyEnv._process_steps = 0
    HANGS_RELEASED.clear()
    yield
    HANGS_RELEASED.set()  # let anything still hung in this process return
    FlakyEnv._process_steps = 0


def interrupt_when(manager, ready, what: str) -> tuple[threading.Thread, list[int]]:
    """A thread that interrupts `manager` once `ready()` holds (the call to cut short is then under way); the
    list gets the manager's worker pids of that moment."""
    pids: list[int] = []

    def run() -> None:
        wait_until(what, ready, 60)
        pids.extend(getattr(manager, "worker_pids", ()))
        manager.interrupt()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, pids


def test_subprocess_launch_of_slow_envs_is_cut_short_and_leaves_no_worker():
    from actor_service.envs import SubprocessEnvManager, SubprocessEnvManagerConfig

    manager = SubprocessEnvManager([partial(FlakyEnv, **SLOW_BUILD)] * 4,
                                   SubprocessEnvManagerConfig(num_workers=2, **NO_TIMEOUTS))
    interrupter, pids = interrupt_when(manager, lambda: len(manager.worker_pids) == 2, "the workers to start")
    with pytest.raises(EnvManagerInterrupted):
        manager.launch()
    interrupter.join(60)
    assert manager.closed and len(pids) == 2  # a failed launch closes the manager
    assert alive(pids) == []


def test_subprocess_step_that_hangs_is_cut_short(tmp_path):
    from actor_service.envs import SubprocessEnvManager, SubprocessEnvManagerConfig

    marker = tmp_path / "hung"
    env = partial(FlakyEnv, inner="python:tests.env_doubles:CountingEnv", hang_every=3, hang_marker=str(marker))
    manager = SubprocessEnvManager([env] * 2, SubprocessEnvManagerConfig(num_workers=1, wait_num=2, **NO_TIMEOUTS))
    try:
        manager.launch()
        pids = manager.worker_pids
        interrupter, _ = interrupt_when(manager, marker.exists, "a step to hang")
        with pytest.raises(EnvManagerInterrupted):
            for _ in range(10):
                manager.step(dict.fromkeys(manager.ready_env, 0))
        interrupter.join(60)
        assert manager.failure_counts == {0: 0, 1: 0}  # the interrupt is not the envs' failure
        with pytest.raises(EnvManagerInterrupted):  # every later call but close
            manager.reset()
    finally:
        manager.close()
    assert alive(pids) == []


def test_a_ctrl_c_while_close_waits_for_the_workers_still_reaps_them_and_frees_shared_memory(tmp_path):
    """A SIGINT landing while `close` waits for a hung worker to exit: close was marked done before its wait, so
    the interrupt left the worker running, the blocks in /dev/shm, and a second close (or the exit hook)
    did nothing: the interpreter then hung at exit on the worker, which ignores SIGTERM (a review)."""
    import os
    import signal

    from actor_service.envs import SubprocessEnvManager, SubprocessEnvManagerConfig
    from actor_service.envs.env_manager import subprocess as subprocess_manager

    def own_blocks() -> set[str]:  # (lg<namespace>_<creator pid>_<id>: other test processes make theirs)
        return {name for name in os.listdir("/dev/shm") if f"_{os.getpid()}_" in name}

    shm_before = own_blocks()
    marker = tmp_path / "hung"
    env = partial(FlakyEnv, inner="python:tests.env_doubles:CountingEnv", hang_every=3, hang_marker=str(marker))
    manager = SubprocessEnvManager([env] * 2, SubprocessEnvManagerConfig(num_workers=1, wait_num=2,
                                                                         close_timeout=30.0, **NO_TIMEOUTS))
    try:
        manager.launch()
        pids = manager.worker_pids
        assert own_blocks() - shm_before  # the observation blocks
        interrupter, _ = interrupt_when(manager, marker.exists, "a step to hang")
        with pytest.raises(EnvManagerInterrupted):
            for _ in range(10):
                manager.step(dict.fromkeys(manager.ready_env, 0))
        interrupter.join(60)
        # Python's own SIGINT handler for the signal (a test before this one in the process may have left
        # another), which raises KeyboardInterrupt in this (the main) thread.
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        ctrl_c = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
        try:
            ctrl_c.start()
            with pytest.raises(KeyboardInterrupt):
                manager.close()  # waits up to 30 s for the hung worker: cut short after 0.5 s
            ctrl_c.join()
        finally:
            signal.signal(signal.SIGINT, previous)
        assert alive(pids) == [] and manager.closed
        assert own_blocks() <= shm_before
        assert manager not in subprocess_manager._open_managers
    finally:
        manager.close()
    assert alive(pids) == []


@SERIAL_TIMEOUTS
def test_serial_launch_in_the_main_thread_is_cut_short_in_a_blocking_wait(timeouts):
    """The watchdog gets into a wait of the main thread (a signal), as it does for a hung env."""
    manager = BaseEnvManager([partial(FlakyEnv, **SLOW_BUILD)] * 3, EnvManagerConfig(**timeouts))
    timer = threading.Timer(0.5, manager.interrupt)
    timer.start()
    try:
        with pytest.raises(EnvManagerInterrupted):
            manager.launch()
    finally:
        timer.cancel()
    assert manager.closed
    assert not [t for t in threading.enumerate() if t.name.startswith("env-watchdog")]


def playing_in_a_thread(manager: BaseEnvManager) -> tuple[threading.Thread, list[BaseException]]:
    """A thread (not the main one) that launches `manager` and steps it; the list gets what it raised."""
    raised: list[BaseException] = []

    def drive() -> None:
        try:
            manager.launch()
            for _ in range(10):
                manager.step(dict.fromkeys(manager.ready_env, 0))
        except BaseException as err:
            raised.append(err)

    driver = threading.Thread(target=drive, daemon=True)  # (one that never ends must not hang the exit)
    driver.start()
    return driver, raised


@SERIAL_TIMEOUTS
def test_serial_step_spinning_in_python_code_is_cut_short_outside_the_main_thread(tmp_path, timeouts, caplog):
    """The cut is logged at INFO: it is what the stopping caller asked for (an actor's SIGTERM, which most often
    lands in a step), and a WARNING for it showed in the logs of healthy `league run`s that ended."""
    caplog.set_level(logging.INFO, logger="actor_service.envs.env_manager.watchdog")
    marker = tmp_path / "hung"
    env = partial(FlakyEnv, inner="python:tests.env_doubles:CountingEnv", hang_every=5, hang_kind="spin",
                  hang_marker=str(marker))
    manager = BaseEnvManager([env] * 2, EnvManagerConfig(**timeouts))
    driver, raised = playing_in_a_thread(manager)
    try:
        wait_until("a step to hang", marker.exists, 60)
        manager.interrupt()
        driver.join(60)
        assert not driver.is_alive()
        assert len(raised) == 1 and isinstance(raised[0], EnvManagerInterrupted), raised
        assert manager.failure_counts == {0: 0, 1: 0}

        def cuts() -> list[logging.LogRecord]:
            return [r for r in caplog.records if "was cut short (the manager was interrupted)" in r.getMessage()]

        # (The watchdog thread logs the cut after raising it in the driver, which may have ended before that.)
        wait_until("the cut to be logged", cuts, 10)
        assert len(cuts()) == 1 and cuts()[0].levelno == logging.INFO, [(r.levelname, r.getMessage()) for r in cuts()]
    finally:
        HANGS_RELEASED.set()
        driver.join(60)
        manager.close()


def blocked_in_lock_wait(thread: threading.Thread) -> bool:
    """`thread` is inside the C call of a lock wait (threading's `waiter.acquire()`), where no async exception
    gets in until it returns."""
    frame = sys._current_frames().get(thread.ident)
    return frame is not None and frame.f_code.co_name == "wait" and "acquire()" in linecache.getline(
        frame.f_code.co_filename, frame.f_lineno)


@SERIAL_TIMEOUTS
def test_serial_step_blocked_where_no_interrupt_gets_in_shows_as_stalled_from_the_interrupt(tmp_path, timeouts):
    """A blocking wait outside the main thread: the call goes on, but `stalled_s` counts from the interrupt, not
    from the step's timeout ten minutes away (the actor's process gives up on it: actor_service/cli.py)."""
    marker = tmp_path / "hung"
    env = partial(FlakyEnv, inner="python:tests.env_doubles:CountingEnv", hang_every=5, hang_marker=str(marker))
    manager = BaseEnvManager([env] * 2, EnvManagerConfig(**timeouts))
    driver, raised = playing_in_a_thread(manager)
    try:
        wait_until("a step to hang", marker.exists, 60)
        # Between the marker and the lock wait the env runs a few lines of Python, where the interrupt would get in.
        wait_until("the step to block in its lock wait", lambda: blocked_in_lock_wait(driver), 60)
        assert manager.stalled_s() == 0.0
        manager.interrupt()
        wait_until("the step to show as stalled", lambda: manager.stalled_s() > 0.5, 60)
        assert driver.is_alive()
        HANGS_RELEASED.set()  # the env comes back: the step ends with the interrupt, not as the env's failure
        driver.join(60)
        assert len(raised) == 1 and isinstance(raised[0], EnvManagerInterrupted), raised
        assert manager.stalled_s() == 0.0
    finally:
        HANGS_RELEASED.set()
        driver.join(60)
        manager.close()


@pytest.mark.parametrize("kind", ["base", "subprocess"])
def test_env_managers_launch_nothing_once_interrupted(kind):
    managers = EnvManagers(kind)
    managers.interrupt()
    with pytest.raises(EnvManagerInterrupted):
        managers.acquire("python:tests.env_doubles:CountingEnv", {}, 2, seed=1)
    assert managers.current is None
    managers.close()


def test_env_managers_discard_a_manager_interrupted_in_a_reset():
    """A reused manager cut short in its reset is closed, not handed to the next job half reset."""
    managers = EnvManagers("base")
    try:
        first = managers.acquire("python:tests.env_doubles:CountingEnv", {}, 2, seed=1)
        first.interrupt()
        with pytest.raises(EnvManagerInterrupted):
            managers.acquire("python:tests.env_doubles:CountingEnv", {}, 2, seed=2)
        assert first.closed and managers.current is None
    finally:
        managers.close()


@SERIAL_TIMEOUTS
def test_the_closes_of_an_interrupted_serial_manager_share_a_short_budget(timeouts, caplog):
    """Each close was watched with the whole reset_timeout, one env after another: a stop with envs whose close
    hangs took minutes (67 s for two at 30 s; a review), or for ever with no timeout. Interrupted, the manager
    gives all its closes INTERRUPTED_CLOSE_S and leaves an env still closing as it is."""
    import time

    from actor_service.envs.env_manager.base import INTERRUPTED_CLOSE_S

    manager = BaseEnvManager([partial(HangingCloseEnv)] * 3, EnvManagerConfig(**timeouts))
    manager.launch()
    manager.interrupt()
    started = time.monotonic()
    with caplog.at_level(logging.WARNING):
        manager.close()
    assert time.monotonic() - started < INTERRUPTED_CLOSE_S + 1.0
    assert caplog.text.count("hung in close") == 3
    assert manager.closed
