"""Search at play time over a policy's own action probabilities and value (AlphaZero's PUCT): `league eval
--search N`.

Why: the greedy policy plays each move from one look at the position. In connect four the league's main player
leaves threats unblocked in positions its league opponents rarely lead to (BENCHMARKS.md, #6). A search of N
simulations looks ahead where the policy itself expects the game to go, and reads wins and losses from the
game's own final positions, for N forward passes of the network a move.

Each simulation walks down from the root, taking at every position the move with the largest
``Q + c_puct * P * sqrt(visits) / (1 + n)``: Q the mean value of the move for the player making it (0 before its
first visit), P the policy's probability of it, n its visits. At the first position not yet searched it stops:
a final position is scored with the game's returns, any other is shown to the network once, for its move
probabilities (the priors of its own moves later) and its value; that value is backed up the path, negated for
the other player's moves. The move played is the root's most visited (of equals, the better mean value, then the
more probable). There is no noise and no sampling: the same weights and position give the same move.

Two departures from AlphaZero, both for a policy's blind spots: the root tries every move once before the
priors steer (PUCT alone never visits a move the policy gives ~0 probability, however bad the alternatives), and
a position is first checked for a move that wins at once, which the rules know without the network: the
position is then a win for its mover and that move is the one taken there. A move after which the opponent
wins at once is known lost and not taken while another is not. From as many simulations as there are moves on,
the search takes every immediate win and blocks every single immediate threat, whatever the policy's priors.

Scope: two-player zero-sum deterministic games of perfect information (connect four, tic-tac-toe, ...) played
through `OpenSpielEnv`, whose true game state the search copies and moves on; and policies that give a
probability to every move and a value (feed-forward PPO). Anything else is refused with the reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pyspiel

from common.computation.computation_task import ComputationTask
from common.envs.base import Env
from common.envs.bot_spec import MAX_SIMULATIONS
from common.envs.openspiel_env import OpenSpielEnv
from common.envs.policy_view import player_view


@dataclass(frozen=True)
class SearchConfig:
    """`simulations`: positions the search evaluates a move (AlphaZero played with 800). `c_puct`: how much the
    policy's probabilities weigh against the values found so far (AlphaZero's 1.25)."""

    simulations: int
    c_puct: float = 1.25

    def __post_init__(self) -> None:
        # (The MCTS bots' bound: the tree grows by a position a simulation; 10^8 grew by gigabytes for minutes
        # before the first move, a review.)
        if not 1 <= self.simulations <= MAX_SIMULATIONS:
            raise ValueError(f"search simulations must be within [1, {MAX_SIMULATIONS:,}], got {self.simulations}")
        if not (math.isfinite(self.c_puct) and self.c_puct > 0):
            raise ValueError(f"search c_puct must be a finite number > 0, got {self.c_puct}")


def unsearchable(env: Env) -> str | None:
    """Why the search cannot play `env`'s game (a phrase after the game's name), or None."""
    if not isinstance(env, OpenSpielEnv):
        return "is not an OpenSpiel game: the search moves copies of the game's own state"
    game_type = env.game.get_type()
    if env.game.num_players() != 2:
        return f"has {env.game.num_players()} players; the search plays two-player games"
    if game_type.utility != pyspiel.GameType.Utility.ZERO_SUM:
        return "is not zero-sum: the search takes one player's value as the other's loss"
    if game_type.chance_mode != pyspiel.GameType.ChanceMode.DETERMINISTIC:
        return "has chance events, which the search does not sample"
    if game_type.information != pyspiel.GameType.Information.PERFECT_INFORMATION:
        return "hides information from the players: a search of the true state would see it"
    return None


class _Node:
    """A position the search has evaluated: its mover's legal moves with their priors, visits and value sums (from
    the mover's side), and the positions after them (None until first taken)."""

    __slots__ = ("state", "player", "value", "returns", "actions", "priors", "visits", "value_sums", "children",
                 "winning", "lost")

    def __init__(self, state: pyspiel.State) -> None:
        self.state = state
        self.player = -1
        self.value = 0.0
        """The network's value of the position for `player`."""
        self.returns: np.ndarray | None = None
        """Every player's returns, at a final position."""
        self.actions = np.zeros(0, np.int64)
        self.priors = np.zeros(0)
        self.visits = np.zeros(0)
        self.value_sums = np.zeros(0)
        self.children: list[_Node | None] = []
        self.winning: int | None = None
        """The index of a move that wins at once: the position's value is then known, and that move is taken."""
        self.lost = np.zeros(0, np.bool_)
        """The moves known to lose: they end the game lost, or the opponent wins at once after them."""

    def value_for(self, player: int) -> float:
        if self.returns is not None:
            return float(self.returns[player])
        return self.value if player == self.player else -self.value


def _open(node: _Node) -> np.ndarray:
    """The moves the search may take at `node`: those not known lost, or all of them if every one is."""
    return ~node.lost if not node.lost.all() else np.ones_like(node.lost)


def _mean_values(node: _Node) -> np.ndarray:
    """Each move's mean value for the mover so far (0 before its first visit)."""
    return np.divide(node.value_sums, node.visits, out=np.zeros_like(node.value_sums), where=node.visits > 0)


class PolicySearch:
    """Chooses moves for `task` in `env`'s game by PUCT search (module docstring); ValueError when the game or the
    policy cannot be searched."""

    def __init__(self, task: ComputationTask, env: Env, config: SearchConfig) -> None:
        reason = unsearchable(env)
        if reason is not None:
            raise ValueError(f"search: game {env.info().name!r} {reason}")
        assert isinstance(env, OpenSpielEnv)
        self._task = task
        self._env = env
        self._info = env.info()
        self._best_return = env.game.max_utility()
        self._worst_return = env.game.min_utility()
        self.config = config
        self.evaluations = 0
        """Positions shown to the network so far (the search's cost)."""
        try:  # asked once here, so that a policy with no probabilities is refused before any game starts
            self._expand(env.game.new_initial_state())
        except NotImplementedError as err:
            raise ValueError(f"search: {err}") from None
        self.evaluations = 0

    def choose(self, state: pyspiel.State) -> int:
        """The move to play at `state` (its current player's); `state` itself is not changed."""
        if state.is_terminal() or state.current_player() < 0:
            raise ValueError("search: the game is over or no player is to move")
        root = self._expand(state.clone())
        if root.winning is not None:
            return int(root.actions[root.winning])
        if len(root.actions) == 1:
            return int(root.actions[0])
        for _ in range(self.config.simulations):
            self._simulate(root)
        # Most visits, then the best mean value, then the highest prior; a move known lost only if all are.
        order, open_moves = np.lexsort((root.priors, _mean_values(root), root.visits)), _open(root)
        return int(root.actions[[i for i in order if open_moves[i]][-1]])

    def _simulate(self, root: _Node) -> None:
        path: list[tuple[_Node, int]] = []
        node = root
        while True:
            index = self._select(node, node is root)
            path.append((node, index))
            child = node.children[index]
            if child is None:
                state = node.state.clone()
                state.apply_action(int(node.actions[index]))
                child = node.children[index] = self._expand(state)
                # The opponent wins at once after it: lost for the mover, never taken while another move is not.
                node.lost[index] = child.winning is not None and child.player != node.player
                break
            if child.returns is not None:
                break
            node = child
        for parent, index in path:
            parent.visits[index] += 1
            parent.value_sums[index] += child.value_for(parent.player)

    def _select(self, node: _Node, root: bool) -> int:
        if node.winning is not None:
            return node.winning
        visits, open_moves = node.visits, _open(node)
        unvisited = (visits == 0) & open_moves
        if root and unvisited.any():  # every move once: a blind spot of the policy (prior ~0) is looked at
            return int(np.flatnonzero(unvisited)[np.argmax(node.priors[unvisited])])
        u = self.config.c_puct * node.priors * math.sqrt(max(visits.sum(), 1.0)) / (1.0 + visits)
        return int(np.argmax(np.where(open_moves, _mean_values(node) + u, -np.inf)))

    def _expand(self, state: pyspiel.State) -> _Node:
        node = _Node(state)
        if state.is_terminal():
            node.returns = np.asarray(state.returns(), np.float64)
            return node
        player = state.current_player()
        actions = np.asarray(state.legal_actions(player), np.int64)
        node.player = player
        node.actions = actions
        node.children = [None] * len(actions)
        node.visits = np.zeros(len(actions))
        node.value_sums = np.zeros(len(actions))
        node.lost = np.zeros(len(actions), np.bool_)
        for index, action in enumerate(actions):  # the rules, before the network: a move that wins at once
            after = state.clone()
            after.apply_action(int(action))
            if after.is_terminal():
                child = node.children[index] = self._expand(after)
                node.lost[index] = child.returns[player] <= self._worst_return
                if child.returns[player] >= self._best_return:
                    node.winning = index
                    node.value = self._best_return
                    return node
        view = player_view(self._env.observation_of(state), player, self._info)
        probs, values = self._task.policy_and_value({name: array[None] for name, array in view.items()})
        self.evaluations += 1
        priors = np.asarray(probs[0], np.float64)[actions]
        total = priors.sum()
        node.value = float(values[0])
        node.priors = priors / total if total > 0 else np.full(len(actions), 1.0 / len(actions))
        return node
