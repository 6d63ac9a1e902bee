"""common/quick_exit.py: the collector is frozen as the interpreter exits, after the atexit handlers registered
later (logging's flush among them), and not before: a process that goes on collects as usual."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import atexit, gc
atexit.register(lambda: print("frozen at exit:", gc.get_freeze_count() > 0))  # registered first: runs last
from common.quick_exit import skip_final_collections_at_exit
handlers = atexit._ncallbacks()
skip_final_collections_at_exit()
skip_final_collections_at_exit()  # (each command's main calls it; a learner under `league` calls it twice)
print("handlers added:", atexit._ncallbacks() - handlers)
print("frozen before exit:", gc.get_freeze_count() > 0)
"""


def test_the_collector_is_frozen_at_exit_only_and_once():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["handlers added: 1", "frozen before exit: False", "frozen at exit: True"]
    assert done.stderr == ""
