"""OpenSpielEnv: connect four with per-player observations, masks, outcomes and reference bots."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from common.envs import DiscreteSpec, Outcome
from common.envs.gymnasium_view import GymnasiumView
from common.envs.openspiel_env import PIECE_PLANES, BotSpec, OpenSpielEnv, outcomes_from_returns
from common.envs.policy_view import player_view, policy_specs


def _first_legal(obs: dict) -> int:
    return int(np.flatnonzero(obs["action_mask"][int(obs["to_play"])])[0])


def _random_game(env: OpenSpielEnv, rng: np.random.Generator) -> list:
    """Play random legal moves to the end; returns every observation and timestep."""
    obs = env.reset()
    trace = [obs]
    while True:
        legal = np.flatnonzero(obs["action_mask"][int(obs["to_play"])])
        ts = env.step(int(rng.choice(legal)))
        trace.append(ts)
        if ts.done:
            return trace
        obs = ts.obs


def test_connect_four_layout():
    env = OpenSpielEnv("connect_four")
    info = env.info()
    assert info.num_players == 2
    assert info.action_spec == DiscreteSpec(7)
    assert info.obs_spec["observation"].shape == (2, 5, 6, 7)
    assert info.obs_spec["action_mask"].shape == (2, 7)
    assert info.reward_spec.shape == (2,)
    obs = env.reset()
    for key, spec in info.obs_spec.items():
        assert obs[key].shape == spec.shape and obs[key].dtype == spec.dtype, key
    assert int(obs["to_play"]) == 0
    assert obs["action_mask"][0].all() and not obs["action_mask"][1].any()


def test_each_player_sees_the_board_and_its_own_seat():
    """Connect four gives both players the same board tensor; the seat planes tell them apart."""
    env = OpenSpielEnv("connect_four")
    obs = env.reset()
    obs = env.step(3).obs
    board = obs["observation"][:, :3]
    assert np.array_equal(board[0], board[1]) and board[0].sum() == 6 * 7  # one plane set per cell
    for seat in (0, 1):
        seat_planes = obs["observation"][seat, 3:]
        assert (seat_planes[seat] == 1).all() and (seat_planes[1 - seat] == 0).all()


@pytest.mark.parametrize("game, first_move, second_move", [("connect_four", 3, 2), ("tic_tac_toe", 4, 0)])
def test_relative_perspective_shows_each_player_its_own_pieces_first(game, first_move, second_move):
    """PIECE_PLANES names the right planes (checked against pyspiel's own tensors), and with
    perspective="relative" the second player sees the first player's view of a colour-swapped board."""
    first_plane, second_plane = PIECE_PLANES[game]
    absolute = OpenSpielEnv(game)
    relative = OpenSpielEnv(game, perspective="relative")
    for env in (absolute, relative):
        env.reset()
        env.step(first_move)
    shape = absolute.game.observation_tensor_shape()
    raw = np.reshape(absolute.state.observation_tensor(0), shape)
    assert raw[first_plane].sum() == 1 and raw[second_plane].sum() == 0  # player 0's one piece
    obs = relative.step(second_move).obs["observation"]
    absolute_obs = absolute.step(second_move).obs["observation"]
    assert np.array_equal(obs[0], absolute_obs[0])  # the first player's view is unchanged
    raw = np.reshape(absolute.state.observation_tensor(1), shape)
    expected = raw.copy()
    expected[[first_plane, second_plane]] = raw[[second_plane, first_plane]]
    assert np.array_equal(obs[1, : shape[0]], expected)
    assert np.array_equal(obs[1, shape[0]:], absolute_obs[1, shape[0]:])  # seat features stay
    own = np.unravel_index(int(np.argmax(obs[1, first_plane])), obs[1, first_plane].shape)
    assert obs[1, first_plane].sum() == 1 and obs[0, second_plane][own] == 1  # player 1's piece, seen by both


def test_relative_perspective_is_refused_where_the_planes_are_unknown():
    with pytest.raises(ValueError, match="perspective 'relative' is defined only for"):
        OpenSpielEnv("kuhn_poker", perspective="relative")
    with pytest.raises(ValueError, match="perspective must be one of"):
        OpenSpielEnv("connect_four", perspective="mine")
    # The game's egocentric tensor gives every player one layout already: 'relative' swapped it for the second
    # player only, without a word (a review).
    with pytest.raises(ValueError, match="'relative' with game_params.egocentric_obs_tensor"):
        OpenSpielEnv("connect_four", perspective="relative", game_params={"egocentric_obs_tensor": True})
    OpenSpielEnv("connect_four", game_params={"egocentric_obs_tensor": True})  # either alone is fine


def test_flat_observations_get_a_one_hot_seat():
    env = OpenSpielEnv("kuhn_poker")
    raw = env.game.information_state_tensor_shape()[0] if not env.game.get_type().provides_observation_tensor \
        else env.game.observation_tensor_shape()[0]
    assert env.info().obs_spec["observation"].shape == (2, raw + 2)
    obs = env.reset()
    assert obs["observation"][0, raw:].tolist() == [1.0, 0.0]
    assert obs["observation"][1, raw:].tolist() == [0.0, 1.0]


def test_players_alternate_and_the_game_ends_with_outcomes():
    env = OpenSpielEnv("connect_four")
    obs = env.reset()
    for _ in range(3):  # player 0 stacks column 0, player 1 column 1: player 0 wins on its 4th move
        obs = env.step(0).obs
        assert int(obs["to_play"]) == 1
        obs = env.step(1).obs
    ts = env.step(0)
    assert ts.terminated and not ts.truncated
    assert ts.reward.dtype == np.float32 and ts.reward.tolist() == [1.0, -1.0]
    assert ts.info.outcome == (Outcome.WIN, Outcome.LOSS)
    assert ts.info.episode.length == 7 and ts.info.episode.episode_return.tolist() == [1.0, -1.0]
    assert int(ts.obs["to_play"]) == -1 and not ts.obs["action_mask"].any()
    with pytest.raises(RuntimeError, match="reset"):
        env.step(0)


@pytest.mark.parametrize("game", ["connect_four", "tic_tac_toe", "kuhn_poker", "leduc_poker"])
def test_observations_are_pyspiels_observation_tensors_through_whole_games(game):
    """The env reads observations through pyspiel's observer buffer (faster than the list); it must give
    exactly `state.observation_tensor(player)`, for every player at every step, chance nodes included."""
    env = OpenSpielEnv(game)
    rng = np.random.default_rng(7)
    raw_shape = tuple(env.game.observation_tensor_shape())
    raw = raw_shape[0]
    for episode in range(5):
        env.seed(episode)
        obs = env.reset()
        while True:
            for player in range(2):
                expected = np.reshape(env.state.observation_tensor(player), raw_shape)
                assert np.array_equal(obs["observation"][player, :raw], expected), (game, player)
            if int(obs["to_play"]) < 0:
                break
            ts = env.step(int(rng.choice(np.flatnonzero(obs["action_mask"][int(obs["to_play"])]))))
            obs = ts.obs


def test_observations_are_per_player():
    env = OpenSpielEnv("connect_four")
    env.reset()
    obs = env.step(3).obs
    assert obs["observation"][:, 0, 0, 3].tolist() == [1.0, 1.0]  # both players see x at the bottom of column 3

    poker = OpenSpielEnv("kuhn_poker")  # chance deals the cards; each player sees only its own
    poker.seed(0)
    obs = poker.reset()
    assert int(obs["to_play"]) == 0
    assert not np.array_equal(obs["observation"][0], obs["observation"][1])


def test_illegal_action_is_refused_with_the_legal_ones():
    env = OpenSpielEnv("connect_four")
    env.reset()
    for _ in range(6):
        env.step(0)  # column 0 is now full
    with pytest.raises(ValueError, match="illegal"):
        env.step(0)
    with pytest.raises(ValueError, match="illegal"):
        env.step(7)


@pytest.mark.parametrize("action", [1.7, "3", True, np.float32(2.0), np.array([2])])
def test_an_action_that_is_no_integer_is_refused_not_truncated(action):
    env = OpenSpielEnv("connect_four")
    env.reset()
    with pytest.raises(TypeError, match="action must be an integer"):
        env.step(action)
    env.step(np.int64(3))  # numpy integers, as policies give them, are fine
    env.step(np.array(4))


def test_a_one_player_game_looks_like_any_single_player_env():
    """No player axis, a float reward, no outcome: what policy_view expects of a one-player env (with the
    axis, a solo league on catch could never build its model)."""
    env = OpenSpielEnv("catch")
    info = env.info()
    specs, action = policy_specs(info)
    assert specs["action_mask"].shape == (3,) and action.num_actions == 3
    obs = env.reset()
    assert obs["observation"].shape == info.obs_spec["observation"].shape == specs["observation"].shape
    view = player_view(obs, 0, info)
    assert {k: v.shape for k, v in view.items()} == {k: s.shape for k, s in specs.items()}
    total = 0.0
    while True:
        ts = env.step(int(np.flatnonzero(obs["action_mask"])[0]))
        assert isinstance(ts.reward, float)
        total += ts.reward
        if ts.done:
            break
        obs = ts.obs
    assert ts.info.episode.episode_return == total and ts.info.outcome is None


@pytest.mark.parametrize(("game", "bots"), [("hanabi", {0: "random"}), ("hanabi", {1: "random"}), ("2048", None),
                                           ("catch", None), ("connect_four", {1: "random"})])
def test_a_games_rewards_add_up_to_its_returns(game, bots):
    """What chance nodes and bot seats earn before the agent's first move (hanabi pays as cards are played)
    was dropped, and summing `rewards()` after every transition counted twice what 2048 and hanabi report
    again after the chance node that follows a move (a 2048 episode's return was exactly twice its score)."""
    paid_before_first_move = 0
    for seed in range(12):
        env = OpenSpielEnv(game, bots=bots)
        env.seed(seed)
        obs = env.reset()
        rng = np.random.default_rng(seed)
        paid = 0.0
        first = None
        while True:
            mask = obs["action_mask"] if env.info().num_players == 1 else obs["action_mask"][int(obs["to_play"])]
            ts = env.step(int(rng.choice(np.flatnonzero(mask))))
            first = ts.reward if first is None else first
            paid = paid + np.asarray(ts.reward)
            if ts.done:
                break
            obs = ts.obs
        returns = np.asarray(env.state.returns(), np.float32)
        np.testing.assert_allclose(paid, returns if env.info().num_players > 1 else returns[0], rtol=0, atol=1e-4)
        np.testing.assert_allclose(ts.info.episode.episode_return,
                                   returns if env.info().num_players > 1 else returns[0], rtol=0, atol=1e-4)
        paid_before_first_move += game == "hanabi" and bots == {0: "random"} and bool(np.any(first))
    if game == "hanabi" and bots == {0: "random"}:
        assert paid_before_first_move > 0  # some games paid something on the agent's first step


def test_seeded_games_repeat():
    def games(seed: int) -> list:
        env = OpenSpielEnv("connect_four", bots={1: "mcts:20"})
        env.seed(seed)
        rng = np.random.default_rng(seed)
        out = []
        for _ in range(2):
            trace = _random_game(env, rng)
            out.append([ts.obs["observation"].tobytes() for ts in trace[1:]])
        return out

    assert games(5) == games(5)


@pytest.mark.parametrize(("game", "before", "after"), [
    ("connect_four", {0: "random"}, {1: "random"}),
    ("connect_four", {}, {0: "mcts:5"}),
    ("leduc_poker", {1: "random"}, {}),  # chance nodes (the deals) draw from the seeded generator too
])
def test_a_reused_env_seeded_again_repeats_a_fresh_ones_games(game, before, after):
    """The actor reuses its envs from job to job: seed(s) and reset(bots=...) must play what a fresh env seeded
    s plays with those bots. Before, the previous job's bots were built first from the new seed's generator."""
    def games(env: OpenSpielEnv) -> list:
        env.seed(11)
        obs = env.reset(bots=after)
        rng = np.random.default_rng(3)
        out = [env.state.history()]
        for _ in range(3):
            while True:
                legal = np.flatnonzero(obs["action_mask"][int(obs["to_play"])])
                ts = env.step(int(rng.choice(legal)))
                if ts.done:
                    break
                obs = ts.obs
            out.append(env.state.history())
            obs = env.reset()
        return out

    fresh = games(OpenSpielEnv(game))
    reused = OpenSpielEnv(game, bots=before)
    reused.seed(5)
    reused.reset()
    assert games(reused) == fresh


def test_bot_seats_are_played_inside_the_env():
    env = OpenSpielEnv("connect_four", bots={0: "random"})
    env.seed(0)
    obs = env.reset()
    assert int(obs["to_play"]) == 1  # the bot at seat 0 has already moved
    assert env.state.move_number() == 1
    rng = np.random.default_rng(0)
    for _ in range(5):
        for ts in _random_game(env, rng)[1:]:
            assert int(ts.obs["to_play"]) in (1, -1)
        assert ts.info.outcome is not None


def test_mcts_bot_beats_random_play():
    env = OpenSpielEnv("connect_four", bots={1: BotSpec("mcts", num_simulations=50)})
    env.seed(1)
    rng = np.random.default_rng(1)
    outcomes = [_random_game(env, rng)[-1].info.outcome[1] for _ in range(6)]
    assert outcomes.count(Outcome.WIN) >= 5  # MCTS50 beats random ~100% of the time on these machines


def test_reset_can_change_the_opponent():
    env = OpenSpielEnv("connect_four")
    assert int(env.reset(bots={0: "random"})["to_play"]) == 1
    assert env.bot_seats == (0,)
    assert int(env.reset(bots={})["to_play"]) == 0


@pytest.mark.parametrize("bots", [{0: "random", 1: "random"}, {2: "random"}, {"x": "random"}, {1: 3}])
def test_bad_bot_seats_are_refused(bots):
    with pytest.raises(ValueError, match="bots"):
        OpenSpielEnv("connect_four", bots=bots)


@pytest.mark.parametrize("game", ["kuhn_poker", "leduc_poker", "liars_dice"])
def test_an_mcts_bot_is_refused_in_a_game_of_imperfect_information(game):
    """pyspiel's MCTS searches the true state: in kuhn poker it called a bet whenever the bettor held the jack
    and folded whenever it held the king, though it cannot see that card. Such a bot is refused, at build
    and at reset (where actors seat a league's reference bots); random play is not."""
    with pytest.raises(ValueError, match="imperfect information"):
        OpenSpielEnv(game, bots={1: "mcts:10"})
    env = OpenSpielEnv(game, bots={1: "random"})
    with pytest.raises(ValueError, match="imperfect information"):
        env.reset(bots={0: "mcts:10"})
    assert env.bot_seats == (1,) and int(env.reset()["to_play"]) == 0
    assert OpenSpielEnv("tic_tac_toe", bots={1: "mcts:10"}).bot_seats == (1,)  # perfect information: allowed


def test_yaml_style_seats_are_accepted():
    assert OpenSpielEnv("connect_four", bots={"1": "mcts:10"}).bot_seats == (1,)


def test_outcomes_from_returns():
    assert outcomes_from_returns(np.array([0.0, 0.0])) == (Outcome.DRAW, Outcome.DRAW)
    assert outcomes_from_returns(np.array([-1.0, 1.0])) == (Outcome.LOSS, Outcome.WIN)


def test_simultaneous_games_are_refused():
    with pytest.raises(ValueError, match="sequential"):
        OpenSpielEnv("matrix_rps")


@pytest.mark.parametrize("bots", [None, {1: "random"}])
def test_gymnasium_env_checker_passes(bots):
    view = GymnasiumView(OpenSpielEnv("connect_four", bots=bots))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(view, skip_render_check=True)
    assert [str(w.message) for w in caught if "infinity" not in str(w.message)] == []
    obs, _ = view.reset(seed=0)
    _, reward, *_ = view.step(_first_legal(obs))
    assert isinstance(reward, float)


def test_a_whole_number_for_a_float_game_parameter_is_taken_as_a_float():
    """Job settings reach the workers through a protobuf Struct, which turns 7.0 into 7; pyspiel refuses an
    int for go's float `komi`, so every job of such a league failed on its actors and learners."""
    from google.protobuf import struct_pb2

    from common.struct_data import struct_to_dict

    sent = struct_pb2.Struct()
    sent.update({"game_params": {"komi": 7.0, "board_size": 9}})
    received = struct_to_dict(sent)["game_params"]
    assert received == {"komi": 7, "board_size": 9} and type(received["komi"]) is int
    env = OpenSpielEnv("go", game_params=received)
    params = env._game.get_parameters()
    assert params["komi"] == 7.0 and params["board_size"] == 9
    env.close()


@pytest.mark.timeout(120)
def test_a_game_that_deals_again_on_some_chance_outcomes_builds():
    """Building the env probed a first position by giving every chance node its first outcome; crazy eights
    deals again while its upturned card is an eight, which that outcome always was: OpenSpielEnv("crazy_eights")
    never returned (a learner hung setting up its player, an actor's envs until their reset timeout)."""
    env = OpenSpielEnv("crazy_eights")  # five players (with two, the first outcomes turn up no eight)
    env.seed(0)
    trace = _random_game(env, np.random.default_rng(0))
    assert trace[0]["observation"].shape == env.info().obs_spec["observation"].shape
    assert trace[-1].info.outcome is not None
