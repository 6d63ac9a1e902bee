"""`league eval`: a published checkpoint against OpenSpiel reference bots, seats alternating, legal moves only,
W/D/L as a table or JSON, checkpoints only from inside a shared root."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pty
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from actor_service import evaluation
from actor_service.evaluation import (
    _play_opening,
    game_seeds,
    load_policy,
    play_against_bot,
    play_against_policy,
    resolve_checkpoint,
    win_rate_interval,
)
from actor_service.search import SearchConfig
from common.algorithms.registry import make_computation_task
from common.checkpoint_store import CheckpointStore
from common.envs.policy_view import policy_specs
from common.envs.registry import make_env
from league_cli import eval as eval_cli
from league_service.config import load_config

CONV = {"conv": [[8, 3, 1]], "hidden": [32]}
PPO = {"algorithm": "ppo", "model": CONV}
# A league file for the CLI. Its algorithm differs from the embedded default's, so the default `policy` section
# is replaced rather than merged into.
DQN = {"algorithm": "dqn", "model": CONV}
REPO = Path(__file__).resolve().parents[2]
# What a CartPole run's config.yaml says of its league (a battle league on a one-seat env is refused at load).
SOLO_LEAGUE = {"league_type": "solo", "active_players": {"solo_active_player": 1}}


def publish(root, policy, player="p", version=1, seed=0, tweak=None, env="connect_four") -> str:
    inputs, actions = policy_specs(make_env(env).info())
    weights = make_computation_task(policy, inputs, actions, "cpu", seed).get_weights()
    if tweak is not None:
        tweak(weights)
    return CheckpointStore(root).publish(player, weights, version).path


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    eval_cli.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_fresh_policy_against_random_alternates_seats(tmp_path):
    path = publish(tmp_path, PPO)
    store, relative = resolve_checkpoint(path, tmp_path)
    task, ref = load_policy(store, relative, PPO, make_env("connect_four").info())
    assert ref.version == 1
    result = play_against_bot(task, "connect_four", {}, "random", games=4, seed=1)
    assert result.games == 4 and result.wins + result.draws + result.losses == 4
    assert [(s.seat, s.games) for s in result.seats] == [(0, 2), (1, 2)]
    assert result.mean_length >= 4  # a connect-four game takes at least 4 moves of each player


def test_a_policy_that_wants_an_illegal_column_plays_legal_moves_only(tmp_path):
    def prefer_column_zero(weights):
        weights["policy_head.bias"] = weights["policy_head.bias"].copy()
        weights["policy_head.bias"][0] = 100.0  # after six moves column 0 is full

    path = publish(tmp_path, PPO, tweak=prefer_column_zero)
    store, relative = resolve_checkpoint(path, tmp_path)
    task, _ = load_policy(store, relative, PPO, make_env("connect_four").info())
    full_column = {"observation": np.zeros((1, 5, 6, 7), np.float32), "action_mask": np.array([[False] + [True] * 6])}
    for greedy in (True, False):
        action = task.predict(full_column, forward_kwargs={"greedy": greedy}).actions["action"][0]
        assert action != 0
    result = play_against_bot(task, "connect_four", {}, "mcts:5", games=2, seed=2)  # the env refuses illegal moves
    assert result.games == 2



def test_a_versions_manifest_stands_for_the_version_and_a_bots_id_is_said_to_be_a_bot(tmp_path):
    """A CLI review: `--checkpoint .../v0000000001.pt.json` (the manifest) said "no published checkpoint (no
    manifest)", and `--checkpoint RUN/shared/bot_random` said the player's folder does not exist."""
    path = publish(tmp_path, PPO)
    assert resolve_checkpoint(str(tmp_path / (path + ".json")), None)[1] == path
    assert resolve_checkpoint(path + ".json", tmp_path)[1] == path
    with pytest.raises(ValueError, match="bot_random is a reference bot's player id.*--opponent"):
        resolve_checkpoint("bot_random", tmp_path)
    with pytest.raises(ValueError, match="does not exist: taken to be a player's folder"):
        resolve_checkpoint("main_player_default_0", tmp_path)

def test_cli_prints_a_table_and_json(tmp_path, capsys):
    path = publish(tmp_path, DQN)
    config = tmp_path / "league.yaml"
    config.write_text(json.dumps({"policy": DQN}))  # JSON is YAML
    assert eval_cli.main(parse("--checkpoint", path, "--shared-root", str(tmp_path), "--config", str(config),
                               "--games", "2")) == 0
    table = capsys.readouterr().out
    assert "wins" in table and "total" in table and "random" in table and "95% interval" in table

    absolute = str(tmp_path / path)  # an absolute path inside the shared root (its grandparent)
    assert eval_cli.main(parse("--checkpoint", absolute, "--config", str(config), "--games", "3", "--json",
                               "--opponent", "mcts:2")) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["games"] == 3 and report["opponent"] == "mcts:2" and report["version"] == 1
    assert report["wins"] + report["draws"] + report["losses"] == 3
    assert sum(s["games"] for s in report["by_seat"]) == 3
    assert report["win_rate_95"] == pytest.approx(list(win_rate_interval(report["wins"], 3)))
    low, high = report["win_rate_95"]
    assert 0.0 <= low <= report["win_rate"] <= high <= 1.0

    # Several bots at once: one JSON line (or table) each, in the order given.
    assert eval_cli.main(parse("--checkpoint", absolute, "--config", str(config), "--games", "2", "--json",
                               "--opponent", "random, mcts:2")) == 0
    reports = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["opponent"] for r in reports] == ["random", "mcts:2"] and all(r["games"] == 2 for r in reports)

    # "mcts" alone is the bot at its default strength, and named so (it showed as "mcts", strength unsaid).
    assert eval_cli.main(parse("--checkpoint", absolute, "--config", str(config), "--games", "1", "--json",
                               "--opponent", "mcts")) == 0
    assert json.loads(capsys.readouterr().out)["opponent"] == "mcts:100"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--checkpoint", "p/v0000000001.pt"], "is relative and not a path from here"),
        (["--checkpoint", "../outside.pt", "--shared-root", "{root}"], "'..'"),
        (["--checkpoint", "p/v0000000009.pt", "--shared-root", "{root}"], "does not exist"),
        (["--checkpoint", "p/v0000000001.pt", "--shared-root", "{root}", "--opponent", "alphazero"], "alphazero"),
        (["--checkpoint", "p/v0000000001.pt", "--shared-root", "{root}", "--opponent", "random,mcts:x"], "mcts:x"),
        (["--checkpoint", "p/v0000000001.pt", "--shared-root", "{root}", "--opponent", " , "], "names no bot"),
        (["--checkpoint", "p/v0000000001.pt", "--shared-root", "{root}", "--opponent", "random,mcts,mcts:100"],
         "'mcts:100' is the same bot as 'mcts'"),
        (["--checkpoint", "p/v0000000001.pt", "--opponent", "mcts:0"], "simulations must be within [1, 100,000]"),
        (["--checkpoint", "p/v0000000001.pt", "--opponent", "mcts:-3"], "simulations must be within [1, 100,000]"),
        (["--checkpoint", "p/v0000000001.pt", "--opponent", "foo"], "'foo': unknown bot; one of 'random', 'mcts:"),
        # Taken and ignored in a game (a review): its length is the game's rules'.
        (["--checkpoint", "p/v0000000001.pt", "--shared-root", "{root}", "--max-episode-steps", "9"],
         "--max-episode-steps: connect_four is a game of 2 players"),
    ],
)
def test_cli_refuses_bad_input_with_a_message(tmp_path, capsys, monkeypatch, argv, message):
    monkeypatch.delenv("LEAGUE_SHARED_ROOT", raising=False)
    publish(tmp_path, DQN)
    config = tmp_path / "league.yaml"
    config.write_text(json.dumps({"policy": DQN}))
    argv = [a.format(root=tmp_path) for a in argv] + ["--config", str(config)]
    assert eval_cli.main(parse(*argv)) == 2
    assert message in capsys.readouterr().err


def test_an_absolute_path_outside_the_shared_root_is_refused(tmp_path):
    inside, outside = tmp_path / "root", tmp_path / "elsewhere"
    inside.mkdir()
    outside.mkdir()
    path = publish(outside, PPO)
    with pytest.raises(ValueError, match="outside the shared root"):
        resolve_checkpoint(str(outside / path), inside)


def test_a_path_that_is_no_checkpoint_is_refused_naming_the_root_it_was_looked_for_in(tmp_path):
    """Without --shared-root the root is guessed from the path; a wrong guess said only "no manifest, in shared
    root /tmp", which read as if the user had named /tmp."""
    stray = tmp_path / "weights" / "model.pt"
    stray.parent.mkdir()
    stray.write_bytes(b"not a published checkpoint")
    with pytest.raises(ValueError, match=f"no shared root given, so it was taken to be {tmp_path}.*give --shared-root"):
        resolve_checkpoint(str(stray), None)
    with pytest.raises(ValueError, match=rf"no manifest.*\(shared root {tmp_path / 'weights'}\)"):
        resolve_checkpoint("model.pt", tmp_path / "weights")
    (tmp_path / "other").mkdir()
    with pytest.raises(ValueError, match=f"outside the shared root .shared root {tmp_path / 'other'}"):
        resolve_checkpoint(str(stray), tmp_path / "other")


def test_a_single_player_checkpoint_is_judged_by_its_episode_returns(tmp_path, capsys):
    """CartPole has no opponent: eval plays --games episodes and reports returns (a solo run's checkpoints)."""
    mlp = {"algorithm": "ppo", "model": {"conv": [], "hidden": [16], "shared_torso": True}}  # as merged
    path = publish(tmp_path, mlp, env="CartPole-v1")
    config = tmp_path / "league.yaml"
    config.write_text(json.dumps({"env": {"name": "CartPole-v1"}, "league": SOLO_LEAGUE, "policy": mlp}))
    common = ("--checkpoint", path, "--shared-root", str(tmp_path), "--config", str(config), "--games", "3")
    assert eval_cli.main(parse(*common, "--json")) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["episodes"] == 3 and report["version"] == 1 and report["env"] == "CartPole-v1"
    assert report["min_return"] <= report["mean_return"] <= report["max_return"] and report["min_return"] >= 1
    assert report["mean_length"] == report["mean_return"]  # CartPole pays 1 per step
    assert eval_cli.main(parse(*common)) == 0
    assert "mean return" in capsys.readouterr().out
    assert eval_cli.main(parse(*common, "--opponent", "random")) == 2
    assert "single-player env" in capsys.readouterr().err
    assert eval_cli.main(parse(*common, "--search", "8")) == 2
    assert "--search: CartPole-v1 is a single-player env" in capsys.readouterr().err


def test_search_plays_the_checkpoints_moves_by_lookahead_and_says_so(tmp_path, capsys):
    """`--search N`: each move a search of N simulations over the checkpoint's policy and value; the report and
    the table say so. A policy the search cannot use is refused with the reason, not played without it."""
    config = tmp_path / "league.yaml"
    config.write_text(json.dumps({"policy": PPO}))
    path = publish(tmp_path, dict(load_config(config, for_training=False).policy))  # as merged over the default
    common = ("--checkpoint", path, "--shared-root", str(tmp_path), "--config", str(config), "--games", "4")
    assert eval_cli.main(parse(*common, "--search", "12", "--json", "--opponent", "random,mcts:2")) == 0
    reports = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["opponent"], r["search"], r["games"]) for r in reports] == [("random", 12, 4), ("mcts:2", 12, 4)]
    assert eval_cli.main(parse(*common, "--search", "12")) == 0
    assert "each of its moves: a search of 12 simulations" in capsys.readouterr().out
    assert eval_cli.main(parse(*common, "--json")) == 0
    assert json.loads(capsys.readouterr().out)["search"] == 0

    dqn_path = publish(tmp_path, DQN, player="q")
    config.write_text(json.dumps({"policy": DQN}))
    assert eval_cli.main(parse("--checkpoint", dqn_path, "--shared-root", str(tmp_path), "--config", str(config),
                               "--search", "12")) == 2
    assert "search: DQN has no action probabilities and state value" in capsys.readouterr().err
    for count in ("0", "100001"):  # (10^8 grew the search tree by gigabytes before its first move; a review)
        with pytest.raises(SystemExit):
            parse(*common, "--search", count)
        assert "--search: must be within [1, 100,000]" in capsys.readouterr().err


def test_the_win_rate_interval_is_wilsons_and_narrows_with_games():
    low, high = win_rate_interval(99, 100)
    assert low == pytest.approx(0.9455, abs=1e-4) and high == pytest.approx(0.9982, abs=1e-4)
    low_k, high_k = win_rate_interval(990, 1000)
    assert low < low_k < 0.99 < high_k < high  # ten times the games: a narrower interval around the same rate
    assert win_rate_interval(0, 10)[0] == 0.0 and win_rate_interval(10, 10)[1] == 1.0  # stays inside [0, 1]
    assert win_rate_interval(0, 0) == (0.0, 1.0)  # no games: nothing known


def test_a_checkpoint_of_a_run_directory_is_judged_with_that_runs_league(tmp_path, capsys):
    """A user evaluates a solo run's checkpoint with no --config: the embedded connect-four model was assumed
    and the load failed with a list of missing weights. The run directory's config.yaml says the league."""
    mlp = {"algorithm": "ppo", "model": {"conv": [], "hidden": [16], "shared_torso": True}}
    shared = tmp_path / "run" / "shared"
    shared.mkdir(parents=True)
    path = publish(shared, mlp, env="CartPole-v1")
    (tmp_path / "run" / "config.yaml").write_text(json.dumps({"env": {"name": "CartPole-v1"}, "league": SOLO_LEAGUE, "policy": mlp}))
    assert eval_cli.main(parse("--checkpoint", str(shared / path), "--games", "2", "--json")) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["env"] == "CartPole-v1"
    assert "the league of" in captured.err
    # Outside a run directory, a model mismatch says what to do.
    (tmp_path / "loose").mkdir()
    elsewhere = publish(tmp_path / "loose", mlp, env="CartPole-v1")
    assert eval_cli.main(parse("--checkpoint", elsewhere, "--shared-root", str(tmp_path / "loose"))) == 2
    assert "give --config with the league the checkpoint comes from" in capsys.readouterr().err


@pytest.mark.parametrize("league", [
    # Trained before config load refused them (6d0a37d, ac64c52): the checkpoints are there, eval reads only the
    # policy and the env, and refused the run's config.yaml.
    {"league": {"active_players": {"main_exploiter": 1}}, "policy": DQN},
    {"league": {"main_player": {"adder_kwargs": {"unroll_len": 4}}}, "policy": {**DQN, "dqn": {"n_step": 5}}},
])
def test_an_older_run_whose_league_is_refused_now_is_still_evaluated(tmp_path, capsys, league):
    shared = tmp_path / "run" / "shared"
    shared.mkdir(parents=True)
    path = publish(shared, league["policy"])
    (tmp_path / "run" / "config.yaml").write_text(json.dumps(league))
    assert eval_cli.main(parse("--checkpoint", str(shared / path), "--games", "2", "--json")) == 0
    assert json.loads(capsys.readouterr().out)["games"] == 2


def test_a_players_folder_stands_for_its_newest_version_and_a_missing_file_says_so(tmp_path, capsys):
    publish(tmp_path, PPO, player="p", version=1)
    newest = publish(tmp_path, PPO, player="p", version=2, seed=1)
    store, path = resolve_checkpoint("p", tmp_path)
    assert path == newest
    assert resolve_checkpoint(str(tmp_path / "p"), None)[1] == newest  # absolute: the folder's parent is the root
    # The player's latest.json, what a user looking in the folder tries: "no published checkpoint" before.
    assert resolve_checkpoint("p/latest.json", tmp_path)[1] == newest
    assert resolve_checkpoint(str(tmp_path / "p" / "latest.json"), None)[1] == newest
    with pytest.raises(ValueError, match="'p/v9.pt' does not exist"):
        resolve_checkpoint("p/v9.pt", tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="a folder with no published checkpoint"):
        resolve_checkpoint("empty", tmp_path)


def test_a_missing_player_folder_is_taken_for_a_folder_whose_parent_is_the_shared_root(tmp_path):
    """`--checkpoint RUN/shared/<player>` before the player published anything: the missing path was taken for
    a file, so the message named RUN (its grandparent) as the guessed shared root instead of RUN/shared."""
    shared = tmp_path / "run" / "shared"
    shared.mkdir(parents=True)
    with pytest.raises(ValueError) as missing:
        resolve_checkpoint(str(shared / "main_player_default_0"), None)
    assert "does not exist: taken to be a player's folder" in str(missing.value)
    assert f"so it was taken to be {shared}, the folder's parent" in str(missing.value)
    with pytest.raises(ValueError) as missing_file:  # a missing .pt is still a file: the root is its grandparent
        resolve_checkpoint(str(shared / "p" / "v0000000001.pt"), None)
    assert "player's folder" not in str(missing_file.value)
    assert f"so it was taken to be {shared}, the file's grandparent" in str(missing_file.value)
    with pytest.raises(ValueError, match=rf"taken to be a player's folder.*\(shared root {shared}\)"):
        resolve_checkpoint("main_player_default_0", shared)


def test_a_config_whose_network_has_other_sizes_says_to_give_the_checkpoints_league(tmp_path, capsys):
    """Same layer names, other channel counts: only "shape (8, 5, 3, 3) != model shape (16, 5, 3, 3)" was said,
    without the --config hint that missing or unknown layer names got."""
    league, wider = tmp_path / "league.yaml", tmp_path / "wider.yaml"
    league.write_text(json.dumps({"policy": PPO}))
    wider.write_text(json.dumps({"policy": {**PPO, "model": {**CONV, "conv": [[16, 3, 1]]}}}))
    path = publish(tmp_path, dict(load_config(league).policy))  # the league's model as eval builds it
    argv = ("--checkpoint", path, "--shared-root", str(tmp_path), "--config", str(wider), "--games", "1")
    assert eval_cli.main(parse(*argv)) == 2
    err = capsys.readouterr().err
    assert "!= model shape" in err
    assert f"(the model of {wider}; give --config with the league the checkpoint comes from" in err


def test_a_checkpoint_path_from_the_current_directory_needs_no_shared_root(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("LEAGUE_SHARED_ROOT", raising=False)
    shared = tmp_path / "run" / "shared"
    shared.mkdir(parents=True)
    path = publish(shared, DQN)
    (tmp_path / "run" / "config.yaml").write_text(json.dumps({"policy": DQN}))
    monkeypatch.chdir(tmp_path)
    assert eval_cli.main(parse("--checkpoint", f"run/shared/{path}", "--games", "2", "--json")) == 0
    assert json.loads(capsys.readouterr().out)["version"] == 1


def test_a_missing_version_under_a_directory_from_here_is_named_missing(tmp_path, capsys, monkeypatch):
    """A version path from the current directory whose file is gone (retired by keep_last, a typo) was refused
    as "relative and not a path from here: give --shared-root", though its player directory is right there:
    the user was sent to add a shared root the path already goes through."""
    monkeypatch.delenv("LEAGUE_SHARED_ROOT", raising=False)
    shared = tmp_path / "run" / "shared"
    shared.mkdir(parents=True)
    publish(shared, DQN)
    (tmp_path / "run" / "config.yaml").write_text(json.dumps({"policy": DQN}))
    monkeypatch.chdir(tmp_path)
    assert eval_cli.main(parse("--checkpoint", "run/shared/p/v0000000009.pt", "--games", "2")) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "not a path from here" not in err


def _run_dir(tmp_path):
    """A `league run` directory whose status names one main player with one checkpoint in RUN/shared."""
    run = tmp_path / "run"
    (run / "shared").mkdir(parents=True)
    path = publish(run / "shared", DQN, player="main")
    (run / "config.yaml").write_text(json.dumps({"policy": DQN}))
    player = {"player_id": "main", "player_type": "main_player", "active": True, "agent_steps": 100,
              "checkpoint_path": path, "checkpoint_version": 1}
    (run / "status_history.jsonl").write_text(json.dumps({"elapsed_s": 1.0, "players": [player]}) + "\n")
    return run


def test_run_dir_reads_the_runs_shared_root_not_the_environments(tmp_path, capsys, monkeypatch):
    """The image sets $LEAGUE_SHARED_ROOT=/league: `eval --run-dir RUN` read its checkpoints there, not in
    RUN/shared, and said only "no published checkpoint". The run's root unless --shared-root is given, and
    the error names the root it searched."""
    run = _run_dir(tmp_path)
    other = tmp_path / "league"
    other.mkdir()
    monkeypatch.setenv("LEAGUE_SHARED_ROOT", str(other))
    argv = ("--run-dir", str(run), "--opponent", "random", "--games", "2", "--json")
    assert eval_cli.main(parse(*argv)) == 0, capsys.readouterr().err
    report = json.loads(capsys.readouterr().out)
    assert report["player_id"] == "main" and [p["version"] for p in report["points"]] == [1]
    assert report["search"] == 0
    assert eval_cli.main(parse(*argv, "--search", "6")) == 2  # the run's policy is a DQN: said, not played without
    assert "search: DQN has no action probabilities" in capsys.readouterr().err

    assert eval_cli.main(parse(*argv, "--shared-root", str(other))) == 2
    err = capsys.readouterr().err
    assert "no published checkpoint" in err and f"in shared root {other} (--shared-root)" in err, err
    # Without --run-dir the variable still stands for --shared-root; an empty player folder names the root.
    (other / "main").mkdir()
    assert eval_cli.main(parse("--checkpoint", "main", "--config", str(run / "config.yaml"))) == 2
    err = capsys.readouterr().err
    assert "a folder with no published checkpoint in it" in err and f"(shared root {other.resolve()})" in err, err


def test_run_dir_with_a_missing_config_or_a_status_from_before_the_first_checkpoint(tmp_path, capsys):
    """A mistyped --config ran the embedded league (no word, exit 0); a run stopped before its first checkpoint
    was in a status record was refused although its shared root held one."""
    run = _run_dir(tmp_path)
    argv = ("--run-dir", str(run), "--opponent", "random", "--games", "2", "--json")
    assert eval_cli.main(parse(*argv, "--config", str(tmp_path / "my_leage.yaml"))) == 2
    assert "my_leage.yaml: cannot read the config file" in capsys.readouterr().err
    player = {"player_id": "main", "player_type": "main_player", "active": True, "agent_steps": 0,
              "checkpoint_path": "", "checkpoint_version": 0}
    (run / "status_history.jsonl").write_text(json.dumps({"elapsed_s": 1.0, "players": [player]}) + "\n")
    assert eval_cli.main(parse(*argv)) == 0, capsys.readouterr().err
    report = json.loads(capsys.readouterr().out)
    assert [p["version"] for p in report["points"]] == [1]  # the store's newest
    shutil.rmtree(run / "shared" / "main")
    assert eval_cli.main(parse(*argv)) == 2
    assert "player 'main' has no published checkpoint in the run's status, nor in shared root" in \
        capsys.readouterr().err


def run_with_stderr_on_a_terminal(argv: list[str]) -> tuple[int, str, str]:
    """`league eval ARGV` as a process whose stderr is a pseudo-terminal (stdout a pipe): (exit code, stdout,
    what the terminal showed, control codes included)."""
    main_fd, terminal_fd = pty.openpty()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "league_cli", "eval", *argv], cwd=REPO,
                                stdout=subprocess.PIPE, stderr=terminal_fd, text=True, start_new_session=True,
                                env={**os.environ, "TERM": "xterm", "COLUMNS": "120"})
    finally:
        os.close(terminal_fd)
    try:
        shown = bytearray()
        while True:
            try:
                chunk = os.read(main_fd, 4096)
            except OSError:  # EIO: the process closed its end
                break
            if not chunk:
                break
            shown += chunk
        out = proc.stdout.read()
        return proc.wait(60), out, shown.decode(errors="replace")
    finally:  # (a failure or a timeout above left a hung eval running for ever, reparented: a review)
        os.close(main_fd)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        proc.stdout.close()


def test_games_show_progress_on_a_terminal_and_nothing_elsewhere(tmp_path, capsys):
    """A strong bot takes seconds a game: a terminal gets a progress bar (gone once the table is printed);
    a pipe or file gets only the results."""
    path = publish(tmp_path, DQN)
    config = tmp_path / "league.yaml"
    config.write_text(json.dumps({"policy": DQN}))
    argv = ["--checkpoint", path, "--shared-root", str(tmp_path), "--config", str(config), "--games", "6",
            "--opponent", "random,mcts:2"]
    code, out, shown = run_with_stderr_on_a_terminal(argv)
    assert code == 0, shown
    assert "vs random" in shown and "vs mcts:2" in shown and "6/6" in shown and "won " in shown, shown
    assert "wins" in out and "mcts:2" in out  # the tables, on stdout as always

    assert eval_cli.main(parse(*argv)) == 0  # stderr is pytest's capture here, not a terminal
    captured = capsys.readouterr()
    assert "wins" in captured.out and "vs random" not in captured.err


def test_a_link_to_a_run_directorys_checkpoint_is_judged_as_the_checkpoint_it_leads_to(tmp_path, capsys):
    """`league eval --checkpoint best.pt`, a link to RUN/shared/<player>/v7.pt: the shared root was guessed from the
    link's own place (its grandparent), and the checkpoint refused as one whose manifest describes another path
    (nor was the run's config found, so the embedded league's model would have been assumed)."""
    mlp = {"algorithm": "ppo", "model": {"conv": [], "hidden": [16], "shared_torso": True}}
    shared = tmp_path / "run" / "shared"
    shared.mkdir(parents=True)
    path = publish(shared, mlp, env="CartPole-v1")
    (tmp_path / "run" / "config.yaml").write_text(json.dumps({"env": {"name": "CartPole-v1"}, "league": SOLO_LEAGUE, "policy": mlp}))
    (tmp_path / "picks").mkdir()
    link = tmp_path / "picks" / "best.pt"
    link.symlink_to(shared / path)
    assert resolve_checkpoint(str(link), None)[1] == path
    assert eval_cli.main(parse("--checkpoint", str(link), "--games", "2", "--json")) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["checkpoint"] == path and "the league of" in captured.err


def test_against_plays_another_checkpoint_both_sampling(tmp_path, capsys):
    """`--against CHECKPOINT`: two published policies play each other, seats alternating, both sampling (two
    greedy policies would play the same two games over and over); a checkpoint whose league plays another env,
    a missing one, or flags that do not go together are refused naming the flag."""
    config = tmp_path / "league.yaml"
    config.write_text(json.dumps({"policy": PPO}))
    policy = dict(load_config(config, for_training=False).policy)
    mine = publish(tmp_path, policy, player="a", seed=0)
    theirs = publish(tmp_path, policy, player="b", seed=1)
    common = ("--checkpoint", mine, "--shared-root", str(tmp_path), "--config", str(config), "--games", "6")
    assert eval_cli.main(parse(*common, "--against", theirs, "--json")) == 0, capsys.readouterr().err
    report = json.loads(capsys.readouterr().out)
    assert report["opponent"] == f"{theirs} (v1)" and report["opponent_checkpoint"] == theirs
    assert report["games"] == 6 and [s["games"] for s in report["by_seat"]] == [3, 3] and report["opening"] == 0
    assert eval_cli.main(parse(*common, "--against", theirs)) == 0
    out = capsys.readouterr().out
    assert "moves drawn from each player's policy" in out and "total" in out
    # The same seed plays the same games; another seed others.
    assert eval_cli.main(parse(*common, "--against", theirs, "--json", "--games", "20")) == 0
    first = json.loads(capsys.readouterr().out)
    assert eval_cli.main(parse(*common, "--against", theirs, "--json", "--games", "20")) == 0
    assert json.loads(capsys.readouterr().out) == first
    # With --search the checkpoint's moves are searched; the opponent still samples.
    assert eval_cli.main(parse(*common, "--against", theirs, "--json", "--search", "10")) == 0
    searched = json.loads(capsys.readouterr().out)
    assert searched["search"] == 10 and searched["wins"] >= 5  # lookahead against a policy that knows nothing

    tic_tac_toe = tmp_path / "ttt.yaml"
    tic_tac_toe.write_text(json.dumps({"env": {"name": "openspiel:tic_tac_toe"}, "policy": PPO}))
    other_game = publish(tmp_path, dict(load_config(tic_tac_toe, for_training=False).policy), player="t",
                         env="openspiel:tic_tac_toe")
    refusals = [
        (["--against", other_game, "--against-config", str(tic_tac_toe)], "the two must play the same env"),
        (["--against", "b/v0000000009.pt"], "--against: checkpoint 'b/v0000000009.pt' does not exist"),
        (["--against", theirs, "--opponent", "random"], "give one of them"),
        (["--against-config", str(config)], "--against-config goes with --against"),
        (["--opening", "2"], "--opening goes with --against"),
    ]
    for extra, message in refusals:
        assert eval_cli.main(parse(*common, *extra)) == 2, extra
        err = capsys.readouterr().err
        assert message in err, (extra, err)
    assert eval_cli.main(parse("--run-dir", str(tmp_path), "--against", theirs)) == 2
    assert "--against goes with --checkpoint" in capsys.readouterr().err
    # Taken and ignored with --run-dir too (the diff review): its snapshots play games, whose rules end them.
    assert eval_cli.main(parse("--run-dir", str(tmp_path), "--max-episode-steps", "9")) == 2
    assert "--max-episode-steps goes with --checkpoint" in capsys.readouterr().err


def test_against_a_checkpoint_of_another_network_names_against_config(tmp_path, capsys):
    config = tmp_path / "league.yaml"
    config.write_text(json.dumps({"policy": PPO}))
    mine = publish(tmp_path, dict(load_config(config, for_training=False).policy), player="a")
    theirs = publish(tmp_path, DQN, player="q")  # a DQN league's checkpoint, played with the PPO league's model
    assert eval_cli.main(parse("--checkpoint", mine, "--shared-root", str(tmp_path), "--config", str(config),
                               "--against", theirs, "--games", "2")) == 2
    err = capsys.readouterr().err
    assert "--against: weights do not fit the model" in err and "give --against-config with the league" in err


def test_players_that_do_not_sample_need_an_opening_of_random_moves(tmp_path, capsys):
    """Two DQN policies (argmax) would play one game a seat over and over: refused, pointing at --opening; with an
    opening of random moves the games differ. A searched checkpoint against a DQN is the same case."""
    config = tmp_path / "league.yaml"
    config.write_text(json.dumps({"policy": DQN}))
    policy = dict(load_config(config, for_training=False).policy)
    mine, theirs = publish(tmp_path, policy, player="a", seed=0), publish(tmp_path, policy, player="b", seed=1)
    common = ("--checkpoint", mine, "--shared-root", str(tmp_path), "--config", str(config), "--against", theirs,
              "--games", "12", "--json")
    assert eval_cli.main(parse(*common)) == 2
    assert "neither player samples its moves" in capsys.readouterr().err
    assert eval_cli.main(parse(*common, "--opening", "3")) == 0, capsys.readouterr().err
    report = json.loads(capsys.readouterr().out)
    assert report["games"] == 12 and report["opening"] == 3
    # A seat's games are its openings then: 7 of one move cannot make 6 games a seat mostly distinct (--opening 1
    # with 1,000 games was 14 games replayed, under an interval for 1,000).
    assert eval_cli.main(parse(*common, "--opening", "1")) == 2
    assert "an opening of 1 random move(s) reaches 7 distinct position(s)" in capsys.readouterr().err
    # Distinct positions, not sequences: 4 moves reach 1,120 (not 7**4 = 2,401), too few for 1,000 games a seat.
    assert eval_cli.main(parse(*common[:-3], "--games", "2000", "--opening", "4")) == 2
    err = capsys.readouterr().err
    assert "reaches 1120 distinct position(s)" in err and "give --opening 5 or more" in err
    # An opening past the game's length is refused at once: counted first, 7**1e9 was computed for ever, deaf to
    # Ctrl-C (a review).
    assert eval_cli.main(parse(*common, "--opening", "1000000000")) == 2
    assert "leaves nothing to play: connect_four lasts at most 42 moves" in capsys.readouterr().err

    # The same loop with the games' moves recorded: an opening gives distinct games, none gives one a seat.
    store, relative = resolve_checkpoint(mine, tmp_path)
    task, _ = load_policy(store, relative, policy, make_env("connect_four").info())
    store, relative = resolve_checkpoint(theirs, tmp_path)
    other, _ = load_policy(store, relative, policy, make_env("connect_four").info())
    lengths = {play_against_policy(task, other, "connect_four", {}, games=2, seed=seed, opening=3).mean_length
               for seed in range(0, 40, 2)}
    assert len(lengths) > 1
    with pytest.raises(ValueError, match="neither player samples"):
        play_against_policy(task, other, "connect_four", {}, games=2)
    inputs, actions = policy_specs(make_env("connect_four").info())
    sampling = make_computation_task(PPO, inputs, actions, "cpu", 0)
    assert play_against_policy(sampling, other, "connect_four", {}, games=2).games == 2  # one of them samples
    with pytest.raises(ValueError, match="neither player samples"):  # ... but not once its moves are searched
        play_against_policy(sampling, other, "connect_four", {}, games=2, search=SearchConfig(5))
    with pytest.raises(ValueError, match="search: DQN has no action probabilities"):  # the search's own refusal
        play_against_policy(task, other, "connect_four", {}, games=2, search=SearchConfig(5))
    with pytest.raises(ValueError, match=r"an opening of 42 random moves \(--opening\) leaves nothing to play"):
        play_against_policy(task, other, "connect_four", {}, games=2, opening=42)


def test_against_takes_two_spellings_of_one_env_for_the_same_env(tmp_path, capsys):
    config, aliased = tmp_path / "league.yaml", tmp_path / "aliased.yaml"
    config.write_text(json.dumps({"policy": PPO}))
    aliased.write_text(json.dumps({"policy": PPO, "env": {"name": "openspiel:connect_four",
                                                          "kwargs": {"perspective": "absolute"}}}))
    policy = dict(load_config(config, for_training=False).policy)
    mine, theirs = publish(tmp_path, policy, player="a"), publish(tmp_path, policy, player="b", seed=1)
    assert eval_cli.main(parse("--checkpoint", mine, "--shared-root", str(tmp_path), "--config", str(config),
                               "--against", theirs, "--against-config", str(aliased), "--games", "2", "--json")) == 0, \
        capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["games"] == 2


def test_argmax_players_need_no_opening_in_a_game_of_chance():
    """Dice make the games differ whoever plays them: two DQN players of pig are not refused."""
    env = make_env("openspiel:pig")
    policy = {"algorithm": "dqn", "model": {"hidden": [8]}}
    inputs, actions = policy_specs(env.info(), "dqn")
    env.close()
    tasks = [make_computation_task(policy, inputs, actions, "cpu", seed) for seed in (0, 1)]
    assert play_against_policy(*tasks, "openspiel:pig", {}, games=2).games == 2


def test_another_seed_plays_other_games_not_the_same_ones_shifted():
    """Games were seeded `seed + game`: --seed 1 replayed games 1, 2, ... of --seed 0 (a review), so runs meant to
    add games re-counted the same ones."""
    first = {game_seeds(0, game) for game in range(1000)}
    second = {game_seeds(1, game) for game in range(1000)}
    assert len(first) == 1000 and not first & second
    assert game_seeds(0, 5) == game_seeds(0, 5)


def test_an_opening_that_ends_the_game_is_drawn_again_alike_for_both_seats():
    """Five random moves can end a game of tic-tac-toe: the whole evaluation was refused at the first such game
    (game 10 of 100); now that opening is drawn again, from the pair's generator, so both games of the pair open
    alike. An opening as long as the game is refused up front, naming --opening."""
    policy = {"algorithm": "dqn", "model": {"conv": [[8, 3, 1]], "conv_padding": "same", "hidden": [8]}}
    env = make_env("openspiel:tic_tac_toe")
    info = env.info()
    inputs, actions = policy_specs(info, "dqn")
    tasks = [make_computation_task(policy, inputs, actions, "cpu", seed) for seed in (0, 1)]
    result = play_against_policy(*tasks, "openspiel:tic_tac_toe", {}, games=100, opening=5)
    assert result.games == 100 and [s.games for s in result.seats] == [50, 50]

    resets = []

    def reset():
        resets.append(1)
        env.seed(0)
        return env.reset()

    redrawn = 0
    for seed in range(60):
        openings = []
        for _ in range(2):  # both games of a pair: the same seed, the same opening
            resets.clear()
            openings.append((_play_opening(env, reset, info, 5, np.random.default_rng(seed), game=0), str(env.state)))
            assert not env.state.is_terminal() and env.state.move_number() == 5
        redrawn += len(resets) > 1
        assert openings[0][1] == openings[1][1]
        np.testing.assert_array_equal(openings[0][0]["observation"], openings[1][0]["observation"])
    assert redrawn  # some first draws ended the game
    env.close()
    with pytest.raises(ValueError, match=r"an opening of 9 random moves \(--opening\) leaves nothing to play"):
        play_against_policy(*tasks, "openspiel:tic_tac_toe", {}, games=2, opening=9)


def test_against_samples_the_two_players_moves_from_different_streams(tmp_path, capsys, monkeypatch):
    """Both policies were built with --seed: the same random numbers drew both players' moves, and one checkpoint
    against itself played the same move as its opponent 84% of the time (a review)."""
    config = tmp_path / "league.yaml"
    config.write_text(json.dumps({"policy": PPO}))
    mine = publish(tmp_path, dict(load_config(config, for_training=False).policy), player="a")
    seeds = []
    real = evaluation.load_policy

    def recording(*args, seed=0, **kwargs):
        seeds.append(seed)
        return real(*args, seed=seed, **kwargs)

    monkeypatch.setattr(evaluation, "load_policy", recording)
    assert eval_cli.main(parse("--checkpoint", mine, "--shared-root", str(tmp_path), "--config", str(config),
                               "--against", mine, "--games", "2", "--seed", "7")) == 0, capsys.readouterr().err
    assert len(seeds) == 2 and seeds[0] == 7 and seeds[1] != 7


def test_against_a_checkpoint_of_another_run_where_the_image_sets_the_shared_root(tmp_path, capsys, monkeypatch):
    """The image sets $LEAGUE_SHARED_ROOT: `--against` an absolute path in another run's shared root was refused as
    outside it (a review). An absolute path outside the variable's root is the checkpoint's own."""
    config = tmp_path / "league.yaml"
    config.write_text(json.dumps({"policy": PPO}))
    policy = dict(load_config(config, for_training=False).policy)
    here, other = tmp_path / "run1" / "shared", tmp_path / "run2" / "shared"
    here.mkdir(parents=True)
    other.mkdir(parents=True)
    mine, theirs = publish(here, policy, player="a"), publish(other, policy, player="b", seed=1)
    monkeypatch.setenv("LEAGUE_SHARED_ROOT", str(here))
    assert eval_cli.main(parse("--checkpoint", mine, "--config", str(config), "--against", str(other / theirs),
                               "--games", "2", "--json")) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["opponent_checkpoint"] == theirs
    # A relative path is still under the variable's root.
    assert eval_cli.main(parse("--checkpoint", mine, "--config", str(config), "--against", theirs,
                               "--games", "2")) == 2
    assert "--against" in capsys.readouterr().err


def test_eval_plays_the_view_the_players_trained_on_where_the_player_types_set_it(tmp_path):
    """A relative perspective set in each player type's env_kwargs (not env.kwargs) was evaluated on the
    absolute board: eval read env.kwargs alone."""
    import yaml

    config = tmp_path / "league.yaml"
    config.write_text(yaml.safe_dump({"league": {t: {"env_kwargs": {"perspective": "relative"}} for t in
                                                 ("main_player", "main_exploiter", "league_exploiter")}}))
    _, env_name, env_kwargs = eval_cli._policy_and_env(eval_cli._load_league(config), "main_exploiter_default_0/v0000000001.pt")
    assert env_name == "connect_four" and env_kwargs == {"perspective": "relative"}


def test_eval_and_export_play_the_env_of_the_checkpoints_player_type(tmp_path, capsys):
    """A solo type's own env_kwargs (README: learners build the player's env with them) were not played by
    `league eval`, nor written by `league export`: env.kwargs alone, another env without a word (a review: a
    player trained on 6-step episodes judged on 2-step ones). A checkpoint outside every player's folder (a
    pretrained one) is played with env.kwargs."""
    import yaml

    from league_cli import export as export_cli

    memory = "python:common.envs.cue_memory:CueMemoryEnv"
    policy = {"algorithm": "ppo", "model": {"conv": [], "hidden": [8]}}
    config = tmp_path / "league.yaml"
    config.write_text(yaml.safe_dump({
        "env": {"name": memory, "kwargs": {"num_cues": 4, "delay": 1}},
        "league": {**SOLO_LEAGUE, "solo_active_player": {"env_kwargs": {"delay": 5}}}, "policy": policy}))
    inputs, actions = policy_specs(make_env(memory, num_cues=4, delay=1).info())
    merged = dict(load_config(config, for_training=False).policy)  # (over the embedded default's)
    weights = make_computation_task(merged, inputs, actions, "cpu", 0).get_weights()
    for player in ("solo_active_player_default_0", "pretrained"):
        CheckpointStore(tmp_path).publish(player, weights, 1)
    lengths = {}
    for player in ("solo_active_player_default_0", "pretrained"):
        common = ("--checkpoint", str(tmp_path / player), "--shared-root", str(tmp_path), "--config", str(config))
        assert eval_cli.main(parse(*common, "--games", "4", "--json")) == 0
        lengths[player] = json.loads(capsys.readouterr().out)["mean_length"]
        out = tmp_path / f"{player}.pt2"
        parser = argparse.ArgumentParser()
        export_cli.add_arguments(parser)
        assert export_cli.main(parser.parse_args([*common, "--out", str(out), "--json"])) == 0
        exported = json.loads(capsys.readouterr().out)
        assert exported["env"]["kwargs"] == {"num_cues": 4, "delay": 5 if player != "pretrained" else 1}, exported
    assert lengths == {"solo_active_player_default_0": 6.0, "pretrained": 2.0}, lengths


def test_eval_reads_an_older_runs_config_that_training_now_refuses(tmp_path):
    """The checks added for training (one view for all player types, no env bots in a battle league, job
    template keys, exploration beside a fixed eps) made `league eval` refuse the configs of runs made before
    them, whose checkpoints it is there to evaluate."""
    import yaml

    from common.config import ConfigError

    config = tmp_path / "league.yaml"
    config.write_text(yaml.safe_dump({"league": {"main_player": {"env_kwargs": {"perspective": "relative"},
                                                                 "job": {"note": "x"}}}}))
    with pytest.raises(ConfigError):
        load_config(config)  # for training: refused
    _, env_name, env_kwargs = eval_cli._policy_and_env(eval_cli._load_league(config), "main_player_default_0")
    assert env_name == "connect_four" and env_kwargs == {"perspective": "relative"}  # the main player's view


def test_a_players_folder_on_a_live_run_loads_its_newest_version_when_retention_removes_the_one_read(
        tmp_path, monkeypatch):
    """The folder's newest version is read, then the env and the network are built before it is loaded: a fast
    learner publishing `keep_last` versions meanwhile retired it, and the command failed with "no published
    checkpoint (no manifest)" for a player with five versions on disk (a review). A version named by its file
    is that version only."""
    publish(tmp_path, DQN, player="p", version=1)
    config = tmp_path / "league.yaml"
    config.write_text(json.dumps({"policy": DQN}))
    built = make_env

    def make_env_while_publishing(*args, **kwargs):
        latest = CheckpointStore(tmp_path).latest("p").version
        for version in range(latest + 1, latest + 6):  # keep_last 5: the version read is retired
            publish(tmp_path, DQN, player="p", version=version, seed=version)
        return built(*args, **kwargs)

    monkeypatch.setattr("common.envs.registry.make_env", make_env_while_publishing)
    loaded = eval_cli.load_checkpoint(parse("--checkpoint", "p", "--shared-root", str(tmp_path), "--config",
                                            str(config)), "eval")
    assert loaded.ref.version > 1
    with pytest.raises(eval_cli.CheckpointRefused, match="no published checkpoint"):
        eval_cli.load_checkpoint(parse("--checkpoint", loaded.ref.path, "--shared-root", str(tmp_path),
                                       "--config", str(config)), "eval")


def test_a_checkpoint_is_played_with_the_activation_it_was_trained_with(tmp_path, capsys):
    """Activation shapes no weight, so a relu-trained checkpoint loaded into the tanh network of a league file
    (or of its run resumed with another activation, which the README allows) played silently as that other
    network: 82% against random where it makes 92-97% (a review). The checkpoint's recorded settings win, and
    the command says so."""
    from common.policy_config import PolicyConfig, play_metadata

    config = tmp_path / "league.yaml"
    config.write_text(json.dumps({"policy": PPO}))  # tanh
    tanh = eval_cli._policy_and_env(eval_cli._load_league(config), "p")[0]  # (the file merged over the embedded league)
    relu = {**tanh, "model": {**tanh["model"], "activation": "relu"}}
    inputs, actions = policy_specs(make_env("connect_four").info())
    weights = make_computation_task(relu, inputs, actions, "cpu", 0).get_weights()
    path = CheckpointStore(tmp_path).publish("p", weights, 1,
                                             metadata=play_metadata(PolicyConfig.from_mapping(relu))).path
    loaded = eval_cli.load_checkpoint(parse("--checkpoint", path, "--shared-root", str(tmp_path), "--config",
                                            str(config)), "eval")
    assert "activation: tanh -> relu" in capsys.readouterr().err
    assert loaded.policy["model"]["activation"] == "relu"
    info = make_env("connect_four").info()
    as_trained, _ = load_policy(*resolve_checkpoint(path, tmp_path), relu, info)
    as_tanh = make_computation_task(tanh, inputs, actions, "cpu", 0)
    as_tanh.set_weights(weights, 1)
    observation = {k: np.ones((1, *s.shape), s.dtype) for k, s in inputs.items()}
    value = loaded.task.predict(observation).artifacts["value"]
    np.testing.assert_array_equal(value, as_trained.predict(observation).artifacts["value"])
    assert not np.allclose(value, as_tanh.predict(observation).artifacts["value"])


@pytest.mark.parametrize("flags", [["--json"], []])
def test_a_reader_gone_before_the_report_is_no_traceback(tmp_path, flags):
    """`league eval --json | head -1` (the reader gone before the report is written) ended in a BrokenPipeError
    traceback and exit 1, the table in rich's exit 1 (`league status` already wrote nowhere and exited 0; a
    review)."""
    path = publish(tmp_path, DQN)
    config = tmp_path / "league.yaml"
    config.write_text(json.dumps({"policy": DQN}))
    proc = subprocess.Popen(
        [sys.executable, "-m", "league_cli", "eval", "--checkpoint", path, "--shared-root", str(tmp_path),
         "--config", str(config), "--games", "2", *flags],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    proc.stdout.close()  # before it writes anything
    try:
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0 and b"Traceback" not in err and b"BrokenPipe" not in err, err.decode()


def test_a_reader_gone_during_a_runs_progression_is_no_empty_refusal(tmp_path):
    """`league eval --run-dir RUN | head -1`: the progress line's BrokenPipeError was caught as an OSError and
    refused with no text ("league eval: ", exit 2; a review)."""
    run = _run_dir(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "league_cli", "eval", "--run-dir", str(run), "--opponent", "random", "--games", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    proc.stdout.close()
    try:
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0 and not err.strip(), err.decode()


@pytest.mark.parametrize("command", ["eval", "export"])
def test_a_shared_root_that_is_no_directory_is_named_as_it_was_given(tmp_path, capsys, monkeypatch, command):
    """With $LEAGUE_SHARED_ROOT set to a missing directory, eval and export said only "shared root '/x' is not a
    directory", naming nothing the user gave (a review); the actor names the variable."""
    from league_cli import export as export_cli

    module = eval_cli if command == "eval" else export_cli
    extra = () if command == "eval" else ("--out", str(tmp_path / "policy.pt2"))
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    monkeypatch.setenv("LEAGUE_SHARED_ROOT", str(tmp_path / "nope"))
    assert module.main(parser.parse_args(["--checkpoint", "main_player_default_0", *extra])) == 2
    assert f"$LEAGUE_SHARED_ROOT {tmp_path / 'nope'} is not a directory" in capsys.readouterr().err
    assert module.main(parser.parse_args(["--checkpoint", "p", "--shared-root", str(tmp_path / "nope2"), *extra])) == 2
    assert f"--shared-root {tmp_path / 'nope2'} is not a directory" in capsys.readouterr().err


def test_the_run_dir_ladder_of_a_game_of_imperfect_information_is_random_only(capsys):
    """pyspiel's MCTS would see the hidden cards, and the env refuses it: `eval --run-dir` on a leduc league
    played the first checkpoint against random, then stopped with no table at the default ladder's first MCTS
    bot (a review)."""
    from league_cli.progression import DEFAULT_LADDER

    assert eval_cli._ladder_for("openspiel:leduc_poker", DEFAULT_LADDER, given=False) == ("random",)
    assert "a game of imperfect information: against random only" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--opponent mcts:10: 'leduc_poker' is a game of imperfect information"):
        eval_cli._ladder_for("openspiel:leduc_poker", ("random", "mcts:10"), given=True)
    assert eval_cli._ladder_for("connect_four", DEFAULT_LADDER, given=False) == DEFAULT_LADDER


def test_an_episode_its_env_never_ends_is_cut_at_the_step_limit():
    """A custom env without a time limit kept `league eval` playing its first episode for good (a review)."""
    env_name, kwargs = "python:tests.env_doubles:CountingEnv", {"length": 10**9}
    inputs, actions = policy_specs(make_env(env_name, **kwargs).info())
    task = make_computation_task({"algorithm": "ppo", "model": {"hidden": [8]}}, inputs, actions, "cpu", 0)
    result = evaluation.play_episodes(task, env_name, kwargs, 3, max_steps=40)
    assert (result.episodes, result.cut_episodes, result.mean_length) == (3, 3, 40.0)
    ended = evaluation.play_episodes(task, env_name, {"length": 5}, 2, max_steps=40)
    assert (ended.cut_episodes, ended.mean_length) == (0, 5.0)


def test_run_dir_of_a_live_run_loads_the_active_version_once_for_its_whole_ladder(tmp_path, capsys, monkeypatch):
    """On a live run retention retires an active player's versions within seconds: loaded again for each rung,
    minutes after the first, the version was gone and the whole evaluation failed (a review). It is loaded once;
    retired before that, the newest is played."""
    run = _run_dir(tmp_path)
    store = CheckpointStore(run / "shared", keep_last=1)
    weights = store.load(store.latest("main").path).tensors
    real_play = evaluation.play_against_bot
    versions = iter(range(2, 100))

    def play_while_the_learner_publishes(*args, **kwargs):
        store.publish("main", weights, next(versions))  # keep_last 1: the version before is retired
        return real_play(*args, **kwargs)

    monkeypatch.setattr(evaluation, "play_against_bot", play_while_the_learner_publishes)
    argv = ("--run-dir", str(run), "--opponent", "random,mcts:2", "--games", "2", "--json")
    assert eval_cli.main(parse(*argv)) == 0, capsys.readouterr().err
    report = json.loads(capsys.readouterr().out)
    assert [p["version"] for p in report["points"]] == [1] and set(report["points"][0]["win_rate"]) == {
        "random", "mcts:2"}
    # The version the status and the store name retired before the first load: the newest then is played.
    real_load = evaluation.load_policy
    first = []

    def load_after_a_publish(store_, path, *args, **kwargs):
        if not first:
            first.append(path)
            store.publish("main", weights, next(versions))
        return real_load(store_, path, *args, **kwargs)

    monkeypatch.setattr(evaluation, "play_against_bot", real_play)
    monkeypatch.setattr(evaluation, "load_policy", load_after_a_publish)
    assert eval_cli.main(parse(*argv)) == 0, capsys.readouterr().err
    newest = CheckpointStore(run / "shared").latest("main").version
    assert [p["version"] for p in json.loads(capsys.readouterr().out)["points"]] == [newest]
    assert first[0] != CheckpointStore(run / "shared").latest("main").path


def test_openings_are_counted_as_the_positions_the_games_legal_moves_reach():
    """Othello has 65 distinct actions and 4 legal first moves: 2-move openings passed as 4,225 a seat, and 400
    games between two argmax players were 24 games replayed (a review). Its 12 two-move positions are counted;
    tic-tac-toe, whose positions run out, names the most games any opening allows."""
    import pyspiel

    from actor_service.evaluation import _check_openings

    othello = pyspiel.load_game("othello")
    info = make_env("openspiel:othello").info()
    with pytest.raises(ValueError, match=r"reaches 12 distinct position\(s\).*give --opening 5 or more"):
        _check_openings(info, othello, 2, 400, 2)
    _check_openings(info, othello, 5, 400, 2)
    tic_tac_toe = pyspiel.load_game("tic_tac_toe")
    with pytest.raises(ValueError, match="no opening of this game reaches that many; give at most 686 --games"):
        _check_openings(make_env("openspiel:tic_tac_toe").info(), tic_tac_toe, 6, 1000, 2)


def test_a_draw_counts_half_in_the_score_and_in_the_strongest_bot_beaten():
    """A tic-tac-toe player that never lost (3 wins, 7 draws) had a win rate of 30% in `league eval`, 65% in the
    league's payoff, and beat nothing along `--run-dir` (a review). The score counts a draw half, as the payoff
    does, and decides which bots a snapshot beats; old records without a score keep the win rate."""
    from actor_service.evaluation import EvalResult, SeatTally
    from league_cli.progression import PointResult

    result = EvalResult("mcts:200", (SeatTally(0, 5, 2, 3, 0), SeatTally(1, 5, 1, 4, 0)), 8.0)
    assert result.win_rate == 0.3 and result.score == 0.65
    record = result.to_dict()
    assert record["score"] == 0.65 and [s["score"] for s in record["by_seat"]] == [0.7, 0.6]
    assert PointResult(None, {"mcts:200": record}).strongest_beaten() == "mcts:200"
    old = {k: v for k, v in record.items() if k != "score"}
    assert PointResult(None, {"mcts:200": old}).strongest_beaten() == "-"
