"""Several discrete choices at once (gymnasium MultiDiscrete from 0, MultiBinary): independent categoricals per
entry, PPO learning with them, the actor's and learner's handling, and what stays refused."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
import torch

from common.algorithms.distributions import MultiCategorical
from common.algorithms.registry import make_computation_task
from common.computation.algorithm import ForwardKwargs
from common.computation.specs import MultiDiscreteActionSpec, specs_from_gym
from common.envs.gym_env import GymEnv
from common.envs.policy_view import UnsupportedEnvError, env_action, policy_specs
from common.policy_config import PolicyConfig
from common.tensor_codec import decode_chunk
from common.trajectory import DEFAULT_AGENT
from learner_service.chunks import ChunkPreparer, InvalidChunkError
from learner_service.learner_testing import edited_chunk, rollout_chunks
from tests.env_doubles import copy_digits

COPY_DIGITS = "python:tests.env_doubles:copy_digits"


def test_log_prob_and_entropy_are_sums_over_independent_categoricals():
    spec = MultiDiscreteActionSpec((2, 2), (2, 3, 4, 5))
    dist = MultiCategorical(spec)
    gen = torch.Generator().manual_seed(0)
    params = torch.randn(6, 14, generator=gen)
    actions = torch.stack([torch.randint(n, (6,), generator=gen) for n in spec.nvec], -1).reshape(6, 2, 2)
    parts = [torch.distributions.Categorical(logits=logits) for logits in torch.split(params, [2, 3, 4, 5], -1)]
    expected = sum(p.log_prob(actions.reshape(6, 4)[:, i]) for i, p in enumerate(parts))
    assert torch.allclose(dist.log_prob(params, actions), expected, atol=1e-6)
    assert torch.allclose(dist.entropy(params), sum(p.entropy() for p in parts), atol=1e-6)


def test_choose_samples_each_entry_greedy_takes_each_argmax_and_eps_records_the_mixture():
    spec = MultiDiscreteActionSpec((2,), (3, 4))
    dist = MultiCategorical(spec)
    params = torch.tensor([[0.0, 5.0, 0.0, 0.0, 0.0, 0.0, 5.0]]).repeat(5000, 1)
    value = torch.zeros(5000)
    out = dist.choose(params, value, None, ForwardKwargs(), torch.Generator().manual_seed(1))
    assert out["action"].shape == (5000, 2) and out["action"].dtype == torch.int64
    assert (out["action"][:, 0] == 1).float().mean() > 0.95 and (out["action"][:, 1] == 3).float().mean() > 0.95
    assert torch.allclose(out["logp"], dist.log_prob(params, out["action"]))
    greedy = dist.choose(params[:2], value[:2], None, ForwardKwargs(greedy=True), torch.Generator())
    assert greedy["action"].tolist() == [[1, 3], [1, 3]]
    assert torch.allclose(greedy["logp"], torch.zeros(2))
    explored = dist.choose(params, value, None, ForwardKwargs(eps=0.5), torch.Generator().manual_seed(2))
    uniform = 1 / 12
    policy = dist.log_prob(params, explored["action"]).exp()
    assert torch.allclose(explored["logp"], torch.log(0.5 * policy + 0.5 * uniform), atol=1e-6)
    off = ~((explored["action"][:, 0] == 1) & (explored["action"][:, 1] == 3))
    assert 0.40 < off.float().mean() < 0.50  # half the rows explore, 11 in 12 of those leave the argmax


@pytest.mark.parametrize("greedy", [False, True])
def test_the_mixture_logp_of_many_entries_is_finite_where_a_joint_probability_underflows(greedy):
    """200 binary entries: a joint action's probability is ~2**-200, 0 in float32. The mixture's log-probability
    must still be the finite log((1 - eps) p + eps 2**-200), not log(0) = -inf (a chunk the learner refuses)."""
    spec = MultiDiscreteActionSpec((200,), (2,) * 200)
    dist = MultiCategorical(spec)
    params = torch.randn(64, 400, generator=torch.Generator().manual_seed(5))
    out = dist.choose(params, torch.zeros(64), None, ForwardKwargs(eps=0.3, greedy=greedy),
                      torch.Generator().manual_seed(6))
    logits = params.double()
    if greedy:
        chosen = (out["action"] == logits.reshape(64, 200, 2).argmax(-1)).all(-1)
        policy = torch.where(chosen, 0.0, -torch.inf).double()
    else:
        policy = dist.log_prob(logits, out["action"])
    expected = torch.logaddexp(policy + np.log(0.7), torch.full_like(policy, np.log(0.3) - 200 * np.log(2)))
    assert torch.isfinite(out["logp"]).all()
    assert torch.allclose(out["logp"].double(), expected, atol=1e-3)


def test_policy_specs_of_multi_discrete_and_multi_binary_and_what_stays_refused():
    inputs, action = policy_specs(GymEnv(copy_digits).info())
    assert action == MultiDiscreteActionSpec((2,), (3, 4)) and inputs["observation"].shape == (7,)
    with pytest.raises(UnsupportedEnvError, match="DQN picks the action of highest value"):
        policy_specs(GymEnv(copy_digits).info(), "dqn")

    def env_with(action_space):
        class Env(gymnasium.Env):
            observation_space = gymnasium.spaces.Box(-1.0, 1.0, (2,), np.float32)

            def reset(self, *, seed=None, options=None):
                return np.zeros(2, np.float32), {}

        Env.action_space = action_space
        return GymEnv(Env).info()

    assert policy_specs(env_with(gymnasium.spaces.MultiBinary(3)))[1] == MultiDiscreteActionSpec((3,), (2, 2, 2))
    assert policy_specs(env_with(gymnasium.spaces.MultiDiscrete([[2, 3], [4, 5]])))[1] == \
        MultiDiscreteActionSpec((2, 2), (2, 3, 4, 5))
    with pytest.raises(UnsupportedEnvError, match=r"multi-discrete not starting at 0 \(an array of shape \(2,\)"):
        policy_specs(env_with(gymnasium.spaces.MultiDiscrete([3, 4], start=[1, 0])))
    assert policy_specs(env_with(gymnasium.spaces.Box(0, 4, (2,), np.int64)))[1] == MultiDiscreteActionSpec((2,), (5, 5))
    with pytest.raises(UnsupportedEnvError, match=r"4,294,967,296 choices over its entries; .* at most 65,536"):
        policy_specs(env_with(gymnasium.spaces.Box(0, 2**31 - 1, (2,), np.int64)))
    _, action = specs_from_gym(gymnasium.spaces.Box(-1, 1, (2,), np.float32), gymnasium.spaces.MultiDiscrete([2, 5]))
    assert action == MultiDiscreteActionSpec((2,), (2, 5))


@pytest.mark.parametrize("high, size, dtype, choices", [
    (np.iinfo(np.int64).max, 2, np.int64, "18,446,744,073,709,551,616"),  # 2 * 2**63: negative in int64
    (2**62, 4, np.int64, "18,446,744,073,709,551,620"),  # 4 * (2**62 + 1): 4 in int64, under the limit
    (np.iinfo(np.uint64).max, 2, np.uint64, "36,893,488,147,419,103,232"),
])
def test_an_integer_box_of_huge_bounds_is_refused_by_its_count_of_choices(high, size, dtype, choices):
    class Env(gymnasium.Env):
        observation_space = gymnasium.spaces.Box(-1.0, 1.0, (2,), np.float32)
        action_space = gymnasium.spaces.Box(0, high, (size,), dtype)

    with pytest.raises(UnsupportedEnvError, match=rf"{choices} choices over its entries; .* at most 65,536"):
        policy_specs(GymEnv(Env).info())


def test_env_action_gives_the_env_its_dtype_and_shape():
    info = GymEnv(copy_digits).info()
    sent = env_action(MultiDiscreteActionSpec((2,), (3, 4)), np.array([2, 3]), info)
    assert sent.tolist() == [2, 3] and sent.dtype == info.action_spec.dtype


def test_ppo_learns_to_copy_both_digits():
    info = GymEnv(copy_digits).info()
    inputs, action = policy_specs(info)
    task = make_computation_task({"algorithm": "ppo", "model": {"hidden": [32]},
                                  "ppo": {"learning_rate": 0.01, "entropy_coef": 0.0, "gamma": 0.0}},
                                 inputs, action, device="cpu", seed=0)
    envs = [GymEnv(copy_digits) for _ in range(16)]
    for i, env in enumerate(envs):
        env.seed(i)
    obs = np.stack([env.reset() for env in envs])
    for _ in range(15):
        rows = {k: [] for k in ("observation", "action", "reward", "logp")}
        for _step in range(8):
            pred = task.predict({"observation": obs})
            steps = [env.step(env_action(action, a, info)) for env, a in zip(envs, pred.actions["action"],
                                                                               strict=True)]
            rows["observation"].append(obs)
            rows["action"].append(pred.actions["action"])
            rows["reward"].append([s.reward for s in steps])
            rows["logp"].append(pred.artifacts["logp"])
            obs = np.stack([env.reset() for env in envs])
        batch = {"observation": np.stack(rows["observation"], 1), "next_observation": obs,
                 "action": np.stack(rows["action"], 1), "reward": np.asarray(rows["reward"], np.float32).T,
                 "terminated": np.ones((16, 8), bool), "truncated": np.zeros((16, 8), bool),
                 "behaviour_logp": np.stack(rows["logp"], 1)}
        task.learn(batch)
    probe = np.eye(7, dtype=np.float32)[[0, 1, 2]] + np.eye(7, dtype=np.float32)[[3, 6, 4]]
    greedy = task.predict({"observation": probe}, forward_kwargs={"greedy": True}).actions["action"]
    assert greedy.tolist() == [[0, 0], [1, 3], [2, 1]]


def test_chunks_become_ppo_rows_and_out_of_range_choices_are_refused_by_key():
    inputs, action = policy_specs(GymEnv(copy_digits).info())
    policy = PolicyConfig.from_mapping({"algorithm": "ppo", "model": {"hidden": [16]}})
    task = make_computation_task(policy, inputs, action, device="cpu", seed=0)
    preparer = ChunkPreparer(policy, task.input_specs, task.learn_specs, action)
    chunk = rollout_chunks(task, player_id="p", env_name=COPY_DIGITS, env_num=3, unroll_len=5, count=1)[0]
    prepared = preparer.prepare(decode_chunk(chunk))
    assert prepared.rows["action"].shape == (3, 5, 2) and prepared.rows["action"].dtype == np.int64
    task.learn(dict(prepared.rows))
    key = f"/agents/{DEFAULT_AGENT}/actions"
    actions = decode_chunk(chunk).trajectory.tensors[key]
    too_big = actions.copy()
    too_big[0, 0, 1] = 4  # the second entry has 4 values: 0-3
    for bad, said in [(too_big, r"in \[0, nvec\[i\]\), nvec \[3, 4\]"),
                      (-np.ones_like(actions), r"in \[0, nvec\[i\]\)"),
                      (actions.astype(np.float32), r"expected integer \(3, 5, 2\)"),
                      (actions[..., 0], r"expected integer \(3, 5, 2\)")]:
        with pytest.raises(InvalidChunkError, match=said) as caught:
            preparer.prepare(edited_chunk(chunk, key, bad))
        assert caught.value.key == key


def test_uniform_logp_of_a_single_choice_matches_the_categorical_one():
    """A MultiDiscrete of one entry is a Discrete: the same log-probabilities under eps."""
    from common.algorithms.distributions import Categorical
    from common.computation.specs import DiscreteActionSpec

    params = torch.randn(4, 5, generator=torch.Generator().manual_seed(3))
    multi = MultiCategorical(MultiDiscreteActionSpec((1,), (5,))).choose(
        params, torch.zeros(4), None, ForwardKwargs(eps=0.3), torch.Generator().manual_seed(4))
    single = Categorical(DiscreteActionSpec(5))
    logp = single.log_prob(params, multi["action"][:, 0])
    assert torch.allclose(multi["logp"], torch.log(0.7 * logp.exp() + 0.3 / 5), atol=1e-6)
