"""Turn-based OpenSpiel games (connect four first) behind the `Env` interface, with reference bots.

The observation is a fixed-shape dict of numpy arrays so it fits shared memory and batches:
`observation` float32 (num_players, *obs_shape), `action_mask` bool (num_players, num_actions) (only the
player to move has legal actions), `to_play` int32 () (-1 once the game is over). `step` takes the action of
the player to move; rewards are float32 (num_players,). Seats given to reference bots are played inside the
env, so the caller only ever sees its own seats' turns. A one-player game (catch, 2048) has no player axis
and a float reward, as every single-player env (common.envs.policy_view), and no win/draw/loss outcome.

Each player's observation ends with one-hot *seat* features (a constant plane per seat for board tensors,
one entry per seat for flat ones). Many OpenSpiel games (connect four, tic-tac-toe) give every player the
same board tensor, so without them a policy could tell which pieces are its own only from the parity of
the piece count: measured here, a connect-four player trained that way beat random only ~89% of the time,
losing mostly as second player. AlphaGo's colour-to-play plane is the same idea.

`perspective="relative"` goes further for the board games listed in `PIECE_PLANES`: each player sees its own
pieces where the first player's pieces are and the opponent's where the second player's are, as
AlphaZero's canonical board does, so a pattern learned from one seat applies to the other. The seat
features stay: moving first or second still matters. Measured on the default connect-four league, it made
no difference beyond noise to the main player against random (93% against 91%; BENCHMARKS.md).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pyspiel
from open_spiel.python.observation import make_observation

from common.envs.base import (
    NO_INFO,
    ArraySpec,
    DiscreteSpec,
    Env,
    EnvInfo,
    EpisodeStats,
    Outcome,
    StepInfo,
    TimeStep,
)
from common.envs.bot_spec import BotSpec

_MAX_SEED = 2**31 - 1  # pyspiel takes seeds as C++ ints
PERSPECTIVES = ("absolute", "relative")
# Games whose observation tensor has one plane of pieces per player, the same for every player: the plane
# index of player 0's pieces and of player 1's (checked against pyspiel in tests/unit/test_env_openspiel.py).
PIECE_PLANES: dict[str, tuple[int, int]] = {"connect_four": (0, 1), "tic_tac_toe": (2, 1)}


def perspective_problem(game: str, perspective: str, game_params: Mapping[str, Any] | None = None) -> str | None:
    """What is wrong with `perspective` for `game` loaded with `game_params` (None: nothing): the env's check, which
    config load makes too."""
    if perspective not in PERSPECTIVES:
        return f"must be one of {', '.join(PERSPECTIVES)}, got {perspective!r}"
    if perspective == "relative" and game not in PIECE_PLANES:
        return (f"'relative' is defined only for {', '.join(sorted(PIECE_PLANES))} (games whose pieces lie in one "
                f"plane per player), not {game!r}")
    if perspective == "relative" and (game_params or {}).get("egocentric_obs_tensor") is True:
        # The game's egocentric tensor gives every player one layout already (the opponent's pieces in plane 0,
        # its own in plane 1): swapped for the second player only, the two players saw the board differently,
        # with no word (a review). (pyspiel takes only a bool for it.)
        return ("'relative' with game_params.egocentric_obs_tensor: the game's egocentric tensor already gives "
                "every player the same layout (the opponent's pieces first, its own next), and 'relative' would swap "
                "it for the second player only; keep one of the two")
    return None


class ReferenceBot:
    """A pyspiel bot bound to one seat.

    pyspiel pitfalls handled here: the MCTS bot segfaults if its evaluator is garbage-collected, so the
    evaluator is kept on this object; the uniform random bot crashes when asked to move for another seat,
    so there is one bot per seat and `act` checks the seat.
    """

    def __init__(self, game: pyspiel.Game, spec: BotSpec, seat: int, seed: int) -> None:
        self.spec = spec
        self.seat = seat
        seed = int(seed) % _MAX_SEED
        if spec.kind == "random":
            self._evaluator = None
            self._bot = pyspiel.make_uniform_random_bot(seat, seed)
        else:
            self._evaluator = pyspiel.RandomRolloutEvaluator(spec.rollouts, seed)
            self._bot = pyspiel.MCTSBot(
                game, self._evaluator, spec.uct_c, spec.num_simulations, spec.max_memory_mb, spec.solve, seed, False
            )

    def act(self, state: pyspiel.State) -> int:
        if state.current_player() != self.seat:
            raise ValueError(f"bot of seat {self.seat} asked to move for player {state.current_player()}")
        return int(self._bot.step(state))

    def restart(self) -> None:
        self._bot.restart()


def parse_bots(bots: Mapping[Any, BotSpec | str] | None, num_players: int) -> dict[int, BotSpec]:
    """Seat -> BotSpec from a mapping whose seats may be ints or digit strings (as from YAML/JSON)."""
    parsed: dict[int, BotSpec] = {}
    for seat, spec in (bots or {}).items():
        try:
            seat_index = int(seat)
        except (TypeError, ValueError):
            raise ValueError(f"bots: seat {seat!r} is not a player index") from None
        if not 0 <= seat_index < num_players:
            raise ValueError(f"bots: seat {seat_index} is out of range for {num_players} players")
        parsed[seat_index] = BotSpec.parse(spec) if isinstance(spec, str) else spec
        if not isinstance(parsed[seat_index], BotSpec):
            raise ValueError(f"bots: seat {seat_index} needs a BotSpec or a string like 'mcts:200', got {spec!r}")
    if len(parsed) == num_players:
        raise ValueError("bots: every seat is a bot, nothing is left for the agent to play")
    return parsed


def outcomes_from_returns(returns: np.ndarray) -> tuple[Outcome, ...]:
    """Win for the unique best return, draw for a shared best, loss for the rest."""
    best = returns.max()
    num_best = int((returns == best).sum())
    return tuple(
        (Outcome.WIN if num_best == 1 else Outcome.DRAW) if r == best else Outcome.LOSS for r in returns
    )


def _typed_params(game: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """`params` with a whole number given for a float parameter made a float (`komi: 7` -> 7.0).

    Why: a job's settings cross the wire as protobuf Structs, whose whole numbers come back as ints
    (common.struct_data), and pyspiel refuses an int for a double parameter ("Wrong type for parameter komi").
    So `komi: 7.0` in a league config made every job fail on the workers, which get their jobs that way."""
    spec = next((t.parameter_specification for t in pyspiel.registered_games() if t.short_name == game), {})
    return {
        name: float(value) if isinstance(spec.get(name), float) and type(value) is int else value
        for name, value in params.items()
    }


def unsupported_game(game: Any) -> str | None:
    """Why OpenSpielEnv cannot play the loaded pyspiel `game` (a phrase after its name), or None. The league
    config asks it too, so that such a game is refused at load rather than in every collect job."""
    game_type = game.get_type()
    if game_type.dynamics != pyspiel.GameType.Dynamics.SEQUENTIAL:
        return "is not sequential-move; only turn-based games are supported"
    if not (game_type.provides_observation_tensor or game_type.provides_information_state_tensor):
        return "provides no observation tensor"
    return None


class OpenSpielEnv(Env):
    """A sequential-move OpenSpiel game, e.g. `OpenSpielEnv("connect_four", bots={1: "mcts:200"})`.

    `perspective`: "absolute" gives every player the game's own tensor; "relative" (games in PIECE_PLANES
    only) shows each player its own pieces in the first player's plane (module docstring)."""

    def __init__(
        self,
        game: str,
        *,
        game_params: Mapping[str, Any] | None = None,
        bots: Mapping[Any, BotSpec | str] | None = None,
        perspective: str = "absolute",
    ) -> None:
        if (problem := perspective_problem(game, perspective, game_params)) is not None:
            raise ValueError(f"OpenSpielEnv: perspective {problem}")
        self._piece_planes = PIECE_PLANES[game] if perspective == "relative" else None
        self._game = pyspiel.load_game(game, _typed_params(game, game_params or {}))
        unsupported = unsupported_game(self._game)
        if unsupported is not None:
            raise ValueError(f"OpenSpielEnv: game {game!r} {unsupported}")
        if self._game.get_type().provides_observation_tensor:
            self._obs_shape = tuple(self._game.observation_tensor_shape())
            self._observe = _tensor_observer(self._game, self._obs_shape)
        else:
            self._obs_shape = tuple(self._game.information_state_tensor_shape())
            self._observe = lambda state, player: state.information_state_tensor(player)
        self._num_players = self._game.num_players()
        self._num_actions = self._game.num_distinct_actions()
        self._raw_shape = self._obs_shape
        self._obs_shape = (self._raw_shape[0] + self._num_players, *self._raw_shape[1:])
        self._seat_features = _seat_features(self._raw_shape, self._num_players)
        self._solo = self._num_players == 1
        players = () if self._solo else (self._num_players,)
        self._info = EnvInfo(
            name=game,
            obs_spec={
                "observation": ArraySpec((*players, *self._obs_shape), np.float32),
                "action_mask": ArraySpec((*players, self._num_actions), np.bool_, minimum=0, maximum=1),
                "to_play": ArraySpec((), np.int32, minimum=-1, maximum=self._num_players - 1),
            },
            action_spec=DiscreteSpec(self._num_actions),
            reward_spec=ArraySpec(players, np.float32),
            num_players=self._num_players,
            channels_first=True,  # (OpenSpiel's tensors are planes first; the seat planes are added as such)
        )
        self._perfect_information = self._game.get_type().information == pyspiel.GameType.Information.PERFECT_INFORMATION
        self._bot_specs = self._fitting_bots(parse_bots(bots, self._num_players))
        self._rng = np.random.default_rng()
        self._pending_seed: int | None = None
        self._bots: dict[int, ReferenceBot] = {}
        self._build_bots()
        self._state: pyspiel.State | None = None
        self._paid = np.zeros(self._num_players, np.float32)
        """Each player's returns at the agent's last move: what its rewards have paid so far."""
        self._episode_length = 0

    @property
    def game(self) -> pyspiel.Game:
        return self._game

    @property
    def state(self) -> pyspiel.State:
        """The current game state (for evaluation code and bots outside the env)."""
        if self._state is None:
            raise RuntimeError("OpenSpielEnv: call reset() first")
        return self._state

    @property
    def has_chance(self) -> bool:
        """The game has chance events (dice, deals): its games differ by the env's seed whoever plays them."""
        return self._game.get_type().chance_mode != pyspiel.GameType.ChanceMode.DETERMINISTIC

    @property
    def perspective(self) -> str:
        return "absolute" if self._piece_planes is None else "relative"

    @property
    def bot_seats(self) -> tuple[int, ...]:
        return tuple(sorted(self._bots))

    def info(self) -> EnvInfo:
        return self._info

    def seed(self, seed: int) -> None:
        self._pending_seed = int(seed)

    def reset(self, *, bots: Mapping[Any, BotSpec | str] | None = None) -> dict[str, np.ndarray]:
        """Start a game; `bots` (seat -> bot) replaces the reference bots from this game on."""
        if bots is not None:
            self._bot_specs = self._fitting_bots(parse_bots(bots, self._num_players))
        if self._pending_seed is not None:
            self._rng = np.random.default_rng(self._pending_seed)
            self._pending_seed = None
            self._build_bots()
        elif bots is not None:
            self._build_bots()
        # (The new bots are built once, after the seed: building the previous ones first drew from the seeded
        # generator as many times as the env had bots before, so a reused env's games depended on its last job.)
        for bot in self._bots.values():
            bot.restart()
        self._state = self._game.new_initial_state()
        self._paid = np.zeros(self._num_players, np.float32)
        self._episode_length = 0
        # What chance and bot seats earn before the agent's first move is paid with its first step's reward.
        self._advance()
        return self._observation()

    def step(self, action: Any) -> TimeStep:
        state = self.state
        if state.is_terminal():
            raise RuntimeError("OpenSpielEnv: step() after the game ended; call reset()")
        player = state.current_player()
        action = _action_index(action)
        if not (0 <= action < self._num_actions and state.legal_actions_mask(player)[action]):
            raise ValueError(f"action {action} is illegal for player {player}; legal: {state.legal_actions(player)}")
        state.apply_action(action)
        self._advance()
        # A step's reward is what the game's returns (each player's total so far) grew by since the agent's last
        # move: summing `state.rewards()` after each transition counted twice what some games (2048, hanabi)
        # report again after the chance node that follows a move.
        returns = np.asarray(state.returns(), np.float32)
        reward, self._paid = returns - self._paid, returns
        self._episode_length += 1
        info = NO_INFO
        if self._solo:
            if state.is_terminal():
                info = StepInfo(episode=EpisodeStats(float(returns[0]), self._episode_length))
            return TimeStep(self._observation(), float(reward[0]), state.is_terminal(), False, info)
        if state.is_terminal():
            info = StepInfo(
                episode=EpisodeStats(returns.copy(), self._episode_length),
                outcome=outcomes_from_returns(returns),
            )
        return TimeStep(self._observation(), reward, state.is_terminal(), False, info)

    def close(self) -> None:
        self._bots = {}
        self._state = None

    def _fitting_bots(self, specs: dict[int, BotSpec]) -> dict[int, BotSpec]:
        """`specs`, once every bot fits the game: pyspiel's MCTS searches the true state, so in a game of imperfect
        information (poker, hanabi, liar's dice) it would see the other players' hidden cards and dice and play
        as no player can: a cheating opponent, and a reference scale that means nothing."""
        if not self._perfect_information:
            for seat, spec in sorted(specs.items()):
                if spec.kind == "mcts":
                    raise ValueError(
                        f"bots: seat {seat}'s {spec.text!r} bot cannot play {self._game.get_type().short_name!r}, a "
                        "game of imperfect information: pyspiel's MCTS searches the true state, so it would see the "
                        "other players' hidden information; use 'random' there")
        return specs

    def _build_bots(self) -> None:
        self._bots = {
            seat: ReferenceBot(self._game, spec, seat, int(self._rng.integers(_MAX_SEED)))
            for seat, spec in sorted(self._bot_specs.items())
        }

    def _advance(self) -> None:
        """Play chance nodes and bot seats until an agent seat is to move or the game ends."""
        state = self._state
        while not state.is_terminal():
            if state.is_chance_node():
                actions, probs = zip(*state.chance_outcomes(), strict=True)
                state.apply_action(int(self._rng.choice(actions, p=probs)))
            elif state.current_player() in self._bots:
                state.apply_action(self._bots[state.current_player()].act(state))
            else:
                return

    def observation_of(self, state: pyspiel.State) -> dict[str, np.ndarray]:
        """The observation the env gives at `state`, a state of this env's game that need not be its own: what a
        search over the game's states (actor_service.search) shows the policy at the positions it imagines."""
        return self._observation_of(state)

    def _observation(self) -> dict[str, np.ndarray]:
        return self._observation_of(self._state)

    def _observation_of(self, state: pyspiel.State) -> dict[str, np.ndarray]:
        observation = np.empty((self._num_players, *self._obs_shape), np.float32)
        raw = self._raw_shape[0]
        for player in range(self._num_players):
            observation[player, :raw] = np.reshape(self._observe(state, player), self._raw_shape)
            observation[player, raw:] = self._seat_features[player]
        if self._piece_planes is not None:  # relative: the second player sees the colours swapped
            first, second = self._piece_planes
            observation[1, [first, second]] = observation[1, [second, first]]
        mask = np.zeros((self._num_players, self._num_actions), np.bool_)
        to_play = -1 if state.is_terminal() else state.current_player()
        if to_play >= 0:
            mask[to_play] = state.legal_actions_mask(to_play)
        if self._solo:
            observation, mask = observation[0], mask[0]
        return {"observation": observation, "action_mask": mask, "to_play": np.array(to_play, np.int32)}


def _action_index(action: Any) -> int:
    """An action as an int: any integer (Python, numpy, a 0-d integer array); a float, bool or string is
    refused rather than truncated (`int(1.7)` plays 1)."""
    if isinstance(action, (bool, np.bool_)):
        raise TypeError(f"action must be an integer, got {action!r} (bool)")
    try:
        return operator.index(action)
    except TypeError:
        raise TypeError(f"action must be an integer, got {action!r} ({type(action).__name__})") from None


_PROBE_CHANCE_LIMIT = 10_000
"""Chance nodes `_tensor_observer` plays through to reach a first move before it gives up its check."""


def _tensor_observer(game: pyspiel.Game, shape: tuple[int, ...]) -> Callable[[pyspiel.State, int], Any]:
    """`state.observation_tensor(player)`, read through pyspiel's observer buffer where the game has one.

    `observation_tensor` builds a Python list of floats that numpy then converts: ~19 us per player for
    connect four against ~1.6 us for the observer's float32 buffer, which an actor pays twice per env step.
    The returned array is the observer's own buffer, overwritten by the next call: callers copy it at once.
    Falls back to the list where the game has no observer tensor or it differs from `observation_tensor`.
    """
    def as_list(state: pyspiel.State, player: int) -> Any:
        return state.observation_tensor(player)

    observer = make_observation(game)
    size = int(np.prod(shape))
    if observer is None or getattr(observer, "tensor", None) is None or observer.tensor.size != size:
        return as_list
    # The chance nodes before the first move are sampled, not given their first outcome: crazy eights deals again
    # while its upturned card is an eight, and its first outcome is always one, so that probe never ended.
    probe = game.new_initial_state()
    rng = np.random.default_rng(0)
    for _ in range(_PROBE_CHANCE_LIMIT):
        if not probe.is_chance_node():
            break
        actions, probs = zip(*probe.chance_outcomes(), strict=True)
        probe.apply_action(int(rng.choice(actions, p=probs)))
    else:
        return as_list
    observer.set_from(probe, 0)
    if not np.array_equal(observer.tensor, np.asarray(probe.observation_tensor(0), np.float32)):
        return as_list

    def from_observer(state: pyspiel.State, player: int) -> np.ndarray:
        observer.set_from(state, player)
        return observer.tensor

    return from_observer


def _seat_features(raw_shape: tuple[int, ...], num_players: int) -> np.ndarray:
    """(num_players, num_players, *raw_shape[1:]): player p's seat features, ones in row p, zeros elsewhere."""
    features = np.zeros((num_players, num_players, *raw_shape[1:]), np.float32)
    for player in range(num_players):
        features[player, player] = 1.0
    return features
