"""Typed configuration: the generic loader (common/config.py) and the league schema."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

import pytest
import yaml

from common.config import REPLACE, ConfigError, deep_merge, from_dict, load_yaml, merge_with_defaults, to_dict
from league_service.config import (
    Config,
    LeagueExploiterConfig,
    config_from_dict,
    config_to_dict,
    default_config_dict,
    load_config,
)
from league_service.wire import to_struct


@dataclass(frozen=True)
class Inner:
    rate: float = 0.5
    names: tuple[str, ...] = ("a",)


@dataclass(frozen=True)
class Outer:
    count: int
    inner: Inner = field(default_factory=Inner)
    maybe: Inner | None = None
    mode: Literal["x", "y"] = "x"
    table: dict[str, int] = field(default_factory=lambda: {"a": 1}, metadata=REPLACE)
    free: dict[str, Any] = field(default_factory=dict)
    flag: bool = False

    def __post_init__(self) -> None:
        if self.count < 0:
            raise ConfigError("count", "must be >= 0")


# -- generic machinery -------------------------------------------------------------------------------------


def test_from_dict_builds_nested_typed_frozen_dataclasses():
    cfg = from_dict(Outer, {"count": 3, "inner": {"rate": 1, "names": ["p", "q"]}, "maybe": {}, "mode": "y"})
    assert cfg == Outer(count=3, inner=Inner(rate=1.0, names=("p", "q")), maybe=Inner(), mode="y")
    assert isinstance(cfg.inner.rate, float)
    with pytest.raises(AttributeError):
        cfg.count = 4  # type: ignore[misc]


@pytest.mark.parametrize(
    ("data", "path", "message"),
    [
        ({"count": "3"}, "count", "expected int, got str"),
        ({"count": True}, "count", "expected int, got bool"),
        ({"count": 1.5}, "count", "expected int, got float"),
        ({"count": 1, "inner": {"rate": "fast"}}, "inner.rate", "expected float, got str"),
        ({"count": 1, "inner": {"names": "abc"}}, "inner.names", "expected a list"),
        ({"count": 1, "inner": {"names": ["a", 2]}}, "inner.names[1]", "expected str, got int"),
        ({"count": 1, "inner": {"speed": 1}}, "inner.speed", "unknown key"),
        ({"count": 1, "mode": "z"}, "mode", "expected one of 'x', 'y'"),
        ({"count": 1, "table": {"a": "1"}}, "table.a", "expected int, got str"),
        ({"count": 1, "flag": "yes"}, "flag", "expected bool, got str"),
        ({"count": 1, "maybe": 3}, "maybe", "expected a mapping"),
        ({}, "count", "missing required key"),
        ({"count": -1}, "count", "must be >= 0"),
    ],
)
def test_from_dict_errors_name_the_key_path(data, path, message):
    with pytest.raises(ConfigError) as info:
        from_dict(Outer, data, path="root")
    assert info.value.path == f"root.{path}"
    assert message in str(info.value)
    assert str(info.value).startswith(f"root.{path}: ")


def test_integral_floats_are_ints_and_free_dicts_pass_through():
    cfg = from_dict(Outer, {"count": 2.0e5, "free": {"nested": {"x": [1, 2]}}})
    assert cfg.count == 200000 and isinstance(cfg.count, int)
    assert cfg.free == {"nested": {"x": [1, 2]}}


def test_deep_merge_recurses_and_copies():
    base = {"a": {"b": 1, "c": [1]}, "d": 1}
    merged = deep_merge(base, {"a": {"b": 2}, "e": 3})
    assert merged == {"a": {"b": 2, "c": [1]}, "d": 1, "e": 3}
    merged["a"]["c"].append(2)
    assert base == {"a": {"b": 1, "c": [1]}, "d": 1}


def test_merge_with_defaults_replaces_fields_marked_replace():
    defaults = {
        "count": 1,
        "table": {"a": 1, "b": 2},
        "free": {"x": 1, "y": {"z": 1}},
        "inner": {"rate": 0.1},
    }
    merged = merge_with_defaults(Outer, defaults, {"table": {"c": 3}, "free": {"y": {"w": 2}}, "inner": {}})
    assert merged["table"] == {"c": 3}
    assert merged["free"] == {"x": 1, "y": {"z": 1, "w": 2}}
    assert merged["inner"] == {"rate": 0.1}


def test_to_dict_round_trips_through_from_dict():
    cfg = from_dict(Outer, {"count": 2, "maybe": {"names": ["k"]}})
    assert from_dict(Outer, json.loads(json.dumps(to_dict(cfg)))) == cfg


def test_load_yaml_reads_a_mapping_and_rejects_others(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text("a: 1\nb: {c: 2}\n")
    assert load_yaml(good) == {"a": 1, "b": {"c": 2}}
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load_yaml(empty) == {}
    listed = tmp_path / "list.yaml"
    listed.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_yaml(listed)
    broken = tmp_path / "broken.yaml"
    broken.write_text("a: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML") as info:
        load_yaml(broken)
    assert f'in "{broken}", line 2' in str(info.value)  # the file, not "<unicode string>"


# -- the league schema -------------------------------------------------------------------------------------


def test_embedded_defaults_are_a_connect_four_battle_league():
    cfg = load_config(None)
    assert isinstance(cfg, Config)
    assert cfg.env.name == "connect_four"
    assert cfg.policy["algorithm"] == "ppo"
    assert cfg.league.league_type == "one_vs_one"
    assert cfg.league.active_players == {"main_player": 1, "main_exploiter": 1, "league_exploiter": 1}
    assert cfg.league.main_player.branch_probs == {"pfsp": 0.5, "sp": 0.35, "verification": 0.15}
    assert cfg.league.league_exploiter.mutate_prob == 0.25
    # AlphaStar's PFSP weightings: main players `squared`, league exploiters `linear_capped` (was `linear`).
    assert cfg.league.main_player.pfsp_weighting == "squared"
    assert cfg.league.league_exploiter.pfsp_weighting == "linear_capped"
    assert LeagueExploiterConfig().pfsp_weighting == "linear_capped"
    assert cfg.coordinator.lease_timeout_s == 30.0
    assert config_from_dict({}) == cfg


def test_config_round_trips_through_json():
    cfg = load_config(None)
    assert config_from_dict(json.loads(json.dumps(config_to_dict(cfg)))) == cfg


def test_the_default_networks_padding_and_activation_go_with_its_conv_stack():
    """The embedded league's network became same-padded relu (session 34). A run directory or state saved before
    writes out its conv stack, [[64, 3, 1], [64, 3, 1]], without conv_padding or activation: merged over the new
    default it would have resumed same-padded (refused: another network shape) or silently relu. A config giving
    its own conv keeps ModelConfig's defaults for both unless it sets them; one that does not gets the default's."""
    model = lambda data: config_from_dict(data).policy["model"]  # noqa: E731
    default = model({})
    assert default["conv"] == [[32, 3, 1], [32, 3, 1]] and default["conv_padding"] == "same"
    assert default["activation"] == "relu"
    saved_before = {"policy": {"algorithm": "ppo", "model": {"conv": [[64, 3, 1], [64, 3, 1]], "hidden": [128],
                                                             "shared_torso": True}}}
    old = model(saved_before)
    assert "conv_padding" not in old and "activation" not in old  # ModelConfig's: valid, PPO's own tanh
    assert model({"policy": {"model": {"conv": [], "hidden": [64]}}}).get("activation") is None
    said = model({"policy": {"model": {"conv": [[16, 3, 1]], "activation": "relu", "conv_padding": "same"}}})
    assert said["activation"] == "relu" and said["conv_padding"] == "same"
    assert model({"policy": {"model": {"hidden": [256]}}})["conv_padding"] == "same"  # the default's stack: its own
    cfg = config_from_dict({})
    assert config_from_dict(json.loads(json.dumps(config_to_dict(cfg)))).policy["model"] == model({})


def test_user_file_merges_over_defaults(tmp_path):
    path = tmp_path / "league.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "league": {
                    "active_players": {"naive_sp_player": 2},
                    "naive_sp_player": {"one_phase_step": 2.0e4, "exploration": {"start": 0.5}},
                    "payoff": {"decay": 0.9},
                },
                "learner": {"batch_size": 512},
                "env": {"env_num": 2},
            }
        )
    )
    cfg = load_config(path)
    assert cfg.league.active_players == {"naive_sp_player": 2}  # replaced, not merged
    assert cfg.league.naive_sp_player.exploration.start == 0.5
    assert cfg.league.naive_sp_player.exploration.end == 0.1  # the fields not given: the DQN default's
    assert cfg.league.naive_sp_player.exploration.decay_len == 10_000
    assert cfg.league.payoff.decay == 0.9
    assert cfg.league.payoff.min_win_rate_games == 8.0
    assert cfg.learner["batch_size"] == 512 and cfg.learner["publish_every"] == 1  # same algorithm: merged
    assert cfg.env.env_num == 2 and cfg.env.name == "connect_four"


def test_another_algorithm_drops_the_default_policy_and_learner():
    cfg = config_from_dict({"policy": {"algorithm": "dqn"}, "learner": {"replay_ratio": 4.0}})
    assert cfg.policy == {"algorithm": "dqn"}
    assert cfg.learner == {"replay_ratio": 4.0}


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        ({"algorithm": "dqn", "ppo": {"learning_rate": 0.1}},
         "policy.ppo: set, but policy.algorithm is 'dqn' (its settings are policy.dqn)"),
        ({"dqn": {"learning_rate": 0.1}}, "policy.dqn: set, but policy.algorithm is 'ppo' (its settings are policy.ppo)"),
        ({"algorithm": "ppo", "dqn": {}}, "policy.dqn: set, but policy.algorithm is 'ppo' (its settings are policy.ppo)"),
    ],
)
def test_a_section_for_the_algorithm_not_trained_is_refused(policy, message):
    """It was parsed and never read: `ppo.learning_rate` under `algorithm: dqn` silently did nothing."""
    with pytest.raises(ConfigError) as info:
        config_from_dict({"policy": policy})
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("data", "path", "hint"),
    [
        ({"policy": {"algorithm": "dqn"}, "learner": {"batch_size": 32}}, "learner.batch_size",
         "policy.dqn.batch_size"),
        ({"learner": {"replay_ratio": 4.0}}, "learner.replay_ratio", "learner.batch_size"),
        ({"policy": {"algorithm": "ppo"}, "learner": {"replay_ratio": 4.0}}, "learner.replay_ratio",
         "learner.batch_size"),
        ({"policy": {"algorithm": "dqn"}, "learner": {"max_staleness": 4}}, "learner.max_staleness",
         "replay buffer"),
    ],
)
def test_a_learner_key_only_the_other_algorithm_reads_is_refused(data, path, hint):
    """`learner.batch_size` is PPO's batch; a DQN learner never read it (its batch is policy.dqn.batch_size), so a
    DQN user's `batch_size: 32` silently did nothing; `learner.replay_ratio` likewise for PPO."""
    with pytest.raises(ConfigError) as info:
        config_from_dict(data)
    assert info.value.path == path and hint in str(info.value), str(info.value)


def test_each_algorithms_own_learner_keys_still_load():
    assert config_from_dict({"learner": {"batch_size": 512}}).learner["batch_size"] == 512
    assert config_from_dict({"learner": {"max_staleness": 4}}).learner["max_staleness"] == 4
    dqn = config_from_dict({"policy": {"algorithm": "dqn", "dqn": {"batch_size": 32}}, "learner": {"replay_ratio": 2.0}})
    assert dqn.learner == {"replay_ratio": 2.0}
    assert config_from_dict(config_to_dict(dqn)) == dqn  # a DQN run directory's saved config resumes


def test_categories_of_ones_own_load_without_restating_the_pretrain_paths():
    """`player_category: [terran, zerg]` alone was refused with "league.pretrain_checkpoint_path.default: not one
    of player_category": the default's fresh-start entry for its own category, a key the file never set."""
    cfg = config_from_dict(yaml.safe_load("league: {player_category: [terran, zerg]}"))
    assert cfg.league.player_category == ("terran", "zerg")
    assert cfg.league.pretrain_path("terran") == "" and cfg.league.pretrain_path("zerg") == ""
    assert config_from_dict(config_to_dict(cfg)) == cfg  # the run directory's saved config resumes
    # A path the file gives for a category it does not have is still refused, naming it.
    with pytest.raises(ConfigError, match=r"^league.pretrain_checkpoint_path.protoss: not one of player_category"):
        config_from_dict({"league": {"player_category": ["terran"], "pretrain_checkpoint_path": {"protoss": ""}}})


def test_a_dqn_file_still_starts_from_dqns_defaults_not_the_default_ppo_section():
    """The embedded default holds a `ppo:` section; a file naming dqn leaves it out instead of tripping over it."""
    cfg = config_from_dict(yaml.safe_load("policy: {algorithm: dqn, dqn: {learning_rate: 0.0005}}"))
    assert cfg.policy == {"algorithm": "dqn", "dqn": {"learning_rate": 0.0005}}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"league": {"main_player": {"one_phase_step": "1e6"}}},
            "league.main_player.one_phase_step: expected int, got str",
        ),
        (
            {"league": {"main_player": {"one_phase_stpe": 10}}},
            "league.main_player.one_phase_stpe: unknown key",
        ),
        ({"leauge": {}}, "leauge: unknown key"),
        ({"league": {"league_type": "team"}}, "league.league_type: expected one of"),
        (
            {"league": {"league_type": "solo"}},
            "league.active_players.main_player: not a player type of a solo",
        ),
        ({"league": {"active_players": {"hero": 1}}}, "league.active_players.hero: not a player type"),
        ({"league": {"active_players": {"main_player": 0}}}, "league.active_players: needs at least one"),
        (
            {"league": {"main_player": {"branch_probs": {"pfsp": 0.5}}}},
            "league.main_player.branch_probs: must sum",
        ),
        (
            {"league": {"main_exploiter": {"branch_probs": {"pfsp": 1.0}}}},
            "league.main_exploiter.branch_probs.pfsp: unknown branch",
        ),
        (
            {"league": {"main_player": {"strong_win_rate": 1.5}}},
            "league.main_player.strong_win_rate: must be within",
        ),
        ({"league": {"payoff": {"decay": 0}}}, "league.payoff.decay: must be within (0, 1]"),
        ({"league": {"max_active_player_job": 0}}, "league.max_active_player_job: must be >= 1"),
        ({"league": {"main_player": {"max_job": 0}}}, "league.main_player.max_job: must be >= 1"),
        ({"league": {"use_pretrain_init_historical": True}}, "league.pretrain_checkpoint_path.default:"),
        ({"league": {"pretrain_checkpoint_path": {"zerg": "x.pt"}}}, "league.pretrain_checkpoint_path.zerg:"),
        ({"league": {"pretrain_checkpoint_path": {"default": "../../etc/passwd"}}},
         "league.pretrain_checkpoint_path.default: path '../../etc/passwd' has an empty, '.' or '..' component"),
        ({"league": {"pretrain_checkpoint_path": {"default": "/sl/x.pt"}}},
         "league.pretrain_checkpoint_path.default: path '/sl/x.pt' is absolute"),
        ({"league": {"trueskill": {"draw_probability": 0.0}}}, "league.trueskill.draw_probability"),
        # Below 1e-9 the draw margin vanished in float64: every drawn game's update divided by zero.
        ({"league": {"trueskill": {"draw_probability": 1e-17}}}, "league.trueskill.draw_probability: must be "
                                                                   "within [1e-09, 1)"),
        # A solo player has no win rates: its first early snapshot killed the snapshot thread.
        ({"league": {"league_type": "solo", "active_players": {"solo_active_player": 1},
                     "solo_active_player": {"strong_win_rate": 0.7}}, "env": {"name": "CartPole-v1"}},
         "league.solo_active_player.strong_win_rate: a solo player has no opponents"),
        ({"league": {"main_player": {"job": {"env_kwargs": 3}}}}, "league.main_player.job.env_kwargs"),
        ({"env": {"env_num": "4"}}, "env.env_num: expected int, got str"),
        ({"env": {"episode_num": 0, "env_steps": 0}}, "env.episode_num:"),
        ({"coordinator": {"heartbeat_interval_s": 60}}, "coordinator.heartbeat_interval_s:"),
        ({"policy": ["ppo"]}, "policy: expected a mapping"),
        # The sections actors and learners parse are checked at load too (a typo stops startup).
        ({"policy": {"ppo": {"learnin_rate": 0.1}}}, "policy.ppo: unknown field(s) ['learnin_rate']"),
        ({"policy": {"ppo": {"gamma": 3}}}, "ppo.gamma must be in [0, 1]"),
        ({"policy": {"algorithm": "a2c"}}, "policy.algorithm: 'a2c' is not one of"),
        ({"learner": {"batch_size": -3}}, "learner.batch_size must be >= 1"),
        ({"learner": {"bach_size": 64}}, "learner: unknown field(s) ['bach_size']"),
        # So are the adder_kwargs and forward_kwargs every actor parses (a bad one failed every collect job).
        ({"league": {"main_player": {"adder_kwargs": {"unrol_len": 8}}}},
         "league.main_player.adder_kwargs: unknown field(s) ['unrol_len']"),
        ({"league": {"main_player": {"adder_kwargs": {"unroll_len": "x"}}}},
         "league.main_player.adder_kwargs.unroll_len: expected an integer"),
        ({"league": {"solo_active_player": {"adder_kwargs": {"chunks_in_flight": 1}}}},
         "league.solo_active_player.adder_kwargs: chunks_in_flight must be 0"),
        ({"league": {"main_exploiter": {"job": {"adder_kwargs": {"unroll_len": 0}}}}},
         "league.main_exploiter.adder_kwargs: unroll_len must be in [1, 4096]"),
        ({"league": {"main_player": {"adder_kwargs": {"unroll_len": 5000}}}},
         "league.main_player.adder_kwargs: unroll_len must be in [1, 4096], got 5000"),
        ({"league": {"main_player": {"forward_kwargs": {"epss": 0.1}}}},
         "league.main_player.forward_kwargs: unknown field(s) ['epss']"),
        ({"league": {"league_exploiter": {"job": {"forward_kwargs": {"eps": 2}}}}},
         "league.league_exploiter.forward_kwargs: eps must be in [0, 1]"),
    ],
)
def test_config_errors_name_the_key_path(data, message):
    with pytest.raises(ConfigError) as info:
        config_from_dict(data)
    assert message in str(info.value)


EMPTY_SECTION = "expected a mapping, got null (an empty section: remove the key to use the defaults)"


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ("policy:\n  model:\n  #  hidden: [256]\n  ppo:\n  #  learning_rate: 0.0003\n", "policy.model"),
        ("policy:\n  ppo:\n", "policy.ppo"),
        ("policy:\n  algorithm: dqn\n  dqn:\n", "policy.dqn"),  # a section the defaults do not have
        ("policy:\n", "policy"),
        ("env:\n", "env"),
        ("env:\n  kwargs:\n", "env.kwargs"),
        ("run:\n", "run"),
        ("league:\n  main_player:\n", "league.main_player"),
        ("league:\n  payoff:\n", "league.payoff"),
        ("league:\n  active_players:\n", "league.active_players"),
        ("league:\n  main_player:\n    adder_kwargs:\n", "league.main_player.adder_kwargs"),
        ("league:\n  main_player:\n    job:\n      forward_kwargs:\n", "league.main_player.job.forward_kwargs"),
    ],
)
def test_an_empty_section_is_refused_naming_its_key_not_read_as_the_defaults(tmp_path, text, path):
    """YAML reads a section whose keys are all commented out as null. Taken for "all defaults", an empty
    `policy.model:` replaced the default league's connect-four network with the bare dataclass defaults."""
    file = tmp_path / "league.yaml"
    file.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(file)
    assert info.value.path == path
    assert str(info.value) == f"{path}: {EMPTY_SECTION} (in {file})"


def test_a_null_where_null_is_a_setting_still_loads():
    """Only sections are refused as null: `exploration: null` means no exploration, `strong_win_rate: null`
    a snapshot every phase, `value_bound: null` an unbounded value head."""
    cfg = config_from_dict(yaml.safe_load(
        "league: {main_player: {exploration: null, strong_win_rate: null}}\n"
        "policy: {model: {value_bound: null}}\n"
    ))
    assert cfg.league.main_player.exploration is None and cfg.league.main_player.strong_win_rate is None
    assert cfg.policy["model"]["value_bound"] is None


def test_league_run_reports_an_empty_section_in_one_line_before_making_the_run_dir(tmp_path, capsys):
    import argparse

    from league_cli.run import add_arguments, run_main

    path = tmp_path / "league.yaml"
    path.write_text("policy:\n  model:\n")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert run_main(parser.parse_args([str(path), "--run-dir", str(tmp_path / "run")])) == 2
    out = " ".join(capsys.readouterr().out.split())  # wrapped to the terminal's width
    assert f"config error: policy.model: {EMPTY_SECTION} (in {path})" in out
    assert not (tmp_path / "run").exists()


def test_load_config_error_names_the_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("league:\n  main_player:\n    one_phase_step: lots\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.path == "league.main_player.one_phase_step"
    assert str(path) in str(info.value)


def test_a_run_directorys_config_with_a_key_retired_since_still_loads(tmp_path, caplog):
    # `league run` writes every key into its run directory's config.yaml; one written before d008dd6 holds
    # coordinator.job_queue_size, which made resuming that league fail with "unknown key".
    old = config_to_dict(load_config(None))
    old["coordinator"]["job_queue_size"] = 64
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(old, sort_keys=False))
    with caplog.at_level("WARNING", logger="league_service.config"):
        cfg = load_config(path)
    assert "job_queue_size" not in config_to_dict(cfg)["coordinator"]
    assert cfg == load_config(None)
    assert "coordinator.job_queue_size: no longer used" in caplog.text
    with pytest.raises(ConfigError, match="unknown key"):  # any other unknown key is still refused
        config_from_dict({"coordinator": {"job_queue_sise": 64}})


def test_an_unreadable_config_file_is_a_config_error_naming_it(tmp_path):
    """`league run missing.yaml` printed a Python traceback; every CLI reports ConfigErrors as one line."""
    for path, message in (
        (tmp_path / "missing.yaml", "cannot read the config file: No such file or directory"),
        (tmp_path, "cannot read the config file"),  # a directory
    ):
        with pytest.raises(ConfigError) as info:
            load_config(path)
        assert str(info.value).startswith(f"{path}: {message}")
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00league")
    with pytest.raises(ConfigError, match="not a text file"):
        load_config(binary)
    listed = tmp_path / "list.yaml"
    listed.write_text("- a\n- b\n")
    with pytest.raises(ConfigError) as info:
        load_config(listed)
    assert str(info.value) == f"{listed}: the top level must be a mapping, got list"  # the file named once


def test_league_run_reports_a_missing_config_file_in_one_line(tmp_path, capsys):
    import argparse

    from league_cli.run import add_arguments, run_main

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert run_main(parser.parse_args([str(tmp_path / "missing.yaml"), "--run-dir", str(tmp_path / "run")])) == 2
    out = capsys.readouterr().out
    assert "config error" in out and "missing.yaml: cannot read the config file" in out
    assert not (tmp_path / "run").exists()


def test_solo_league_config():
    cfg = config_from_dict(
        {
            "env": {"name": "CartPole-v1"},
            "league": {"league_type": "solo", "active_players": {"solo_active_player": 2}},
        }
    )
    assert cfg.league.league_type == "solo"
    assert cfg.league.player_config("solo_active_player").branch_probs == {}


def test_default_yaml_only_holds_known_keys():
    # from_dict would reject unknown keys; also check the file is the one load_config(None) uses.
    assert from_dict(Config, default_config_dict()) == load_config(None)


def test_loading_a_league_config_does_not_import_torch():
    """The coordinator parses the policy and learner sections without torch (it never imports it)."""
    import subprocess
    import sys

    code = ("import sys; from league_service.config import load_config; load_config(None); "
            "import league_service.server; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "False"


def test_free_form_sections_hold_plain_data_with_string_keys():
    """Free-form sections travel to actors and learners in protobuf Structs (string keys only). YAML's
    `bots: {1: random}` used to load and then fail every GetJob of the league; its keys now become strings
    at load, the same on a local run and over the wire."""
    cfg = config_from_dict(yaml.safe_load(
        "env: {name: connect_four, kwargs: {bots: {1: random}, game_params: {rows: 6}}}\n"
        "league: {league_type: solo, active_players: {solo_active_player: 1},\n"
        "         solo_active_player: {env_kwargs: {bots: {1: 'mcts:10'}}}}\n"
    ))
    assert cfg.env.kwargs == {"bots": {"1": "random"}, "game_params": {"rows": 6}}
    assert cfg.league.player_config("solo_active_player").env_kwargs == {"bots": {"1": "mcts:10"}}
    to_struct(cfg.env.kwargs)  # what the coordinator puts into every collect job


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ("{start: 2024-01-01}", "env.kwargs.start: expected a string, number, boolean, null, list or mapping, got date"),
        ("{bots: {1.5: random}}", "env.kwargs.bots.1.5: keys must be strings"),
        ("{bots: {true: random}}", "env.kwargs.bots.True: keys must be strings"),
        ("{bots: {1: random, '1': mcts}}", "env.kwargs.bots.1: the key is given twice"),
        ("{layers: [{at: 2024-01-01}]}", "env.kwargs.layers[0].at: expected a string"),
    ],
)
def test_free_form_values_a_struct_cannot_hold_are_refused_at_load(kwargs, message):
    with pytest.raises(ConfigError) as info:
        config_from_dict(yaml.safe_load(f"env: {{name: connect_four, kwargs: {kwargs}}}"))
    assert message in str(info.value)


def test_an_actor_section_with_settings_is_refused_naming_the_key():
    """Nothing reads `actor:`: a setting there would silently do nothing. Empty, it still loads (older files)."""
    assert config_from_dict({"actor": {}}).actor == {}
    with pytest.raises(ConfigError, match=r"actor\.env_num: actors read no settings from the league config"):
        config_from_dict({"actor": {"env_num": 4}})


def test_league_run_reports_a_malformed_token_in_one_line_before_making_the_run_dir(tmp_path, capsys, monkeypatch):
    """`export LEAGUE_TOKEN=$(cat file)` of a two-line file: a traceback (exit 1) once the run directory existed."""
    import argparse

    from league_cli.run import add_arguments, run_main

    monkeypatch.setenv("LEAGUE_TOKEN", "tôken")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert run_main(parser.parse_args(["--run-dir", str(tmp_path / "run"), "--seconds", "5"])) == 2
    assert "$LEAGUE_TOKEN: the token must be one line of printable ASCII" in capsys.readouterr().out
    assert not (tmp_path / "run").exists()


def test_a_dqn_league_explores_by_default_unless_a_player_type_says_otherwise():
    """DQN acts greedily on its Q-values: a DQN config's player types get an epsilon schedule (a DQN league
    without one never explored), except where the config names one, names none (`exploration: null`) or fixes
    `eps` in the forward kwargs; PPO, which explores by sampling, gets none."""
    from league_service.config import DQN_EXPLORATION, PLAYER_TYPES

    dqn = config_from_dict(yaml.safe_load(
        "policy: {algorithm: dqn, model: {conv: [[16, 3, 1]]}}\n"
        "league:\n"
        "  main_player: {exploration: null}\n"
        "  main_exploiter: {exploration: {start: 0.5, kind: linear}}\n"
        "  league_exploiter: {forward_kwargs: {eps: 0.2}}\n"
        "  naive_sp_player: {job: {forward_kwargs: {eps: 0.3}}}\n"
    ))
    assert dqn.league.solo_active_player.exploration == DQN_EXPLORATION
    assert dqn.league.main_player.exploration is None
    assert dqn.league.main_exploiter.exploration.start == 0.5
    assert dqn.league.main_exploiter.exploration.kind == "linear"
    assert dqn.league.league_exploiter.exploration is None
    assert dqn.league.naive_sp_player.exploration is None
    assert config_from_dict(config_to_dict(dqn)) == dqn  # what a run directory keeps loads back the same

    solo = config_from_dict(yaml.safe_load(
        "league: {league_type: solo, active_players: {solo_active_player: 1}}\n"
        "env: {name: CartPole-v1}\npolicy: {algorithm: dqn}\n"
    ))
    assert solo.league.solo_active_player.exploration == DQN_EXPLORATION
    ppo = config_from_dict({})
    assert all(getattr(ppo.league, t).exploration is None for t in PLAYER_TYPES)


def test_a_dqn_league_that_never_explores_is_named_at_start():
    """A run directory saved before DQN leagues got a default schedule holds `exploration: null`, which a resume
    keeps: `league run` and the coordinator say which player types act greedily."""
    from league_service.config import greedy_dqn_player_types

    assert greedy_dqn_player_types(config_from_dict({})) == []  # PPO
    dqn = {"policy": {"algorithm": "dqn", "model": {"conv": [[16, 3, 1]]}}}
    assert greedy_dqn_player_types(config_from_dict(dqn)) == []
    saved = config_to_dict(config_from_dict(dqn))
    for player_type in ("main_player", "league_exploiter"):
        saved["league"][player_type]["exploration"] = None
    saved["league"]["league_exploiter"]["forward_kwargs"] = {"eps": 0.1}
    assert greedy_dqn_player_types(config_from_dict(saved)) == ["main_player"]


SOLO = {"league_type": "solo", "active_players": {"solo_active_player": 1}}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"env": {"name": "CartPole-v1"}}, "env.name: 'CartPole-v1' names a gymnasium env, of one seat, but a battle"),
        ({"env": {"name": "tic_tac_toe"}}, "(OpenSpiel has a game 'tic_tac_toe': 'openspiel:tic_tac_toe')"),
        ({"env": {"name": "openspiel:catch"}}, "env.name: 'openspiel:catch' gives a game of 1 player(s)"),
        ({"env": {"name": "openspiel:kuhn_poker", "kwargs": {"game_params": {"players": 3}}}},
         "env.kwargs.game_params: 'openspiel:kuhn_poker' gives a game of 3 player(s)"),
        ({"league": {"main_exploiter": {"env_kwargs": {"game_params": {"players": 4}}}},
          "env": {"name": "openspiel:kuhn_poker"}},
         "league.main_exploiter.env_kwargs.game_params: 'openspiel:kuhn_poker' gives a game of 4 player(s)"),
        ({"env": {"name": "openspiel:tictactoe"}}, "env.name: OpenSpiel has no game 'tictactoe'"),
        ({"env": {"name": "openspiel:blotto"}}, "env.name: OpenSpiel's 'blotto' is not sequential-move"),
        ({"env": {"name": "openspiel:blotto", "kwargs": {"game_params": {"players": 2}}}},  # (loaded in a child)
         "env.name: OpenSpiel's 'blotto' is not sequential-move"),
        ({"env": {"name": "openspiel:coordinated_mp"}},
         "env.name: OpenSpiel's 'coordinated_mp' provides no observation tensor"),
        ({"env": {"kwargs": {"game_params": {"rowz": 6}}}}, "env.kwargs.game_params: 'connect_four' refuses them"),
        ({"env": {"kwargs": {"game_params": {"rows": 2**31}}}},  # was pybind11's bare RuntimeError, a traceback
         "env.kwargs.game_params.rows: 2147483648 is out of range for an OpenSpiel game parameter"),
        ({"league": {"main_player": {"env_kwargs": {"game_params": {"columns": -(10**20)}}}}},
         "league.main_player.env_kwargs.game_params.columns: must be within ±2**53"),
        # Parameters these games' C++ checks abort or crash on: config load (in the coordinator, in league run)
        # died with the process (exit 134 or 139, before the fix this test's process too); loaded aside now.
        ({"env": {"name": "openspiel:hanabi", "kwargs": {"game_params": {"players": 6}}}},
         "env.kwargs.game_params: 'hanabi' refuses them: pyspiel crashed loading the game (signal SIGABRT): Input "
         "requirements failed"),
        ({"env": {"name": "openspiel:universal_poker", "kwargs": {"game_params": {"numPlayers": 3}}}},
         "env.kwargs.game_params: 'universal_poker' refuses them: pyspiel crashed loading the game (signal SIGSEGV)"),
        # At their defaults: a game that needs a parameter (SpielError), and nfg_game's IndexError (a traceback).
        ({"env": {"name": "openspiel:add_noise"}}, "env.kwargs.game_params: 'add_noise' refuses them: Missing "
         "parameter epsilon"),
        ({"env": {"name": "openspiel:nfg_game"}}, "env.kwargs.game_params: 'nfg_game' refuses them: map::at"),
        ({"league": SOLO, "env": {"name": "connect_four"}},
         "env.kwargs.bots: 'connect_four' gives a game of 2 players and a solo league's job has one"),
        # A list or a bare name was 'got 0' bots; the env wants seat -> bot and failed every job on `.items()`.
        ({"league": SOLO, "env": {"name": "connect_four", "kwargs": {"bots": ["random"]}}},
         "env.kwargs.bots: expected a mapping of seat -> bot, e.g. {1: random}, got list ['random']"),
        ({"league": {**SOLO, "solo_active_player": {"env_kwargs": {"bots": "random"}}}, "env": {"name": "connect_four"}},
         "league.solo_active_player.env_kwargs.bots: expected a mapping of seat -> bot, e.g. {1: random}, got str"),
        ({"league": SOLO, "env": {"name": "openspiel:kuhn_poker", "kwargs": {"bots": {1: "random"},
                                                                            "game_params": {"players": 3}}}},
         "env.kwargs.bots: 'openspiel:kuhn_poker' gives a game of 3 players"),
        # A bot the env cannot seat loaded, then failed every env build on every worker.
        ({"league": SOLO, "env": {"name": "connect_four", "kwargs": {"bots": {1: "rando"}}}},
         "env.kwargs.bots: bot spec 'rando': unknown bot"),
        ({"league": SOLO, "env": {"name": "connect_four", "kwargs": {"bots": {1: "random", 7: "random"}}}},
         "env.kwargs.bots: bots: seat 7 is out of range for 2 players"),
        # An OpenSpiel env's own keyword arguments: a typo loaded fine and failed every job in the workers.
        ({"env": {"kwargs": {"perspective": "absolute_ish"}}},
         "env.kwargs.perspective: must be one of absolute, relative, got 'absolute_ish'"),
        ({"env": {"name": "openspiel:kuhn_poker", "kwargs": {"perspective": "relative"}}},
         "env.kwargs.perspective: 'relative' is defined only for connect_four, tic_tac_toe"),
        ({"league": {"main_player": {"env_kwargs": {"perspectiv": "relative"}}}},
         "league.main_player.env_kwargs.perspectiv: an OpenSpiel env takes game_params, bots, perspective, not "
         "'perspectiv'"),
        # The env's bots in a battle league took a seat in every match: the two league players each played seat 0
        # against the bot, credited as if they had played each other.
        ({"env": {"kwargs": {"bots": {1: "random"}}}}, "env.kwargs.bots: a battle league seats two league players"),
        ({"league": {"main_player": {"env_kwargs": {"bots": {1: "random"}}}}},
         "league.main_player.env_kwargs.bots: a battle league seats two league players"),
        # A match is played in its launch player's env, every seat seeing its observations: a type's own view
        # reached only its launch seats (as an opponent it saw the absolute board, or another board size).
        ({"league": {"main_player": {"env_kwargs": {"perspective": "relative"}}}},
         "league.main_player.env_kwargs.perspective: main_exploiter's jobs would play with perspective 'absolute', "
         "main_player's with 'relative'"),
        ({"league": {"league_exploiter": {"job": {"env_kwargs": {"game_params": {"rows": 5}}}}}},
         "league.league_exploiter.job.env_kwargs.game_params: league_exploiter's jobs would play with game_params "
         "{'rows': 5}, main_player's with {}"),
    ],
)
def test_a_league_whose_matches_cannot_fill_the_envs_seats_is_refused_at_load(data, message):
    """A battle league on CartPole or on three-player Kuhn poker, or a solo league on connect four with nobody in
    the other seat, loaded and then failed every collect job in the actors for as long as the league ran."""
    with pytest.raises(ConfigError) as info:
        config_from_dict(data)
    assert message in str(info.value)


def test_leagues_whose_matches_fill_the_envs_seats_load():
    config_from_dict({"league": SOLO, "env": {"name": "connect_four", "kwargs": {"bots": {1: "random"}}}})
    config_from_dict({"league": SOLO, "env": {"name": "openspiel:catch"}})
    config_from_dict({"env": {"name": "openspiel:kuhn_poker", "kwargs": {"game_params": {"players": 2}}}})
    config_from_dict({"env": {"name": "python:tests.env_doubles:CountingEnv"}})  # known only once built
    config_from_dict({"env": {"kwargs": {"perspective": "relative"}}})
    config_from_dict({"league": {t: {"env_kwargs": {"perspective": "relative"}}  # one view, set per type
                                 for t in ("main_player", "main_exploiter", "league_exploiter")}})
    config_from_dict({"league": {"main_player": {"env_kwargs": {"perspective": "absolute"}}}})  # the default


@pytest.mark.parametrize(
    ("league", "key"),
    [
        ({"main_player": {"adder_kwargs": {"unroll_len": 4}}}, "league.main_player.adder_kwargs.unroll_len = 4"),
        ({"main_exploiter": {"job": {"adder_kwargs": {"unroll_len": 2}}}},
         "league.main_exploiter.job.adder_kwargs.unroll_len = 2"),
    ],
)
def test_a_dqn_n_step_above_an_active_players_unroll_len_is_refused(league, key):
    """An n-step window ends with its trajectory row (at most unroll_len steps): n_step 10 on rows of 4 summed
    4 rewards at most, as n_step 4 does, and nothing said so."""
    with pytest.raises(ConfigError) as info:
        config_from_dict({"policy": {"algorithm": "dqn", "dqn": {"n_step": 10}}, "league": league})
    assert str(info.value).startswith(f"policy.dqn.n_step: must be at most {key}, got 10")


def test_a_dqn_n_step_within_every_active_players_unroll_len_loads():
    config_from_dict({"policy": {"algorithm": "dqn", "dqn": {"n_step": 4}},
                      "league": {"main_player": {"adder_kwargs": {"unroll_len": 4}},
                                 "naive_sp_player": {"adder_kwargs": {"unroll_len": 1}}}})  # not active
    with pytest.raises(ConfigError, match=r"league.main_player.adder_kwargs.unroll_len \(default\) = 32, got 33"):
        config_from_dict({"policy": {"algorithm": "dqn", "dqn": {"n_step": 33}}})


def test_main_exploiters_without_a_main_player_are_refused():
    """A main exploiter's one branch plays the main players: without one every job fell back to playing itself,
    reference bots or not, for as long as the league ran."""
    with pytest.raises(ConfigError) as info:
        config_from_dict({"league": {"active_players": {"main_exploiter": 1, "league_exploiter": 1,
                                                        "main_player": 0}}})
    assert str(info.value).startswith("league.active_players.main_exploiter: a main exploiter plays only main "
                                      "players, and there is no main_player")
    # League exploiters alone still load: their PFSP finds their own snapshots once they have some.
    config_from_dict({"league": {"active_players": {"league_exploiter": 2}}})


def test_step_budget_jobs_that_cut_episodes_are_named_at_start():
    """With episode_num 0 an episode still running at a job's end is cut and its result never reported, unless
    the actor's next job plays on from there: the same match, as in a solo league of one player. Elsewhere the
    results favour short episodes (and never count one longer than a job's steps per env)."""
    from league_service.env_fit import cut_episodes_note

    def note(env, league=SOLO):
        return cut_episodes_note(config_from_dict({"league": league, "env": {"episode_num": 0, **env}}))

    cartpole = {"name": "CartPole-v1", "env_num": 8, "env_steps": 1024}
    assert note(cartpole) is None  # one solo player: its episodes go on in the actor's next job
    two_solo = {**SOLO, "active_players": {"solo_active_player": 2}}
    assert note(cartpole, two_solo).startswith("env.episode_num 0 ends jobs on a step budget, and an actor's next job "
                                               "is mostly another match, so the episodes under way")
    assert ("and none longer than env.env_steps / env.env_num = 1024 / 8 = 128 steps (episodes of CartPole-v1 last "
            "up to 500); end jobs after whole episodes (env.episode_num > 0)") in note(cartpole, two_solo)
    assert "none longer" not in note({**cartpole, "env_steps": 4000}, two_solo)
    assert "none longer" not in note({**cartpole, "kwargs": {"max_episode_steps": 100}}, two_solo)
    assert cut_episodes_note(config_from_dict({"league": two_solo, "env": {**cartpole, "episode_num": 8}})) is None
    connect_four = {"name": "connect_four", "env_num": 4, "env_steps": 64}
    assert "(episodes of connect_four last up to 42)" in note(connect_four, league={})
    assert "another match" in note({**connect_four, "env_steps": 4096}, league={})  # a battle league's mostly are


def test_a_number_in_exponent_form_is_a_number_as_in_yaml_1_2(tmp_path):
    """PyYAML follows YAML 1.1, whose floats need a dot in the mantissa and a sign in the exponent: `seconds: 1e3`
    was the string '1e3' (refused, then refused with how to write it). Read as YAML 1.2 and Python read it."""
    path = tmp_path / "league.yaml"
    for text, value in (("1e3", 1000.0), ("1.5e3", 1500.0), ("1.0e+3", 1000.0), (".5e2", 50.0)):
        path.write_text(f"coordinator:\n  lease_timeout_s: {text}\n")
        assert load_config(path).coordinator.lease_timeout_s == value, text
    path.write_text("coordinator:\n  lease_timeout_s: -1e+3\n")
    with pytest.raises(ConfigError, match="lease_timeout_s: must be > 0"):
        load_config(path)
    path.write_text("policy:\n  ppo: {learning_rate: 2E-4}\n")
    assert load_config(path).policy["ppo"]["learning_rate"] == 2e-4
    path.write_text("coordinator:\n  lease_timeout_s: '1e3'\n")  # quoted: a string, as the user wrote it
    with pytest.raises(ConfigError, match=r"lease_timeout_s: expected float, got str \('1e3'\)"):
        load_config(path)


@pytest.mark.parametrize("league, key", [
    ({"elo": {"k_factor": 999}}, "league.elo"),
    ({"trueskill": {"mu": 100}}, "league.trueskill"),
    ({"payoff": {"decay": 0.5}}, "league.payoff.decay"),  # was refused as "min_win_rate_games: must be below ..."
    ({"payoff": {"min_win_rate_games": 3}}, "league.payoff.min_win_rate_games"),
    ({"payoff": {"default_win_rate": 0.2}}, "league.payoff.default_win_rate"),
])
def test_a_solo_league_says_its_ratings_and_win_rate_settings_change_nothing(league, key):
    """A solo league took `elo.k_factor: 999` and the like without a word, changing nothing, and refused
    `payoff.decay: 0.5` alone for a reason about win rates (a review). They are taken, with a start-up warning
    naming them (a refusal would stop an older solo run's config.yaml from resuming); the defaults say nothing."""
    from league_service.config import battle_only_note

    solo = {"league_type": "solo", "active_players": {"solo_active_player": 1}}
    note = battle_only_note(config_from_dict({"env": {"name": "CartPole-v1"}, "league": {**solo, **league}}))
    assert note == (f"{key} set, but a solo league rates no matches and keeps no win rates (its players are "
                    "judged by their returns): they change nothing")
    assert battle_only_note(config_from_dict({"env": {"name": "CartPole-v1"}, "league": solo})) is None
    assert battle_only_note(config_from_dict({"league": league if key != "league.payoff.decay" else {}})) is None
