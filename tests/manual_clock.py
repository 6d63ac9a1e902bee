"""A clock that moves only when a test says so: for the timers, leases and intervals tests step through without
sleeping (a sleep under CPU load wakes late, and the test then measures the machine)."""

from __future__ import annotations


class ManualClock:
    """Callable like `time.monotonic`; tests set or advance `now`."""

    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
