"""How SubprocessEnvManager sizes itself from the CPU count when the config leaves it open (no processes are
started: sizing happens when the manager is built)."""

from __future__ import annotations

import os

import pytest

from actor_service.envs import SubprocessEnvManager, SubprocessEnvManagerConfig
from tests.env_doubles import CountingEnv


@pytest.fixture
def cpus(monkeypatch):
    """Pretend this process may run on `n` CPUs."""

    def set_cpus(n: int) -> None:
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(n)))

    return set_cpus


def _manager(env_num: int, **config) -> SubprocessEnvManager:
    return SubprocessEnvManager([CountingEnv] * env_num, SubprocessEnvManagerConfig(**config))


def test_defaults_leave_the_parent_a_cpu_and_spin_in_halves(cpus):
    cpus(2)
    manager = _manager(8)
    assert (manager.num_workers, manager.num_splits, manager.wait_num) == (1, 2, 4)
    assert manager.worker_spin_s == manager.parent_spin_s == pytest.approx(SubprocessEnvManagerConfig().spin_s)
    cpus(16)
    manager = _manager(8)
    assert (manager.num_workers, manager.num_splits, manager.wait_num) == (8, 2, 1)  # one env per worker
    assert manager.worker_spin_s > 0 and manager.parent_spin_s > 0


def test_a_worker_per_cpu_leaves_the_parent_sleeping_and_sends_one_message_per_worker(cpus):
    """With as many workers as CPUs, the parent shares a CPU with a worker: it sleeps (and is run on a
    waiting worker's CPU when a reply wakes it), and each worker's envs go in one message."""
    cpus(2)
    manager = _manager(8, num_workers=2)
    assert (manager.num_workers, manager.num_splits, manager.wait_num) == (2, 1, 4)
    assert manager.parent_spin_s == 0.0 and manager.worker_spin_s > 0
    cpus(1)
    manager = _manager(3)
    assert (manager.num_workers, manager.num_splits, manager.parent_spin_s) == (1, 1, 0.0)
    manager = _manager(8, num_workers=4)  # more workers than CPUs: nobody spins
    assert manager.parent_spin_s == manager.worker_spin_s == 0.0


def test_explicit_settings_win(cpus):
    cpus(2)
    manager = _manager(8, num_workers=2, num_splits=2, wait_num=8, spin_s=50e-6)
    assert (manager.num_workers, manager.num_splits, manager.wait_num) == (2, 2, 8)
    assert manager.worker_spin_s == 50e-6
    manager = _manager(8, spin_s=0.0)
    assert manager.parent_spin_s == manager.worker_spin_s == 0.0


def test_a_cpu_share_sizes_the_manager_as_a_machine_of_that_many_cpus(cpus):
    """Two actors on two CPUs, each given one: one worker, one message per step, the parent sleeping,
    instead of the whole machine's sizing twice over."""
    cpus(2)
    manager = _manager(8, cpus=1)
    assert (manager.num_workers, manager.num_splits, manager.wait_num) == (1, 1, 8)
    assert manager.parent_spin_s == 0.0
    cpus(64)  # a container seeing a large node's CPUs with a quota of four
    manager = _manager(16, cpus=4)
    assert (manager.num_workers, manager.num_splits) == (3, 2)


@pytest.mark.parametrize("field", ["num_splits", "spin_s", "cpus"])
def test_bad_settings_name_the_field(field):
    with pytest.raises(ValueError, match=field):
        SubprocessEnvManagerConfig(**{field: -1})
