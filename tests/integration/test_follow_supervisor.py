"""A `league` command started by a ProcessGroup (what `league run` uses) stops when its supervisor is killed
outright, instead of running on as an orphan."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from league_cli.processes import SUPERVISOR_ENV_VAR

ROOT = Path(__file__).resolve().parents[2]

SUPERVISOR = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from league_cli.processes import ProcessGroup, league_command
    work = Path(sys.argv[1])
    group = ProcessGroup(work / "logs")
    proc = group.start("coordinator", league_command(
        "coordinator", "--config", sys.argv[2], "--shared-root", str(work / "shared"),
        "--state", str(work / "state.sqlite"), "--port", "0", "--port-file", str(work / "port")))
    print(proc.pid, flush=True)
    time.sleep(600)
""")


def _state(pid: int) -> str | None:
    """The process's state letter (Z: exited, not yet reaped), None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def _wait_until(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_children_stop_politely_when_the_supervisor_is_killed(tmp_path):
    (tmp_path / "shared").mkdir()
    supervisor = subprocess.Popen(
        [sys.executable, "-c", SUPERVISOR, str(tmp_path), str(ROOT / "configs" / "solo_cartpole.yaml")],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )
    child = None
    try:
        child = int(supervisor.stdout.readline())
        assert _wait_until(lambda: (tmp_path / "port").exists(), 60), (tmp_path / "logs" / "coordinator.log").read_text()
        supervisor.kill()
        supervisor.wait()
        assert _wait_until(lambda: _state(child) in (None, "Z"), 30), "the coordinator outlived its supervisor"
        log = (tmp_path / "logs" / "coordinator.log").read_text()
        assert "shutting down" in log  # SIGTERM: it stopped as it does when asked
    finally:
        supervisor.kill()
        supervisor.wait()
        if child is not None and _state(child) not in (None, "Z"):
            os.kill(child, signal.SIGKILL)


def test_a_command_whose_supervisor_already_exited_does_not_start():
    gone = subprocess.Popen(["true"])
    gone.wait()
    out = subprocess.run([sys.executable, "-m", "league_cli", "status", "--help"], cwd=ROOT, capture_output=True,
                         text=True, env={**os.environ, SUPERVISOR_ENV_VAR: str(gone.pid)}, timeout=60)
    assert out.returncode == 1
    assert f"(pid {gone.pid}) has exited; not starting" in out.stderr


def test_a_supervisor_that_is_not_the_parent_leaves_the_command_alone():
    """Started through a wrapper that stays its parent: nothing to follow, the command runs as usual."""
    out = subprocess.run([sys.executable, "-m", "league_cli", "status", "--help"], cwd=ROOT, capture_output=True,
                         text=True, env={**os.environ, SUPERVISOR_ENV_VAR: "1"}, timeout=60)
    assert out.returncode == 0, out.stderr
