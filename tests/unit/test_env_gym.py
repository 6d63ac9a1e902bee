"""GymEnv: gymnasium envs behind our Env interface, checked with gymnasium's own env checker."""

from __future__ import annotations

import re
import warnings

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from common.computation.specs import BoxActionSpec
from common.envs import DiscreteSpec, EpisodeStats
from common.envs.gym_env import GymEnv
from common.envs.gymnasium_view import GymnasiumView
from common.envs.policy_view import UnsupportedEnvError, policy_specs


def _play(env: GymEnv, seed: int, steps: int) -> list[tuple]:
    env.seed(seed)
    trace = [tuple(env.reset())]
    for t in range(steps):
        ts = env.step(t % 2)
        trace.append((tuple(ts.obs), ts.reward, ts.terminated, ts.truncated))
        if ts.done:
            trace.append(tuple(env.reset()))
    return trace


def test_cartpole_info_describes_spaces():
    info = GymEnv("CartPole-v1").info()
    assert info.obs_spec.shape == (4,) and info.obs_spec.dtype == np.float32
    assert info.action_spec == DiscreteSpec(2)
    assert info.num_players == 1 and info.reward_spec.shape == ()


def test_seeding_makes_trajectories_repeat():
    assert _play(GymEnv("CartPole-v1"), 3, 60) == _play(GymEnv("CartPole-v1"), 3, 60)
    assert _play(GymEnv("CartPole-v1"), 3, 60) != _play(GymEnv("CartPole-v1"), 4, 60)


def test_time_limit_is_truncation_and_falling_is_termination():
    env = GymEnv("CartPole-v1", max_episode_steps=3)
    env.seed(0)
    env.reset()
    steps = [env.step(0) for _ in range(3)]
    assert [s.truncated for s in steps] == [False, False, True]
    assert not any(s.terminated for s in steps)
    assert steps[-1].info.episode == EpisodeStats(3.0, 3)

    env = GymEnv("CartPole-v1")
    env.seed(0)
    env.reset()
    ts = env.step(0)
    while not ts.done:
        ts = env.step(0)  # always pushing left: the pole falls well before the time limit
    assert ts.terminated and not ts.truncated
    assert ts.info.episode.length < 100


def test_discrete_observations_become_arrays_and_reset_options_pass_through():
    env = GymEnv("FrozenLake-v1", is_slippery=False)
    assert env.info().obs_spec == DiscreteSpec(16)
    obs = env.reset()
    assert isinstance(obs, np.ndarray) and obs.shape == () and int(obs) == 0
    ts = env.step(2)  # right
    assert int(ts.obs) == 1


def test_factory_form_and_its_name():
    env = GymEnv(lambda: gymnasium.make("MountainCar-v0"))
    assert env.info().name == "MountainCar-v0"
    with pytest.raises(ValueError, match="make_kwargs"):
        GymEnv(lambda: gymnasium.make("MountainCar-v0"), max_episode_steps=3)


@pytest.mark.parametrize("env_id", ["CartPole-v1", "MountainCar-v0", "FrozenLake-v1"])
def test_gymnasium_env_checker_passes_through_our_adapter(env_id):
    view = GymnasiumView(GymEnv(env_id))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(view, skip_render_check=True)
    view.close()
    # The checker reports soft problems as warnings; unbounded Box spaces are the underlying env's own choice.
    assert [str(w.message) for w in caught if "infinity" not in str(w.message)] == []


class _ScalarBoxEnv(gymnasium.Env):
    observation_space = gymnasium.spaces.Box(-1.0, 1.0, (), np.float32)
    action_space = gymnasium.spaces.Discrete(3, start=2)

    def reset(self, *, seed=None, options=None):
        return np.float32(0.0), {}

    def step(self, action):
        return np.float32(0.0), 0.0, True, False, {}


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: GymEnv("FrozenLake-v1"), r"observation is one integer .*FlattenObservation"),
        (lambda: GymEnv("Blackjack-v1"), r"observations are not arrays \(a gymnasium Tuple"),
        (lambda: GymEnv(_ScalarBoxEnv), r"action space is a Discrete space not starting at 0 \(from 2\)"),
    ],
    ids=["discrete-obs", "tuple-obs", "discrete-action-from-2"],
)
def test_spaces_no_policy_can_play_are_named_when_the_policy_is_built(make, message):
    """They failed deep in model building with an AttributeError or IndexError (the learner's job error, the
    actor's traceback); now the env and the space are named."""
    env = make()
    with pytest.raises(UnsupportedEnvError, match=message):
        policy_specs(env.info())
    env.close()


@pytest.mark.parametrize(("space", "said"), [
    (gymnasium.spaces.Box(0, 5, (), np.int64), "an integer scalar (int64)"),
    (gymnasium.spaces.Box(1, 5, (2,), np.int64), "multi-discrete not starting at 0 (an array of shape (2,), int64)"),
])
def test_an_integer_box_action_is_not_called_a_discrete_space(space, said):
    class ScalarAction(_ScalarBoxEnv):
        observation_space = gymnasium.spaces.Box(-1.0, 1.0, (2,), np.float32)
        action_space = space

    with pytest.raises(UnsupportedEnvError, match=re.escape(f"its action space is {said};")):
        policy_specs(GymEnv(ScalarAction).info())


def test_a_scalar_float_box_action_is_a_one_number_box():
    class ScalarAction(_ScalarBoxEnv):
        observation_space = gymnasium.spaces.Box(-1.0, 1.0, (2,), np.float32)
        action_space = gymnasium.spaces.Box(-1.0, 1.0, (), np.float32)

    assert policy_specs(GymEnv(ScalarAction).info())[1] == BoxActionSpec((), -1.0, 1.0)


def test_a_scalar_observation_is_named_too():
    class ScalarObs(_ScalarBoxEnv):
        action_space = gymnasium.spaces.Discrete(3)

    with pytest.raises(UnsupportedEnvError, match=r"its observation is a scalar \(shape \(\)\)"):
        policy_specs(GymEnv(ScalarObs).info())


def test_a_python_env_may_return_a_gymnasium_env_as_the_unsupported_space_advice_says():
    """UnsupportedEnvError tells a user with a Discrete-observation env (FrozenLake-v1) to name a
    'python:<module>:<callable>' returning it wrapped in FlattenObservation; doing so was refused with
    "returned a FlattenObservation, not an Env"."""
    from common.envs.policy_view import UnsupportedEnvError, policy_specs
    from common.envs.registry import make_env

    with pytest.raises(UnsupportedEnvError, match="FlattenObservation") as refused:
        policy_specs(make_env("FrozenLake-v1").info())
    assert "python:<module>:<callable>" in str(refused.value)
    env = make_env("python:tests.env_doubles:flat_frozen_lake", is_slippery=False)
    inputs, actions = policy_specs(env.info())
    assert inputs["observation"].shape == (16,) and actions.num_actions == 4
    obs = env.reset()
    assert obs.shape == (16,) and obs.sum() == 1
    for _ in range(100):  # right, right, down, ... until the episode ends
        step = env.step(2)
        if step.terminated or step.truncated:
            break
    assert step.info.episode is not None
    env.close()


class _Picture(gymnasium.Env):
    """A uint8 picture of (12, 12, 3), laid out (H, W, C) as gymnasium's pixel envs give them."""

    observation_space = gymnasium.spaces.Box(0, 255, (12, 12, 3), np.uint8)
    action_space = gymnasium.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 0.0, True, False, {}


def test_a_channels_last_picture_is_refused_and_the_advised_transpose_builds():
    """The conv torso reads (C, H, W): a (12, 12, 3) picture failed the default conv stack with advice
    (`conv_padding: same`) that, followed, trained on rows taken for channels. Now refused, naming the layout;
    the advised TransformObservation gives a (3, 12, 12) picture that builds and acts."""
    from common.algorithms.registry import make_computation_task

    with pytest.raises(UnsupportedEnvError, match=re.escape("(12, 12, 3) (uint8) is a picture laid out (H, W, C)")):
        policy_specs(GymEnv(_Picture).info())
    transposed = GymEnv(lambda: gymnasium.wrappers.TransformObservation(
        _Picture(), lambda obs: obs.transpose(2, 0, 1), gymnasium.spaces.Box(0, 255, (3, 12, 12), np.uint8)))
    inputs, actions = policy_specs(transposed.info())
    assert inputs["observation"].shape == (3, 12, 12)
    task = make_computation_task({"algorithm": "ppo", "model": {"conv": [[8, 3, 1]], "conv_padding": "same"}},
                                 inputs, actions, device="cpu", seed=0)
    obs = transposed.reset()
    assert task.predict({"observation": obs[None]}).actions["action"].shape == (1,)
    transposed.close()


def test_a_float_channels_last_picture_is_refused_too():
    """Every 3-D observation goes through the conv torso: a float (64, 64, 3) picture passed the uint8-only check
    and, once `conv_padding: same` made the stack fit, trained on 64 channels of width 3."""

    class FloatPicture(_Picture):
        observation_space = gymnasium.spaces.Box(0.0, 1.0, (64, 64, 3), np.float32)

    with pytest.raises(UnsupportedEnvError, match=re.escape("(64, 64, 3) (float32) is a picture laid out")) as err:
        policy_specs(GymEnv(FloatPicture).info())
    assert "(3, 64, 64), numpy.float32)" in str(err.value) and "obs_scale" not in str(err.value)


@pytest.mark.parametrize("shape", [(4, 84, 84), (3, 3, 3), (12, 12, 5), (16, 4, 4), (2, 3, 3)])
def test_channels_first_or_non_picture_uint8_observations_are_not_refused(shape):
    """Stacked frames (4, 84, 84) and pictures already (C, H, W) pass, as do arrays that are no pictures, and
    planes of a small board channels first ((16, 4, 4): 2048's one-hot tiles; (2, 3, 3): two players' stones)."""

    class Frames(_Picture):
        observation_space = gymnasium.spaces.Box(0, 255, shape, np.uint8)

    inputs, _ = policy_specs(GymEnv(Frames).info())
    assert inputs["observation"].shape == shape


@pytest.mark.parametrize("game, params", [("dots_and_boxes", {}), ("connect_four", {"columns": 4}),
                                          ("breakthrough", {"columns": 4})])
def test_an_openspiel_board_of_three_or_four_columns_is_no_picture_laid_out_hwc(game, params):
    """The seat planes make connect four on 4 columns (5, 6, 4): the shape guess took its 5 planes for rows and
    refused dots_and_boxes and every 3- or 4-column board, on every job, with advice no OpenSpiel env can follow
    (a review). OpenSpiel's observations are channels first by construction."""
    pytest.importorskip("pyspiel")
    from common.envs.openspiel_env import OpenSpielEnv

    env = OpenSpielEnv(game, game_params=params)
    try:
        inputs, _ = policy_specs(env.info())
        assert inputs["observation"].shape[-1] in (3, 4)
    finally:
        env.close()


def _dict_env(spaces: dict) -> type[gymnasium.Env]:
    class DictObs(_Picture):
        observation_space = gymnasium.spaces.Dict(spaces)

    return DictObs


@pytest.mark.parametrize(("spaces", "message"), [
    ({"pos": gymnasium.spaces.Box(0, 1, (1,), np.float32), "vel": gymnasium.spaces.Box(-1, 1, (2,), np.float32)},
     r"its observation is a dict of \['pos', 'vel'\]; .*'observation'.*FlattenObservation"),
    ({"observation": gymnasium.spaces.Box(0, 1, (1,), np.float32), "action_mask": gymnasium.spaces.MultiBinary(2)},
     re.escape("its 'action_mask' is int8; the models take a bool mask: declare it "
               "gymnasium.spaces.Box(0, 1, (2,), bool)")),
], ids=["other-entries", "multibinary-mask"])
def test_a_dict_observation_the_models_cannot_read_is_refused_with_what_to_do(spaces, message):
    """These failed in model building ("standard models read only 'observation' and 'action_mask'", "expected
    bool (2,), got int8(2,)"), saying nothing of what to do."""
    with pytest.raises(UnsupportedEnvError, match=message):
        policy_specs(GymEnv(_dict_env(spaces)).info())


def test_a_dict_observation_with_a_bool_mask_is_read():
    inputs, actions = policy_specs(GymEnv(_dict_env({
        "observation": gymnasium.spaces.Box(0, 1, (1,), np.float32),
        "action_mask": gymnasium.spaces.Box(0, 1, (2,), np.bool_)})).info())
    assert inputs["observation"].shape == (1,) and inputs["action_mask"].dtype == "bool"


def test_a_python_env_module_not_found_says_to_put_it_on_pythonpath(tmp_path, monkeypatch):
    """`league run` found a module in the directory it was started from (its workers run `python -m`), but
    `league eval` of the same run's checkpoint, from the same directory, said only "No module named ..."."""
    from common.envs.registry import make_env

    with pytest.raises(ValueError, match=r"No module named 'no_such_env_module_4821'; .*PYTHONPATH"):
        make_env("python:no_such_env_module_4821:make")
    (tmp_path / "env_needing_a_package.py").write_text("import no_such_dependency_4821\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match="No module named 'no_such_dependency_4821'") as refused:
        make_env("python:env_needing_a_package:make")  # its own import failed: no PYTHONPATH advice
    assert "PYTHONPATH" not in str(refused.value)
