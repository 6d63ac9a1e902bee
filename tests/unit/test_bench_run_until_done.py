"""`bench.common.run_until_done`: a benchmark interrupted while its `league run` works stops that run with
SIGTERM and waits for it (so the run's last writes come before the temp directory is removed); a child that
ignores SIGTERM is killed after the grace period; a failing child raises like `subprocess.run(check=True)`."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from bench.common import run_until_done

# Stands in for `league run`: on SIGTERM it writes its last file (after a pause) and exits 0.
GRACEFUL = """
import pathlib, signal, sys, time
out = pathlib.Path(sys.argv[1])
def stop(*_):
    time.sleep(0.3)
    out.write_text("stopped")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
out.with_suffix(".started").write_text("")
time.sleep(60)
"""

STUBBORN = """
import pathlib, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
pathlib.Path(sys.argv[1]).with_suffix(".started").write_text("")
time.sleep(60)
"""


def _wait_started(path):
    deadline = time.monotonic() + 30
    while not path.with_suffix(".started").exists():
        assert time.monotonic() < deadline, "the child did not start"
        time.sleep(0.02)


def test_an_interrupted_run_is_stopped_with_sigterm_and_waited_for(tmp_path):
    out = tmp_path / "last_write"
    with pytest.raises(subprocess.TimeoutExpired):
        run_until_done([sys.executable, "-c", GRACEFUL, str(out)], timeout=5.0)
    assert out.read_text() == "stopped"  # written before run_until_done gave the exception back


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace_period(tmp_path):
    out = tmp_path / "never"
    with pytest.raises(subprocess.TimeoutExpired):  # a child never killed would hang here (pytest-timeout fails it)
        run_until_done([sys.executable, "-c", STUBBORN, str(out)], timeout=5.0, grace_s=0.5)
    _wait_started(out)  # it did run, and nothing of it is left to wait for


def test_a_failing_child_raises_called_process_error():
    with pytest.raises(subprocess.CalledProcessError) as info:
        run_until_done([sys.executable, "-c", "import sys; sys.exit(3)"], timeout=30)
    assert info.value.returncode == 3


def test_a_child_that_finishes_returns_normally(tmp_path):
    run_until_done([sys.executable, "-c", "pass"], timeout=30)

