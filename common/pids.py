"""Whether a process id names a running process: what cleanups of other processes' leftovers ask first."""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """True while `pid` exists (a zombie counts): signal 0 checks without sending anything."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True
