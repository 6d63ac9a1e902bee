"""An exclusive lock on a file that says who holds it: one coordinator per state file, one `league run` per run dir.

Why: two coordinators on one SQLite state each keep their own league in memory and overwrite each other's
commits, and two `league run`s in one run directory also share checkpoints, logs and the status history.
Nothing stopped either (a second terminal, a container restarted while the old one still runs).

`flock` on a separate `.lock` file, never on the SQLite file itself: SQLite takes POSIX locks on its own file,
and closing any other descriptor of that file would drop them. The kernel lets go of the lock when the holder
exits, however it exits (kill -9 included), so a crashed holder never blocks a restart. The lock file is
never deleted: removing it would let a second process lock a new file while a third still locks the old one.
"""

from __future__ import annotations

import datetime
import fcntl
import os
import socket
from pathlib import Path


class LockedError(RuntimeError):
    """Another live process holds the lock."""


class ExclusiveLock:
    """Held from construction until `release()` (idempotent) or the process's exit. When the holder line cannot
    be written (a full disk), the lock is let go and an OSError naming the lock file (errno kept) is raised."""

    def __init__(self, path: str | Path, what: str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise LockedError(f"{what} is in use by {holder or 'another process'} (lock file {self.path}); "
                              f"stop that one first") from None
        except BaseException:
            os.close(fd)
            raise
        stamp = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since {stamp}\n".encode(), 0)
        except OSError as err:
            # (a full disk, EIO) Let go: raised from here, the descriptor leaked and kept the lock held by nobody,
            # so even a retry in this process was refused with "in use by another process".
            os.close(fd)
            raise OSError(err.errno, f"lock file {self.path}: cannot write who holds it "
                                     f"({err.strerror or err})") from err
        except BaseException:
            os.close(fd)
            raise
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    @property
    def fd(self) -> int:
        """The descriptor the lock is on. A child process given it (`Popen(pass_fds=...)`) shares the lock: it is
        held until the holder and every such child have exited."""
        if self._fd is None:
            raise RuntimeError(f"{self.path}: the lock was released")
        return self._fd

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing the descriptor lets go of the lock

    def __enter__(self) -> ExclusiveLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read_holder(fd: int) -> str:
    try:
        return os.pread(fd, 512, 0).decode(errors="replace").strip()
    except OSError:
        return ""
