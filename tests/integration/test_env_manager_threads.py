"""A worker's parent-death signal follows the thread that forked it: workers are started from a thread that
lives as long as the process, so a manager launched (or a worker replaced) in a thread that then ends keeps
its workers."""

from __future__ import annotations

import os
import signal
import threading

from actor_service.envs import SubprocessEnvManager, SubprocessEnvManagerConfig
from actor_service.envs.env_manager import subprocess as subprocess_manager
from tests.env_doubles import CountingEnv
from tests.polling import wait_until


def _manager(**config) -> SubprocessEnvManager:
    return SubprocessEnvManager([CountingEnv] * 2, SubprocessEnvManagerConfig(num_workers=1, wait_num=2, **config))


def _in_a_thread_that_ends(work) -> None:
    thread = threading.Thread(target=work)
    thread.start()
    thread.join()


def _failures_after_steps(manager: SubprocessEnvManager) -> dict[int, int]:
    """Step every env a few times from this (the main) thread; the failures counted by then."""
    for _ in range(4):
        manager.step({env_id: 1 for env_id in manager.ready_env})
    return manager.failure_counts


def test_workers_outlive_the_thread_that_launched_them():
    manager = _manager()
    try:
        _in_a_thread_that_ends(manager.launch)
        assert _failures_after_steps(manager) == {0: 0, 1: 0}
    finally:
        manager.close()


def test_a_replacement_outlives_the_thread_that_found_its_predecessor_dead():
    manager = _manager(max_retry=2)
    try:
        manager.launch()
        os.kill(manager.worker_pids[0], signal.SIGKILL)

        def step_until_replaced() -> None:
            manager.step({env_id: 1 for env_id in manager.ready_env})
            while len(manager.ready_env) < 2:  # the replacement has answered: its prctl has run
                manager.step({})

        _in_a_thread_that_ends(step_until_replaced)
        assert _failures_after_steps(manager) == {0: 1, 1: 1}  # the kill only
    finally:
        manager.close()


def test_a_manager_dropped_without_close_is_closed_at_exit():
    manager = _manager()
    manager.launch()
    pids = manager.worker_pids
    del manager
    assert any(open_one.worker_pids == pids for open_one in subprocess_manager._open_managers)
    subprocess_manager._close_open_managers()
    wait_until("workers gone", lambda: not any(os.path.exists(f"/proc/{pid}") for pid in pids), 5.0)
