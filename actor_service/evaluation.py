"""Playing a published checkpoint against OpenSpiel reference bots, or alone in a single-player env (what
`league eval` runs).

The checkpoint is loaded through the checkpoint store (digest verified, unpickled with weights_only) from a path
relative to the shared root, or from an absolute path that must lie inside a shared root (when no root is given
the root is taken to be the checkpoint's grandparent: ``<root>/<player_id>/v<version>.pt``, or the parent of a
player's folder ``<root>/<player_id>``, which a missing path not ending in ``.pt`` is taken to be). The network
is built from the league config's ``policy`` section and the env's specs, exactly as actors and learners build
it. Seats alternate game by game; the policy acts greedily (its most likely legal move), or plays the moves of a
search over its probabilities and value (actor_service.search).
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from actor_service.search import PolicySearch, SearchConfig
from common.algorithms.registry import make_computation_task
from common.checkpoint_store import LATEST, MANIFEST_SUFFIX, CheckpointError, CheckpointRef, CheckpointStore
from common.computation.algorithm import ForwardKwargs
from common.computation.computation_task import ComputationTask
from common.envs.base import DiscreteSpec, EnvInfo, Outcome
from common.envs.bot_spec import REFERENCE_BOT_PREFIX
from common.envs.policy_view import ACTION_MASK, env_action, player_view, policy_specs, to_play
from common.envs.registry import make_env
from common.policy_config import as_published


def win_rate_interval(wins: int, games: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval (95% by default) of a win rate of `wins` in `games`: how far a score on this
    many games can be from the player's true rate (near 95%: about +-4 points on 100 games, +-1.4 on 1,000).
    Wilson's, not the normal approximation, because the rates that matter here are near 0 or 1."""
    if games <= 0:
        return 0.0, 1.0
    p = wins / games
    denom = 1 + z * z / games
    centre = (p + z * z / (2 * games)) / denom
    half = z * math.sqrt(p * (1 - p) / games + z * z / (4 * games * games)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(frozen=True)
class SeatTally:
    seat: int
    games: int
    wins: int
    draws: int
    losses: int

    @property
    def win_rate(self) -> float:
        return self.wins / self.games if self.games else 0.0

    @property
    def win_rate_interval(self) -> tuple[float, float]:
        return win_rate_interval(self.wins, self.games)

    @property
    def score(self) -> float:
        return game_score(self.wins, self.draws, self.games)


def game_score(wins: int, draws: int, games: int) -> float:
    """Wins plus half the draws, per game: what the league's payoff counts (`league status`, PFSP). The win rate
    alone took a tic-tac-toe player that never lost (3 wins, 7 draws) for one beaten 70% of the time."""
    return (wins + draws / 2) / games if games else 0.0


@dataclass(frozen=True)
class EvalResult:
    opponent: str
    seats: tuple[SeatTally, ...]
    mean_length: float
    search: int = 0
    """Simulations of the search the agent played with a move (0: the policy's own greedy moves)."""

    @property
    def games(self) -> int:
        return sum(s.games for s in self.seats)

    @property
    def wins(self) -> int:
        return sum(s.wins for s in self.seats)

    @property
    def draws(self) -> int:
        return sum(s.draws for s in self.seats)

    @property
    def losses(self) -> int:
        return sum(s.losses for s in self.seats)

    @property
    def win_rate(self) -> float:
        return self.wins / self.games if self.games else 0.0

    @property
    def win_rate_interval(self) -> tuple[float, float]:
        """The 95% interval of the win rate (`win_rate_interval`)."""
        return win_rate_interval(self.wins, self.games)

    @property
    def score(self) -> float:
        """Wins plus half the draws, per game (`game_score`)."""
        return game_score(self.wins, self.draws, self.games)

    def to_dict(self) -> dict[str, Any]:
        return {
            "opponent": self.opponent, "games": self.games, "wins": self.wins, "draws": self.draws,
            "losses": self.losses, "win_rate": self.win_rate, "win_rate_95": list(self.win_rate_interval),
            "score": self.score, "mean_length": self.mean_length, "search": self.search,
            "by_seat": [{**asdict(s), "win_rate": s.win_rate, "win_rate_95": list(s.win_rate_interval),
                         "score": s.score} for s in self.seats],
        }


def play_against_bot(
    task: ComputationTask,
    env_name: str,
    env_kwargs: Mapping[str, Any],
    opponent: str,
    games: int,
    seed: int = 0,
    greedy: bool = True,
    on_game: Callable[[int, int], None] | None = None,
    search: SearchConfig | None = None,
) -> EvalResult:
    """`games` games of `task` against the bot `opponent` ("random", "mcts:N"), the agent's seat alternating.
    `on_game(games played, games won)` after each game (progress: a strong bot takes seconds a game). With
    `search` the agent plays the moves of a search over its policy and value (actor_service.search) instead of
    the policy's own."""
    return _play_games(task, env_name, env_kwargs, games, seed, opponent, _Opponent(bot=opponent),
                       ForwardKwargs(greedy=greedy), on_game, search)


def play_against_policy(
    task: ComputationTask,
    opponent_task: ComputationTask,
    env_name: str,
    env_kwargs: Mapping[str, Any],
    games: int,
    seed: int = 0,
    opponent: str = "policy",
    on_game: Callable[[int, int], None] | None = None,
    search: SearchConfig | None = None,
    opening: int = 0,
) -> EvalResult:
    """`games` games of `task` against another policy, `opponent_task` (named `opponent` in the result), the
    agent's seat alternating. Both sample their moves from their policies, as the league's own matches are played:
    two greedy policies in a game without chance would play the same two games over and over. With `search` the
    agent plays the moves of a search instead (the opponent still samples). The first `opening` moves of every
    game (both players') are uniformly random legal ones: distinct games where neither player samples (a DQN's
    moves, a search's), which is refused without an opening."""
    if opening < 0:
        raise ValueError(f"opening must be >= 0, got {opening}")
    return _play_games(task, env_name, env_kwargs, games, seed, opponent, _Opponent(task=opponent_task),
                       ForwardKwargs(), on_game, search, opening)


def game_seeds(seed: int, game: int) -> tuple[int, int]:
    """Two seeds for game `game` of an evaluation seeded `seed` (the env's, the opening's), mixed from both
    numbers: with `seed + game`, --seed 1 replayed games 1, 2, ... of --seed 0, and runs meant to add games
    re-counted the same ones."""
    env_seed, opening_seed = np.random.SeedSequence([seed, game]).generate_state(2)
    return int(env_seed), int(opening_seed)


def _seeded_reset(env: Any, seed: int, bots: Mapping[int, str]) -> Any:
    env.seed(seed)
    return env.reset(bots=bots)


MAX_OPENING_DRAWS = 100
"""Openings drawn for one game before giving up: each one that ends the game is drawn again."""


OPENINGS_PER_GAME = 4
"""Between two players that do not sample, a game is its seat and its opening: the openings a seat can draw must
outnumber its games this many times, or many of the games repeat (as a sample, 4x leaves ~90% distinct)."""


OPENING_WALK_POSITIONS = 100_000
"""Positions one depth of the opening count walks at most: past it, that depth and deeper count as enough."""


def _check_openings(info: EnvInfo, game: Any, opening: int, games: int, seats: int) -> None:
    """Refuse an opening too short to make the games asked for mostly distinct: `--opening 1` on connect four has
    7 openings a seat, so 1,000 games were 14 games replayed, under an interval for 1,000 (a review). Counted as
    the distinct positions the opening's legal moves reach: the number of distinct actions to the power of its
    length passed othello's 2-move openings as 4,225 a seat, where 12 exist (a review)."""
    actions = info.action_spec.num_values if isinstance(info.action_spec, DiscreteSpec) else None
    if actions is None or actions < 2:
        return
    games_a_seat = -(-games // seats)
    wanted = OPENINGS_PER_GAME * games_a_seat
    if game is not None:
        counts = _opening_positions(game, wanted, game.max_game_length() - 1)
    else:  # (no game tree to walk: at most the distinct actions to the power of its length, without big numbers)
        depth = math.ceil(math.log(wanted) / math.log(actions)) + 1  # (one past where the power reaches `wanted`)
        counts = [min(actions ** d, wanted) for d in range(depth + 1)]
    count = counts[min(opening, len(counts) - 1)]
    if count >= wanted:
        return
    enough = next((d for d in range(opening + 1, len(counts)) if counts[d] >= wanted), None)
    advice = (f"give --opening {enough} or more, or fewer --games" if enough is not None
              else f"no opening of this game reaches that many; give at most {count * seats // OPENINGS_PER_GAME} "
                   "--games")
    raise ValueError(f"neither player samples its moves, so a game is its seat and its opening, and an opening of "
                     f"{opening} random move(s) reaches {count} distinct position(s): {games_a_seat} games a seat "
                     f"would mostly repeat a few (the interval would count them as {games} games); {advice}")


def _opening_positions(game: Any, wanted: int, depth: int) -> list[int]:
    """The distinct positions d legal moves from the start reach without ending the game, for d = 0, 1, ... up to
    `depth`, or up to the first count at or past `wanted` (any deeper one is taken as enough too). A depth of more
    than OPENING_WALK_POSITIONS positions counts as `wanted`."""
    level = {str(start): start for start in (game.new_initial_state(),)}
    counts = [1]
    while len(counts) <= depth and 0 < counts[-1] < wanted:
        deeper: dict[str, Any] = {}
        for state in level.values():
            for action in state.legal_actions():
                child = state.child(action)
                if not child.is_terminal():
                    deeper.setdefault(str(child), child)
            if len(deeper) > OPENING_WALK_POSITIONS:
                break
        if len(deeper) > OPENING_WALK_POSITIONS:
            counts.append(wanted)
            break
        counts.append(len(deeper))
        level = deeper
    return counts


def _play_opening(env: Any, reset: Callable[[], Any], info: EnvInfo, opening: int, rng: np.random.Generator,
                  game: int) -> Any:
    """The observation after `opening` uniformly random legal moves from `reset()`. An opening that ends the
    game is drawn again from the same generator, so the two games of a pair (whose generators are seeded alike)
    still open alike in a game without chance."""
    for _ in range(MAX_OPENING_DRAWS):
        obs = reset()
        for _ in range(opening):
            view = player_view(obs, to_play(obs, info), info)
            ts = env.step(int(rng.choice(np.flatnonzero(view[ACTION_MASK]))))
            obs = ts.obs
            if ts.terminated or ts.truncated:
                break
        else:
            return obs
    raise ValueError(f"game {game}: {MAX_OPENING_DRAWS} openings of {opening} random moves in a row ended the "
                     "game: give a shorter one (--opening)")


def samples_moves(task: ComputationTask) -> bool:
    """Whether `task` draws its moves from a distribution (its predictions carry their log-probability, as PPO's
    do) rather than taking the argmax of values (DQN's): two players that both take argmaxes play one game."""
    return any(spec.name == "logp" for spec in task.artifact_specs)


@dataclass(frozen=True)
class _Opponent:
    """Who plays the seats that are not the agent's: a reference bot the env plays inside, or a policy here."""

    bot: str | None = None
    task: ComputationTask | None = None


def _play_games(
    task: ComputationTask,
    env_name: str,
    env_kwargs: Mapping[str, Any],
    games: int,
    seed: int,
    label: str,
    opponent: _Opponent,
    kwargs: ForwardKwargs,
    on_game: Callable[[int, int], None] | None,
    search: SearchConfig | None,
    opening: int = 0,
) -> EvalResult:
    if games < 1:
        raise ValueError(f"games must be >= 1, got {games}")
    env = make_env(env_name, **env_kwargs)
    try:
        info = env.info()
        if not hasattr(env, "bot_seats") or info.num_players < 2:
            raise ValueError(f"env {env_name!r}: evaluation plays two-player OpenSpiel games against reference bots "
                             "or another policy")
        searcher = None if search is None else PolicySearch(task, env, search)
        seats = info.num_players
        max_length = env.game.max_game_length() if hasattr(env, "game") else None
        if opening and max_length is not None and opening >= max_length:  # (first: the count below walks it)
            raise ValueError(f"an opening of {opening} random moves (--opening) leaves nothing to play: "
                             f"{env_name} lasts at most {max_length} moves")
        if (opponent.task is not None and not getattr(env, "has_chance", False)
                and (searcher is not None or not samples_moves(task)) and not samples_moves(opponent.task)):
            if opening == 0:
                raise ValueError("neither player samples its moves (a DQN's argmax, a search's choice): every game "
                                 "of a seat would be the same one; give an opening of random moves (--opening K)")
            _check_openings(info, getattr(env, "game", None), opening, games, seats)
        tallies = {seat: [0, 0, 0, 0] for seat in range(seats)}  # games, wins, draws, losses
        lengths = []
        for game in range(games):
            seat, pair = game % seats, game // seats
            # Seeds of the pair of games (one from each seat), mixed with `seed`: another --seed plays other games,
            # not these shifted by one (seed + game did: --seed 1 replayed games 1.. of --seed 0).
            env_seed, opening_seed = game_seeds(seed, pair)
            bots = {other: opponent.bot for other in range(seats) if other != seat and opponent.bot}

            reset = functools.partial(_seeded_reset, env, env_seed, bots)
            # The opening's moves (a recurrent player's memory does not see them: its game starts after).
            obs = (reset() if not opening
                   else _play_opening(env, reset, info, opening, np.random.default_rng(opening_seed), game))
            length = 0
            states = task.initial_states(1)  # a recurrent policy's memory starts afresh with every game
            other_states = ({} if opponent.task is None
                            else {other: opponent.task.initial_states(1) for other in range(seats) if other != seat})
            while True:
                mover = to_play(obs, info)
                view = player_view(obs, mover, info)
                if mover == seat:
                    length += 1
                    if searcher is not None:
                        action = searcher.choose(env.state)  # type: ignore[attr-defined]  (an OpenSpielEnv's)
                    else:
                        chosen, states = _decide(task, view, states, kwargs)
                        action = int(chosen)  # a two-player game's move: one of its actions
                elif opponent.task is not None:  # one memory per seat it plays (games of more than two players)
                    chosen, other_states[mover] = _decide(opponent.task, view, other_states[mover], kwargs)
                    action = int(chosen)
                else:
                    raise RuntimeError(f"game {game}: the env asks seat {mover} to move, the agent is {seat}")
                if ACTION_MASK in view and not view[ACTION_MASK][action]:
                    who = "the policy" if mover == seat else "the opponent policy"
                    raise RuntimeError(f"game {game}: {who} chose illegal action {action}")
                ts = env.step(action)
                obs = ts.obs
                if ts.terminated or ts.truncated:
                    break
            outcome = ts.info.outcome[seat] if ts.info.outcome else Outcome.DRAW
            tally = tallies[seat]
            tally[0] += 1
            tally[{Outcome.WIN: 1, Outcome.DRAW: 2, Outcome.LOSS: 3}[outcome]] += 1
            lengths.append(length)
            if on_game is not None:
                on_game(game + 1, sum(t[1] for t in tallies.values()))
    finally:
        env.close()
    return EvalResult(
        label,
        tuple(SeatTally(seat, *counts) for seat, counts in tallies.items() if counts[0]),
        float(np.mean(lengths)),
        0 if search is None else search.simulations,
    )


@dataclass(frozen=True)
class ReturnResult:
    """A single-player env (CartPole): the policy's undiscounted episode returns; there is no opponent."""

    episodes: int
    mean_return: float
    std_return: float
    min_return: float
    max_return: float
    mean_length: float
    cut_episodes: int = 0
    """Episodes ended at `max_steps` (the env ended none of them itself)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


DEFAULT_MAX_EPISODE_STEPS = 100_000
"""Steps after which `play_episodes` ends an episode its env has not ended: an env without a time limit (a
custom one without gymnasium's TimeLimit) kept `league eval` playing its first episode for good (a review)."""


def play_episodes(
    task: ComputationTask,
    env_name: str,
    env_kwargs: Mapping[str, Any],
    episodes: int,
    seed: int = 0,
    greedy: bool = True,
    on_episode: Callable[[int], None] | None = None,
    max_steps: int = DEFAULT_MAX_EPISODE_STEPS,
) -> ReturnResult:
    """`episodes` episodes of `task` alone in a single-player env, each seeded from (`seed`, its index), each
    ended after `max_steps` steps if its env has not ended it (counted in `cut_episodes`);
    `on_episode(episodes played)` after each."""
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    env = make_env(env_name, **env_kwargs)
    returns, lengths, cut = [], [], 0
    try:
        info = env.info()
        if info.num_players != 1:
            raise ValueError(f"env {env_name!r} has {info.num_players} players: play it against a reference bot")
        kwargs = ForwardKwargs(greedy=greedy)
        action_spec = policy_specs(info)[1]
        for episode in range(episodes):
            env.seed(game_seeds(seed, episode)[0])
            obs = env.reset()
            states = task.initial_states(1)
            total, length = 0.0, 0
            while True:
                chosen, states = _decide(task, player_view(obs, 0, info), states, kwargs)
                ts = env.step(env_action(action_spec, chosen, info))
                total += float(np.sum(ts.reward))
                length += 1
                obs = ts.obs
                if ts.terminated or ts.truncated:
                    break
                if length >= max_steps:
                    cut += 1
                    break
            returns.append(total)
            lengths.append(length)
            if on_episode is not None:
                on_episode(episode + 1)
    finally:
        env.close()
    values = np.asarray(returns)
    return ReturnResult(episodes, float(values.mean()), float(values.std()), float(values.min()),
                        float(values.max()), float(np.mean(lengths)), cut)


def _decide(
    task: ComputationTask, view: Mapping[str, np.ndarray], states: Any, kwargs: ForwardKwargs
) -> tuple[np.ndarray, Any]:
    """One move of the evaluated policy (a batch of 1): its action as the policy gave it (an index, or a Box
    array before clipping), and the memory a recurrent policy carries to the next."""
    prediction = task.predict({k: v[None] for k, v in view.items()}, states, forward_kwargs=kwargs)
    return prediction.actions["action"][0], prediction.states


def resolve_checkpoint(checkpoint: str, shared_root: Path | None) -> tuple[CheckpointStore, str]:
    """The store and root-relative path of `checkpoint` (see the module docstring). A player's folder
    (`<root>/<player_id>`) stands for that player's newest published version. The version's manifest is read
    here, so that a path that is no published checkpoint is refused with the root it was looked for in."""
    path = Path(checkpoint)
    if path.name == LATEST:  # the pointer to the player's newest version: its folder says the same
        path = path.parent
        checkpoint = str(path)
    if path.name.endswith(".pt" + MANIFEST_SUFFIX):  # a version's manifest: that version ("no manifest", it said)
        path = path.with_name(path.name.removesuffix(MANIFEST_SUFFIX))
        checkpoint = str(path)
    # A missing path is a player's folder unless it names a .pt file: a player with nothing published yet has
    # no folder, and taking its path for a file guessed the run directory, not the shared root, as the root.
    folder = path.is_dir() if path.is_absolute() and path.exists() else path.suffix != ".pt"
    guessed = ""
    if path.is_absolute():
        if shared_root is not None:
            root = shared_root
        else:
            # Of the file a link names (best.pt -> RUN/shared/<player>/v7.pt): the root was guessed from the
            # link's own place, and the checkpoint refused as one whose manifest describes another path.
            real = Path(os.path.realpath(path))  # (a link loop stays as it is: refused below as no checkpoint)
            root = real.parent if folder else real.parent.parent
            guessed = (f" (no shared root given, so it was taken to be {root}, the "
                       f"{'folder' if folder else 'file'}'s {'parent' if folder else 'grandparent'}: "
                       "a checkpoint is <shared root>/<player id>/v<version>.pt; give --shared-root if it lies "
                       "elsewhere)")
        store = CheckpointStore(root)
    else:
        if shared_root is None:
            raise ValueError(f"checkpoint {checkpoint!r} is relative: give the shared root it is relative to")
        store = CheckpointStore(shared_root)
    try:
        relative = store.root.relative(path) if path.is_absolute() else checkpoint  # UnsafePathError outside it
        target = store.root.resolve(relative)
        if target.is_dir():
            latest = store.latest(relative)
            if latest is None:
                raise ValueError(f"checkpoint {checkpoint!r}: a folder with no published checkpoint in it")
            return store, latest.path
        if not target.exists():
            if folder and path.name.startswith(REFERENCE_BOT_PREFIX):
                raise ValueError(f"checkpoint {checkpoint!r}: {path.name} is a reference bot's player id, a bot of "
                                 "OpenSpiel's with no checkpoint: play against it with --opponent (as --opponent "
                                 "random or mcts:25)")
            raise ValueError(f"checkpoint {checkpoint!r} does not exist" + (
                ": taken to be a player's folder (it does not end in .pt), which appears with the player's "
                "first published checkpoint" if folder else ""))
        store.manifest(relative)
    except (ValueError, CheckpointError) as err:
        raise ValueError(f"{err}{guessed or f' (shared root {store.root.root})'}") from err
    return store, relative


def load_policy(
    store: CheckpointStore, path: str, policy_config: Mapping[str, Any], info: EnvInfo, seed: int = 0
) -> tuple[ComputationTask, CheckpointRef]:
    """A task built from `policy_config` for `info`'s specs, with the verified weights at `path`: with the play
    settings (activation, obs_scale, ...) the checkpoint was trained with where it records them, which a run
    resumed with other ones, or another league file, does not change (`as_published`)."""
    inputs, actions = policy_specs(info, str(policy_config.get("algorithm", "ppo")))
    checkpoint = store.load(path)
    policy_config, _ = as_published(policy_config, checkpoint.ref.metadata)
    task = make_computation_task(policy_config, inputs, actions, device="cpu", seed=seed)
    task.set_weights(checkpoint.tensors, checkpoint.ref.version)
    return task, checkpoint.ref
