"""The env value types, config validation and the env registry."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest

from actor_service.envs import EnvManagerConfig, SubprocessEnvManagerConfig
from common.envs import NO_INFO, ArraySpec, DiscreteSpec, EnvSpec, StepInfo, TimeStep, env_factories, make_env
from common.envs.gym_env import GymEnv
from common.envs.openspiel_env import BotSpec, OpenSpielEnv


def test_timestep_keeps_terminated_and_truncated_apart():
    assert TimeStep(None, 0.0, terminated=True, truncated=False).done
    assert TimeStep(None, 0.0, terminated=False, truncated=True).done
    assert not TimeStep(None, 0.0, terminated=False, truncated=False).done
    assert TimeStep(None, 0.0, False, False).info is NO_INFO


def test_values_are_frozen_and_picklable():
    ts = TimeStep(np.zeros(2), 1.0, False, True, StepInfo(failure="x", extra={"a": 1}))
    with pytest.raises(AttributeError):
        ts.reward = 2.0  # type: ignore[misc]
    back = pickle.loads(pickle.dumps(ts))
    assert back.info.failure == "x" and back.info.extra == {"a": 1} and back.truncated


def test_specs_compare_by_layout_not_bounds():
    assert ArraySpec((2, 3), np.float32, minimum=0.0) == ArraySpec([2, 3], "float32", maximum=1.0)
    assert ArraySpec((2,), np.uint8).nbytes == 2
    assert DiscreteSpec(4).shape == ()
    with pytest.raises(ValueError, match="num_values"):
        DiscreteSpec(0)
    with pytest.raises(ValueError, match="shape"):
        ArraySpec((-1,), np.float32)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"episode_num": 0}, "episode_num"),
        ({"episode_num": 2.5}, "episode_num"),
        ({"max_retry": -1}, "max_retry"),
    ],
)
def test_manager_config_names_the_bad_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        EnvManagerConfig(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"num_workers": 0}, "num_workers"),
        ({"num_splits": 0}, "num_splits"),
        ({"wait_num": 0}, "wait_num"),
        ({"timeout": 0}, "timeout"),
        ({"step_timeout": -1.0}, "step_timeout"),
        ({"reset_timeout": 0}, "reset_timeout"),
        ({"close_timeout": -1}, "close_timeout"),
        ({"start_method": "teleport"}, "start_method"),
    ],
)
def test_subprocess_config_names_the_bad_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SubprocessEnvManagerConfig(**kwargs)


def test_default_configs_are_valid():
    assert EnvManagerConfig().episode_num == math.inf
    assert SubprocessEnvManagerConfig().start_method == "spawn"


def test_make_env_maps_names_to_adapters():
    assert isinstance(make_env("connect_four"), OpenSpielEnv)
    tic_tac_toe = make_env("openspiel:tic_tac_toe")
    assert isinstance(tic_tac_toe, OpenSpielEnv) and tic_tac_toe.info().name == "tic_tac_toe"
    cartpole = make_env("CartPole-v1", max_episode_steps=7)
    assert isinstance(cartpole, GymEnv) and cartpole.info().name == "CartPole-v1"
    with pytest.raises(ValueError, match="empty"):
        make_env("")


def test_an_unknown_env_name_says_so_and_points_to_an_openspiel_game_of_that_name():
    with pytest.raises(ValueError, match="env name 'tic_tac_toe': .* use 'openspiel:tic_tac_toe'"):
        make_env("tic_tac_toe")
    with pytest.raises(ValueError, match="env name 'NoSuchEnv-v0': .*doesn't exist") as info:
        make_env("NoSuchEnv-v0")
    assert "openspiel" not in str(info.value)
    with pytest.raises(ValueError, match="version `v9`"):
        make_env("CartPole-v9")


def test_an_unknown_openspiel_game_is_one_line_naming_the_closest_games(capfd):
    """pyspiel's own error lists every registered game (over a hundred lines) in every worker's log."""
    with pytest.raises(ValueError) as info:
        make_env("openspiel:tictactoe")
    message = str(info.value)
    assert message.startswith("env name 'openspiel:tictactoe': OpenSpiel has no game 'tictactoe'; did you mean "
                              "'tic_tac_toe'")
    assert "\n" not in message
    assert "connect_four" not in capfd.readouterr().err  # nor does pyspiel print its list to stderr
    with pytest.raises(ValueError, match="^env name 'openspiel:zzzzzzzz': OpenSpiel has no game 'zzzzzzzz' "):
        make_env("openspiel:zzzzzzzz")


def test_bad_openspiel_game_parameters_are_a_short_value_error():
    with pytest.raises(ValueError, match="^env name 'openspiel:connect_four': Unknown parameter 'foo'") as info:
        make_env("openspiel:connect_four", game_params={"foo": 1})
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="^env name 'connect_four': Wrong type for parameter rows"):
        make_env("connect_four", game_params={"rows": "six"})


def test_a_python_env_is_named_by_its_league_name_and_a_failing_module_by_its_own(tmp_path, monkeypatch):
    """A module whose import fails otherwise than ImportError (a SyntaxError, an error of its own) was a bare
    error naming neither; a gymnasium env of one's own was called by its class name only (a review)."""
    (tmp_path / "broken_envs.py").write_text("raise RuntimeError('simulator not found')\n")
    (tmp_path / "my_envs.py").write_text("import gymnasium\n"
                                         "def walker():\n"
                                         "    return gymnasium.make('CartPole-v1').unwrapped\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match=r"env name 'python:broken_envs:make': importing 'broken_envs' raised "
                                         r"RuntimeError: simulator not found"):
        make_env("python:broken_envs:make")
    assert make_env("python:my_envs:walker").info().name == "python:my_envs:walker"


def test_env_spec_is_a_picklable_factory():
    spec = EnvSpec("connect_four", {"bots": {1: "random"}})
    env = pickle.loads(pickle.dumps(spec))()
    assert env.bot_seats == (1,)
    assert len(env_factories("CartPole-v1", 3)) == 3
    with pytest.raises(ValueError, match="env_num"):
        env_factories("CartPole-v1", 0)


def test_bot_spec_parsing():
    assert BotSpec.parse("random") == BotSpec("random")
    assert BotSpec.parse("mcts:200").num_simulations == 200
    for bad in ("mcts:lots", "random:3", "alphazero"):
        with pytest.raises(ValueError):
            BotSpec.parse(bad)
