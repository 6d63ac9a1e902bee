"""The play settings a checkpoint records (`play_metadata`) and a reader's config with them (`as_published`)."""

from common.policy_config import PolicyConfig, as_published, play_metadata


def test_a_null_activation_is_recorded_as_the_model_resolves_it():
    assert play_metadata(PolicyConfig.from_mapping({"algorithm": "ppo"}))["model.activation"] == "tanh"
    assert play_metadata(PolicyConfig.from_mapping({"algorithm": "dqn"}))["model.activation"] == "relu"
    recorded = play_metadata(PolicyConfig.from_mapping({"model": {"obs_scale": 0.5, "value_bound": 1.0}}))
    assert recorded == {"model.activation": "tanh", "model.obs_scale": 0.5, "model.value_bound": 1.0,
                        "model.obs_norm_clip": 10.0}


def test_a_readers_config_takes_the_recorded_settings_and_names_those_that_differ():
    config = {"algorithm": "ppo", "model": {"hidden": [8]}}
    recorded = play_metadata(PolicyConfig.from_mapping({"model": {"activation": "relu", "obs_scale": 0.5}}))
    published, changed = as_published(config, {"agent_steps": 3, **recorded})
    assert published == {"algorithm": "ppo", "model": {"hidden": [8], "activation": "relu", "obs_scale": 0.5}}
    assert changed == ["activation: tanh -> relu", "obs_scale: 1.0 -> 0.5"]
    assert config == {"algorithm": "ppo", "model": {"hidden": [8]}}  # untouched
    # Nothing recorded (published before this), the same settings, or a value no config may have: the config's.
    assert as_published(config, {"agent_steps": 3}) == (config, [])
    assert as_published(config, play_metadata(PolicyConfig.from_mapping(config))) == (config, [])
    assert as_published(config, {"model.obs_scale": -1.0}) == (config, [])
