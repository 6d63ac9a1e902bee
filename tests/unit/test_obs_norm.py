"""`policy.model.obs_norm`: running observation statistics the learner updates and the weights carry."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from common.algorithms.models import RunningNorm
from common.algorithms.registry import make_computation_task
from common.computation.specs import TensorSpec
from common.policy_config import ModelConfig, PolicyConfig
from league_service.league_identity import LeagueIdentity

OBS = {"observation": TensorSpec("observation", (2,))}


def test_running_norm_keeps_the_mean_and_variance_of_everything_it_was_given():
    norm = RunningNorm((2,), clip=10.0)
    x = torch.ones(3, 2) * 7
    assert torch.equal(norm(x), x)  # before any update: the identity
    rng = np.random.default_rng(0)
    batches = [rng.normal([5.0, -300.0], [2.0, 40.0], size=(n, 2)) for n in (1, 7, 300, 64)]
    for batch in batches:
        norm.update(torch.as_tensor(batch, dtype=torch.float32))
    everything = np.concatenate(batches)
    assert norm.count.item() == len(everything)
    assert np.allclose(norm.mean.numpy(), everything.mean(0), rtol=1e-5)
    assert np.allclose(norm.var.numpy(), everything.var(0), rtol=1e-4)
    standardised = norm(torch.tensor([[5.0, -300.0], [1e6, -1e6]]))
    assert standardised[0].abs().max() < 0.2 and standardised[1].tolist() == [10.0, -10.0]  # clipped


def _batch(obs: np.ndarray, actions: np.ndarray, rewards: np.ndarray, logp: np.ndarray, truncated=None) -> dict:
    rows, steps = rewards.shape
    return {"observation": obs, "next_observation": obs[:, -1], "action": actions, "reward": rewards,
            "terminated": np.ones((rows, steps), bool),
            "truncated": np.zeros((rows, steps), bool) if truncated is None else truncated,
            "behaviour_logp": logp}


def test_the_learner_updates_the_statistics_from_valid_steps_and_the_weights_carry_them():
    task = make_computation_task({"algorithm": "ppo", "model": {"hidden": [8], "obs_norm": True}}, OBS, 2,
                                 device="cpu", seed=0)
    obs = np.full((2, 4, 2), 3.0, np.float32)
    obs[0, 0] = 1e4  # front padding of a row: a step truncated inside it, which is no data
    truncated = np.zeros((2, 4), bool)
    truncated[0, 0] = True
    task.learn(_batch(obs, np.zeros((2, 4), np.int64), np.zeros((2, 4), np.float32),
                      np.full((2, 4), -0.69, np.float32), truncated))
    weights = task.get_weights()
    for torso in ("actor_torso", "critic_torso"):
        assert weights[f"{torso}.obs_norm.count"] == 7 and np.allclose(weights[f"{torso}.obs_norm.mean"], 3.0)
    fresh = make_computation_task({"algorithm": "ppo", "model": {"hidden": [8], "obs_norm": True}}, OBS, 2,
                                  device="cpu", seed=0)
    probe = {"observation": np.array([[3.0, 3.5]], np.float32)}
    fresh.set_weights(weights, 1)
    greedy = {"greedy": True}
    assert np.array_equal(fresh.predict(probe, forward_kwargs=greedy).artifacts["value"],
                          task.predict(probe, forward_kwargs=greedy).artifacts["value"])
    plain = make_computation_task({"algorithm": "ppo", "model": {"hidden": [8]}}, OBS, 2, device="cpu", seed=0)
    assert not any("obs_norm" in name for name in plain.get_weights())  # no buffers without it


def test_a_policy_learns_on_standardised_observations_of_a_large_offset():
    """The sign to copy hides in observations of 5,000 +- 1,000 (standardised: +-1); the statistics the learner
    keeps are the ones acting uses."""
    task = make_computation_task({"algorithm": "ppo", "model": {"hidden": [16], "obs_norm": True},
                                  "ppo": {"learning_rate": 0.01, "entropy_coef": 0.0, "gamma": 0.0}}, OBS, 2,
                                 device="cpu", seed=0)
    rng = np.random.default_rng(0)
    for _ in range(20):
        sign = rng.integers(2, size=(16, 8))
        obs = np.stack([5000.0 + 1000.0 * (2 * sign - 1), np.full((16, 8), 5000.0)], -1).astype(np.float32)
        pred = task.predict({"observation": obs.reshape(-1, 2)})
        actions = pred.actions["action"].reshape(16, 8)
        task.learn(_batch(obs, actions, (actions == sign).astype(np.float32), pred.artifacts["logp"].reshape(16, 8)))
    probe = np.array([[4000.0, 5000.0], [6000.0, 5000.0]], np.float32)
    assert task.predict({"observation": probe}, forward_kwargs={"greedy": True}).actions["action"].tolist() == [0, 1]
    mean = task.get_weights()["actor_torso.obs_norm.mean"]
    assert abs(mean[0] - 5000.0) < 100 and mean[1] == 5000.0


def test_obs_norm_is_ppo_only_and_its_clip_positive():
    with pytest.raises(ValueError, match="obs_norm: PPO only"):
        PolicyConfig.from_mapping({"algorithm": "dqn", "model": {"obs_norm": True}})
    with pytest.raises(ValueError, match="obs_norm_clip must be a finite number > 0"):
        ModelConfig(obs_norm_clip=0.0)


def test_a_league_saved_before_obs_norm_existed_resumes_and_a_changed_setting_is_named():
    saved = LeagueIdentity("CartPole-v1", "ppo", {"hidden": [64, 64], "conv": [], "conv_padding": "valid",
                                                  "shared_torso": False, "recurrent": None, "recurrent_size": 64})
    same = LeagueIdentity("CartPole-v1", "ppo", {**saved.model, "obs_norm": False})
    assert saved.first_change(same) is None
    normalised = LeagueIdentity("CartPole-v1", "ppo", {**saved.model, "obs_norm": True})
    assert saved.first_change(normalised) == ("policy.model.obs_norm", False, True)


def test_a_checkpoint_of_another_obs_scale_is_carried_into_the_configs_and_computes_what_it_did(tmp_path):
    """The statistics are of observations after obs_scale: a learner resumed with obs_scale changed (the README
    allows it) standardised every entry against a mean and spread in the old units, pinning most at the clip, and
    trained on that (a review). Carried over, the network computes what it did; the learner's start, a reset and a
    roll-back load them so (CheckpointPublisher.choose_start's metadata, load_for)."""
    from common.checkpoint_store import CheckpointStore
    from common.policy_config import obs_norm_in_scale
    from learner_service.publisher import CheckpointPublisher
    from learner_service.trainer import Progress

    def task(scale):
        return make_computation_task({"algorithm": "ppo", "model": {"hidden": [8], "obs_norm": True,
                                                                    "obs_scale": scale}}, OBS, 2, device="cpu", seed=0)

    old = task(1.0)
    rng = np.random.default_rng(0)
    obs = np.stack([rng.normal(101.6, 1.3, 64), np.full(64, 5.0)], -1).astype(np.float32).reshape(8, 8, 2)
    old.learn(_batch(obs, np.zeros((8, 8), np.int64), np.zeros((8, 8), np.float32), np.full((8, 8), -0.69,
                                                                                             np.float32)))
    store = CheckpointStore(tmp_path)
    store.publish("p", old.get_weights(), 1, metadata={"model.obs_scale": 1.0})
    new_policy = PolicyConfig.from_mapping({"algorithm": "ppo", "model": {"hidden": [8], "obs_norm": True,
                                                                          "obs_scale": 0.01}})
    start = CheckpointPublisher(store, "p", "w").choose_start("", 0, Progress())
    carried, factor = obs_norm_in_scale(start.weights, start.metadata, new_policy)
    assert factor == pytest.approx(0.01)
    probe = {"observation": obs[0, :3]}
    greedy = {"greedy": True}
    before = old.predict(probe, forward_kwargs=greedy).artifacts
    for weights, same in ((carried, True), (start.weights, False)):
        new = task(0.01)
        new.set_weights(weights, 2)
        after = new.predict(probe, forward_kwargs=greedy).artifacts
        assert np.allclose(after["value"], before["value"], atol=1e-4) == same, (after["value"], before["value"])
    loaded = CheckpointPublisher(store, "p", "w").load_for("p/v0000000001.pt", new_policy)
    assert all(np.array_equal(loaded[k], carried[k]) for k in carried)
    # Nothing to carry: the same scale, no obs_norm, nothing recorded.
    assert obs_norm_in_scale(start.weights, {"model.obs_scale": 0.01}, new_policy)[1] is None
    assert obs_norm_in_scale(start.weights, {}, new_policy)[1] is None
