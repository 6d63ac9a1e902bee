"""Waiting on another process's state in tests: there is no event to wait on across a process boundary."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any


def wait_until(what: str, check: Callable[[], Any], timeout_s: float, context: Callable[[], str] = str) -> Any:
    """Poll until ``check()`` is truthy and return it; on timeout fail naming `what`, with ``context()``
    (logs, say) in the message."""
    deadline = time.monotonic() + timeout_s
    pause = threading.Event()  # never set: its wait() is the pause between polls
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}\n{context()}")
        pause.wait(0.1)
