"""Where a thread is stuck, for the log of a process that gives up on it (a stop that could not get it back)."""

from __future__ import annotations

import sys
import threading
import traceback

STACK_LINES = 12
"""Lines of the innermost frames kept: enough to show the call that hangs and who made it."""


def stack_of(thread: threading.Thread, lines: int = STACK_LINES) -> str:
    """The innermost frames of `thread`, as a traceback shows them."""
    frame = sys._current_frames().get(thread.ident) if thread.ident is not None else None
    if frame is None:
        return "  (its stack is gone)"
    return "".join(traceback.format_stack(frame)[-lines:]).rstrip()
