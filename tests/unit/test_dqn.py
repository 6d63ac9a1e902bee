"""DQN: n-step transitions, double-Q targets, target network, ε from forward kwargs, learning CartPole."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from common.algorithms import PolicyConfig, make_computation_task, make_replay, transitions_from_trajectory
from common.computation import ComputationTask, TensorSpec, specs_from_gym
from common.trajectory import AgentStep, Trajectory, TrajectoryBuilder


def row(terminals=(), truncations=(), steps=4):
    """One row whose observation at step t is [t] and whose next observation is [100]."""
    term = np.zeros((1, steps), bool)
    trunc = np.zeros((1, steps), bool)
    term[0, list(terminals)] = True
    trunc[0, list(truncations)] = True
    return Trajectory({
        "/observations": np.arange(steps, dtype=np.float32).reshape(1, steps, 1),
        "/next_observations": np.array([[100.0]], np.float32),
        "/rewards": np.arange(1, steps + 1, dtype=np.float32).reshape(1, steps),
        "/terminals": term,
        "/truncations": trunc,
        "/agents/agent/actions": np.arange(steps).reshape(1, steps) % 2,
    })


def summary(transitions):
    return [(float(o[0]), float(r), float(d), float(n[0])) for o, r, d, n in zip(
        transitions["observation"], transitions["return"], transitions["discount"], transitions["next_observation"],
        strict=True)]


def test_n_step_windows_without_episode_ends():
    got = summary(transitions_from_trajectory(row(), gamma=0.5, n_step=2))
    # (obs, return, discount, next obs): windows shorten at the row's end and bootstrap from next_observations.
    assert got == [(0, 1 + 0.5 * 2, 0.25, 2), (1, 2 + 0.5 * 3, 0.25, 3), (2, 3 + 0.5 * 4, 0.25, 100),
                   (3, 4, 0.5, 100)]


def test_n_step_windows_stop_at_terminals():
    got = summary(transitions_from_trajectory(row(terminals=[1]), gamma=0.5, n_step=3))
    assert got[0][:3] == (0, 1 + 0.5 * 2, 0.0) and got[1][:3] == (1, 2, 0.0)
    assert got[2] == (2, 3 + 0.5 * 4, 0.25, 100)


def test_truncation_at_row_end_bootstraps_from_the_final_observation():
    got = summary(transitions_from_trajectory(row(truncations=[3]), gamma=0.5, n_step=2))
    assert got[-1] == (3, 4, 0.5, 100) and got[-2] == (2, 3 + 0.5 * 4, 0.25, 100)


def test_truncation_inside_a_row_is_dropped_and_windows_stop_before_it():
    transitions = transitions_from_trajectory(row(truncations=[1]), gamma=0.5, n_step=3)
    got = summary(transitions)
    assert [g[0] for g in got] == [0, 2, 3]  # step 1's final observation is unknown: no transition
    assert got[0] == (0, 1, 0.5, 1)  # bootstraps from o_1, the last observation of its episode
    assert transitions["action"].tolist() == [0, 0, 1]


def q_task(double_q=True, period=3, tau=1.0) -> ComputationTask:
    obs = {"observation": TensorSpec("observation", (3,)), "action_mask": TensorSpec("action_mask", (4,), "bool")}
    config = {"algorithm": "dqn", "model": {"hidden": [16]},
              "dqn": {"double_q": double_q, "target_update_period": period, "target_update_tau": tau}}
    return make_computation_task(config, obs, 4, device="cpu", seed=0)


def learn_batch(rng, n=32):
    mask = rng.random((n, 4)) < 0.6
    mask[:, 0] = True
    return {
        "observation": rng.normal(size=(n, 3)).astype(np.float32), "action_mask": np.ones((n, 4), bool),
        "next_observation": rng.normal(size=(n, 3)).astype(np.float32), "next_action_mask": mask,
        "action": rng.integers(0, 4, n), "return": rng.normal(size=n).astype(np.float32),
        "discount": np.where(rng.random(n) < 0.2, 0.0, 0.9).astype(np.float32),
        "weight": rng.random(n).astype(np.float32),
    }


@pytest.mark.parametrize("double_q", [True, False])
def test_td_targets_follow_double_q_and_respect_next_masks(double_q):
    task = q_task(double_q)
    rng = np.random.default_rng(0)
    # Make online and target networks differ so the double-Q choice matters (one learn step moved them too
    # little: both chose the same next actions, and a double_q that used the target's choice passed).
    task.learn(learn_batch(rng))
    batch = learn_batch(rng)
    algorithm = task.algorithm
    with torch.no_grad():
        noise = torch.Generator().manual_seed(5)
        for p in algorithm.target.parameters():
            p.add_(torch.randn(p.shape, generator=noise, dtype=p.dtype))
        tensors = {k: torch.as_tensor(v) for k, v in batch.items()}
        next_inputs = {"observation": tensors["next_observation"], "action_mask": tensors["next_action_mask"]}
        assert not torch.equal(algorithm.model(next_inputs).argmax(-1), algorithm.target(next_inputs).argmax(-1))
        chooser = algorithm.model if double_q else algorithm.target
        next_action = chooser(next_inputs).argmax(-1, keepdim=True)
        assert tensors["next_action_mask"].gather(-1, next_action).all()  # never an illegal next action
        next_q = algorithm.target(next_inputs).gather(-1, next_action).squeeze(-1)
        target = tensors["return"] + tensors["discount"] * torch.where(tensors["discount"] > 0, next_q, 0.0)
        q = algorithm.model({"observation": tensors["observation"]}).gather(-1, tensors["action"][:, None])[:, 0]
    result = task.learn(batch)
    np.testing.assert_allclose(result.priorities, (target - q).abs().numpy(), rtol=1e-5, atol=1e-6)


def test_target_network_updates_every_period():
    task = q_task(period=3)
    rng = np.random.default_rng(1)

    def same() -> bool:
        return all(torch.equal(a, b) for a, b in zip(task.algorithm.model.parameters(),
                                                     task.algorithm.target.parameters(), strict=True))

    assert same()
    task.learn(learn_batch(rng))
    task.learn(learn_batch(rng))
    assert not same()
    task.learn(learn_batch(rng))
    assert same()
    task.learn(learn_batch(rng))
    other = q_task()
    other.set_weights(task.get_weights(), 9)  # loading weights also syncs the target network
    assert all(torch.equal(a, b) for a, b in zip(other.algorithm.model.parameters(),
                                                 other.algorithm.target.parameters(), strict=True))


def test_soft_target_updates():
    task = q_task(period=1, tau=0.25)  # not 0.5: moving the target by tau or by 1 - tau must differ
    before = [p.clone() for p in task.algorithm.target.parameters()]
    task.learn(learn_batch(np.random.default_rng(2)))
    for old, target, online in zip(before, task.algorithm.target.parameters(), task.algorithm.model.parameters(),
                                   strict=True):
        torch.testing.assert_close(target, 0.75 * old + 0.25 * online)


def test_epsilon_comes_from_forward_kwargs_and_respects_masks():
    task = q_task()
    n = 6000
    observation = np.zeros((n, 3), np.float32)
    mask = np.zeros((n, 4), bool)
    mask[:, 1:] = True
    greedy = task.predict({"observation": observation, "action_mask": mask}).actions["action"]
    assert len(set(greedy.tolist())) == 1 and greedy[0] != 0
    random = task.predict({"observation": observation, "action_mask": mask}, forward_kwargs={"eps": 1.0})
    counts = np.bincount(random.actions["action"], minlength=4)
    assert counts[0] == 0
    np.testing.assert_allclose(counts[1:] / n, 1 / 3, atol=0.03)
    some = task.predict({"observation": observation, "action_mask": mask}, forward_kwargs={"eps": 0.3})
    explored = np.mean(some.actions["action"] != greedy)
    assert explored == pytest.approx(0.3 * 2 / 3, abs=0.03)


def test_learn_rejects_unbatched_transitions():
    task = q_task()
    batch = learn_batch(np.random.default_rng(0))
    with pytest.raises(ValueError, match="DQN learns from"):
        task.learn({k: v[None] for k, v in batch.items()})


# ---- learning CartPole in-process ---------------------------------------------------------------------------
CARTPOLE_DQN = {
    "algorithm": "dqn",
    "model": {"hidden": [256, 256]},
    "dqn": {"learning_rate": 2.3e-3, "target_update_period": 5, "batch_size": 64, "n_step": 3,
            "learning_starts": 500},
}


def evaluate(task: ComputationTask, episodes: int = 10, seed: int = 1000) -> float:
    env = gym.make("CartPole-v1")
    returns = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(int(task.predict({"observation": obs[None]}).actions["action"][0]))
            total += reward
            done = terminated or truncated
        returns.append(total)
    env.close()
    return float(np.mean(returns))


def train_dqn(total_steps: int, eps_steps: int, eval_every: int = 0, target: float = float("inf"),
              num_envs: int = 4, unroll: int = 8, updates_per_segment: int = 16) -> tuple[ComputationTask, float]:
    config = PolicyConfig.from_mapping(CARTPOLE_DQN)
    envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(num_envs)],
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    task = make_computation_task(config, *specs_from_gym(envs.single_observation_space, envs.single_action_space),
                                 device="cpu", seed=0)
    replay = make_replay(config.dqn, seed=0)
    builder = TrajectoryBuilder(num_envs, unroll)
    best = evaluate(task)
    try:
        obs, _ = envs.reset(seed=0)
        steps = 0
        while steps < total_steps and best < target:
            eps = max(0.04, 1.0 - 0.96 * steps / eps_steps)  # the exploration schedule a league would send
            action = task.predict({"observation": obs}, forward_kwargs={"eps": eps}).actions["action"]
            next_obs, reward, terminated, truncated, info = envs.step(action)
            builder.add(obs, {"agent": AgentStep(action)}, reward, terminated, truncated)
            steps += num_envs
            obs = next_obs
            if not builder.full:
                continue
            bootstrap = next_obs.copy()
            for i in np.flatnonzero(terminated | truncated):
                bootstrap[i] = info["final_obs"][i]
            replay.add(transitions_from_trajectory(builder.build(bootstrap), config.dqn.gamma, config.dqn.n_step))
            if len(replay) < config.dqn.learning_starts:
                continue
            for _ in range(updates_per_segment):
                sample = replay.sample(config.dqn.batch_size)
                result = task.learn({**sample.batch, "weight": sample.weights})
                replay.update_priorities(sample, result.priorities)
            if eval_every and task.version % eval_every == 0:
                best = max(best, evaluate(task))
    finally:
        envs.close()
    return task, best


def test_dqn_smoke_improves_on_cartpole_in_seconds():
    untrained = evaluate(make_computation_task(CARTPOLE_DQN, TensorSpec("observation", (4,)), 2, device="cpu",
                                               seed=0))
    task, _ = train_dqn(total_steps=3000, eps_steps=2000)
    assert evaluate(task) > 2 * untrained


@pytest.mark.slow
def test_dqn_solves_cartpole():
    _, best = train_dqn(total_steps=80_000, eps_steps=8000, eval_every=400, target=195)
    assert best >= 195, best


@pytest.mark.parametrize("key", ["return", "discount", "weight"])
def test_per_transition_values_with_another_shape_are_refused(key):
    """FLARE's reward spec is shape [1]: (N, 1) returns broadcast the TD target to (N, N), and DQN trained on
    it without a word (priorities came back (N, N))."""
    batch = learn_batch(np.random.default_rng(2))
    batch[key] = batch[key][:, None]
    with pytest.raises(ValueError, match=rf"{key}: expected shape \(32,\) like action"):
        q_task().learn(batch)


def test_a_window_bootstrapping_from_a_position_without_legal_moves_is_dropped():
    """A turn-based game truncated on the opponent's turn (or over) ends the player's row at a position where it
    may not move: max over no action was the masked logits' float minimum, a finite target of -3.4e38 that
    prioritized replay then drew for ever."""
    steps, actions = 3, 3
    trajectory = Trajectory({
        "/observations/observation": np.zeros((1, steps, 2), np.float32),
        "/observations/action_mask": np.ones((1, steps, actions), bool),
        "/next_observations/observation": np.ones((1, 2), np.float32),
        "/next_observations/action_mask": np.zeros((1, actions), bool),  # nobody's move of ours
        "/rewards": np.zeros((1, steps), np.float32),
        "/terminals": np.zeros((1, steps), bool),
        "/truncations": np.array([[False, False, True]]),
        "/agents/agent/actions": np.zeros((1, steps), np.int64),
    })
    rows = transitions_from_trajectory(trajectory, 0.99, 1)
    assert len(rows["discount"]) == 2 and rows["next_action_mask"].any(axis=1).all()  # the last step is dropped
    two_step = transitions_from_trajectory(trajectory, 0.99, 2)
    assert len(two_step["discount"]) == 1  # step 1's window reaches the same bootstrap: dropped too
