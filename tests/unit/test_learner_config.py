"""The learner's config section, and the policy/learner sections of the shipped league configs."""

import hashlib
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import json_format, struct_pb2

from common.algorithms.registry import make_computation_task
from common.envs import make_env
from common.envs.policy_view import policy_specs
from common.learner_config import LearnerConfig
from common.policy_config import PolicyConfig, player_seed
from league_service.config import load_config
from learner_service.config import LearnerSettings

REPO = Path(__file__).resolve().parents[2]


def _through_struct(data: dict) -> dict:
    """What a learn job's Struct turns the section into: every number a double."""
    struct = struct_pb2.Struct()
    struct.update(data)
    return json_format.MessageToDict(struct)


def test_learner_section_survives_a_struct_and_typos_name_the_field():
    cfg = LearnerConfig.from_mapping(_through_struct({"batch_size": 256, "publish_every": 2, "seed": 7}))
    assert cfg.batch_size == 256 and isinstance(cfg.batch_size, int)
    assert cfg.publish_every == 2 and cfg.seed == 7
    assert LearnerConfig.from_mapping(None) == LearnerConfig()
    with pytest.raises(ValueError, match=r"learner: unknown field\(s\) \['bach_size'\]"):
        LearnerConfig.from_mapping({"bach_size": 1})
    with pytest.raises(ValueError, match="learner.batch_size"):
        LearnerConfig.from_mapping({"batch_size": 0})
    with pytest.raises(ValueError, match="learner.batch_size: expected an integer"):
        LearnerConfig.from_mapping({"batch_size": 12.5})
    with pytest.raises(ValueError, match="learner.replay_ratio"):
        LearnerConfig(replay_ratio=0)


def test_a_policy_section_given_as_null_is_refused_not_read_as_its_defaults():
    """A job's policy without a section takes that section's defaults; a section sent as null is an empty one
    in the user's file (its keys commented out), which used to swap the configured network for the bare
    defaults on every actor and learner."""
    assert PolicyConfig.from_mapping(None) == PolicyConfig()
    for algorithm, section in (("ppo", "model"), ("ppo", "ppo"), ("dqn", "dqn")):
        with pytest.raises(ValueError, match=rf"^policy\.{section}: expected a mapping, got null \(an empty section"):
            PolicyConfig.from_mapping(_through_struct({"algorithm": algorithm, section: None}))


def test_publish_period_defaults_by_algorithm_unless_given():
    """A DQN iteration is one gradient step: publishing each one (the old default for every algorithm) meant
    ~100 checkpoints, UpdatePlayer calls and actor reloads a second."""
    default = LearnerConfig.from_mapping(None)
    assert default.publish_every is None
    assert default.publish_period("ppo") == 1 and default.publish_period("dqn") == 100
    given = LearnerConfig.from_mapping(_through_struct({"publish_every": 3}))
    assert given.publish_period("ppo") == 3 and given.publish_period("dqn") == 3
    with pytest.raises(ValueError, match="learner.publish_every must be >= 1"):
        LearnerConfig.from_mapping({"publish_every": 0})


def test_player_seed_is_stable_across_processes():
    # The documented formula (actors that initialise a player without a checkpoint use it too), not hash().
    assert player_seed("a") == int.from_bytes(hashlib.sha256(b"a").digest()[:4], "little") == 310482890
    assert player_seed("a") != player_seed("b")
    assert 0 <= player_seed("x" * 200) < 2**32


def test_settings_check_their_fields():
    with pytest.raises(ValueError, match="coordinator"):
        LearnerSettings(coordinator="", shared_root=Path("."), worker_id="w")
    with pytest.raises(ValueError, match="device"):
        LearnerSettings(coordinator="h:1", shared_root=Path("."), worker_id="w", device="tpu")
    with pytest.raises(ValueError, match="port"):
        LearnerSettings(coordinator="h:1", shared_root=Path("."), worker_id="w", port=70000)
    with pytest.raises(ValueError, match="^--tls-cert and --tls-key go together"):  # the flags, as the CLI says
        LearnerSettings(coordinator="h:1", shared_root=Path("."), worker_id="w", tls_cert=Path("c.pem"))
    # Actors reach learners with the CA they use for the coordinator: TLS to the coordinator means TLS here.
    with pytest.raises(ValueError, match="^--tls-cert: .*--tls-cert/--tls-key"):
        LearnerSettings(coordinator="h:1", shared_root=Path("."), worker_id="w", tls_ca=Path("ca.pem"))
    LearnerSettings(coordinator="h:1", shared_root=Path("."), worker_id="w", tls_ca=Path("ca.pem"),
                    tls_cert=Path("c.pem"), tls_key=Path("k.pem"))
    # ... and the reverse: a learner over TLS beside a plaintext coordinator bound its player, and no actor (with
    # no CA, as the coordinator needs none) could ever stream to it.
    with pytest.raises(ValueError, match="^--tls-ca: this learner serves trajectories over TLS"):
        LearnerSettings(coordinator="h:1", shared_root=Path("."), worker_id="w", tls_cert=Path("c.pem"),
                        tls_key=Path("k.pem"))


def test_default_league_policy_and_learner_sections_build_a_connect_four_model():
    cfg = load_config(None)
    policy = PolicyConfig.from_mapping(_through_struct(cfg.policy))
    learner = LearnerConfig.from_mapping(_through_struct(cfg.learner))
    assert policy.algorithm == "ppo" and policy.model.conv == ((32, 3, 1), (32, 3, 1))
    assert policy.model.conv_padding == "same" and policy.model.activation == "relu"
    assert learner.batch_size >= 1
    env = make_env(cfg.env.name, **cfg.env.kwargs)
    obs_specs, action_spec = policy_specs(env.info())
    env.close()
    task = make_computation_task(policy, obs_specs, action_spec, device="cpu", seed=0)
    board = {"observation": np.zeros((2, *obs_specs["observation"].shape), np.float32), "action_mask": np.ones((2, 7), bool)}
    assert task.predict(board).actions["action"].shape == (2,)


def test_solo_cartpole_config_is_a_solo_ppo_league():
    cfg = load_config(REPO / "configs" / "solo_cartpole.yaml")
    assert cfg.league.league_type == "solo"
    assert cfg.league.active_players == {"solo_active_player": 1}
    assert cfg.env.name == "CartPole-v1" and cfg.env.env_num == 8
    policy = PolicyConfig.from_mapping(_through_struct(cfg.policy))
    learner = LearnerConfig.from_mapping(_through_struct(cfg.learner))
    assert policy.algorithm == "ppo" and policy.ppo.update_epochs == 20 and policy.ppo.gamma == 0.98
    assert learner.batch_size == cfg.env.env_num * cfg.league.solo_active_player.adder_kwargs["unroll_len"]
    env = make_env(cfg.env.name)
    obs_specs, action_spec = policy_specs(env.info())
    env.close()
    task = make_computation_task(policy, obs_specs, action_spec, device="cpu", seed=0)
    assert task.predict({"observation": np.zeros((3, 4), np.float32)}).actions["action"].shape == (3,)
