"""The clock a worker counts its lease by.

`time.monotonic()` is CLOCK_MONOTONIC on Linux, which stands still while the machine is suspended (a laptop's
sleep, a VM suspended or snapshotted). A learner resumed after a suspend longer than its lease counted the lease
as still held and published, though the coordinator on another host had expired it and may have bound the player
to another learner: the two writers `LeaseKeeper.held` exists to prevent (a review). CLOCK_BOOTTIME counts the
suspended time; elsewhere the monotonic clock is what there is.
"""

from __future__ import annotations

import time
from collections.abc import Callable


def _boottime() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


lease_now: Callable[[], float] = _boottime if hasattr(time, "CLOCK_BOOTTIME") else time.monotonic
"""Seconds on a clock that goes on while the machine is suspended (Linux), for comparing with a lease's length."""
