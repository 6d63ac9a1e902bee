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


def test_ctrl_c_while_a_command_starts_up_exits_130_without_a_traceback(tmp_path):
    # SIGINT arrives while `league run` imports its modules, before it installs its own handler: an audit hook
    # sends it at a fixed import, so the test does not depend on timing.
    child = (
        "import os, signal, sys\n"
        "def hook(event, args):\n"
        "    if event == 'import' and args[0] == 'rich.markup':\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "sys.addaudithook(hook)\n"
        "from league_cli.main import main\n"
        f"sys.exit(main(['run', '--run-dir', {str(tmp_path / 'run')!r}, '--seconds', '5']))\n"
    )
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60)
    assert out.returncode == 130, out.stderr
    assert "Traceback" not in out.stderr and "league: interrupted" in out.stderr
    assert not (tmp_path / "run").exists()  # nothing was started


@pytest.mark.parametrize("command, flag, value", [
    ("actor", "--env-cpus", "0"), ("actor", "--env-num", "0"), ("actor", "--max-jobs", "-3"),
    ("actor", "--env-max-retry", "-1"),
    ("learner", "--stop-timeout", "0"), ("learner", "--stop-timeout", "inf"), ("learner", "--publish-timeout", "-1"),
])
def test_workers_refuse_a_number_out_of_range_naming_the_flag(tmp_path, capsys, command, flag, value):
    with pytest.raises(SystemExit) as exited:
        main([command, "--coordinator", "127.0.0.1:1", "--shared-root", str(tmp_path), flag, value])
    assert exited.value.code == 2
    assert f"argument {flag}: must be " in capsys.readouterr().err
