"""PPO: targets (GAE, V-trace, truncation), legal-action masks, exploration, and learning CartPole in-process."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from common.algorithms import batch_from_trajectory, compute_targets, make_computation_task
from common.computation import ComputationTask, TensorSpec, specs_from_gym
from common.trajectory import AgentStep, Trajectory, TrajectoryBuilder

GAMMA, LAM = 0.9, 0.8


def reference_gae(values, bootstrap, rewards, terminated, truncated, gamma, lam):
    """Straightforward per-row GAE following common/trajectory.py's bootstrapping rules."""
    batch, steps = rewards.shape
    adv = np.zeros((batch, steps))
    valid = np.ones((batch, steps), bool)
    for b in range(batch):
        running = 0.0
        for t in reversed(range(steps)):
            if truncated[b, t] and t < steps - 1:
                valid[b, t] = False
                running = 0.0
                continue
            next_value = bootstrap[b] if t == steps - 1 else values[b, t + 1]
            if terminated[b, t]:
                next_value = 0.0
            delta = rewards[b, t] + gamma * next_value - values[b, t]
            ended = terminated[b, t] or truncated[b, t]
            running = delta + (0.0 if ended else gamma * lam * running)
            adv[b, t] = running
    return adv, valid


def t(x, dtype=torch.float64):
    return torch.as_tensor(np.asarray(x), dtype=dtype)


def random_segments(seed, batch=5, steps=9):
    rng = np.random.default_rng(seed)
    return dict(
        values=rng.normal(size=(batch, steps)),
        bootstrap=rng.normal(size=batch),
        rewards=rng.normal(size=(batch, steps)),
        terminated=rng.random((batch, steps)) < 0.15,
        truncated=rng.random((batch, steps)) < 0.15,
    )


@pytest.mark.parametrize("seed", range(5))
def test_gae_matches_reference_with_terminals_and_truncations(seed):
    d = random_segments(seed)
    d["truncated"] &= ~d["terminated"]
    targets = compute_targets(t(d["values"]), t(d["bootstrap"]), t(d["rewards"]), t(d["terminated"], torch.bool),
                              t(d["truncated"], torch.bool), GAMMA, LAM)
    adv, valid = reference_gae(**d, gamma=GAMMA, lam=LAM)
    np.testing.assert_array_equal(targets.valid.numpy(), valid)
    np.testing.assert_allclose(targets.advantages.numpy()[valid], adv[valid], rtol=1e-10)
    np.testing.assert_allclose(targets.returns.numpy()[valid], (adv + d["values"])[valid], rtol=1e-10)


def test_truncation_bootstraps_but_termination_does_not():
    values = t([[0.0, 0.0]])
    bootstrap = t([10.0])
    rewards = t([[1.0, 1.0]])
    no = t([[False, False]], torch.bool)
    end = t([[False, True]], torch.bool)
    truncated = compute_targets(values, bootstrap, rewards, no, end, 1.0, 1.0)
    terminated = compute_targets(values, bootstrap, rewards, end, no, 1.0, 1.0)
    assert truncated.returns.tolist() == [[12.0, 11.0]]  # bootstraps V(final obs) = 10
    assert terminated.returns.tolist() == [[2.0, 1.0]]
    # Mid-row truncation: step 0 is dropped; the reset observation's value at step 1 never leaks into it.
    mid = compute_targets(t([[0.0, 5.0, 0.0]]), t([0.0]), t([[1.0, 1.0, 1.0]]), t([[False] * 3], torch.bool),
                          t([[True, False, False]], torch.bool), 1.0, 1.0)
    assert mid.valid.tolist() == [[False, True, True]]
    # And an earlier step bootstraps from the last known observation of its episode.
    before = compute_targets(t([[0.0, 3.0, 7.0]]), t([0.0]), t([[1.0, 1.0, 1.0]]), t([[False] * 3], torch.bool),
                             t([[False, True, False]], torch.bool), 1.0, 1.0)
    assert before.valid.tolist() == [[True, False, True]]
    assert before.returns[0, 0].item() == 1.0 + 3.0


def test_vtrace_on_policy_gives_gae_value_targets():
    d = random_segments(7)
    d["truncated"] &= ~d["terminated"]
    args = (t(d["values"]), t(d["bootstrap"]), t(d["rewards"]), t(d["terminated"], torch.bool),
            t(d["truncated"], torch.bool), GAMMA, LAM)
    gae = compute_targets(*args)
    vtrace = compute_targets(*args, log_ratio=torch.zeros_like(args[0]))
    np.testing.assert_allclose(vtrace.returns.numpy(), gae.returns.numpy(), rtol=1e-10)
    assert torch.all(vtrace.rho == 1.0)


def test_vtrace_clips_importance_weights():
    values, bootstrap = t([[0.0, 0.0]]), t([0.0])
    rewards = t([[1.0, 1.0]])
    no = t([[False, False]], torch.bool)
    log_ratio = torch.log(t([[4.0, 0.25]]))
    targets = compute_targets(values, bootstrap, rewards, no, no, 1.0, 1.0, log_ratio=log_ratio, rho_clip=1.0,
                              c_clip=1.0)
    assert targets.rho.tolist() == [[1.0, 0.25]]
    # v_1 = V + rho_1 * delta_1 = 0.25; v_0 = V + rho_0 * delta_0 + c_0 * (v_1 - V_1) = 1 + 0.25.
    assert targets.returns.tolist() == [[1.25, 0.25]]
    assert targets.advantages.tolist() == [[1.25, 0.25]]



def reference_vtrace(values, bootstrap, rewards, terminated, truncated, log_ratio, gamma, lam, rho_clip, c_clip):
    """IMPALA's V-trace per row, step by step (v_s - V(x_s) = rho_s delta_s + gamma c_s (v_{s+1} - V(x_{s+1})),
    policy advantage rho_s (r_s + gamma v_{s+1} - V(x_s))), under common/trajectory.py's bootstrapping rules."""
    batch, steps = rewards.shape
    ratio = np.exp(log_ratio)
    rho, c = np.minimum(ratio, rho_clip), lam * np.minimum(ratio, c_clip)
    returns, adv = values.copy(), np.zeros((batch, steps))
    valid = ~(truncated & (np.arange(steps) < steps - 1))
    for b in range(batch):
        later = 0.0  # v_{s+1} - V(x_{s+1}) of the same episode (0 past its end)
        for t in reversed(range(steps)):
            if not valid[b, t]:
                later = 0.0
                continue
            next_value = bootstrap[b] if t == steps - 1 else values[b, t + 1]
            if terminated[b, t]:
                next_value = 0.0
            delta = rewards[b, t] + gamma * next_value - values[b, t]
            ended = terminated[b, t] or truncated[b, t]
            diff = rho[b, t] * delta + (0.0 if ended else gamma * c[b, t] * later)
            returns[b, t] = values[b, t] + diff
            later = diff
        for t in range(steps):
            if valid[b, t]:
                next_return = bootstrap[b] if t == steps - 1 else returns[b, t + 1]
                if terminated[b, t]:
                    next_return = 0.0
                adv[b, t] = rho[b, t] * (rewards[b, t] + gamma * next_return - values[b, t])
    return returns, adv, valid


@pytest.mark.parametrize("seed", range(3))
def test_vtrace_matches_reference_with_terminals_truncations_and_separate_clips(seed):
    d = random_segments(seed)
    d["truncated"] &= ~d["terminated"]
    log_ratio = np.random.default_rng(100 + seed).normal(scale=0.8, size=d["values"].shape)
    targets = compute_targets(t(d["values"]), t(d["bootstrap"]), t(d["rewards"]), t(d["terminated"], torch.bool),
                              t(d["truncated"], torch.bool), GAMMA, LAM, log_ratio=t(log_ratio), rho_clip=1.3,
                              c_clip=0.7)
    returns, adv, valid = reference_vtrace(**d, log_ratio=log_ratio, gamma=GAMMA, lam=LAM, rho_clip=1.3, c_clip=0.7)
    np.testing.assert_array_equal(targets.valid.numpy(), valid)
    np.testing.assert_allclose(targets.returns.numpy()[valid], returns[valid], rtol=1e-10)
    np.testing.assert_allclose(targets.advantages.numpy()[valid], adv[valid], rtol=1e-10, atol=1e-12)


def test_the_value_loss_is_clipped_pessimistically():
    from common.algorithms.ppo import _value_loss
    from common.policy_config import PPOConfig

    # The new value moved from 0 to 1.9 towards a return of 2: clipped to 0.2, the larger error (1.8^2) counts.
    new, old, returns = t([1.9]), t([0.0]), t([2.0])
    assert _value_loss(new, old, returns, PPOConfig(clip_coef=0.2)).item() == pytest.approx(0.5 * 1.8**2)
    assert _value_loss(new, old, returns, PPOConfig(clip_coef=0.2, clip_value_loss=False)).item() == pytest.approx(
        0.5 * 0.1**2)


# ---- acting with masks -------------------------------------------------------------------------------------
def board_task(**ppo) -> ComputationTask:
    obs = {"observation": TensorSpec("observation", (5,)), "action_mask": TensorSpec("action_mask", (6,), "bool")}
    return make_computation_task({"algorithm": "ppo", "ppo": ppo}, obs, 6, device="cpu", seed=0)


def test_masked_actions_are_never_chosen_and_have_zero_probability():
    task = board_task()
    rng = np.random.default_rng(0)
    mask = rng.random((256, 6)) < 0.4
    mask[np.arange(256), rng.integers(0, 6, 256)] = True
    observation = rng.normal(size=(256, 5)).astype(np.float32)
    for forward_kwargs in ({}, {"eps": 0.5}, {"eps": 1.0}, {"greedy": True}):
        prediction = task.predict({"observation": observation, "action_mask": mask}, forward_kwargs=forward_kwargs)
        actions = prediction.actions["action"]
        assert mask[np.arange(256), actions].all(), forward_kwargs
        assert np.isfinite(prediction.artifacts["logp"]).all()
    logits, _ = task.algorithm.model({"observation": torch.as_tensor(observation),
                                      "action_mask": torch.as_tensor(mask)})
    probs = torch.softmax(logits, dim=-1).detach().numpy()
    assert (probs[~mask] == 0).all()
    np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-5)


def test_epsilon_mixture_logp_and_rows_without_legal_actions():
    task = board_task()
    mask = np.zeros((2, 6), bool)
    mask[0, :2] = True
    mask[1, :] = True
    prediction = task.predict({"observation": np.zeros((2, 5), np.float32), "action_mask": mask},
                              forward_kwargs={"eps": 1.0})
    np.testing.assert_allclose(prediction.artifacts["logp"], np.log([1 / 2, 1 / 6]), rtol=1e-5)
    mask[1, :] = False
    with pytest.raises(ValueError, match=r"row\(s\) \[1\] have no legal action"):
        task.predict({"observation": np.zeros((2, 5), np.float32), "action_mask": mask})


def test_sampling_follows_the_policy_and_is_seeded():
    task = board_task()
    observation = np.zeros((4000, 5), np.float32)
    first = task.predict({"observation": observation, "action_mask": np.ones((4000, 6), bool)})
    logp = first.artifacts["logp"][0]
    freq = np.bincount(first.actions["action"], minlength=6) / 4000
    np.testing.assert_allclose(freq, np.exp(logp), atol=0.03)  # near-uniform initial policy
    again = board_task().predict({"observation": observation, "action_mask": np.ones((4000, 6), bool)})
    np.testing.assert_array_equal(first.actions["action"], again.actions["action"])


def test_batch_needs_behaviour_logp_and_consistent_segments():
    task = board_task()
    traj = Trajectory({
        "/observations/observation": np.zeros((2, 3, 5), np.float32),
        "/observations/action_mask": np.ones((2, 3, 6), bool),
        "/next_observations/observation": np.zeros((2, 5), np.float32),
        "/next_observations/action_mask": np.ones((2, 6), bool),
        "/rewards": np.ones((2, 3), np.float32),
        "/terminals": np.zeros((2, 3), bool),
        "/truncations": np.zeros((2, 3), bool),
        "/agents/agent/actions": np.zeros((2, 3), np.int64),
    })
    with pytest.raises(ValueError, match="artifacts/logp"):
        batch_from_trajectory(traj)
    batch = batch_from_trajectory(Trajectory({**traj.tensors, "/agents/agent/artifacts/logp":
                                              np.full((2, 3), np.log(1 / 6), np.float32)}))
    result = task.learn(batch)
    assert np.isfinite(list(result.stats.values())).all()
    assert result.stats["samples"] == 6 and result.version == 1
    with pytest.raises(ValueError, match="reward"):
        task.learn({**batch, "reward": np.ones((2, 4), np.float32)})


def test_illegal_actions_get_no_gradient_towards_them():
    task = board_task(entropy_coef=0.5)
    mask = np.zeros((1, 3, 6), bool)
    mask[..., :2] = True
    batch = {
        "observation": np.ones((1, 3, 5), np.float32), "action_mask": mask,
        "next_observation": np.ones((1, 5), np.float32), "next_action_mask": mask[:, 0],
        "action": np.zeros((1, 3), np.int64), "reward": np.ones((1, 3), np.float32),
        "terminated": np.zeros((1, 3), bool), "truncated": np.zeros((1, 3), bool),
        "behaviour_logp": np.full((1, 3), np.log(0.5), np.float32),
    }
    for _ in range(3):
        stats = task.learn(batch).stats
        assert np.isfinite(list(stats.values())).all()
    logits, _ = task.algorithm.model({"observation": torch.ones(1, 5), "action_mask": torch.as_tensor(mask[:, 0])})
    assert (torch.softmax(logits, -1)[0, 2:] == 0).all()



def _board_batch(behaviour_prob: float = 0.5) -> dict[str, np.ndarray]:
    mask = np.zeros((2, 3, 6), bool)
    mask[..., :2] = True
    return {
        "observation": np.ones((2, 3, 5), np.float32), "action_mask": mask,
        "next_observation": np.ones((2, 5), np.float32), "next_action_mask": mask[:, 0],
        "action": np.zeros((2, 3), np.int64), "reward": np.ones((2, 3), np.float32),
        "terminated": np.zeros((2, 3), bool), "truncated": np.zeros((2, 3), bool),
        "behaviour_logp": np.full((2, 3), np.log(behaviour_prob), np.float32),
    }


def _adam_steps(task: ComputationTask) -> int:
    return max(int(state["step"]) for state in task.algorithm.optimizer.state.values())


def test_the_learning_rate_anneals_to_zero_and_stays_there():
    task = board_task(learning_rate=0.01, anneal_lr_updates=2)
    rates = [task.learn(_board_batch()).stats["learning_rate"] for _ in range(4)]
    assert rates == pytest.approx([0.01, 0.005, 0.0, 0.0])  # never negative: that would climb the loss


def test_target_kl_stops_the_epochs_early():
    batch = _board_batch()
    for target_kl, steps in ((1e-12, 2), (None, 3 * 2)):
        task = board_task(learning_rate=0.05, update_epochs=3, num_minibatches=2, target_kl=target_kl)
        task.learn(batch)
        assert _adam_steps(task) == steps, target_kl


def test_vtrace_clips_the_ratio_against_the_policy_at_the_update_start_not_the_stale_one():
    """Stale data (behaviour prob 0.01, the policy's about 0.5): with V-trace the clipped ratio starts at 1 (the
    staleness is in rho), so nothing is clipped in the first step; plain PPO clips every sample against mu."""
    batch = _board_batch(behaviour_prob=0.01)
    for correction, clipped in (("vtrace", 0.0), ("none", 1.0)):
        task = board_task(off_policy_correction=correction, update_epochs=1, num_minibatches=1)
        stats = task.learn(batch).stats
        assert stats["clip_fraction"] == clipped, correction
    assert stats["behaviour_ratio"] == pytest.approx(50.0, rel=0.1)


# ---- learning CartPole in-process ---------------------------------------------------------------------------
CARTPOLE_PPO = {
    "algorithm": "ppo",
    "ppo": {"learning_rate": 1e-3, "anneal_lr_updates": 300, "gamma": 0.98, "gae_lambda": 0.8, "update_epochs": 20,
            "num_minibatches": 1, "entropy_coef": 0.0},
}


class CartPoleRunner:
    """Vector CartPole driving a task through the trajectory format, as an actor + learner would."""

    def __init__(self, task: ComputationTask, num_envs: int = 8, unroll: int = 32, seed: int = 0) -> None:
        self.envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(num_envs)],
                                             autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
        self.task = task
        self.builder = TrajectoryBuilder(num_envs, unroll)
        self.obs, _ = self.envs.reset(seed=seed)
        self.episode_returns = np.zeros(num_envs)
        self.finished: list[float] = []
        self.steps = 0

    def segment(self, actor: ComputationTask | None = None) -> Trajectory:
        actor = actor or self.task
        while True:
            prediction = actor.predict({"observation": self.obs})
            action = prediction.actions["action"]
            obs, reward, terminated, truncated, info = self.envs.step(action)
            self.builder.add(self.obs, {"agent": AgentStep(action, prediction.artifacts)}, reward, terminated,
                             truncated)
            self.steps += len(action)
            self.episode_returns += reward
            done = terminated | truncated
            for i in np.flatnonzero(done):
                self.finished.append(self.episode_returns[i])
                self.episode_returns[i] = 0.0
            self.obs = obs
            if self.builder.full:
                next_obs = obs.copy()
                for i in np.flatnonzero(done):  # the episode's final observation, for bootstrapping
                    next_obs[i] = info["final_obs"][i]
                return self.builder.build(next_obs)

    def close(self) -> None:
        self.envs.close()


def evaluate(task: ComputationTask, episodes: int = 10, seed: int = 1000) -> float:
    env = gym.make("CartPole-v1")
    returns = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        total, done = 0.0, False
        while not done:
            action = task.predict({"observation": obs[None]}, forward_kwargs={"greedy": True}).actions["action"][0]
            obs, reward, terminated, truncated, _ = env.step(int(action))
            total += reward
            done = terminated or truncated
        returns.append(total)
    env.close()
    return float(np.mean(returns))


@pytest.fixture
def cartpole():
    envs = gym.make("CartPole-v1")
    obs_spec, action_spec = specs_from_gym(envs.observation_space, envs.action_space)
    envs.close()
    return obs_spec, action_spec


def test_ppo_smoke_improves_on_cartpole_in_seconds(cartpole):
    task = make_computation_task(CARTPOLE_PPO, *cartpole, device="cpu", seed=0)
    runner = CartPoleRunner(task)
    try:
        first_losses = []
        for update in range(24):  # ~6k env steps, a couple of seconds
            result = task.learn(batch_from_trajectory(runner.segment()))
            if update < 3:
                first_losses.append(result.stats["value_loss"])
        early = np.mean(runner.finished[:20])
        late = np.mean(runner.finished[-20:])
    finally:
        runner.close()
    assert late > early * 1.5, (early, late)
    assert task.version == 24


@pytest.mark.slow
@pytest.mark.parametrize("correction", ["vtrace", "none"])
def test_ppo_solves_cartpole(cartpole, correction):
    config = {**CARTPOLE_PPO, "ppo": {**CARTPOLE_PPO["ppo"], "off_policy_correction": correction}}
    task = make_computation_task(config, *cartpole, device="cpu", seed=0)
    runner = CartPoleRunner(task)
    best = 0.0
    try:
        while runner.steps < 150_000 and best < 195:
            task.learn(batch_from_trajectory(runner.segment()))
            if task.version % 20 == 0:
                best = max(best, evaluate(task))
    finally:
        runner.close()
    assert best >= 195, best


@pytest.mark.slow
def test_ppo_with_vtrace_learns_from_stale_actors(cartpole):
    """Actors a few versions behind (as in a distributed run): V-trace keeps learning stable."""
    task = make_computation_task(CARTPOLE_PPO, *cartpole, device="cpu", seed=0)
    actor = make_computation_task(CARTPOLE_PPO, *cartpole, device="cpu", seed=0)
    runner = CartPoleRunner(task)
    best = 0.0
    try:
        while runner.steps < 200_000 and best < 195:
            if task.version % 4 == 0:  # the actor reloads weights every 4 learner versions
                actor.set_weights(task.get_weights(), task.version)
            task.learn(batch_from_trajectory(runner.segment(actor)))
            if task.version % 20 == 0:
                best = max(best, evaluate(task))
    finally:
        runner.close()
    assert best >= 195, best


def test_minibatches_are_near_equal_and_never_empty():
    """Slices of ceil(n / count) left 13 samples in 4 as 4, 4, 4, 1: one sample took a full step with its raw
    (unnormalisable) advantage, and its KL alone decided the early stop."""
    from common.algorithms.ppo import minibatches

    def sizes(n: int, count: int) -> list[int]:
        return [len(mb) for mb in minibatches(torch.arange(n), count)]

    assert sizes(13, 4) == [4, 3, 3, 3]
    assert sizes(1024, 4) == [256] * 4
    assert sizes(2, 4) == [1, 1]
    assert sizes(0, 4) == []
    assert sorted(torch.cat(minibatches(torch.arange(13), 4)).tolist()) == list(range(13))
