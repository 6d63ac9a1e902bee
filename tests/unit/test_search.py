"""Play-time search (actor_service.search): it takes wins and blocks threats that a policy with no knowledge
misses, leaves the position it is given alone, plays the same move every time, and refuses games and policies it
cannot search with the reason."""

from __future__ import annotations

import numpy as np
import pytest

from actor_service.evaluation import play_against_bot
from actor_service.search import PolicySearch, SearchConfig, unsearchable
from common.algorithms.registry import make_computation_task
from common.envs.policy_view import player_view, policy_specs
from common.envs.registry import make_env

PPO = {"algorithm": "ppo", "model": {"conv": [[8, 3, 1]], "hidden": [32]}}


def task_for(env, policy=PPO, seed=0):
    inputs, actions = policy_specs(env.info(), policy["algorithm"])
    return make_computation_task(policy, inputs, actions, "cpu", seed)


@pytest.fixture
def connect_four():
    env = make_env("connect_four")
    yield env
    env.close()


def position(env, moves):
    state = env.game.new_initial_state()
    for move in moves:
        state.apply_action(move)
    return state


def favour_column(task, column):
    """The policy's weights changed so that it plays `column` whenever it may (a policy with a blind spot)."""
    weights = task.get_weights()
    weights["policy_head.bias"] = weights["policy_head.bias"].copy()
    weights["policy_head.bias"][column] = 20.0
    task.set_weights(weights, 1)


def greedy_move(task, env, state):
    view = player_view(env.observation_of(state), state.current_player(), env.info())
    return int(task.predict({k: v[None] for k, v in view.items()}, forward_kwargs={"greedy": True}).actions["action"][0])


@pytest.mark.parametrize("simulations", [7, 8, 15, 100])
def test_takes_a_win_and_blocks_a_threat_the_policy_would_miss(connect_four, simulations):
    """From as many simulations as there are moves: a move after which the opponent wins at once is known lost
    (a reviewer found the search playing it on up to 15 simulations, its prior pulling the visits there)."""
    task = task_for(connect_four)
    favour_column(task, 3)
    search = PolicySearch(task, connect_four, SearchConfig(simulations))
    win = position(connect_four, [0, 6, 0, 6, 0, 5])  # first player: three in column 0, to move
    threat = position(connect_four, [0, 6, 0, 6, 0])  # second player: must play column 0
    assert greedy_move(task, connect_four, win) == 3 and greedy_move(task, connect_four, threat) == 3
    assert search.choose(win) == 0
    assert search.choose(threat) == 0


def test_leaves_the_state_alone_and_chooses_the_same_move_every_time(connect_four):
    search = PolicySearch(task_for(connect_four), connect_four, SearchConfig(30))
    state = position(connect_four, [3, 3, 2])
    before = str(state)
    moves = {search.choose(state) for _ in range(3)}
    assert len(moves) == 1 and str(state) == before
    # At most the root and one new position a simulation (none for a position the rules decide), the same each time.
    assert search.evaluations % 3 == 0 and 3 < search.evaluations <= 3 * 31


def test_a_forced_move_is_played_without_searching():
    env = make_env("openspiel:tic_tac_toe")
    search = PolicySearch(task_for(env), env, SearchConfig(50))
    state = position(env, [0, 1, 2, 4, 3, 5, 7, 6])  # one empty square left: 8
    assert search.choose(state) == 8 and search.evaluations == 1


def test_refuses_a_finished_game(connect_four):
    search = PolicySearch(task_for(connect_four), connect_four, SearchConfig(5))
    with pytest.raises(ValueError, match="the game is over"):
        search.choose(position(connect_four, [0, 1, 0, 1, 0, 1, 0]))


@pytest.mark.parametrize(("env_name", "reason"), [
    ("CartPole-v1", "is not an OpenSpiel game"),
    ("openspiel:pig", "has chance events"),
    ("openspiel:kuhn_poker", "has chance events"),
    ("openspiel:catch", "has 1 players"),
])
def test_refuses_games_it_cannot_search(env_name, reason):
    env = make_env(env_name)
    try:
        assert reason in unsearchable(env)
        with pytest.raises(ValueError, match=reason):
            PolicySearch(task_for(env), env, SearchConfig(5))
    finally:
        env.close()


@pytest.mark.parametrize(("policy", "reason"), [
    ({"algorithm": "dqn", "model": PPO["model"]}, "DQN has no action probabilities"),
    ({"algorithm": "ppo", "model": {**PPO["model"], "recurrent": "gru"}}, "a recurrent policy"),
])
def test_refuses_policies_without_probabilities_and_value(connect_four, policy, reason):
    with pytest.raises(ValueError, match=reason):
        PolicySearch(task_for(connect_four, policy), connect_four, SearchConfig(5))


@pytest.mark.parametrize(("simulations", "c_puct"), [(0, 1.25), (10, 0.0), (10, float("nan"))])
def test_config_refuses_bad_numbers(simulations, c_puct):
    with pytest.raises(ValueError, match="search"):
        SearchConfig(simulations, c_puct)


def test_evaluation_with_search_beats_the_policy_alone(connect_four):
    task = task_for(connect_four)
    favour_column(task, 3)  # alone it plays column 3 until it is full: random blocks it often enough
    alone = play_against_bot(task, "connect_four", {}, "random", games=10, seed=3)
    searched = play_against_bot(task, "connect_four", {}, "random", games=10, seed=3, search=SearchConfig(40))
    assert alone.search == 0 and searched.search == 40 and searched.to_dict()["search"] == 40
    assert searched.wins > alone.wins and searched.wins >= 9


def test_observation_of_a_state_is_what_the_env_shows_there(connect_four):
    obs = connect_four.reset()
    for move in (3, 2, 3):
        obs = connect_four.step(move).obs
    imagined = connect_four.observation_of(connect_four.state.clone())
    assert set(imagined) == set(obs)
    for name in obs:
        np.testing.assert_array_equal(imagined[name], obs[name])


def test_the_searched_value_is_in_the_games_units_whatever_the_reward_scale(connect_four):
    """PPO's value head learns returns of rewards times reward_scale; the search compares values with the game's
    final scores (+-1), so `policy_and_value` gives them back in the env's units."""
    scaled = {**PPO, "ppo": {"reward_scale": 4.0}}
    plain, four = task_for(connect_four), task_for(connect_four, scaled)
    four.set_weights(plain.get_weights(), 0)
    view = player_view(connect_four.observation_of(position(connect_four, [3])), 1, connect_four.info())
    batch = {k: v[None] for k, v in view.items()}
    (probs, value), (probs4, value4) = plain.policy_and_value(batch), four.policy_and_value(batch)
    np.testing.assert_allclose(probs4, probs)
    np.testing.assert_allclose(value4 * 4.0, value, rtol=1e-6)
    assert probs.shape == (1, 7) and probs[0].sum() == pytest.approx(1.0)
