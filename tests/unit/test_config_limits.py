"""Hostile config values and flags: each is refused at load (or by argparse) naming the key, instead of hanging,
eating memory, or failing every job later at encode or run time."""

from __future__ import annotations

import argparse
import math
import string
from pathlib import Path

import pytest
import yaml

from common.config import ConfigError, from_dict, parse_yaml
from common.job_limits import MAX_EPISODES_PER_JOB
from common.learner_config import (
    MAX_KEEP_LAST,
    MAX_LEARNER_BATCH_SIZE,
    MAX_PUBLISH_EVERY,
    MAX_QUEUE_BYTES,
    MAX_QUEUE_CHUNKS,
    MAX_REPLAY_RATIO,
    MAX_SEED,
    LearnerConfig,
)
from common.policy_config import (
    MAX_DQN_BATCH_SIZE,
    MAX_KERNEL,
    MAX_LAYER_WIDTH,
    MAX_LAYERS,
    MAX_N_STEP,
    MAX_REPLAY_CAPACITY,
    MAX_UPDATE_EPOCHS,
    DQNConfig,
    ModelConfig,
    PPOConfig,
)
from common.ports import split_host_port
from league_cli.main import build_parser
from league_cli.run import RunConfig
from league_service.cli import _status_address, add_status_arguments, coordinator_main
from league_service.config import (
    MAX_ELO_K_FACTOR,
    MAX_ENV_NUM,
    MAX_JOBS_PER_PLAYER,
    config_from_dict,
    default_config_dict,
    load_config,
)
from league_service.player_factory import active_player_id

ROOT = Path(__file__).resolve().parents[2]


def _refused(data: dict, path: str, message: str = "") -> ConfigError:
    with pytest.raises(ConfigError) as info:
        config_from_dict(data)
    assert info.value.path == path, str(info.value)
    assert message in str(info.value)
    return info.value


# -- 1. YAML aliases --------------------------------------------------------------------------------------------


def _alias_bomb() -> str:
    lines = ["env:", "  kwargs:", "    a: &a [" + ", ".join(["lol"] * 9) + "]"]
    for prev, name in zip(string.ascii_lowercase[:9], string.ascii_lowercase[1:10], strict=True):
        lines.append(f"    {name}: &{name} [" + ", ".join([f"*{prev}"] * 9) + "]")
    return "\n".join(lines) + "\n"


@pytest.mark.timeout(20)
def test_an_alias_bomb_is_refused_at_once(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(_alias_bomb())
    with pytest.raises(ConfigError, match=r"over 100,000 values once its YAML aliases are expanded"):
        load_config(path)


def test_ordinary_aliases_and_merges_load():
    """Anchors, aliases and merges are common YAML (and yaml.safe_dump writes aliases for shared values)."""
    assert parse_yaml("x: &base {a: 1}\ny: *base\nz: {<<: *base, b: 2}\n") == {
        "x": {"a": 1}, "y": {"a": 1}, "z": {"a": 1, "b": 2}}
    shared = {"unroll_len": 8}
    dumped = yaml.safe_dump({"main_player": {"adder_kwargs": shared}, "main_exploiter": {"adder_kwargs": shared}})
    assert "*id001" in dumped and parse_yaml(dumped)["main_exploiter"]["adder_kwargs"] == shared


def test_an_alias_inside_the_value_it_names_and_deep_nesting_are_refused():
    with pytest.raises(ConfigError, match="refers to a value it is inside of"):
        parse_yaml("a: &a [1, *a]\n")
    with pytest.raises(ConfigError, match="nested too deeply"):
        parse_yaml("a: " + "[" * 5000 + "]" * 5000 + "\n")


def test_an_inline_merge_key_still_merges():
    assert parse_yaml("a: {<<: {x: 1}, y: 2}\n") == {"a": {"x": 1, "y": 2}}


def test_merges_follow_the_yaml_spec_whatever_the_keys_length():
    """PyYAML 6.0.4 (yaml/pyyaml#953) let which value won depend on the key's length in chains and lists of merges:
    `n` came from `common` past `base`'s override, and `lr` from the later of two merged mappings (a review). A
    mapping's own keys win over merged ones; of merged mappings, the earlier; a mapping merged in one place and
    used as an alias in another is no duplicate."""
    chain = "common: &common {n: 1, depth: 1}\nbase: &base {<<: *common, n: 2, depth: 2}\na: {<<: *base}\n"
    assert parse_yaml(chain)["a"] == {"n": 2, "depth": 2}
    assert parse_yaml("a: &a {lr: 1, k: 1}\nb: &b {lr: 2, k: 2}\nr: {<<: [*a, *b]}\n")["r"] == {"lr": 1, "k": 1}
    assert parse_yaml("a: &a {lr: 1}\nr: {<<: *a, lr: 5}\n")["r"] == {"lr": 5}
    assert parse_yaml("a:\n  <<: &base {<<: {k: 1}, k: 2}\nb: *base\n") == {"a": {"k": 2}, "b": {"k": 2}}
    with pytest.raises(ConfigError, match="found the key 'lr' a second time"):
        parse_yaml("a: &a {lr: 1}\nr: {<<: *a, lr: 5, lr: 6}\n")
    with pytest.raises(ConfigError, match="expected a mapping or a list of mappings to merge"):
        parse_yaml("r: {<<: 3}\n")


def test_a_key_given_twice_in_one_mapping_is_refused():
    """PyYAML keeps the last silently: two `env:` sections, say, lost the first one's settings."""
    with pytest.raises(ConfigError, match="found the key 'env_num' a second time"):
        parse_yaml("env:\n  env_num: 2\n  env_num: 3\n")
    with pytest.raises(ConfigError, match="found the key 'env' a second time"):
        parse_yaml("env: {env_num: 2}\nrun: {actors: 1}\nenv: {episode_num: 3}\n")
    assert parse_yaml("a: {x: 1}\nb: {x: 2}\n") == {"a": {"x": 1}, "b": {"x": 2}}  # the same key, elsewhere



def test_a_number_with_an_exponent_and_no_dot_is_a_number():
    """YAML 1.1 (PyYAML) reads `1e-3` as a string: `learning_rate: 1e-3` was refused as "expected a number" (a
    review). Read as YAML 1.2 and Python do; quoted, it stays a string; other loaders are left as they are."""
    assert parse_yaml("lr: 1e-3\nn: 2E5\nm: -1e+2\nq: '1e-3'\nk: 10\nv: 1e\n") == {
        "lr": 0.001, "n": 200000.0, "m": -100.0, "q": "1e-3", "k": 10, "v": "1e"}
    assert yaml.safe_load("lr: 1e-3") == {"lr": "1e-3"}
    config = config_from_dict(parse_yaml("policy: {ppo: {learning_rate: 1e-3}}\nenv: {env_steps: 1e5}\n"))
    assert config.policy["ppo"]["learning_rate"] == 0.001 and config.env.env_steps == 100_000


@pytest.mark.parametrize(("text", "read_as"), [("unroll_len: 010", "an octal number"),
                                                ("one_phase_step: 012000", "an octal number"),
                                                ("seconds: 1:30", "a base-60 number"),
                                                ("seconds: 1:30.5", "a base-60 number")])
def test_yaml_1_1_octal_and_base_60_numbers_are_refused(text, read_as):
    """PyYAML read `010` as 8, `012000` as 5120 and `1:30` as 90 (YAML 1.1; YAML 1.2 has neither): refused,
    saying how it would be read. Quoted, they are strings; 0 and 0x10 stay numbers."""
    with pytest.raises(ConfigError, match=f"would be read as {read_as}"):
        parse_yaml(text)
    assert parse_yaml("a: '010'\nb: 0\nc: 0x10\nd: -0\ne: 10\n") == {"a": "010", "b": 0, "c": 16, "d": 0, "e": 10}

def test_the_embedded_default_and_shipped_configs_load():
    assert default_config_dict()["league"]["league_type"] == "one_vs_one"
    for path in [*sorted((ROOT / "configs").glob("*.yaml")), ROOT / "deploy" / "league.yaml"]:
        load_config(path)


def test_an_integer_too_long_to_read_is_a_config_error():
    with pytest.raises(ConfigError, match="cannot read a value"):
        parse_yaml("x: 1" + "0" * 5000 + "\n")


# -- 2. job slots -----------------------------------------------------------------------------------------------


def test_job_slots_per_player_are_bounded():
    _refused({"league": {"max_active_player_job": 10**23}}, "league.max_active_player_job",
             f"must be at most {MAX_JOBS_PER_PLAYER}, got")
    _refused({"league": {"main_player": {"max_job": MAX_JOBS_PER_PLAYER + 1}}}, "league.main_player.max_job",
             f"must be at most {MAX_JOBS_PER_PLAYER}, got")
    cfg = config_from_dict({"league": {"max_active_player_job": MAX_JOBS_PER_PLAYER}})
    assert cfg.league.job_limit("main_player") == MAX_JOBS_PER_PLAYER


def test_a_payoff_whose_decayed_games_never_reach_min_win_rate_games_is_refused():
    # With decay d a pair's decayed game count stays below 1 / (1 - d): 1 / 0.125 = 8 games never reached.
    _refused({"league": {"payoff": {"decay": 0.875, "min_win_rate_games": 8}}}, "league.payoff.min_win_rate_games",
             "must be below 1 / (1 - decay) = 8")
    config_from_dict({"league": {"payoff": {"decay": 0.9, "min_win_rate_games": 8}}})
    config_from_dict({"league": {"payoff": {"decay": 1.0, "min_win_rate_games": 1000}}})


@pytest.mark.parametrize("decay", [0.7, 0.8, 0.9, 0.95, 0.97, 0.99, 0.999, 0.9999])
def test_every_accepted_min_win_rate_games_is_reached_by_the_decayed_counts(decay):
    """In floating point the counts settle a few units in the last place below 1 / (1 - decay): with decay 0.9,
    9.999999999999995 against 10.000000000000002, so `min_win_rate_games: 10` passed and no win rate ever left the
    default (a review). The largest value accepted is reached; the limit itself is refused."""
    from league_service.config import reachable_games

    limit = 1.0 / (1.0 - decay)
    _refused({"league": {"payoff": {"decay": decay, "min_win_rate_games": limit}}},
             "league.payoff.min_win_rate_games", "never reach")
    accepted = math.nextafter(reachable_games(decay), 0.0)
    config_from_dict({"league": {"payoff": {"decay": decay, "min_win_rate_games": accepted}}})
    games, before = 0.0, -1.0
    while games != before and games < accepted:  # (as the payoff counts: decay, then one more game)
        before, games = games, games * decay + 1.0
    assert games >= accepted, (decay, games, accepted)


def test_an_elo_k_factor_that_would_overflow_the_expected_score_is_refused():
    _refused({"league": {"elo": {"k_factor": 3e5}}}, "league.elo.k_factor", f"must be within (0, {MAX_ELO_K_FACTOR:g}]")
    config_from_dict({"league": {"elo": {"k_factor": MAX_ELO_K_FACTOR}}})


# -- 3. integers the wire cannot carry ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "path"),
    [
        ({"env": {"env_num": 3_000_000_000}}, "env.env_num"),
        ({"env": {"env_num": MAX_ENV_NUM + 1}}, "env.env_num"),
        ({"env": {"env_steps": 1e23}}, "env.env_steps"),
        ({"env": {"episode_num": 1e23}}, "env.episode_num"),
        ({"env": {"episode_num": MAX_EPISODES_PER_JOB + 1}}, "env.episode_num"),  # one FinishJob reports them
    ],
)
def test_job_sizes_must_fit_their_wire_fields(data, path):
    _refused(data, path, "must be at most")


def test_job_sizes_at_their_limits_load():
    cfg = config_from_dict({"env": {"env_num": MAX_ENV_NUM, "env_steps": 2**63 - 1,
                                    "episode_num": MAX_EPISODES_PER_JOB}})
    assert cfg.env.env_num == MAX_ENV_NUM


@pytest.mark.parametrize("seed", [1e23, -1])
def test_the_learner_seed_must_be_one_torch_numpy_and_a_struct_take(seed):
    _refused({"learner": {"seed": seed}}, "learner", "learner.seed must be within [0, 2**53]")
    _refused({"learner": {"seed": MAX_SEED + 1}}, "learner.seed", "must be within ±2**53")  # (as any free-form int)


def test_the_largest_learner_seed_seeds_torch_and_numpy():
    import numpy as np
    import torch

    seed = LearnerConfig.from_mapping({"seed": float(MAX_SEED)}).seed  # as it arrives in a Struct
    assert seed == MAX_SEED
    torch.Generator().manual_seed(seed)
    np.random.default_rng(seed)


def test_free_form_integers_beyond_a_double_are_refused():
    from common.config import _plain_data

    _refused({"env": {"kwargs": {"game_params": {"rows": 10**400}}}}, "env.kwargs.game_params.rows",
             "sent as a double")
    # A job carries numbers as doubles: 2**53 + 1 arrived as 2**53, 2**64 + 1 as 2**64.
    _refused({"env": {"kwargs": {"big": 2**53 + 1}}}, "env.kwargs.big", "must be within ±2**53")
    assert _plain_data({"exact": -(2**53)}, "env.kwargs") == {"exact": -(2**53)}


def test_free_form_values_nested_deeper_than_a_worker_reads_are_refused():
    """A Struct nested 40 mappings deep loaded, then every GetJob reply failed at the worker (INTERNAL
    "Exception deserializing response")."""
    deep: dict = {}
    inner = deep
    for _ in range(40):
        inner["x"] = {}
        inner = inner["x"]
    _refused({"env": {"kwargs": {"deep": deep}}}, "env.kwargs.deep" + ".x" * 21, "nested more than 20 mappings or lists")


# -- 4. NaN and infinity, and the PPO/DQN ranges ------------------------------------------------------------------


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize(
    ("section", "path"),
    [
        ({"ppo": {"learning_rate": None}}, "policy.ppo.learning_rate"),
        ({"ppo": {"clip_coef": None}}, "policy.ppo.clip_coef"),
        ({"ppo": {"value_coef": None}}, "policy.ppo.value_coef"),
        ({"ppo": {"target_kl": None}}, "policy.ppo.target_kl"),
        ({"model": {"obs_scale": None}}, "policy.model.obs_scale"),
        ({"algorithm": "dqn", "dqn": {"learning_rate": None}}, "policy.dqn.learning_rate"),
        ({"algorithm": "dqn", "dqn": {"target_update_tau": None}}, "policy.dqn.target_update_tau"),
    ],
)
def test_non_finite_numbers_in_the_policy_are_refused_naming_the_key(section, path, bad):
    *parents, key = path.split(".")[1:]
    inner = section
    for name in parents:
        inner = inner[name]
    inner[key] = bad
    _refused({"policy": section}, path, "expected a finite number")


def test_non_finite_numbers_anywhere_in_free_form_data_are_refused():
    _refused({"env": {"kwargs": {"scores": [1.0, math.nan]}}}, "env.kwargs.scores[1]", "expected a finite number")
    _refused({"league": {"main_player": {"job": {"env_kwargs": {"x": math.inf}}}}},
             "league.main_player.job.env_kwargs.x", "expected a finite number")


def test_a_job_template_key_other_than_its_three_sections_is_refused():
    """Such keys went into JobSpec.extra, which no job carries to a worker: a typo (`forward_kwrags`) loaded and
    the actor played with none of it."""
    _refused({"league": {"main_player": {"job": {"forward_kwrags": {"eps": 0.5}}}}},
             "league.main_player.job.forward_kwrags", "a job template holds forward_kwargs, adder_kwargs, env_kwargs")


@pytest.mark.parametrize(
    ("ppo", "message"),
    [
        ({"entropy_coef": -5}, "ppo.entropy_coef must be >= 0 and finite, got -5"),
        ({"value_coef": -1}, "ppo.value_coef must be >= 0 and finite, got -1"),
        ({"target_kl": -1}, "ppo.target_kl must be > 0 and finite (or null)"),
        ({"target_kl": 0}, "ppo.target_kl must be > 0 and finite (or null)"),
    ],
)
def test_ppo_ranges_are_checked(ppo, message):
    _refused({"policy": {"ppo": ppo}}, "policy.ppo", message)


def test_the_dataclasses_refuse_nan_when_built_directly():
    """Workers build them from Structs, and a Struct carries infinity."""
    for build in (lambda: PPOConfig(learning_rate=math.nan), lambda: PPOConfig(clip_coef=math.inf),
                  lambda: PPOConfig(target_kl=math.nan), lambda: ModelConfig(obs_scale=math.nan),
                  lambda: DQNConfig(learning_rate=math.nan), lambda: DQNConfig(target_update_tau=math.nan),
                  lambda: DQNConfig(priority_alpha=math.inf)):
        with pytest.raises(ValueError, match="must be|a finite priority_alpha"):
            build()
    assert PPOConfig(target_kl=None, entropy_coef=0.0).target_kl is None


def test_active_players_of_a_type_are_bounded():
    _refused({"league": {"active_players": {"main_player": 10**9}}}, "league.active_players.main_player",
             "at most 256")


def test_active_players_in_all_are_bounded_across_categories():
    categories = [f"c{i}" for i in range(2000)]
    _refused({"league": {"player_category": categories, "pretrain_checkpoint_path": {}}}, "league.active_players",
             "at most 1024")


# -- 5. player categories -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("category", ["a/b", "", "é 😀", "x" * 300])
def test_player_categories_must_be_safe_in_player_ids(category):
    _refused({"league": {"player_category": [category], "pretrain_checkpoint_path": {category: ""}}},
             "league.player_category[0]")


@pytest.mark.parametrize("category", ["-fast", ".v2", "default"])
def test_a_category_is_checked_inside_the_ids_it_is_part_of(category):
    """`main_player_-fast_0` is a safe id (leagues with such categories ran before the check came)."""
    cfg = config_from_dict({"league": {"player_category": [category], "pretrain_checkpoint_path": {category: ""}}})
    assert list(cfg.league.player_category) == [category]


@pytest.mark.parametrize("categories", [["a", "a_0"], ["a_12", "x", "a"]])
def test_a_category_whose_ids_are_another_categorys_snapshots_is_refused(categories):
    """`a` and `a_0`: main_player_a_0 snapshotted at step 1 is main_player_a_0_1, the id of `a_0`'s second main
    player; the snapshot round failed on the taken id and the league closed (a review of the league core)."""
    clash = next(i for i, c in enumerate(categories) if "_" in c)
    _refused({"league": {"player_category": categories, "pretrain_checkpoint_path": {}}},
             f"league.player_category[{clash}]", "followed by '_' and a number")


def test_categories_that_only_look_numbered_are_fine():
    cfg = config_from_dict({"league": {"player_category": ["a_0", "b", "b_x", "a0"], "pretrain_checkpoint_path": {}}})
    assert len(cfg.league.player_category) == 4


def test_the_longest_category_still_makes_safe_player_ids():
    from common.paths import check_component

    longest = "c" * 200
    while True:  # the longest one the config takes
        try:
            cfg = config_from_dict({"league": {"player_category": [longest], "pretrain_checkpoint_path": {}}})
            break
        except ConfigError as err:
            assert err.path == "league.player_category[0]"
            longest = longest[:-1]
    for player_type, count in cfg.league.active_players.items():
        check_component(f"{active_player_id(player_type, longest, count - 1)}_{2**63 - 1}", "snapshot id")
    assert len(longest) > 100


# -- 6. addresses ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "message"),
    [
        ("127.0.0.1:99999", "the port must be from 0 to 65535, got 99999"),
        ("127.0.0.1:" + "9" * 40, "the port must be from 0 to 65535"),
        ("nonsense", "expected HOST:PORT"),
        ("host:port", "expected HOST:PORT"),
        ("::1:50051", "IPv6 host goes in brackets"),
    ],
)
def test_the_bind_address_is_checked_at_load(address, message):
    _refused({"coordinator": {"bind_address": address}}, "coordinator.bind_address", message)


def test_good_bind_addresses_load():
    for address in ("0.0.0.0:0", "[::1]:50051", "localhost:65535"):
        config_from_dict({"coordinator": {"bind_address": address}})
    assert split_host_port("[::1]:50051") == ("::1", 50051)


def test_the_coordinator_refuses_a_bad_bind_address_with_exit_2(tmp_path, capsys):
    config = tmp_path / "league.yaml"
    config.write_text("coordinator:\n  bind_address: nonsense\n")
    args = build_parser().parse_args(["coordinator", "--config", str(config), "--shared-root", str(tmp_path)])
    assert coordinator_main(args) == 2
    assert "coordinator.bind_address: expected HOST:PORT" in capsys.readouterr().err


def _status_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="league status", exit_on_error=False)
    add_status_arguments(parser)
    return parser.parse_args(argv)


def _usage_error(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["status", *argv])
    assert info.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("addr", ["127.0.0.1:99999", "127.0.0.1:0", "nonsense"])
def test_status_refuses_an_address_with_a_port_grpc_would_wrap(addr, capsys):
    assert "argument --addr" in _usage_error(["--addr", addr], capsys)


def test_status_refuses_a_bad_address_from_the_environment(monkeypatch):
    monkeypatch.setenv("LEAGUE_COORDINATOR", "127.0.0.1:99999")
    with pytest.raises(ValueError, match=r"\$LEAGUE_COORDINATOR: the port must be from 1 to 65535"):
        _status_address(_status_args([]))


def test_grpc_target_uris_are_taken_as_they_are(capsys):
    for target in ("dns:///coordinator:50051", "ipv4:127.0.0.1:50051", "unix:/run/league.sock", "dns:///coordinator"):
        assert build_parser().parse_args(["status", "--addr", target]).addr == target
    for target in ("coordinator", "dns:", "dns:///", "dns:///h:99999", "ipv4:1.2.3.4:0", "dns:a b", "h:1\n"):
        assert "argument --addr" in _usage_error(["--addr", target], capsys), target


# -- 7. status flags ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "1e300", "soon"])
def test_status_timeout_must_be_a_sane_number_of_seconds(value, capsys):
    assert "argument --timeout" in _usage_error(["--timeout", value], capsys)


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
def test_status_watch_must_be_a_finite_positive_number_of_seconds(value, capsys):
    assert "argument --watch" in _usage_error(["--watch", value], capsys)


def test_good_status_flags_parse():
    args = _status_args(["--timeout", "3600", "--watch", "0.5"])
    assert (args.timeout, args.watch) == (3600.0, 0.5)
    assert _status_args(["--watch"]).watch == 2.0


# -- 8. league run's own section ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"status_interval_s": 0}, "run.status_interval_s: must be within [0.1, 1e+07]"),
        ({"status_interval_s": -1}, "run.status_interval_s: must be within [0.1, 1e+07]"),
        ({"status_interval_s": 1e-300}, "run.status_interval_s: must be within [0.1, 1e+07]"),  # a busy loop
        ({"status_interval_s": math.inf}, "run.status_interval_s: expected a finite float"),
        # An integer beyond a float's range: math.isfinite raised OverflowError, a traceback from every command.
        ({"status_interval_s": 10**400}, "run.status_interval_s: expected a finite float, got an integer beyond"),
        ({"stop_grace_s": 10**5000}, "run.stop_grace_s: expected a finite float, got an integer beyond"),
        # Past threading.TIMEOUT_MAX the run's waits raise OverflowError.
        ({"status_interval_s": 1e10}, "run.status_interval_s: must be within [0.1, 1e+07]"),
        ({"stop_grace_s": -1}, "run.stop_grace_s: must be >= 0 and at most 1e+07"),
        ({"stop_grace_s": 1e10}, "run.stop_grace_s: must be >= 0 and at most 1e+07"),
        ({"env_num_per_actor": MAX_ENV_NUM + 1}, f"run.env_num_per_actor: must be within [0, {MAX_ENV_NUM}]"),
    ],
)
def test_run_intervals_are_checked(section, message):
    with pytest.raises(ConfigError) as info:
        from_dict(RunConfig, section, "run")
    assert str(info.value).startswith(message)
    assert from_dict(RunConfig, {"stop_grace_s": 0}, "run").stop_grace_s == 0


# -- 9. upper limits of the policy's and the learner's integers ---------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "path", "message"),
    [
        ({"ppo": {"update_epochs": 1_000_000_000}}, "policy.ppo",
         f"ppo.update_epochs must be at most {MAX_UPDATE_EPOCHS}, got 1000000000"),
        ({"ppo": {"num_minibatches": 10**12}}, "policy.ppo", "ppo.num_minibatches must be at most"),
        ({"algorithm": "dqn", "dqn": {"batch_size": 10**9}}, "policy.dqn",
         f"dqn.batch_size must be at most {MAX_DQN_BATCH_SIZE}"),
        ({"algorithm": "dqn", "dqn": {"replay_capacity": 10**12, "learning_starts": 0}}, "policy.dqn",
         f"dqn.replay_capacity must be at most {MAX_REPLAY_CAPACITY}"),
        ({"algorithm": "dqn", "dqn": {"n_step": 10**6}}, "policy.dqn", f"dqn.n_step must be at most {MAX_N_STEP}"),
        # 0.6 written as 60: the importance weights of all but the top priorities rounded to 0 (a DQN that learned
        # nothing, silently), and a priority^alpha that underflowed to 0 failed the learner.
        ({"algorithm": "dqn", "dqn": {"priority_alpha": 60}}, "policy.dqn",
         "dqn.priority_alpha must be within [0, 1] (0: uniform sampling, 1: in proportion to |TD error|), got 60"),
        # Adam's step overflowed a float32 and the optimizer failed the learner (a rate that merely diverges is
        # rolled back).
        ({"ppo": {"learning_rate": 1e38}}, "policy.ppo", "ppo.learning_rate must be at most 1e+30, got 1e+38"),
        # IMPALA's analysis of V-trace assumes c_clip <= rho_clip; a larger c_clip was accepted and trained on.
        ({"ppo": {"vtrace_c_clip": 2.0}}, "policy.ppo",
         "ppo.vtrace_c_clip (2.0) must be at most ppo.vtrace_rho_clip (1.0)"),
        ({"algorithm": "dqn", "dqn": {"learning_rate": 1e38}}, "policy.dqn", "dqn.learning_rate must be at most"),
        # Finite in float64 and infinite in the float32 networks: every collect job failed ("logp holds NaN") or
        # every update rolled back, naming no key (a review); the same for the PPO loss terms.
        ({"model": {"obs_scale": 1e39}}, "policy.model", "model.obs_scale must be at most 1000000.0, got 1e+39"),
        ({"model": {"value_bound": 1e39}}, "policy.model", "model.value_bound must be at most 1e+30, got 1e+39"),
        ({"ppo": {"reward_scale": 1e39}}, "policy.ppo", "ppo.reward_scale must be at most 1000000.0"),
        ({"ppo": {"value_coef": 1e39}}, "policy.ppo", "ppo.value_coef must be at most 1000000.0"),
        ({"ppo": {"entropy_coef": 1e39}}, "policy.ppo", "ppo.entropy_coef must be at most 1000000.0"),
        # Its priority sums overflowed: the learner crash-looped on ZeroDivisionError.
        ({"algorithm": "dqn", "dqn": {"priority_eps": 1e305}}, "policy.dqn", "dqn.priority_eps must be at most"),
        ({"model": {"hidden": [100_000_000]}}, "policy.model",
         f"model.hidden: widths must be within [1, {MAX_LAYER_WIDTH}], got (100000000,)"),
        ({"model": {"hidden": [64] * (MAX_LAYERS + 1)}}, "policy.model",
         f"model.hidden: at most {MAX_LAYERS} layers"),
        ({"model": {"conv": [[100_000_000, 3, 1]]}}, "policy.model", "model.conv: channels must be within"),
        ({"model": {"conv": [[32, 10**6, 1]]}}, "policy.model", f"kernels and strides must be within [1, {MAX_KERNEL}]"),
        ({"model": {"conv": [[32, 3, 1]] * (MAX_LAYERS + 1)}}, "policy.model",
         f"model.conv: at most {MAX_LAYERS} layers"),
        ({"model": {"recurrent": "gru", "recurrent_size": 10**6}}, "policy.model",
         f"model.recurrent_size must be within [1, {MAX_LAYER_WIDTH}]"),
        # Each layer within the limits, the model far beyond them: 8192 x 8192 weights a layer.
        ({"model": {"hidden": [MAX_LAYER_WIDTH] * 8}}, "policy.model", "model: the layers sized here hold"),
        ({"model": {"conv": [[4096, 3, 1], [4096, 5, 1]]}}, "policy.model", "model: the layers sized here hold"),
        ({"model": {"recurrent": "lstm", "recurrent_size": MAX_LAYER_WIDTH}}, "policy.model",
         "model: the layers sized here hold"),
    ],
)
def test_policy_integers_that_hang_a_learner_or_exhaust_its_memory_are_refused(policy, path, message):
    _refused({"policy": policy}, path, message)


def test_a_replay_that_never_holds_learning_starts_transitions_is_refused():
    """The learner trains once the replay holds `learning_starts` transitions, which it never does above its
    capacity: the league would run without ever training."""
    _refused({"policy": {"algorithm": "dqn", "dqn": {"replay_capacity": 500, "learning_starts": 1000}}},
             "policy.dqn", "dqn.learning_starts must be at most dqn.replay_capacity (500), got 1000")
    assert DQNConfig(replay_capacity=1000, learning_starts=1000).learning_starts == 1000


@pytest.mark.parametrize(
    ("learner", "message"),
    [
        ({"batch_size": 10**12}, f"learner.batch_size must be at most {MAX_LEARNER_BATCH_SIZE}, got 1000000000000"),
        ({"publish_every": 10**12}, f"learner.publish_every must be at most {MAX_PUBLISH_EVERY}"),
        ({"keep_last": 10**12}, f"learner.keep_last must be at most {MAX_KEEP_LAST}"),
        ({"queue_chunks": 10**12}, f"learner.queue_chunks must be at most {MAX_QUEUE_CHUNKS}"),
        ({"queue_bytes": 2**50}, f"learner.queue_bytes must be at most {MAX_QUEUE_BYTES}"),
        ({"replay_ratio": 1e30}, f"learner.replay_ratio must be a finite number in (0, {MAX_REPLAY_RATIO:g}]"),
        ({"tensorboard_every_s": -1.0}, "learner.tensorboard_every_s must be a number of seconds in [0, 1e+07]"),
        ({"tensorboard_every_s": 1e300}, "learner.tensorboard_every_s must be a number of seconds in [0, 1e+07]"),
        ({"average_decay": 1.0}, "learner.average_decay must be a number in [0, 1)"),
        ({"average_decay": -0.1}, "learner.average_decay must be a number in [0, 1)"),
    ],
)
def test_learner_integers_that_hang_a_learner_or_exhaust_its_memory_are_refused(learner, message):
    _refused({"learner": learner}, "learner", message)


def test_ppo_minibatches_must_not_outnumber_the_batchs_samples():
    """More minibatches than samples in a batch: minibatches of one sample, or none at all."""
    error = _refused({"policy": {"ppo": {"num_minibatches": 2048}}, "learner": {"batch_size": 1024}},
                     "policy.ppo.num_minibatches")
    assert "must be at most learner.batch_size (1024), got 2048" in str(error)
    config_from_dict({"policy": {"ppo": {"num_minibatches": 1024}}, "learner": {"batch_size": 1024}})
    # DQN's policy holds PPO's defaults (4 minibatches), which a DQN learner does not concern: a DQN config's
    # learner.batch_size is refused as the key DQN does not read, not as too small for PPO's minibatches.
    error = _refused({"policy": {"algorithm": "dqn"}, "learner": {"batch_size": 2}}, "learner.batch_size")
    assert "policy.dqn.batch_size" in str(error)


def test_the_largest_allowed_values_load():
    config_from_dict({
        "policy": {"model": {"hidden": [MAX_LAYER_WIDTH, 1024], "conv": [[256, 3, 1]] * 4, "recurrent": "gru",
                             "recurrent_size": 1024},
                   "ppo": {"update_epochs": MAX_UPDATE_EPOCHS, "num_minibatches": 4096}},
        "learner": {"batch_size": MAX_LEARNER_BATCH_SIZE, "publish_every": MAX_PUBLISH_EVERY,
                    "keep_last": MAX_KEEP_LAST, "queue_chunks": MAX_QUEUE_CHUNKS, "queue_bytes": MAX_QUEUE_BYTES,
                    "tensorboard_every_s": 1e7},
    })
    config_from_dict({"policy": {"algorithm": "dqn", "dqn": {
        "batch_size": MAX_DQN_BATCH_SIZE, "replay_capacity": MAX_REPLAY_CAPACITY, "n_step": MAX_N_STEP,
        "priority_alpha": 1.0}},
        "learner": {"replay_ratio": MAX_REPLAY_RATIO},
        # An n-step window ends with its row: the longest n_step needs rows at least as long.
        "league": {t: {"adder_kwargs": {"unroll_len": MAX_N_STEP}}
                   for t in ("main_player", "main_exploiter", "league_exploiter")}})


def test_the_limits_hold_for_sections_built_from_a_job_struct_too():
    """Workers build the sections from their job's Struct, without the league config's checks."""
    with pytest.raises(ValueError, match="ppo.update_epochs must be at most"):
        PPOConfig(update_epochs=MAX_UPDATE_EPOCHS + 1)
    with pytest.raises(ValueError, match="model.hidden: widths must be within"):
        ModelConfig(hidden=(MAX_LAYER_WIDTH + 1,))
    with pytest.raises(ValueError, match="learner.keep_last must be at most"):
        LearnerConfig.from_mapping({"keep_last": float(MAX_KEEP_LAST + 1)})


# -- 10. YAML tags, text, ratings, durations and paths (session 25's fuzz review) -----------------------------


@pytest.mark.parametrize("value", ["!!bool maybe", '!!int ""', '!!float ""', "!!timestamp soon", "!!set [1]"])
def test_an_explicit_yaml_tag_that_does_not_fit_its_value_is_a_config_error(tmp_path, value):
    """SafeLoader's constructors failed on these with a bare KeyError/IndexError/AttributeError (a traceback)."""
    config = tmp_path / "league.yaml"
    config.write_text(f"league:\n  max_active_player_job: {value}\n")
    expected = (r"league\.yaml: not valid YAML: expected a mapping node, but found sequence" if value == "!!set [1]"
                else r"league\.yaml: a value's explicit YAML tag .* does not fit the value")  # (the set: with its line)
    with pytest.raises(ConfigError, match=expected):
        load_config(config)


@pytest.mark.parametrize(("text", "path"), [
    ('env:\n  name: "openspiel:connect_four\\ud800"\n', "env.name"),
    ('env:\n  kwargs:\n    note: "\\udfff"\n', "env.kwargs.note"),
    ('env:\n  kwargs:\n    "k\\ud800": 1\n', "env.kwargs.k\\ud800"),
    ('league:\n  "x\\ud800": 1\n', "league.x\\ud800"),
])
def test_a_lone_surrogate_in_a_config_string_is_refused_naming_the_key(text, path):
    """A lone surrogate cannot be encoded as UTF-8: every job that carried it failed, and the run went on."""
    with pytest.raises(ConfigError) as info:
        config_from_dict(parse_yaml(text))
    assert info.value.path == path
    assert "lone surrogate" in str(info.value)
    str(info.value).encode("utf-8")  # the error itself can be printed


@pytest.mark.parametrize(("section", "path"), [
    ({"trueskill": {"sigma": 1e200}}, "league.trueskill.sigma"),  # its square is inf: NaN ratings
    ({"trueskill": {"mu": -1e10}}, "league.trueskill.mu"),
    ({"trueskill": {"beta": 1e-15}}, "league.trueskill.beta"),
    ({"trueskill": {"tau": 1e160}}, "league.trueskill.tau"),
    ({"elo": {"initial": 1e300}}, "league.elo.initial"),
    ({"payoff": {"solo_buffer_size": 2**63}}, "league.payoff.solo_buffer_size"),  # deque(maxlen=) overflowed
])
def test_rating_scales_and_the_solo_buffer_are_bounded(section, path):
    _refused({"league": section}, path)


@pytest.mark.parametrize(("section", "path"), [
    ({"lease_timeout_s": 1e10, "heartbeat_interval_s": 5.0}, "coordinator.lease_timeout_s"),
    ({"forget_workers_after_s": 1e10}, "coordinator.forget_workers_after_s"),
    ({"max_job_retry_backoff_s": 1e10}, "coordinator.max_job_retry_backoff_s"),
])
def test_coordinator_durations_past_what_a_wait_takes_are_refused(section, path):
    """A heartbeat thread waiting longer than threading.TIMEOUT_MAX died with OverflowError."""
    _refused({"coordinator": section}, path, "at most 1e+07")


@pytest.mark.parametrize("argv", [
    ["coordinator", "--shared-root", "/tmp", "--drain", "1e10"],
    ["coordinator", "--shared-root", "/tmp", "--grace", "1e10"],
    ["coordinator", "--shared-root", "/tmp", "--lease-timeout", "1e10"],
    ["learner", "--coordinator", "127.0.0.1:1", "--shared-root", "/tmp", "--stream-idle-timeout", "1e10"],
    ["actor", "--coordinator", "127.0.0.1:1", "--env-step-timeout", "1e10"],
    ["status", "--watch", "1e10"],
])
def test_duration_flags_past_what_a_wait_takes_are_usage_errors(argv, capsys):
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(argv)
    assert info.value.code == 2
    assert "must be at most 1e+07 seconds" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [
    ["run", "--run-dir", ""],
    ["coordinator", "--shared-root", ""],
    ["learner", "--coordinator", "127.0.0.1:1", "--shared-root", ""],
    ["eval", "--checkpoint", "x", "--shared-root", ""],
    ["plot", "--history", "", "--out", "x"],
])
def test_an_empty_path_flag_is_a_usage_error_not_the_current_directory(argv, capsys):
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(argv)
    assert info.value.code == 2
    assert "must not be empty" in capsys.readouterr().err


@pytest.mark.parametrize("seed", ["-1", str(2**32), "1e3"])
def test_evals_seed_is_checked_by_argparse(seed, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["eval", "--checkpoint", "x", "--seed", seed])
    assert "argument --seed" in capsys.readouterr().err


def test_a_registration_with_a_lease_past_what_a_wait_takes_is_refused():
    from common.rpc import RegistrationError, check_registration

    with pytest.raises(RegistrationError, match="lease <= 1e"):
        check_registration("127.0.0.1:1", 5.0, 1e300)
    check_registration("127.0.0.1:1", 5.0, 30.0)


def test_a_surrogate_pair_as_json_writes_it_is_the_character_it_stands_for():
    """json.dumps writes a character beyond the BMP as two escapes ("\\ud83d\\ude00"): valid JSON and YAML."""
    env = 'env:\n  name: "python:tests.env_doubles:CountingEnv"\n  kwargs:\n    note: '  # (kwargs of its own)
    cfg = config_from_dict(parse_yaml(env + '"\\ud83d\\ude00"\n'))
    assert cfg.env.kwargs["note"] == "\U0001F600"
    with pytest.raises(ConfigError, match="lone surrogate"):
        config_from_dict(parse_yaml(env + '"\\ude00\\ud83d"\n'))  # the wrong way round


def test_league_health_reports_an_unknown_argument_with_exit_1_through_the_league_command(capsys):
    from league_cli.main import main

    with pytest.raises(SystemExit) as info:
        main(["health", "--addr", "127.0.0.1:1", "--bogus"])
    assert info.value.code == 1
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:  # other commands keep argparse's usual exit 2
        main(["status", "--bogus"])
    assert info.value.code == 2


def test_an_exploration_schedule_beside_a_fixed_eps_is_refused():
    """The schedule's eps went into every job over the fixed one (`forward_kwargs.eps: 0.05` played 0.5)."""
    _refused({"league": {"main_player": {"exploration": {"start": 0.5, "end": 0.5},
                                         "forward_kwargs": {"eps": 0.05}}}},
             "league.main_player.exploration", "fixes eps too: give one of them")
    _refused({"league": {"main_player": {"exploration": {"start": 0.5, "end": 0.5},
                                         "job": {"forward_kwargs": {"eps": 0.05}}}}},
             "league.main_player.exploration", "fixes eps too")
