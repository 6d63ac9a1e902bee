"""The environment variables the README lists are read by every command it lists them for."""

import argparse
from pathlib import Path

import pytest

from league_service.cli import (
    DEFAULT_STATUS_ADDR,
    _status_address,
    add_coordinator_arguments,
    add_status_arguments,
)


def _parse(add, argv, monkeypatch, **env):
    for name in ("LEAGUE_COORDINATOR", "LEAGUE_SHARED_ROOT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    parser = argparse.ArgumentParser()
    add(parser)
    return parser.parse_args(argv)


def test_status_reads_the_coordinator_address_from_the_environment_or_a_run_directory(monkeypatch, tmp_path):
    assert _status_address(_parse(add_status_arguments, [], monkeypatch)) == DEFAULT_STATUS_ADDR
    args = _parse(add_status_arguments, [], monkeypatch, LEAGUE_COORDINATOR="node-a:50051")
    assert _status_address(args) == "node-a:50051"
    given = _parse(add_status_arguments, ["--addr", "b:1"], monkeypatch, LEAGUE_COORDINATOR="node-a:50051")
    assert _status_address(given) == "b:1"
    # `league run` picks a free port: its run directory says which.
    run = _parse(add_status_arguments, ["--run-dir", str(tmp_path)], monkeypatch)
    with pytest.raises(ValueError, match="is a `league run` going on there"):
        _status_address(run)
    # A run that ended (its history is there, its port file gone): where to look instead; no such directory.
    (tmp_path / "status_history.jsonl").write_text("")
    with pytest.raises(ValueError, match=r"no `league run` is going on in .*, or its coordinator is starting.*"
                                         r"`league plot --history .*status_history.jsonl` shows how it went, "
                                         r"`league eval --run-dir .*` how strong its players grew"):
        _status_address(run)
    # A solo league's players have no snapshots for `eval --run-dir` to play against bots: its checkpoint.
    (tmp_path / "config.yaml").write_text("league:\n  league_type: solo\n")
    (tmp_path / "shared" / "solo_active_player_default_0").mkdir(parents=True)
    (tmp_path / "shared" / "solo_active_player_default_0" / "v0000000003.pt").write_bytes(b"")
    (tmp_path / "shared" / "tensorboard").mkdir()
    with pytest.raises(ValueError, match=r"`league eval --checkpoint .*/shared/solo_active_player_default_0` how "
                                         r"well its player plays$"):
        _status_address(run)
    with pytest.raises(ValueError, match="is not a directory"):
        _status_address(_parse(add_status_arguments, ["--run-dir", str(tmp_path / "nope")], monkeypatch))
    (tmp_path / "coordinator.port").write_text("23510\n")
    assert _status_address(run) == "127.0.0.1:23510"


@pytest.mark.parametrize("content", ["99999\n", "0\n", "-5\n"])
def test_a_run_directory_whose_port_file_holds_no_port_is_refused(monkeypatch, tmp_path, content):
    """A port file holding 99999 (damaged, hand-edited) was taken as it was: gRPC wraps the port, so `league
    status --run-dir` asked whatever listened on port 34463, and said that 127.0.0.1:99999 did not answer."""
    run = _parse(add_status_arguments, ["--run-dir", str(tmp_path)], monkeypatch)
    (tmp_path / "coordinator.port").write_text(content)
    with pytest.raises(ValueError, match=f"coordinator.port holds {content.strip()}, not a port from 1 to 65535"):
        _status_address(run)


def test_the_coordinator_reads_its_shared_root_from_the_environment(monkeypatch, capsys):
    args = _parse(add_coordinator_arguments, [], monkeypatch, LEAGUE_SHARED_ROOT="/league")
    assert args.shared_root == Path("/league")
    with pytest.raises(SystemExit):  # neither the flag nor the variable
        _parse(add_coordinator_arguments, [], monkeypatch)
    assert "--shared-root" in capsys.readouterr().err


def test_a_shared_root_from_the_environment_has_its_tilde_expanded(monkeypatch, tmp_path):
    """A path flag expands `~` (`--shared-root=~/x`); $LEAGUE_SHARED_ROOT=~/league from an env file (compose, k8s:
    no shell to expand it) was taken as a folder named `~` in the working directory."""
    monkeypatch.setenv("HOME", str(tmp_path))
    args = _parse(add_coordinator_arguments, [], monkeypatch, LEAGUE_SHARED_ROOT="~/league")
    assert args.shared_root == tmp_path / "league"


@pytest.mark.parametrize("command", ["actor", "learner", "coordinator"])
def test_a_shared_root_from_the_environment_that_is_no_directory_names_the_variable(monkeypatch, capsys, command):
    """`LEAGUE_SHARED_ROOT=/nonexistent league actor ...` said "--shared-root /nonexistent is not a directory",
    naming a flag that was not given."""
    from league_cli.main import main

    monkeypatch.setenv("LEAGUE_SHARED_ROOT", "/nonexistent/league")
    monkeypatch.setenv("LEAGUE_COORDINATOR", "127.0.0.1:1")
    assert main([command]) == 2
    assert "--shared-root (or $LEAGUE_SHARED_ROOT) /nonexistent/league is not a directory" in capsys.readouterr().err


def _unwritable_dir(tmp_path: Path) -> Path:
    """A directory nobody may create a file in: a read-only one (as root, whom a mode does not stop: sysfs)."""
    import os

    if os.geteuid() == 0:
        folder = Path("/sys")
    else:
        folder = tmp_path / "read-only"
        folder.mkdir()
        folder.chmod(0o555)
    try:
        (folder / ".league-probe").touch()
    except OSError:
        return folder
    (folder / ".league-probe").unlink()
    pytest.skip(f"{folder} is writable here")


@pytest.mark.parametrize(("command", "writes"), [("learner", "the learner publishes its checkpoints there"),
                                                 ("coordinator", "the coordinator writes the league's snapshots")])
def test_a_shared_root_the_process_cannot_write_in_is_refused_at_start(monkeypatch, capsys, tmp_path, command, writes):
    """A learner and a coordinator on a read-only shared root (a read-only mount, a volume without write
    permission) served as if it were fine: every publish and snapshot then failed for as long as they ran, and
    actors waited for a first version that never came. They refuse it at start now, exit 2, naming the flag."""
    from league_cli.main import main

    folder = _unwritable_dir(tmp_path)
    monkeypatch.delenv("LEAGUE_SHARED_ROOT", raising=False)

    def started(*args, **kwargs):
        raise AssertionError(f"the {command} started on a shared root it cannot write in")

    monkeypatch.setattr("learner_service.learner.Learner" if command == "learner" else
                        "league_service.coordinator.Coordinator", started)
    argv = ["--shared-root", str(folder), *(["--port", "0"] if command == "coordinator" else
                                            ["--coordinator", "127.0.0.1:1"])]
    assert main([command, *argv]) == 2
    err = capsys.readouterr().err
    assert f"--shared-root (or $LEAGUE_SHARED_ROOT) {folder}: cannot write in it" in err
    assert writes in err and "Traceback" not in err
