import signal
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
        # A shell's background job starts with SIGINT ignored, and Python keeps it so: the test's own setting.
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
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


def _sigterm_at(event: str, arg: str, argv: list[str]) -> subprocess.CompletedProcess:
    """`league ARGV` in a child that sends itself SIGTERM at the first audit `event` whose first argument ends
    with `arg` (a fixed point of its start-up, so the test does not depend on timing)."""
    child = (
        "import os, signal, sys\n"
        "def hook(event, args):\n"
        f"    if event == {event!r} and str(args[0]).endswith({arg!r}):\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "sys.addaudithook(hook)\n"
        "from league_cli.main import main\n"
        f"sys.exit(main({argv!r}))\n"
    )
    return subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("event, arg", [("import", "rich.markup"), ("os.mkdir", "shared")],
                         ids=["importing", "run-directory-made"])
def test_sigterm_while_league_run_starts_up_says_so_and_exits_143(tmp_path, event, arg):
    """A SIGTERM before `league run` installs its own handler (imports, config, run directory: a second or more)
    ended it with exit 143 and not a word. It still dies of the signal (143 to a shell), with one line saying so;
    no process was started by then."""
    run_dir = tmp_path / "run"
    out = _sigterm_at(event, arg, ["run", "--run-dir", str(run_dir), "--seconds", "5"])
    assert out.returncode == -signal.SIGTERM, out.stderr
    assert out.stderr == "league run: stopped by SIGTERM during start-up, before any process was started\n"
    assert not (run_dir / "logs").exists()  # (made before the first process starts)


def test_sigterm_while_a_worker_starts_up_stays_silent(tmp_path):
    """A worker that `league run` stops while it still imports is told apart by its silent death by SIGTERM."""
    out = _sigterm_at("import", "league_cli.run_monitor", ["health", "--addr", "127.0.0.1:1"])  # (building the parser)
    assert out.returncode == -signal.SIGTERM and out.stderr == "", out.stderr


@pytest.mark.parametrize("command, flag, value", [
    ("actor", "--env-cpus", "0"), ("actor", "--env-num", "0"), ("actor", "--env-num", "100000"),
    ("actor", "--max-jobs", "-3"),
    ("actor", "--env-max-retry", "-1"),
    ("learner", "--stop-timeout", "0"), ("learner", "--stop-timeout", "inf"), ("learner", "--publish-timeout", "-1"),
    ("learner", "--stream-idle-timeout", "0"),
])
def test_workers_refuse_a_number_out_of_range_naming_the_flag(tmp_path, capsys, command, flag, value):
    with pytest.raises(SystemExit) as exited:
        main([command, "--coordinator", "127.0.0.1:1", "--shared-root", str(tmp_path), flag, value])
    assert exited.value.code == 2
    assert f"argument {flag}: must be " in capsys.readouterr().err


@pytest.mark.parametrize("value", ["gpu", "cuda:", "cuda:x", "cuda:-1", "cuda:١", "cuda:12345", "cuda:00", "CPU"])
def test_a_learner_device_that_is_no_device_is_a_usage_error_naming_the_flag(tmp_path, capsys, value):
    with pytest.raises(SystemExit) as exited:
        main(["learner", "--coordinator", "127.0.0.1:1", "--shared-root", str(tmp_path), "--device", value])
    assert exited.value.code == 2
    assert "argument --device: expected auto, cpu, cuda or cuda:N" in capsys.readouterr().err


def test_a_learner_given_a_gpu_the_machine_lacks_refuses_at_start_naming_it(tmp_path, capsys):
    """`cuda:N` is accepted by the parser (one learner per GPU of a node): a GPU that is not there is refused
    before the learner registers, not at its first job. (On a machine with a GPU, the index past its last.)"""
    import torch

    gpu = f"cuda:{torch.cuda.device_count()}"
    assert main(["learner", "--coordinator", "127.0.0.1:1", "--shared-root", str(tmp_path), "--device", gpu]) == 2
    err = capsys.readouterr().err
    assert f"--device: device {gpu!r} requested but" in err and "Traceback" not in err


@pytest.mark.parametrize("command", ["coordinator", "actor", "learner"])
def test_a_log_level_that_does_not_exist_is_a_usage_error(tmp_path, capsys, command):
    """It was a traceback from `logging` (ValueError: Unknown level), exit 1."""
    with pytest.raises(SystemExit) as exited:
        main([command, "--coordinator", "127.0.0.1:1", "--shared-root", str(tmp_path), "--log-level", "bogus"]
             if command != "coordinator" else [command, "--shared-root", str(tmp_path), "--log-level", "bogus"])
    assert exited.value.code == 2
    assert "argument --log-level: invalid choice: 'BOGUS'" in capsys.readouterr().err


def test_an_actor_without_a_shared_root_says_it_needs_one(capsys, monkeypatch):
    monkeypatch.delenv("LEAGUE_SHARED_ROOT", raising=False)
    assert main(["actor", "--coordinator", "127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert "--shared-root (or $LEAGUE_SHARED_ROOT) is required" in err and "None" not in err


@pytest.mark.parametrize("flag, value", [("--points", "3"), ("--player", "main_player_default_0")])
def test_eval_options_of_a_run_directory_are_refused_with_a_checkpoint(tmp_path, capsys, flag, value):
    """They choose along a run's snapshots; with --checkpoint they were ignored without a word."""
    assert main(["eval", "--checkpoint", str(tmp_path / "x.pt"), flag, value]) == 2
    assert f"{flag} goes with --run-dir" in capsys.readouterr().err


def test_every_option_with_a_default_says_it_in_its_help():
    """`--help` left most defaults unsaid (eval's --games 20, the coordinator's --grace 5, the actor's timeouts,
    status's and health's --timeout, the actor's --manager subprocess): a user had to read the code, or the README
    where it had them, to learn them."""
    import argparse

    from league_cli.main import build_parser

    (commands,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    unsaid = []
    for name, sub in commands.choices.items():
        for action in sub._actions:
            if action.default in (None, False, argparse.SUPPRESS) or isinstance(action, argparse._HelpAction):
                continue
            if "default" not in (action.help or ""):
                unsaid.append(f"league {name} {'/'.join(action.option_strings)} (default {action.default!r})")
    assert not unsaid, unsaid


PATH_FLAG_NAMES = ("config", "run_dir", "shared_root", "state", "port_file", "token_file", "tls_cert", "tls_key",
                   "tls_ca", "checkpoint", "history", "out")


def test_every_path_flag_expands_a_tilde(monkeypatch, tmp_path):
    """The shell expands `--run-dir ~/x` but not `--run-dir=~/x`: taken as it was, it made a directory named `~`
    where the command was started, and `league run` handed that path on to its processes."""
    import argparse

    from league_cli.main import build_parser

    monkeypatch.setenv("HOME", str(tmp_path))
    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    seen = []
    for name, sub in commands.choices.items():
        for action in sub._actions:
            if action.dest in PATH_FLAG_NAMES:
                seen.append(f"{name} {action.dest}")
                assert str(action.type("~/x")) == str(tmp_path / "x"), f"league {name} {action.option_strings}"
    assert len(seen) >= 20 and "eval checkpoint" in seen and "run config" in seen, seen
    args = parser.parse_args(["run", "--run-dir=~/runs/a", "~/league.yaml"])
    assert (args.run_dir, args.config) == (tmp_path / "runs" / "a", tmp_path / "league.yaml")
    assert parser.parse_args(["eval", "--checkpoint=~/p/v1.pt"]).checkpoint == str(tmp_path / "p" / "v1.pt")


def test_a_timeout_over_its_limit_is_told_that_limit_first(capsys):
    """`--timeout 1e8` was told the general limit of durations (1e+07 s), and a value under it then refused again
    at 3600 (a review)."""
    from league_cli.main import build_parser

    for value in ("1e8", "5000"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["status", "--addr", "127.0.0.1:1", "--timeout", value])
        assert f"must be at most 3600 seconds, got {value}" in capsys.readouterr().err
