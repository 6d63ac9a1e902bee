"""`league export`: a published checkpoint becomes a file that a Python with torch but without this package loads
and plays: the same moves `league eval` would make, on positions of real games."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import yaml

from actor_service.evaluation import load_policy, resolve_checkpoint
from common.checkpoint_store import CheckpointStore
from common.envs.policy_view import env_action, player_view, policy_specs, to_play
from common.envs.registry import make_env
from league_cli import export as export_cli
from tests.full_disk import pretend_full_disk
from tests.integration.test_eval import PPO, publish

# A loader that must not reach this package: every module of ours is refused on import.
STANDALONE = textwrap.dedent("""
    import sys, numpy as np
    class Refuse:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("common", "league_cli", "league_service", "actor_service", "learner_service"):
                raise ImportError("the export must load without the league package, not " + name)
    sys.meta_path.insert(0, Refuse())
    import torch
    policy = torch.export.load(sys.argv[1]).module()
    given = dict(np.load(sys.argv[2]))
    with torch.no_grad():
        out = policy(**{k: torch.from_numpy(v) for k, v in given.items()})
    np.save(sys.argv[3], out[0].numpy())
""")


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    export_cli.add_arguments(parser)
    return parser.parse_args(list(argv))


def _board_checkpoint(tmp_path, **publish_kwargs) -> tuple[Path, Path, str]:
    """A shared root with a connect-four PPO checkpoint of player "p", the league file of its network, and the
    checkpoint's root-relative path."""
    root = tmp_path / "shared"
    root.mkdir()
    path = publish(root, PPO, **publish_kwargs)
    config = tmp_path / "league.yaml"
    config.write_text(yaml.safe_dump({"policy": {"model": {**PPO["model"], "shared_torso": False}}}))
    return root, config, path


def _play_standalone(tmp_path, exported, inputs: dict[str, np.ndarray]) -> np.ndarray:
    (tmp_path / "loader.py").write_text(STANDALONE)
    np.savez(tmp_path / "inputs.npz", **inputs)
    done = subprocess.run([sys.executable, "-I", str(tmp_path / "loader.py"), str(exported),
                           str(tmp_path / "inputs.npz"), str(tmp_path / "actions.npy")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return np.load(tmp_path / "actions.npy")


def _positions(env_name: str, count: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """The views of the player to move along games of random legal moves of `env_name` (a board game)."""
    env = make_env(env_name)
    info = env.info()
    rng = np.random.default_rng(seed)
    views = []
    try:
        env.seed(seed)
        obs = env.reset()
        while len(views) < count:
            view = player_view(obs, to_play(obs, info), info)
            views.append(view)
            ts = env.step(int(rng.choice(np.flatnonzero(view["action_mask"]))))
            obs = env.reset() if ts.terminated or ts.truncated else ts.obs
    finally:
        env.close()
    return views


def test_an_exported_board_policy_plays_the_moves_league_eval_plays_without_the_package(tmp_path, capsys):
    root, config, path = _board_checkpoint(tmp_path, version=4, seed=3)
    out = tmp_path / "policy.pt2"
    assert export_cli.main(parse("--checkpoint", "p", "--shared-root", str(root), "--out", str(out),
                                 "--config", str(config))) == 0
    said = capsys.readouterr().out
    assert f"{path} (v4, ppo, connect_four) -> {out}" in said
    assert "policy(observation=<float32 (B, 5, 6, 7)>, action_mask=<bool (B, 7)>) -> (action, logits, value)" in said

    views = _positions("connect_four", 200)
    batch = {k: np.stack([v[k] for v in views]) for k in views[0]}
    store, relative = resolve_checkpoint(path, root)
    task, _ = load_policy(store, relative, PPO, make_env("connect_four").info())
    want = task.predict(batch, forward_kwargs={"greedy": True}).actions["action"]
    got = _play_standalone(tmp_path, out, batch)
    assert np.array_equal(got, want) and len(set(want.tolist())) > 1  # a policy, not one column everywhere
    assert batch["action_mask"][np.arange(len(got)), got].all()


def test_an_exported_box_policy_gives_the_action_the_env_receives(tmp_path, capsys):
    root = tmp_path / "shared"
    root.mkdir()
    league = {"league": {"league_type": "solo", "active_players": {"solo_active_player": 1}},
              "env": {"name": "Pendulum-v1"}, "policy": {"model": {"conv": [], "hidden": [16], "activation": "tanh",
                                                                         "log_std_init": -0.5}}}
    config = tmp_path / "pendulum.yaml"
    config.write_text(yaml.safe_dump(league))
    from league_service.config import load_config

    policy = dict(load_config(config, for_training=False).policy)
    info = make_env("Pendulum-v1").info()
    inputs, actions = policy_specs(info)
    from common.algorithms.registry import make_computation_task

    weights = make_computation_task(policy, inputs, actions, "cpu", 5).get_weights()
    weights["policy_head.bias"] = weights["policy_head.bias"] + 2.0  # means around the Box's high bound, 2
    CheckpointStore(root).publish("solo", weights, 2)
    out = tmp_path / "pendulum.pt2"
    assert export_cli.main(parse("--checkpoint", str(root / "solo"), "--out", str(out), "--config", str(config),
                                 "--json")) == 0
    meta = json.loads(capsys.readouterr().out)
    assert meta["action"] == {"kind": "box", "shape": [1], "low": [-2.0], "high": [2.0]}
    assert meta["checkpoint"]["version"] == 2 and meta["env"]["name"] == "Pendulum-v1"
    assert meta["league_config"] == str(config)

    rng = np.random.default_rng(0)
    batch = {"observation": rng.normal(0, 3, (64, 3)).astype(np.float32)}
    store, relative = resolve_checkpoint(str(root / "solo"), None)
    task, _ = load_policy(store, relative, policy, info)
    chosen = task.predict(batch, forward_kwargs={"greedy": True}).actions["action"]
    want = np.stack([env_action(actions, row, info) for row in chosen])
    got = _play_standalone(tmp_path, out, batch)
    assert np.allclose(got, want) and (got == 2.0).any() and (got < 2.0).any()


def test_an_existing_file_is_kept_unless_forced_and_bad_arguments_say_what_is_wrong(tmp_path, capsys):
    root, config, _ = _board_checkpoint(tmp_path)
    out = tmp_path / "policy.pt2"
    out.write_bytes(b"keep me")
    base = ("--checkpoint", "p", "--shared-root", str(root), "--config", str(config))
    assert export_cli.main(parse(*base, "--out", str(out))) == 2
    assert f"--out {out} exists: give --force to replace it" in capsys.readouterr().err
    assert out.read_bytes() == b"keep me"
    assert export_cli.main(parse(*base, "--out", str(tmp_path / "nowhere" / "p.pt2"))) == 2
    assert "does not exist" in capsys.readouterr().err
    assert export_cli.main(parse(*base, "--out", str(tmp_path))) == 2
    assert "is a directory" in capsys.readouterr().err
    # A directory yet to be made: Path() dropped the slash, and a file named `exports` was written (a review).
    with pytest.raises(SystemExit) as usage:
        parse(*base, "--out", str(tmp_path / "exports") + "/")
    assert usage.value.code == 2 and "ends in '/', a directory: name the file to write" in capsys.readouterr().err
    assert not (tmp_path / "exports").exists()
    assert export_cli.main(parse("--checkpoint", "q", "--shared-root", str(root), "--out", str(out), "--force")) == 2
    assert "league export: checkpoint 'q' does not exist" in capsys.readouterr().err
    assert out.read_bytes() == b"keep me"
    # The embedded league's network is not this checkpoint's: eval's hint, naming --config.
    assert export_cli.main(parse("--checkpoint", "p", "--shared-root", str(root), "--out", str(out), "--force")) == 2
    assert "give --config with the league the checkpoint comes from" in capsys.readouterr().err
    assert export_cli.main(parse(*base, "--out", str(out), "--force")) == 0
    assert out.read_bytes() != b"keep me" and not list(tmp_path.glob("*.tmp"))


def test_the_checkpoint_being_exported_is_never_its_out_even_forced(tmp_path, capsys):
    """`--out` the published checkpoint with --force replaced it with the export: its manifest no longer matched,
    and the league's jobs failed on it (a review)."""
    root, config, path = _board_checkpoint(tmp_path)
    source = root / path
    before = {f: f.read_bytes() for f in (source, source.with_name(source.name + ".json"))}
    base = ("--checkpoint", path, "--shared-root", str(root), "--config", str(config), "--force")
    for target in before:
        assert export_cli.main(parse(*base, "--out", str(target))) == 2
        assert "is the checkpoint being exported (or its manifest)" in capsys.readouterr().err
    assert {f: f.read_bytes() for f in before} == before
    CheckpointStore(root).load(path)  # still a published checkpoint


def test_force_never_replaces_a_file_of_the_league(tmp_path, capsys):
    """Another version's checkpoint, a training state, a snapshot: replaced by an export, the league's jobs (or a
    learner's resume) failed on it (a review). An earlier export there, or anywhere, is replaced (the diff review:
    a guessed shared root, the checkpoint's grandparent, refused --force for every file under it)."""
    from common.checkpoint_store import CheckpointStore

    root, config, path = _board_checkpoint(tmp_path)
    store = CheckpointStore(root)
    snapshot = "hist/q_500.pt"  # another player's snapshot, outside any player's folder
    store.snapshot(store.publish("q", {"w": np.zeros(2, np.float32)}, version=1).path, snapshot)
    (root / "p" / "v0000000001.pt.train").write_bytes(b"the league's")
    league = [root / "p" / "v0000000009.pt", root / "p" / "v0000000001.pt.train", root / "league_state.sqlite"]
    for other in league[::2]:
        other.write_bytes(b"the league's")
    (tmp_path / "link").symlink_to(root)  # the same files by another spelling
    base = ("--checkpoint", path, "--shared-root", str(root), "--config", str(config), "--force")
    for target in [*league, root / snapshot, tmp_path / "link" / "league_state.sqlite"]:
        assert export_cli.main(parse(*base, "--out", str(target))) == 2
        assert "--force does not replace the league's files" in capsys.readouterr().err
    assert all(other.read_bytes() == b"the league's" for other in league)
    (root / "tensorboard" / "p").mkdir(parents=True)
    (root / "tensorboard" / "p" / "events.out.tfevents.1").write_bytes(b"the league's")
    assert export_cli.main(parse(*base, "--out", str(root / "tensorboard" / "p" / "events.out.tfevents.1"))) == 2
    assert "--force does not replace the league's files" in capsys.readouterr().err
    for mine in (root / "exports" / "mine.pt2", tmp_path / "mine.pt2"):
        mine.parent.mkdir(exist_ok=True)
        mine.write_bytes(b"old export")
        mine.with_name(mine.name + ".json").write_text('{"notes": "my own, not a manifest"}')  # (the diff review)
        assert export_cli.main(parse(*base, "--out", str(mine))) == 0
        assert mine.read_bytes() != b"old export"


@pytest.mark.parametrize("argv", [["export", "--help"]])
def test_the_command_is_listed(argv):
    done = subprocess.run([sys.executable, "-m", "league_cli", *argv], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "--checkpoint" in done.stdout and "--force" in done.stdout


def test_an_exported_float64_box_policy_gives_the_env_its_own_dtype_inside_the_box(tmp_path, capsys):
    """A float64 Box (bounds 0.1 and 1/3, which float32 cannot hold): the export gives float64 actions clipped as
    `league eval` clips them, each inside the env's Box, not float32 ones a rounding outside it."""
    from common.algorithms.policy_export import load_exported
    from tests.unit.test_box_actions import _Float64Box

    root = tmp_path / "shared"
    root.mkdir()
    league = {"league": {"league_type": "solo", "active_players": {"solo_active_player": 1}},
              "env": {"name": "python:tests.unit.test_box_actions:_Float64Box"}, "policy": {"model": {"hidden": [8]}}}
    config = tmp_path / "f64.yaml"
    config.write_text(yaml.safe_dump(league))
    from league_service.config import load_config

    policy = dict(load_config(config, for_training=False).policy)
    info = make_env(league["env"]["name"]).info()
    inputs, actions = policy_specs(info)
    from common.algorithms.registry import make_computation_task

    weights = make_computation_task(policy, inputs, actions, "cpu", 5).get_weights()
    weights["policy_head.bias"] = weights["policy_head.bias"] + np.array([3.0, -3.0], np.float32)
    CheckpointStore(root).publish("solo", weights, 1)
    out = tmp_path / "f64.pt2"
    assert export_cli.main(parse("--checkpoint", str(root / "solo"), "--out", str(out), "--config", str(config),
                                 "--json")) == 0
    meta = json.loads(capsys.readouterr().out)
    assert meta["outputs"][0] == {"name": "action", "shape": [2], "dtype": "float64"}
    batch = {"observation": np.random.default_rng(0).normal(0, 1, (16, 3)).astype(np.float32)}
    store, relative = resolve_checkpoint(str(root / "solo"), None)
    task, _ = load_policy(store, relative, policy, info)
    chosen = task.predict(batch, forward_kwargs={"greedy": True}).actions["action"]
    want = np.stack([env_action(actions, row, info) for row in chosen])
    module, _ = load_exported(out.read_bytes())
    got = module(observation=__import__("torch").from_numpy(batch["observation"]))[0].numpy()
    assert got.dtype == np.float64 and np.array_equal(got, want)
    assert all(_Float64Box.action_space.contains(row) for row in got)


def test_a_file_made_at_out_while_the_export_is_traced_is_kept_without_force(tmp_path, capsys, monkeypatch):
    """--out is checked before the trace (seconds) and written after it: a file another export wrote there in
    between was replaced without --force (two exports to one file both exited 0, the first one's lost)."""
    from common.algorithms import policy_export

    root, config, _ = _board_checkpoint(tmp_path)
    out = tmp_path / "policy.pt2"
    real = policy_export.export_policy

    def racing(*args, **kwargs):
        exported = real(*args, **kwargs)
        out.write_bytes(b"another export's")  # written while this one traced
        return exported

    monkeypatch.setattr(policy_export, "export_policy", racing)
    base = ("--checkpoint", "p", "--shared-root", str(root), "--config", str(config), "--out", str(out))
    assert export_cli.main(parse(*base)) == 2
    assert f"--out {out} exists: give --force to replace it" in capsys.readouterr().err
    assert out.read_bytes() == b"another export's" and not list(tmp_path.glob(".*.tmp"))
    assert export_cli.main(parse(*base, "--force")) == 0  # --force replaces it, as before
    assert out.read_bytes() != b"another export's" and not list(tmp_path.glob(".*.tmp"))


def lock_directory(monkeypatch, prefix: str) -> None:
    """Paths starting with `prefix` fail to stat with PermissionError, as a non-root user finds a directory of
    mode 700 that is not theirs (the tests run as root, who may search anything)."""
    real_stat = Path.stat

    def stat(self, *args, **kwargs):
        if str(self).startswith(prefix):
            raise PermissionError(13, "Permission denied", str(self))
        return real_stat(self, *args, **kwargs)

    monkeypatch.setattr(Path, "stat", stat)


def test_an_out_path_that_cannot_be_looked_at_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    """--out under a directory the user may not search: Path.is_dir raised PermissionError, and the command
    ended in a traceback."""
    lock_directory(monkeypatch, str(tmp_path / "locked" / ""))
    out = tmp_path / "locked" / "inner" / "policy.pt2"
    assert export_cli.main(parse("--checkpoint", "p", "--shared-root", str(tmp_path), "--out", str(out))) == 2
    assert capsys.readouterr().err == f"league export: --out {out}: Permission denied\n"


@pytest.mark.parametrize("relative", [True, False])
@pytest.mark.parametrize("command", ["export", "eval"])
def test_a_checkpoint_under_a_directory_that_cannot_be_searched_is_refused_naming_the_flag(
        tmp_path, capsys, monkeypatch, command, relative):
    """Without a shared root, load_checkpoint asks whether a relative --checkpoint is a path from here: under a
    directory the user may not search, Path.exists raised PermissionError and both commands ended in a
    traceback. An absolute one was refused with the bare OSError ("[Errno 13] Permission denied: '/...'"), which
    did not say which argument it was about."""
    from league_cli import eval as eval_cli
    from tests.integration.test_eval import parse as parse_eval

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("LEAGUE_SHARED_ROOT", raising=False)
    checkpoint = "locked/main/v1.pt" if relative else str(tmp_path / "locked" / "main" / "v1.pt")
    lock_directory(monkeypatch, "locked/" if relative else str(tmp_path / "locked" / ""))
    if command == "export":
        code = export_cli.main(parse("--checkpoint", checkpoint, "--out", str(tmp_path / "policy.pt2")))
    else:
        code = eval_cli.main(parse_eval("--checkpoint", checkpoint))
    assert code == 2
    assert capsys.readouterr().err == f"league {command}: --checkpoint {checkpoint!r}: Permission denied\n"


@pytest.mark.parametrize("still_full", [True, False])
def test_a_full_disk_at_the_write_is_a_failure_not_a_usage_error(tmp_path, capsys, monkeypatch, still_full):
    """A full disk when the export is written exited 2, the code of a command a rerun fails the same way, and the
    message lacked the full disk (statvfs was asked of the file not yet written; a review): 1, naming it, also
    when the failed write's own space is free again after it (a 4 MB export on a 3 MB disk)."""
    import errno
    import os

    from common import durable_files

    root, config, path = _board_checkpoint(tmp_path)
    out = tmp_path / "policy.pt2"

    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(durable_files, "atomic_create", no_space)
    if still_full:
        pretend_full_disk(monkeypatch)
    assert export_cli.main(parse("--checkpoint", path, "--shared-root", str(root), "--config", str(config),
                                 "--out", str(out))) == 1
    err = capsys.readouterr().err
    said = f"league export: --out {out}: [Errno 28] No space left on device"
    assert (said + (f"; the disk of {out} is full" if still_full else "\n")) in err, err
