"""pid_alive answers for any integer: the orphaned shared-memory sweep reads pids out of /dev/shm file names,
which any local process can choose."""

from __future__ import annotations

import os

import pytest

from actor_service.envs.env_manager.shm_blocks import _pid_namespace, remove_orphaned_blocks
from common.pids import pid_alive


@pytest.mark.parametrize("pid", [0, -1, 2**31, 2**63])
def test_only_a_pid_the_kernel_could_give_can_be_alive(pid):
    assert pid_alive(pid) is False  # 0 named our own process group (alive); 2**31 raised OverflowError


def test_this_process_is_alive():
    assert pid_alive(os.getpid())


def test_the_orphan_sweep_survives_a_name_with_an_impossible_pid(tmp_path):
    odd = tmp_path / f"lg{_pid_namespace()}_99999999999_deadbeef"
    odd.write_bytes(b"")
    remove_orphaned_blocks(str(tmp_path))  # raised OverflowError: every SubprocessEnvManager launch failed
