"""stack_of: where a stuck thread is, in the log of a process that gives up on it."""

from __future__ import annotations

import threading

from common.thread_stack import stack_of

_LIBRARY = {}
exec(compile(  # frames of code outside the project, as torch's are
    "def deep(depth, ready, release):\n"
    "    if depth:\n"
    "        deep(depth - 1, ready, release)\n"
    "        return\n"
    "    ready.set()\n"
    "    release.wait(10)\n",
    "/usr/lib/python3/dist-packages/a_library.py", "exec"), _LIBRARY)


def _project_entry_point(ready: threading.Event, release: threading.Event) -> None:
    _LIBRARY["deep"](30, ready, release)


def test_the_projects_own_frames_further_out_are_shown_above_the_innermost_ones():
    """A learner stuck deep in torch showed twelve frames of torch and none of its own (a reviewer could not
    tell that it was in the learner's release)."""
    ready, release = threading.Event(), threading.Event()
    thread = threading.Thread(target=_project_entry_point, args=(ready, release), daemon=True)
    thread.start()
    try:
        assert ready.wait(10)
        text = stack_of(thread, lines=5)
    finally:
        release.set()
        thread.join(10)
    head, _, inner = text.partition("  ...\n")
    assert "_project_entry_point" in head and "a_library.py" in inner and "a_library.py" not in head
    assert stack_of(thread) == "  (its stack is gone)"
