"""The lock that keeps a second coordinator off a state file and a second `league run` out of a run dir."""

import errno
import os
import signal
import subprocess
import sys

import pytest

from common.exclusive_lock import ExclusiveLock, LockedError


def test_one_holder_at_a_time_and_the_refusal_names_it(tmp_path):
    path = tmp_path / "state.sqlite.lock"
    with ExclusiveLock(path, "state X") as held:
        assert held.held
        with pytest.raises(LockedError, match=rf"state X is in use by pid {os.getpid()} on .* since .*; stop"):
            ExclusiveLock(path, "state X")
    again = ExclusiveLock(path, "state X")  # released on exit from the with block
    again.release()
    again.release()  # idempotent
    assert not again.held and path.exists()  # the file stays (deleting it would race with a new holder)


def test_a_holder_killed_with_sigkill_lets_go(tmp_path):
    path = tmp_path / "run.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from common.exclusive_lock import ExclusiveLock; "
         f"lock = ExclusiveLock({str(path)!r}, 'run'); print('held', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(LockedError, match=f"pid {holder.pid} "):
            ExclusiveLock(path, "run")
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        holder.stdout.close()
    ExclusiveLock(path, "run").release()


@pytest.mark.parametrize("call", ["ftruncate", "pwrite"])
def test_a_holder_line_that_cannot_be_written_lets_go_and_names_the_file(tmp_path, monkeypatch, call):
    """A full disk (or EIO) while writing who holds the lock raised from the constructor with the descriptor left
    open: the lock stayed held by nothing anyone could release, and a retry was refused as "in use"."""
    path = tmp_path / "state.sqlite.lock"

    def full_disk(*_args: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    open_fds = len(os.listdir("/proc/self/fd"))
    with monkeypatch.context() as patch:
        patch.setattr(os, call, full_disk)
        with pytest.raises(OSError, match=rf"lock file {path}: cannot write who holds it \(No space left") as raised:
            ExclusiveLock(path, "state X")
    assert raised.value.errno == errno.ENOSPC  # (callers tell a full disk by it)
    assert len(os.listdir("/proc/self/fd")) == open_fds
    ExclusiveLock(path, "state X").release()  # not held any more
