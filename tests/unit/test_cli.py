import subprocess
import sys

import pytest

from league_cli.main import SUBCOMMANDS, main


def test_help_lists_every_subcommand():
    out = subprocess.run([sys.executable, "-m", "league_cli", "--help"], capture_output=True, text=True, check=True)
    for name in ("coordinator", "actor", "learner", "status", "run"):
        assert name in out.stdout


def test_unbuilt_subcommand_says_so_and_fails(capsys):
    unbuilt = [c for c in SUBCOMMANDS if c.entry is None]
    if not unbuilt:
        pytest.skip("every subcommand is built")
    assert main([unbuilt[0].name]) != 0
    assert "not built yet" in capsys.readouterr().err


def test_actor_refuses_a_cpu_share_below_one(tmp_path, capsys):
    code = main(["actor", "--coordinator", "127.0.0.1:1", "--shared-root", str(tmp_path), "--env-cpus", "0"])
    assert code == 2
    assert "env_cpus must be >= 1, got 0" in capsys.readouterr().err
