"""Every benchmark script starts as `python bench/X.py` also with the repository on PYTHONPATH: the script's own
folder (sys.path[0]) holds bench/common.py, which must not shadow the project's `common` package."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPTS = ["bench_checkpoint", "bench_computation", "bench_coordinator", "bench_env_manager", "bench_exit",
           "bench_league", "bench_league_scale", "bench_load", "bench_pendulum", "bench_restore", "bench_system",
           "connect_four_tactics",
           "run_all", "sb3_reference"]


@pytest.mark.parametrize("script", SCRIPTS)
def test_bench_script_starts_with_root_on_pythonpath(script):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(ROOT / "bench" / f"{script}.py"), "--help"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
