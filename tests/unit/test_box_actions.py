"""Real-valued (gymnasium Box) actions: the Gaussian policy's math, PPO learning with it, the actor's clipping,
the learner's chunk checks, and what is refused (DQN, an action mask, integer Boxes)."""

from __future__ import annotations

import math

import gymnasium
import numpy as np
import pytest
import torch

from common.algorithms.distributions import LOG_STD_MAX, DiagGaussian
from common.algorithms.models import ActorCriticModel
from common.algorithms.registry import UnsupportedActionError, make_computation_task
from common.computation.algorithm import ForwardKwargs
from common.computation.specs import BoxActionSpec, DiscreteActionSpec, TensorSpec
from common.envs.gym_env import GymEnv
from common.envs.policy_view import UnsupportedEnvError, env_action, policy_specs
from common.policy_config import ModelConfig, PolicyConfig
from common.tensor_codec import decode_chunk
from common.trajectory import DEFAULT_AGENT
from learner_service.chunks import ChunkPreparer, InvalidChunkError
from learner_service.learner_testing import edited_chunk, rollout_chunks

OBS = {"observation": TensorSpec("observation", (3,))}


def _params(mean, log_std):
    return torch.cat([torch.as_tensor(mean, dtype=torch.float32), torch.as_tensor(log_std, dtype=torch.float32)], -1)


def test_gaussian_log_prob_and_entropy_are_those_of_independent_normals():
    spec = BoxActionSpec((2, 3), -1.0, 1.0)
    dist = DiagGaussian(spec)
    gen = torch.Generator().manual_seed(0)
    mean = torch.randn(5, 6, generator=gen)
    log_std = torch.randn(5, 6, generator=gen) * 0.3
    actions = torch.randn(5, 2, 3, generator=gen)
    reference = torch.distributions.Normal(mean, log_std.exp())
    params = _params(mean, log_std)
    assert torch.allclose(dist.log_prob(params, actions), reference.log_prob(actions.reshape(5, 6)).sum(-1), atol=1e-5)
    assert torch.allclose(dist.entropy(params), reference.entropy().sum(-1), atol=1e-5)


def test_choose_samples_around_the_mean_greedy_is_the_mean_and_logp_is_the_draws_density():
    spec = BoxActionSpec((2,), (-1.0, -5.0), (1.0, 5.0))
    dist = DiagGaussian(spec)
    mean = torch.tensor([[0.5, -2.0]]).repeat(4000, 1)
    params = dist.params(mean, torch.log(torch.tensor([0.1, 2.0])))
    value = torch.zeros(4000)
    out = dist.choose(params, value, None, ForwardKwargs(), torch.Generator().manual_seed(1))
    assert out["action"].shape == (4000, 2)
    assert torch.allclose(out["action"].mean(0), torch.tensor([0.5, -2.0]), atol=0.1)
    assert torch.allclose(out["action"].std(0), torch.tensor([0.1, 2.0]), rtol=0.05)
    assert torch.allclose(out["logp"], dist.log_prob(params, out["action"]))
    greedy = dist.choose(params[:3], value[:3], None, ForwardKwargs(greedy=True), torch.Generator())
    assert torch.equal(greedy["action"], mean[:3])


def test_epsilon_exploration_draws_uniformly_in_the_box_and_records_the_mixtures_density():
    spec = BoxActionSpec((1,), -2.0, 2.0)
    dist = DiagGaussian(spec)
    params = dist.params(torch.full((20000, 1), 10.0), torch.log(torch.tensor([0.01])))  # mean far outside
    out = dist.choose(params, torch.zeros(20000), None, ForwardKwargs(eps=0.25), torch.Generator().manual_seed(2))
    explored = (out["action"][:, 0] - 10.0).abs() > 0.5
    assert 0.23 < explored.float().mean() < 0.27
    assert out["action"][explored].min() >= -2.0 and out["action"][explored].max() <= 2.0
    # Uniform draws (inside the box, far from the Gaussian): density eps / 4; Gaussian draws (outside): (1-eps) N.
    assert torch.allclose(out["logp"][explored], torch.full((int(explored.sum()),), math.log(0.25 / 4)), atol=1e-5)
    normal = dist.log_prob(params[~explored], out["action"][~explored]) + math.log(0.75)
    assert torch.allclose(out["logp"][~explored], normal, atol=1e-4)
    unbounded = DiagGaussian(BoxActionSpec((1,), -np.inf, np.inf))
    with pytest.raises(ValueError, match=r"forward_kwargs.eps 0.1: .*unbounded"):
        unbounded.choose(params[:2], torch.zeros(2), None, ForwardKwargs(eps=0.1), torch.Generator())


def test_the_log_std_is_clamped_where_float32_densities_stay_finite():
    dist = DiagGaussian(BoxActionSpec((1,), -1.0, 1.0))
    params = dist.params(torch.zeros(1, 1), torch.tensor([50.0]))
    assert dist.split(params)[1].item() == LOG_STD_MAX
    assert torch.isfinite(dist.log_prob(params, torch.tensor([[3.0]]))).all()


def test_box_action_spec_bounds_and_clip():
    spec = BoxActionSpec((2, 2), np.array([[-1, -2], [-3, -np.inf]]), 1.0)
    assert spec.low == (-1.0, -2.0, -3.0, -np.inf) and spec.high == (1.0,) * 4 and not spec.bounded
    clipped = spec.clip(np.array([[5.0, -5.0], [-5.0, -1e9]]))
    assert clipped.dtype == np.float32 and clipped.tolist() == [[1.0, -2.0], [-3.0, -1e9]]
    assert BoxActionSpec((), -1.0, 1.0).clip(np.float32(3.0)).shape == ()
    with pytest.raises(ValueError, match="low <= high"):
        BoxActionSpec((1,), 1.0, -1.0)
    with pytest.raises(ValueError, match=r"must have 2 entries \(shape \(2,\)\) or one, got 3"):
        BoxActionSpec((2,), (0.0, 0.0, 0.0), 1.0)


def test_policy_specs_of_pendulum_and_what_stays_refused():
    info = GymEnv("Pendulum-v1").info()
    inputs, action = policy_specs(info)
    assert action == BoxActionSpec((1,), -2.0, 2.0)
    assert inputs["observation"].shape == (3,)
    with pytest.raises(UnsupportedEnvError, match=r"DQN picks the action of highest value .* policy.algorithm: ppo"):
        policy_specs(info, "dqn")
    with pytest.raises(UnsupportedActionError, match="use policy.algorithm: ppo"):
        make_computation_task({"algorithm": "dqn"}, inputs, action)

    class MaskedBox(gymnasium.Env):
        observation_space = gymnasium.spaces.Dict({
            "observation": gymnasium.spaces.Box(-1.0, 1.0, (2,), np.float32),
            "action_mask": gymnasium.spaces.Box(0, 1, (2,), bool)})
        action_space = gymnasium.spaces.Box(-1.0, 1.0, (2,), np.float32)

    with pytest.raises(UnsupportedEnvError, match=r"'action_mask'.* but its action space is continuous"):
        policy_specs(GymEnv(MaskedBox).info())


def test_env_action_clips_to_the_box_in_the_envs_dtype_and_passes_indices_as_ints():
    info = GymEnv("Pendulum-v1").info()
    action = policy_specs(info)[1]
    sent = env_action(action, np.array([3.7], np.float32), info)
    assert sent.tolist() == [2.0] and sent.dtype == np.float32
    assert env_action(DiscreteActionSpec(3), np.int64(2), info) == 2


def test_discrete_models_keep_their_weight_names_and_box_models_add_a_log_std():
    """Checkpoints of discrete policies written before Box actions existed must still load."""
    discrete = ActorCriticModel(OBS, 4, ModelConfig(hidden=(8,)))
    assert "log_std" not in discrete.state_dict() and "policy_head.weight" in discrete.state_dict()
    box = ActorCriticModel(OBS, BoxActionSpec((2,), -1.0, 1.0), ModelConfig(hidden=(8,), log_std_init=-0.5))
    assert box.state_dict()["log_std"].tolist() == [-0.5, -0.5]
    assert box.state_dict()["policy_head.weight"].shape == (2, 8)
    assert box.get_input_specs() == [OBS["observation"]]  # no action mask
    assert box.get_action_specs() == [TensorSpec("action", (2,), "float32")]
    with pytest.raises(ValueError, match="log_std_init"):
        ModelConfig(log_std_init=5.0)


@pytest.mark.parametrize("model", [{"hidden": [32]}, {"hidden": [32], "recurrent": "gru", "recurrent_size": 16}])
def test_ppo_learns_the_best_action_of_a_continuous_bandit(model):
    """Reward -(a - 0.7)^2 (one-step episodes, one observation): the Gaussian's mean moves to 0.7."""
    task = make_computation_task({"algorithm": "ppo", "model": model,
                                  "ppo": {"learning_rate": 0.01, "entropy_coef": 0.0, "update_epochs": 4,
                                          "num_minibatches": 2, "gamma": 0.0}},
                                 OBS, BoxActionSpec((1,), -2.0, 2.0), device="cpu", seed=0)
    rows, steps = 32, 4
    states = {k: v[:, None].repeat(steps, 1) for k, v in task.initial_states(rows).items()}
    for _ in range(60):
        obs = np.full((rows, steps, 3), 0.5, np.float32)
        flat = obs.reshape(-1, 3)
        pred = task.predict({"observation": flat},
                            {k: v.reshape(rows * steps, -1) for k, v in states.items()} or None)
        actions = pred.actions["action"].reshape(rows, steps, 1)
        batch = {"observation": obs, "next_observation": obs[:, -1], "action": actions,
                 "reward": -((np.clip(actions[..., 0], -2, 2) - 0.7) ** 2).astype(np.float32),
                 "terminated": np.ones((rows, steps), bool), "truncated": np.zeros((rows, steps), bool),
                 "behaviour_logp": pred.artifacts["logp"].reshape(rows, steps)}
        batch.update({f"state_{k}": v for k, v in states.items()})
        stats = task.learn(batch).stats
    greedy = task.predict({"observation": np.full((4, 3), 0.5, np.float32)},
                          {k: v[:4, 0] for k, v in states.items()} or None, forward_kwargs={"greedy": True})
    assert np.abs(greedy.actions["action"] - 0.7).max() < 0.1
    assert stats["action_std"] < 0.9  # started at 1 (log_std_init 0): the policy narrowed around its optimum


def _pendulum_preparer():
    info = GymEnv("Pendulum-v1").info()
    obs, action = policy_specs(info)
    policy = PolicyConfig.from_mapping({"algorithm": "ppo", "model": {"hidden": [16]}})
    task = make_computation_task(policy, obs, action, device="cpu", seed=0)
    return task, ChunkPreparer(policy, task.input_specs, task.learn_specs, action)


def test_pendulum_chunks_become_ppo_rows_and_bad_actions_are_refused_by_key():
    task, preparer = _pendulum_preparer()
    chunk = rollout_chunks(task, player_id="p", env_name="Pendulum-v1", env_num=3, unroll_len=5, count=1)[0]
    prepared = preparer.prepare(decode_chunk(chunk))
    assert prepared.rows["action"].shape == (3, 5, 1) and prepared.rows["action"].dtype == np.float32
    task.learn(dict(prepared.rows))
    key = f"/agents/{DEFAULT_AGENT}/actions"
    actions = decode_chunk(chunk).trajectory.tensors[key]
    for bad, said in [
        (actions.astype(np.int64), r"expected float \(3, 5, 1\)"),
        (actions[..., 0], r"expected float \(3, 5, 1\)"),
        (np.where(np.arange(5) == 2, np.nan, actions[..., 0])[..., None].astype(np.float32), "NaN or infinite"),
    ]:
        with pytest.raises(InvalidChunkError, match=said) as caught:
            preparer.prepare(edited_chunk(chunk, key, bad))
        assert caught.value.key == key
    # An unclipped draw outside the Box is a valid action: its density is what the behaviour logp is.
    preparer.prepare(edited_chunk(chunk, key, (actions * 0 + 7.5).astype(np.float32)))


def test_finite_but_huge_box_actions_are_refused_by_key_before_they_make_an_update_nan():
    """An action of 1e20 is finite in float32 (and 1e300 in float64), so it passed the finiteness check; the
    learner's Gaussian gave it a log-density of -inf and the update it was in went NaN (rolled back, with the
    batch of good data around it: an actor sending such chunks made the learner give up as diverged)."""
    task, preparer = _pendulum_preparer()
    chunk = rollout_chunks(task, player_id="p", env_name="Pendulum-v1", env_num=2, unroll_len=4, count=1)[0]
    key = f"/agents/{DEFAULT_AGENT}/actions"
    actions = decode_chunk(chunk).trajectory.tensors[key]
    for bad in [np.where(np.arange(4)[:, None] == 1, 1e20, actions).astype(np.float32),
                np.full(actions.shape, 1e300), np.full(actions.shape, -3e38, np.float32)]:
        with pytest.raises(InvalidChunkError, match=r"magnitude .*within ±1e\+06") as caught:
            preparer.prepare(edited_chunk(chunk, key, bad))
        assert caught.value.key == key
    preparer.prepare(edited_chunk(chunk, key, np.full(actions.shape, -1e6, np.float32)))  # far, and still a draw


@pytest.mark.parametrize("off_policy_correction", ["vtrace", "none"])
def test_an_action_far_from_the_mean_does_not_overflow_the_ppo_ratio(off_policy_correction):
    """A draw a thousand units from the mean (within the chunk bound) has a log-density near -5e5: the policy's
    next steps moved it by hundreds, exp() of that overflowed float32, and the clipped objective's unclipped
    branch made the whole update NaN (rolled back, the batch lost)."""
    info = GymEnv("Pendulum-v1").info()
    obs, action = policy_specs(info)
    policy = PolicyConfig.from_mapping({"algorithm": "ppo", "model": {"hidden": [16]},
                                        "ppo": {"off_policy_correction": off_policy_correction, "target_kl": None}})
    task = make_computation_task(policy, obs, action, device="cpu", seed=0)
    preparer = ChunkPreparer(policy, task.input_specs, task.learn_specs, action)
    chunk = rollout_chunks(task, player_id="p", env_name="Pendulum-v1", env_num=8, unroll_len=16, count=1)[0]
    key = f"/agents/{DEFAULT_AGENT}/actions"
    actions = decode_chunk(chunk).trajectory.tensors[key].copy()
    actions[0, 3, 0] = 1000.0
    rows = preparer.prepare(edited_chunk(chunk, key, actions)).rows
    stats = task.learn(dict(rows)).stats
    assert all(torch.isfinite(p).all() for p in task.algorithm.model.parameters()), stats
    assert all(math.isfinite(v) for v in stats.values()), stats


def test_specs_from_gym_takes_a_float_box_action():
    from common.computation.specs import specs_from_gym

    obs, action = specs_from_gym(gymnasium.spaces.Box(-1, 1, (3,), np.float32),
                                 gymnasium.spaces.Box(np.array([-1.0, 0.0], np.float32), np.array([1.0, 2.0], np.float32)))
    assert action == BoxActionSpec((2,), (-1.0, 0.0), (1.0, 2.0)) and obs["observation"].shape == (3,)
    with pytest.raises(ValueError, match="only Discrete, MultiDiscrete .* and float Box actions"):
        specs_from_gym(gymnasium.spaces.Box(-1, 1, (3,), np.float32),
                       gymnasium.spaces.Tuple([gymnasium.spaces.Discrete(2), gymnasium.spaces.Discrete(3)]))


class _TorqueEcho(gymnasium.Env):
    """Records the actions it receives; pays nothing; episodes of 3 steps."""

    observation_space = gymnasium.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gymnasium.spaces.Box(-2.0, 2.0, (1,), np.float32)
    received: list[np.ndarray] = []

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return np.zeros(3, np.float32), {}

    def step(self, action):
        type(self).received.append(np.array(action))
        self.t += 1
        return np.zeros(3, np.float32), 0.0, self.t == 3, False, {}


def test_the_actor_sends_the_env_the_clipped_action_and_records_the_draw():
    """A wide Gaussian (log std 2: std 7.4) draws far outside [-2, 2]: the env gets the clipped torque, the
    trajectory the draw, whose density the recorded logp is."""
    import math as _math

    from actor_service.envs.env_manager import BaseEnvManager, EnvManagerConfig
    from actor_service.policy_pool import Policy
    from actor_service.rollout import Rollout, RolloutTarget
    from actor_service.stop import StopSignal
    from actor_service.trajectory_sender import InMemorySink

    _TorqueEcho.received = []
    manager = BaseEnvManager([lambda: GymEnv(_TorqueEcho)] * 2, EnvManagerConfig(episode_num=_math.inf))
    sink = InMemorySink()
    target = RolloutTarget(("p",), 6, 0, ForwardKwargs(), 3)
    with manager:
        manager.launch()
        inputs, action = policy_specs(manager.env_info)
        task = make_computation_task({"algorithm": "ppo", "model": {"hidden": [8], "log_std_init": 2.0}}, inputs,
                                     action, device="cpu", seed=0)
        Rollout(manager, manager.env_info, target, [Policy("p", task, version=1, path="")], stop=StopSignal(),
                sink=sink).run()
    received = np.concatenate(_TorqueEcho.received)
    recorded = np.concatenate([t.actions().reshape(-1) for t, _ in sink.items])
    assert received.dtype == np.float32 and np.abs(received).max() <= 2.0
    assert np.abs(recorded).max() > 2.0  # some draws left the Box (std 7.4) and are kept as drawn
    assert sorted(np.clip(recorded, -2, 2).tolist()) == sorted(received.tolist())


class _UnboundedTorque(_TorqueEcho):
    action_space = gymnasium.spaces.Box(-np.inf, np.inf, (1,), np.float32)


def test_eps_on_an_unbounded_box_fails_the_job_as_a_config_problem_in_one_line():
    """forward_kwargs.eps in a player type's job template, with an env whose Box is unbounded: the ValueError came
    from the first step's sampling, so the actor logged it as a crash and FinishJob carried its traceback (shown
    by the coordinator and `league status`). Said before the job plays, as the env/config problem it is."""
    import math as _math

    from actor_service.actor import failure_text
    from actor_service.envs.env_manager import BaseEnvManager, EnvManagerConfig
    from actor_service.policy_pool import Policy
    from actor_service.rollout import Rollout, RolloutTarget
    from actor_service.stop import StopSignal
    from actor_service.trajectory_sender import InMemorySink

    manager = BaseEnvManager([lambda: GymEnv(_UnboundedTorque)], EnvManagerConfig(episode_num=_math.inf))
    with manager:
        manager.launch()
        inputs, action = policy_specs(manager.env_info)
        task = make_computation_task({"algorithm": "ppo", "model": {"hidden": [8]}}, inputs, action, device="cpu",
                                     seed=0)
        with pytest.raises(UnsupportedEnvError, match=r"forward_kwargs.eps 0.1: .*unbounded") as caught:
            Rollout(manager, manager.env_info, RolloutTarget(("p",), 6, 0, ForwardKwargs(eps=0.1), 3),
                    [Policy("p", task, version=1, path="")], stop=StopSignal(), sink=InMemorySink())
    assert "Traceback" not in failure_text(caught.value) and "\n" not in failure_text(caught.value)


def test_a_log_std_the_entropy_bonus_pushed_to_its_bound_comes_back_when_rewards_ask():
    """The Gaussian clamps its log std to [-20, 2] and the clamp passes no gradient beyond: the entropy bonus,
    on a reward that ignored the action, pushed the parameter a step past 2, and there it stayed (a std of 7.4)
    when the rewards later paid for precise actions. The parameter is kept within the bounds after each step."""
    task = make_computation_task({"algorithm": "ppo", "model": {"hidden": [16], "log_std_init": 2.0},
                                  "ppo": {"learning_rate": 0.03, "entropy_coef": 0.05, "update_epochs": 2,
                                          "num_minibatches": 2, "gamma": 0.0, "target_kl": None}},
                                 OBS, BoxActionSpec((1,), -10.0, 10.0), device="cpu", seed=0)
    log_std = task.algorithm.model.log_std
    rng = np.random.default_rng(0)

    def learn(pays_precision: bool) -> None:
        obs = rng.standard_normal((16, 4, 3)).astype(np.float32)
        pred = task.predict({"observation": obs.reshape(-1, 3)})
        actions = pred.actions["action"].reshape(16, 4, 1)
        reward = -((np.clip(actions[..., 0], -10, 10) - 0.7) ** 2) if pays_precision else np.zeros((16, 4))
        task.learn({"observation": obs, "next_observation": obs[:, -1], "action": actions,
                    "reward": reward.astype(np.float32), "terminated": np.ones((16, 4), bool),
                    "truncated": np.zeros((16, 4), bool), "behaviour_logp": pred.artifacts["logp"].reshape(16, 4)})

    learn(pays_precision=False)  # only the entropy bonus pulls: up against the bound
    assert float(log_std.detach().max()) <= LOG_STD_MAX
    for _ in range(10):
        learn(pays_precision=True)
    assert float(log_std.detach().max()) < LOG_STD_MAX - 0.3  # the std shrinks for the precise action


class _Float64Box(_TorqueEcho):
    action_space = gymnasium.spaces.Box(np.array([-0.1, 0.2]), np.array([0.1, 1 / 3]), (2,), np.float64)


def test_env_action_of_a_float64_box_stays_inside_bounds_float32_cannot_hold():
    """Clipped in float32 and cast up, a float64 Box's bound of 0.1 reached the env as 0.10000000149: outside
    its Box (an env checking `action_space.contains` failed every episode of a league run)."""
    info = GymEnv(_Float64Box).info()
    action = policy_specs(info)[1]
    for drawn in ([5.0, 5.0], [-5.0, -5.0], [0.1, 0.2]):
        sent = env_action(action, np.array(drawn, np.float32), info)
        assert sent.dtype == np.float64 and _Float64Box.action_space.contains(sent), sent.tolist()


@pytest.mark.parametrize("bound", [float(np.finfo(np.float32).max), 1e30])
def test_eps_is_refused_on_a_box_too_wide_for_its_uniform_draws(bound):
    """A Box of ±float32 max (the old spelling of 'unbounded') counted as bounded: its uniform draws were inf
    (the chunks then refused as non-finite, the job failing on the learner's word), and those of a ±1e30 Box
    had a log-density of -inf under the learner's Gaussian. Refused like an unbounded Box."""
    dist = DiagGaussian(BoxActionSpec((2,), -bound, bound))
    params = dist.params(torch.zeros(4, 2), torch.zeros(2))
    with pytest.raises(ValueError, match=r"forward_kwargs.eps 0.5: .*too wide"):
        dist.choose(params, torch.zeros(4), None, ForwardKwargs(eps=0.5), torch.Generator().manual_seed(0))
    wide = DiagGaussian(BoxActionSpec((2,), -1e6, 1e6)).choose(params, torch.zeros(4), None, ForwardKwargs(eps=0.5),
                                                             torch.Generator().manual_seed(0))
    assert torch.isfinite(wide["action"]).all() and torch.isfinite(wide["logp"]).all()


def test_the_behaviour_ratio_statistic_stays_finite_for_an_improbable_behaviour_draw():
    """behaviour_ratio (TensorBoard) was exp() of the log ratio uncapped: a behaviour log-density of -100 for a
    draw the learner's narrow Gaussian finds likely made it inf (an algorithms review). Capped as the PPO ratio."""
    info = GymEnv("Pendulum-v1").info()
    obs, action = policy_specs(info)
    policy = PolicyConfig.from_mapping({"algorithm": "ppo", "model": {"hidden": [16], "log_std_init": -3.0},
                                        "ppo": {"target_kl": None}})
    task = make_computation_task(policy, obs, action, device="cpu", seed=0)
    preparer = ChunkPreparer(policy, task.input_specs, task.learn_specs, action)
    chunk = rollout_chunks(task, player_id="p", env_name="Pendulum-v1", env_num=4, unroll_len=8, count=1)[0]
    key = f"/agents/{DEFAULT_AGENT}/artifacts/logp"
    logp = decode_chunk(chunk).trajectory.tensors[key]
    stats = task.learn(dict(preparer.prepare(edited_chunk(chunk, key, np.full_like(logp, -100.0))).rows)).stats
    assert math.isfinite(stats["behaviour_ratio"]), stats
