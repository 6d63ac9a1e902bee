"""Shared-memory blocks that a killed process does not leave behind for good.

A block lives in /dev/shm until someone unlinks it. The manager unlinks its blocks at close, and Python's
resource tracker does so when the manager's process dies without closing; but SIGKILL to a whole process
group (an orchestrator stopping an actor, `kill -9 -PGID`) kills the tracker too, and the blocks stay until
reboot. So every block is named after the process that creates it, `lg<pid namespace>_<pid>_<random>`, and a
manager starting up removes the blocks of processes of its own PID namespace that are gone
(`remove_orphaned_blocks`). Blocks of other PID namespaces (containers sharing /dev/shm) are never touched:
their PIDs mean nothing here.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import secrets
from multiprocessing import shared_memory

from common.pids import pid_alive

logger = logging.getLogger(__name__)

SHM_DIR = "/dev/shm"
_NAME = re.compile(r"^lg(\d+)_(\d+)_[0-9a-f]{8}$")


def _pid_namespace() -> str:
    """This process's PID namespace id (the inode of /proc/self/ns/pid), "0" where there is none to read."""
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return "0"


def create_block(size: int) -> shared_memory.SharedMemory:
    """A new block of `size` bytes named after this process (see the module doc), its memory reserved: OSError
    (ENOSPC) when /dev/shm has no room for it."""
    prefix = f"lg{_pid_namespace()}_{os.getpid()}_"
    for _ in range(16):
        try:
            shm = shared_memory.SharedMemory(name=prefix + secrets.token_hex(4), create=True, size=size)
        except FileExistsError:  # 32 random bits taken already: draw again
            continue
        _reserve(shm, size)
        return shm
    raise FileExistsError(f"no free shared-memory name with prefix {prefix!r} after 16 draws")


def _reserve(shm: shared_memory.SharedMemory, size: int) -> None:
    """Allocate the block's pages now. A block is only ftruncate()d into being, which succeeds on a full /dev/shm
    (a tmpfs: docker gives a container 64 MB); the first write into its memory then raised SIGBUS, which
    killed the actor (or an env worker) without a word. Reserved here, a full /dev/shm is an OSError naming it,
    and the block is removed."""
    fd = getattr(shm, "_fd", -1)
    if fd < 0 or not hasattr(os, "posix_fallocate"):
        return
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as err:
        if err.errno in (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOSYS):  # a filesystem without it: as before
            return
        shm.close()
        shm.unlink()
        raise OSError(err.errno, f"no room in {SHM_DIR} for a shared-memory block of {size:,} bytes "
                      f"({err.strerror}): free space there, or make it larger (docker: --shm-size)") from err


def remove_orphaned_blocks(directory: str = SHM_DIR) -> list[str]:
    """Unlink the blocks in `directory` created by processes of this PID namespace that no longer exist;
    returns their names. A directory that does not exist (no POSIX shared memory there) gives []."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    namespace = _pid_namespace()
    removed = []
    for name in names:
        match = _NAME.match(name)
        if match is None or match.group(1) != namespace or pid_alive(int(match.group(2))):
            continue
        path = os.path.join(directory, name)
        try:
            # Another user's (/dev/shm is sticky: unlink refuses it): raised, it failed every launch of this
            # user's env managers (a review), as any block a local user names so could.
            if os.stat(path, follow_symlinks=False).st_uid != os.geteuid():
                continue
            os.unlink(path)
        except FileNotFoundError:  # removed by another process's sweep meanwhile
            continue
        except OSError as err:  # a sweep is housekeeping: it never fails a launch
            logger.debug("could not remove the orphaned shared-memory block %s: %s", path, err)
            continue
        removed.append(name)
    if removed:
        logger.warning("removed %d shared-memory block(s) left behind by killed processes: %s", len(removed),
                       ", ".join(sorted(removed)))
    return removed
