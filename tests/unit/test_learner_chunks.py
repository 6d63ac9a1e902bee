"""Pushed chunks -> learn rows: real CartPole rollouts and connect-four shaped data; bad data names its key."""

import numpy as np
import pytest

from common.adder_config import MAX_UNROLL_LEN
from common.algorithms.registry import make_computation_task
from common.envs import make_env
from common.envs.policy_view import policy_specs
from common.policy_config import PolicyConfig
from common.tensor_codec import decode_chunk, encode_chunk
from common.trajectory import Trajectory
from learner_service.chunks import ChunkPreparer, InvalidChunkError
from learner_service.learner_testing import rollout_chunks, synthetic_chunk


def _specs(env_name: str):
    env = make_env(env_name)
    try:
        return policy_specs(env.info())
    finally:
        env.close()


def _preparer(algorithm: str, env_name: str = "CartPole-v1"):
    obs, action = _specs(env_name)
    policy = PolicyConfig.from_mapping({"algorithm": algorithm, "model": {"hidden": [16], "conv": [[8, 3, 1]]},
                                        **({"dqn": {"n_step": 2}} if algorithm == "dqn" else {})})
    task = make_computation_task(policy, obs, action, device="cpu", seed=0)
    return task, ChunkPreparer(policy, task.input_specs, task.learn_specs, action.num_actions)


def _edited(chunk, **changes):
    """The chunk's trajectory with keys replaced (None removes a key), re-encoded."""
    decoded = decode_chunk(chunk)
    tensors = dict(decoded.trajectory.tensors)
    for key, value in changes.items():
        key = key.replace("__", "/")
        if value is None:
            tensors.pop(key)
        else:
            tensors[key] = value
    return decode_chunk(encode_chunk(Trajectory(tensors), decoded.header))


def test_cartpole_rollout_becomes_ppo_segments_and_dqn_transitions():
    task, ppo = _preparer("ppo")
    chunk = rollout_chunks(task, player_id="p", env_num=3, unroll_len=5, count=1)[0]
    prepared = ppo.prepare(decode_chunk(chunk))
    assert prepared.steps == 5 and prepared.agent_steps == 15
    assert prepared.rows["observation"].shape == (3, 5, 4)
    assert prepared.rows["next_observation"].shape == (3, 4)
    assert prepared.rows["behaviour_logp"].dtype == np.float32
    task.learn(dict(prepared.rows))  # the rows are exactly what PPO learns from
    _, dqn = _preparer("dqn")
    transitions = dqn.prepare(decode_chunk(chunk))
    assert transitions.rows["action"].shape == (15,)  # no truncation inside a row: one transition per step
    assert set(transitions.rows) >= {"observation", "next_observation", "return", "discount"}


def test_connect_four_view_with_action_masks_is_accepted():
    task, preparer = _preparer("ppo", "connect_four")
    obs, action = _specs("connect_four")
    chunk = synthetic_chunk(obs, action.num_actions, player_id="p", batch=2, steps=6)
    prepared = preparer.prepare(decode_chunk(chunk))
    assert prepared.rows["observation"].shape == (2, 6, 5, 6, 7)
    assert prepared.rows["action_mask"].shape == (2, 6, 7)
    task.learn(dict(prepared.rows))
    # An action its step's mask forbids (a full column): no policy of the league plays it.
    tensors = decode_chunk(chunk).trajectory.tensors
    mask, actions = tensors["/observations/action_mask"].copy(), tensors["/agents/agent/actions"].copy()
    mask[1, 4] = False
    mask[1, 4, 2] = True
    actions[1, 4] = 5
    with pytest.raises(InvalidChunkError) as err:
        preparer.prepare(_edited(chunk, __observations__action_mask=mask, __agents__agent__actions=actions))
    assert err.value.key == "/agents/agent/actions" and "row 1, step 4, action 5" in str(err.value)


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"__agents__agent__artifacts__logp": None}, "/agents/agent/artifacts/logp"),
        ({"__observations": np.zeros((3, 5, 5), np.float32), "__next_observations": np.zeros((3, 5), np.float32)},
         "/observations"),
        ({"__agents__agent__actions": np.full((3, 5), 7, np.int64)}, "/agents/agent/actions"),
        ({"__agents__agent__actions": np.zeros((3, 5), np.float32)}, "/agents/agent/actions"),
        ({"__rewards": np.full((3, 5), np.nan, np.float32)}, "/rewards"),
        ({"__agents__agent__artifacts__logp": np.full((3, 5), np.inf, np.float32)}, "/agents/agent/artifacts/logp"),
        ({"__infos__episode_return": np.zeros((3, 4), np.float32)}, None),  # caught by the trajectory format
        # Finite in float64 but not once held as float32: refused, not accepted and turned into inf by the cast.
        ({"__rewards": np.full((3, 5), 1e300)}, "/rewards"),
        ({"__agents__agent__artifacts__logp": np.full((3, 5), -1e300)}, "/agents/agent/artifacts/logp"),
        # No discrete action is more likely than 1, or less than any float32 policy samples (a review: +25
        # silently cancelled the samples' ratios, -200 made the behaviour ratio's telemetry infinite).
        ({"__agents__agent__artifacts__logp": np.full((3, 5), 25.0, np.float32)}, "/agents/agent/artifacts/logp"),
        ({"__agents__agent__artifacts__logp": np.full((3, 5), -200.0, np.float32)}, "/agents/agent/artifacts/logp"),
    ],
)
def test_bad_chunks_name_the_key(changes, key):
    task, preparer = _preparer("ppo")
    chunk = rollout_chunks(task, player_id="p", env_num=3, unroll_len=5, count=1)[0]
    with pytest.raises(ValueError) as err:
        preparer.prepare(_edited(chunk, **changes))
    if key is not None:
        assert isinstance(err.value, InvalidChunkError) and err.value.key == key
        assert str(err.value).startswith(key)


def test_dqn_returns_that_overflow_float32_are_refused():
    # Every reward is a finite float32, their 2-step sum is not: DQN's replay would sample inf forever.
    task, preparer = _preparer("dqn")
    chunk = rollout_chunks(task, player_id="p", env_num=3, unroll_len=5, count=1)[0]
    with pytest.raises(InvalidChunkError) as err:
        preparer.prepare(_edited(chunk, __rewards=np.full((3, 5), 3e38, np.float32)))
    assert err.value.key == "/rewards" and "return is not finite" in str(err.value)


def test_rows_longer_than_the_unroll_bound_are_refused():
    task, preparer = _preparer("ppo")
    obs, action = _specs("CartPole-v1")
    long = synthetic_chunk(obs, action.num_actions, player_id="p", batch=1, steps=MAX_UNROLL_LEN + 1)
    with pytest.raises(InvalidChunkError) as err:
        preparer.prepare(decode_chunk(long))
    assert err.value.key == "/rewards" and f"at most {MAX_UNROLL_LEN}" in str(err.value)
    ok = synthetic_chunk(obs, action.num_actions, player_id="p", batch=1, steps=MAX_UNROLL_LEN)
    assert preparer.prepare(decode_chunk(ok)).steps == MAX_UNROLL_LEN


def test_observation_entries_the_model_does_not_read_are_refused():
    _, preparer = _preparer("ppo", "connect_four")
    obs, action = _specs("connect_four")
    chunk = decode_chunk(synthetic_chunk(obs, action.num_actions, player_id="p"))
    tensors = dict(chunk.trajectory.tensors)
    tensors["/observations/to_play"] = np.zeros((2, 8), np.int32)
    tensors["/next_observations/to_play"] = np.zeros(2, np.int32)
    with pytest.raises(InvalidChunkError) as err:
        preparer.prepare(decode_chunk(encode_chunk(Trajectory(tensors), chunk.header)))
    assert err.value.key == "/observations/to_play"
    tensors = dict(chunk.trajectory.tensors)
    del tensors["/observations/action_mask"], tensors["/next_observations/action_mask"]
    with pytest.raises(InvalidChunkError) as err:
        preparer.prepare(decode_chunk(encode_chunk(Trajectory(tensors), chunk.header)))
    assert err.value.key == "/observations/action_mask"  # the env declares it: required


def test_episode_returns_come_from_the_info_when_sent():
    task, preparer = _preparer("ppo")
    chunk = rollout_chunks(task, player_id="p", env_num=2, unroll_len=40, count=1, with_episode_returns=True)[0]
    prepared = preparer.prepare(decode_chunk(chunk))
    ended = prepared.dones.sum()
    assert ended >= 1 and prepared.episode_returns.shape == (ended,)
    assert np.all(prepared.episode_returns >= 1)
    # Finite in float64, infinite as TensorBoard's float32: refused (a review).
    huge = np.full(decode_chunk(chunk).trajectory.rewards.shape, 1.7e308)
    with pytest.raises(InvalidChunkError, match="beyond float32's range") as err:
        preparer.prepare(_edited(chunk, __infos__episode_return=huge))
    assert err.value.key == "/infos/episode_return"


def test_integer_observations_that_do_not_fit_the_specs_dtype_are_refused_not_wrapped():
    """A same-kind cast narrows: uint16 300 became uint8 44 in the learn rows (a review)."""
    from common.computation.specs import TensorSpec

    spec = TensorSpec("observation", (2,), "uint8")
    assert spec.check(np.array([[3, 255]], np.uint16)).dtype == np.uint8  # values that fit pass
    with pytest.raises(ValueError, match="values 44..300 do not fit uint8"):
        spec.check(np.array([[300, 44]], np.uint16))
    with pytest.raises(ValueError, match="do not fit int8"):
        TensorSpec("observation", (1,), "int8").check(np.array([[-129]], np.int64))
