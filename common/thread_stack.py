"""Where a thread is stuck, for the log of a process that gives up on it (a stop that could not get it back)."""

from __future__ import annotations

import sys
import threading
import traceback
from pathlib import Path

STACK_LINES = 12
"""Innermost frames kept: enough to show the call that hangs and who made it."""
OWN_FRAMES = 6
"""Frames of this project's code further out, kept above them: a stop stuck deep in torch showed twelve frames
of torch and none of the learner's (a reviewer could not tell it was in the learner's release)."""
_PROJECT = str(Path(__file__).resolve().parents[1])


def stack_of(thread: threading.Thread, lines: int = STACK_LINES) -> str:
    """The innermost `lines` frames of `thread`, as a traceback shows them, below the innermost OWN_FRAMES of the
    project's own frames further out (after a '...')."""
    frame = sys._current_frames().get(thread.ident) if thread.ident is not None else None
    if frame is None:
        return "  (its stack is gone)"
    frames = traceback.extract_stack(frame)
    inner, outer = frames[-lines:], frames[:-lines]
    own = [f for f in outer if _is_own(f.filename)][-OWN_FRAMES:]
    head = "".join(traceback.format_list(own)) + "  ...\n" if own else ""
    return (head + "".join(traceback.format_list(inner))).rstrip()


def _is_own(filename: str) -> bool:
    return filename.startswith(_PROJECT) and "site-packages" not in filename
