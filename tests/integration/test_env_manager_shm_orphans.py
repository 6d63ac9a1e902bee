"""Shared-memory blocks of a manager whose whole process group was SIGKILLed (its resource tracker with it)
are removed by the next manager that starts on the machine; blocks of live processes are never touched."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from actor_service.envs import SubprocessEnvManager, SubprocessEnvManagerConfig
from actor_service.envs.env_manager.shm_blocks import SHM_DIR, _pid_namespace, remove_orphaned_blocks
from tests.env_doubles import CountingEnv
from tests.polling import wait_until

ROOT = Path(__file__).resolve().parents[2]


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_only_blocks_of_gone_processes_of_this_namespace_are_removed(tmp_path):
    ns, dead = _pid_namespace(), _dead_pid()
    names = {
        "orphan": f"lg{ns}_{dead}_0123abcd",
        "mine": f"lg{ns}_{os.getpid()}_0123abcd",
        "other_namespace": f"lg1{ns}_{dead}_0123abcd",
        "foreign": "psm_0123abcd",
        "lookalike": f"lg{ns}_{dead}_0123abcd.bak",
    }
    for name in names.values():
        (tmp_path / name).write_bytes(b"x")
    assert remove_orphaned_blocks(str(tmp_path)) == [names["orphan"]]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(n for k, n in names.items() if k != "orphan")
    assert remove_orphaned_blocks(str(tmp_path / "missing")) == []



def test_a_block_another_user_left_or_one_that_cannot_be_removed_never_fails_the_sweep(tmp_path, monkeypatch):
    """/dev/shm is sticky: an orphan of another user's killed actor (or a file any local user names so) made
    unlink raise PermissionError, and every SubprocessEnvManager launch of this user failed (a review). Another
    user's block is left alone; a block this user cannot remove is skipped."""
    import errno

    import actor_service.envs.env_manager.shm_blocks as shm_blocks

    ns, dead = _pid_namespace(), _dead_pid()
    others, mine = tmp_path / f"lg{ns}_{dead}_0123abcd", tmp_path / f"lg{ns}_{dead}_4567cdef"
    others.write_bytes(b"x")
    mine.write_bytes(b"x")
    me = os.stat(mine).st_uid
    monkeypatch.setattr(shm_blocks.os, "geteuid", lambda: me + 1)  # every block is another user's
    assert remove_orphaned_blocks(str(tmp_path)) == [] and others.exists() and mine.exists()
    monkeypatch.setattr(shm_blocks.os, "geteuid", lambda: me)
    real_unlink = os.unlink

    def refused(path, *args, **kwargs):
        if path.endswith(others.name):
            raise PermissionError(errno.EPERM, "Operation not permitted", path)
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(shm_blocks.os, "unlink", refused)
    assert remove_orphaned_blocks(str(tmp_path)) == [mine.name]
    assert others.exists() and not mine.exists()


CHILD = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, sys.argv[1])
    from actor_service.envs import SubprocessEnvManager, SubprocessEnvManagerConfig
    from tests.env_doubles import CountingEnv
    manager = SubprocessEnvManager([CountingEnv] * 2, SubprocessEnvManagerConfig(num_workers=1))
    manager.launch()
    print("launched", flush=True)
    time.sleep(600)
""")


def test_blocks_left_by_a_sigkilled_process_group_are_removed_by_the_next_manager():
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(ROOT)], stdout=subprocess.PIPE, text=True,
                             start_new_session=True)
    prefix = f"lg{_pid_namespace()}_{child.pid}_"
    try:
        assert child.stdout.readline().strip() == "launched"
        left = [n for n in os.listdir(SHM_DIR) if n.startswith(prefix)]
        assert len(left) == 2  # the observation buffer and the doorbells
    finally:
        os.killpg(child.pid, signal.SIGKILL)  # the manager, its env worker and its resource tracker
        child.wait(30)
        child.stdout.close()
    wait_until("the killed group's processes to be gone",
               lambda: not subprocess.run(["pgrep", "-g", str(child.pid)], capture_output=True).stdout, 30)
    # Nobody of the killed group cleaned up (its resource tracker died with it). Another env manager that starts
    # on this machine meanwhile (a league's actor, a test run beside this one) removes them as the one below
    # would: the behaviour under test, by another process. Only then may some be gone already.
    gone = [n for n in left if not os.path.exists(os.path.join(SHM_DIR, n))]
    if gone:
        print(f"another env manager on this machine removed {gone} first")
    manager = SubprocessEnvManager([CountingEnv] * 2, SubprocessEnvManagerConfig(num_workers=1))
    try:
        manager.launch()
        assert not [n for n in left if os.path.exists(os.path.join(SHM_DIR, n))]
        assert [n for n in os.listdir(SHM_DIR) if n.startswith(f"lg{_pid_namespace()}_{os.getpid()}_")]
    finally:
        manager.close()
    assert not [n for n in os.listdir(SHM_DIR) if n.startswith(f"lg{_pid_namespace()}_{os.getpid()}_")]


def test_a_block_that_does_not_fit_in_dev_shm_is_an_error_naming_it_not_a_sigbus(monkeypatch):
    """A block was only ftruncate()d into being, which a full /dev/shm (a tmpfs; docker gives 64 MB) allows: the
    first write into it raised SIGBUS and the actor died without a word ("Bus error", exit -7). Its pages are
    reserved at creation now: a full /dev/shm is an OSError naming it, and the block is gone."""
    import errno

    from actor_service.envs.env_manager import shm_blocks

    before = set(os.listdir(SHM_DIR))

    def full(fd, offset, size):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    try:
        shm_blocks.create_block(1 << 20)
    except OSError as err:
        assert err.errno == errno.ENOSPC and f"no room in {SHM_DIR}" in str(err), err
    else:
        raise AssertionError("a block was created that /dev/shm has no room for")
    assert {n for n in os.listdir(SHM_DIR) if n.startswith(f"lg{_pid_namespace()}_{os.getpid()}_")} <= before


def test_an_env_manager_on_a_full_dev_shm_fails_with_an_error_and_lives(tmp_path):
    """The same with a real full /dev/shm: a small tmpfs mounted over it in a mount namespace of its own (root
    only). Before, the process launching the manager died of SIGBUS."""
    if os.geteuid() != 0 or subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
        import pytest

        pytest.skip("needs root and mount namespaces to mount a small /dev/shm")
    script = textwrap.dedent("""
        import os
        from actor_service.envs import SubprocessEnvManager, SubprocessEnvManagerConfig
        from tests.env_doubles import CountingEnv
        fd = os.open("/dev/shm/filler", os.O_WRONLY | os.O_CREAT)
        try:
            while True:
                os.write(fd, bytes(4096))
        except OSError:
            pass
        manager = SubprocessEnvManager([CountingEnv] * 2, SubprocessEnvManagerConfig())
        try:
            manager.launch()
        except OSError as err:
            print("refused:", err)
        manager.close()
    """)
    done = subprocess.run(
        ["unshare", "-m", "sh", "-c", 'mount -t tmpfs -o size=256k tmpfs /dev/shm && exec "$0" -c "$1"',
         sys.executable, script], capture_output=True, text=True, timeout=60, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "refused: [Errno 28] no room in /dev/shm" in done.stdout, done.stdout + done.stderr[-2000:]
