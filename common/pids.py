"""Whether a process id names a running process: what cleanups of other processes' leftovers ask first."""

from __future__ import annotations

import os

_MAX_PID = 2**22  # Linux's PID_MAX_LIMIT


def pid_alive(pid: int) -> bool:
    """True while `pid` exists (a zombie counts): signal 0 checks without sending anything. Only a positive pid
    the kernel could give names a process: 0 and negative ones name process groups (0: our own, so "alive"),
    and one beyond a C int made os.kill raise OverflowError (a file name in /dev/shm is anyone's to choose)."""
    if not 0 < pid <= _MAX_PID:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True
