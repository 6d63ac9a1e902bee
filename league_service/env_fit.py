"""What a league's config can know of its env without building it: whether the env can seat its matches
(checked at load), and how long its longest episode is (for a start-up warning).

Why: a battle league on a one-seat env (CartPole) or on a three-player game, or a solo league on a two-player
game with nobody in the other seat, loaded fine and then failed every collect job in the actors, for as long as
the league ran; so did an OpenSpiel game the env cannot play (simultaneous moves, no observation tensor). The
seat count of a gymnasium id (one) and of an OpenSpiel game (`pyspiel.load_game`, cheap) is
known here; a `python:<module>:<callable>` env is known only by building it, which is the workers' business.
"""

from __future__ import annotations

import functools
import json
import signal
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any

from common.config import ConfigError, deep_merge
from common.envs.registry import OPENSPIEL_ALIASES, OPENSPIEL_PREFIX, PYTHON_PREFIX

if TYPE_CHECKING:
    from league_service.config import Config, LeagueConfig

OPENSPIEL_INT_MIN, OPENSPIEL_INT_MAX = -(2**31), 2**31 - 1
"""The ints pyspiel takes as a game parameter (C++ int); beyond them load_game raised a bare RuntimeError."""

BATTLE_SEATS = 2
"""A battle league's match: the launch player and one opponent (a past player, a reference bot, itself)."""


@dataclass(frozen=True)
class PlayerEnv:
    """The env kwargs one active player type's jobs carry, and the config key each part came from."""

    player_type: str
    kwargs: dict[str, Any]
    sources: dict[str, str]  # env kwarg name ("game_params", "bots") -> the config key that gave it


def player_envs(env_kwargs: Mapping[str, Any], league: LeagueConfig) -> list[PlayerEnv]:
    """Each active player type's job env kwargs, merged as the coordinator merges them (env.kwargs, under the
    type's job template's env_kwargs, under its own env_kwargs)."""
    out = []
    for player_type, count in league.active_players.items():
        if not count:
            continue
        section = league.player_config(player_type)
        template = section.job.get("env_kwargs") or {}
        layers = (("env.kwargs", env_kwargs), (f"league.{player_type}.job.env_kwargs", template),
                  (f"league.{player_type}.env_kwargs", section.env_kwargs))
        merged: dict[str, Any] = {}
        sources: dict[str, str] = {}
        for path, layer in layers:
            merged = deep_merge(merged, layer)
            sources.update({key: f"{path}.{key}" for key in layer})
        out.append(PlayerEnv(player_type, merged, sources))
    return out


def checkpoint_env_kwargs(env_kwargs: Mapping[str, Any], league: LeagueConfig, checkpoint: str) -> dict[str, Any]:
    """The env kwargs the checkpoint at `checkpoint` (relative to the shared root) was trained with: those of the
    active player whose folder holds it (`<player id>/...`: its versions and its snapshots), merged as its jobs
    merge them (`player_envs`); for any other (a pretrained one), env.kwargs with the view every player shares.
    `league eval` played a solo type's checkpoint with env.kwargs alone: another env than its own `env_kwargs`."""
    from league_service.player_factory import active_player_id  # (it imports the config, which imports this)

    owner = PurePosixPath(checkpoint).parts[0] if checkpoint else ""
    for player in player_envs(env_kwargs, league):
        count = league.active_players[player.player_type]
        if owner in {active_player_id(player.player_type, category, i) for category in league.player_category
                     for i in range(count)}:
            return dict(player.kwargs)
    return {**env_kwargs, **view_kwargs(env_kwargs, league)}


def openspiel_game(name: str) -> str | None:
    """The OpenSpiel game an env name gives (`connect_four`, `openspiel:<game>`); None for any other env."""
    if name in OPENSPIEL_ALIASES:
        return name
    return name.removeprefix(OPENSPIEL_PREFIX) if name.startswith(OPENSPIEL_PREFIX) else None


def _openspiel_hint(name: str) -> str:
    """A gymnasium id that is the name of an OpenSpiel game: how to ask for the game."""
    import pyspiel

    return f" (OpenSpiel has a game {name!r}: '{OPENSPIEL_PREFIX}{name}')" if name in pyspiel.registered_names() else ""


@dataclass(frozen=True)
class GameFacts:
    """What config load reads of an OpenSpiel game."""

    num_players: int
    max_game_length: int
    unsupported: str | None  # why OpenSpielEnv cannot play it (openspiel_env.unsupported_game), or None


_PROBE = """
import json, sys
asked = json.loads(sys.stdin.read())
sys.path[:] = asked["path"]  # the parent's: this package where the parent found it
import pyspiel
from common.envs.openspiel_env import unsupported_game
try:
    game = pyspiel.load_game(sys.argv[1], asked["params"])
except Exception as err:  # SpielError, a pybind11 cast error, nfg_game's IndexError
    print(json.dumps({"error": (str(err).strip().splitlines() or [type(err).__name__])[0]}))
else:
    print(json.dumps({"num_players": game.num_players(), "max_game_length": game.max_game_length(),
                      "unsupported": unsupported_game(game)}))
"""
PROBE_TIMEOUT_S = 60.0


def load_game(name: str, player: PlayerEnv) -> GameFacts:
    """The pyspiel game `name` with the player's game_params; a ConfigError naming the key that is wrong.

    A game with game_params is loaded in a child process: some games' C++ checks abort the process, or crash it,
    on parameters they refuse (hanabi with players: 6 aborts, universal_poker with numPlayers: 3 and no stack
    sizes segfaults), which at config load took the coordinator or `league run` down with them."""
    import pyspiel

    from common.envs.openspiel_env import _typed_params, unsupported_game

    game = openspiel_game(name)
    if game not in pyspiel.registered_names():
        raise ConfigError("env.name", f"OpenSpiel has no game {game!r} (pyspiel.registered_names() lists its games)")
    params = player.kwargs.get("game_params") or {}
    where = player.sources.get("game_params", "env.kwargs.game_params")
    if not isinstance(params, Mapping):
        raise ConfigError(where, f"expected a mapping of {game!r}'s parameters, got {type(params).__name__}")
    for key, value in params.items():
        # pybind11 cannot cast an int outside C++'s int to a game parameter: a RuntimeError that names no key
        if type(value) is int and not OPENSPIEL_INT_MIN <= value <= OPENSPIEL_INT_MAX:
            raise ConfigError(f"{where}.{key}", f"{value} is out of range for an OpenSpiel game parameter "
                              f"([{OPENSPIEL_INT_MIN}, {OPENSPIEL_INT_MAX}])")
    if not params:  # the game's defaults: loaded in this process
        try:
            loaded = pyspiel.load_game(game)
            return GameFacts(loaded.num_players(), loaded.max_game_length(), unsupported_game(loaded))
        except Exception as err:  # noqa: BLE001 (SpielError for a game that needs a parameter; nfg_game: IndexError)
            raise ConfigError(where, f"{game!r} refuses them: {_first_line(err)}") from None
    try:
        typed = json.dumps(_typed_params(game, params), sort_keys=True)
    except (TypeError, ValueError) as err:  # not JSON-like data: pyspiel would refuse it too
        raise ConfigError(where, f"{game!r} refuses them: {err}") from None
    facts = _probe(game, typed)
    if isinstance(facts, str):
        raise ConfigError(where, f"{game!r} refuses them: {facts}")
    return facts


def _first_line(err: BaseException) -> str:
    """An error's first line: pyspiel may append a list of parameters or of games."""
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


@functools.lru_cache(maxsize=64)
def _probe(game: str, params_json: str) -> GameFacts | str:
    """`GameFacts` of the game loaded in a child process, or why it was refused (`load_game`)."""
    try:
        asked = f'{{"path": {json.dumps(sys.path)}, "params": {params_json}}}'
        done = subprocess.run([sys.executable, "-P", "-c", _PROBE, game], input=asked, capture_output=True,
                              text=True, timeout=PROBE_TIMEOUT_S, check=False)  # (stdin: no argv size limit)
    except subprocess.TimeoutExpired:
        return f"loading the game took over {PROBE_TIMEOUT_S:g} s"
    except OSError as err:
        return f"cannot start a process to load the game: {err}"
    if done.returncode == 0:
        try:
            answer = json.loads(done.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            answer = {"error": f"unreadable answer {done.stdout[-200:]!r}"}
        if "error" in answer:
            return str(answer["error"])
        return GameFacts(int(answer["num_players"]), int(answer["max_game_length"]), answer["unsupported"])
    how = (f"signal {signal.Signals(-done.returncode).name}" if done.returncode < 0
           else f"exit status {done.returncode}")
    said = [line for line in done.stderr.strip().splitlines() if line.strip()]
    return f"pyspiel crashed loading the game ({how}){': ' + said[-1].strip() if said else ''}"


def check_env_seats(name: str, env_kwargs: Mapping[str, Any], league: LeagueConfig) -> None:
    """Refuse a league whose matches cannot fill its env's seats (module docstring)."""
    if name.startswith(PYTHON_PREFIX):
        return
    battle = league.league_type != "solo"
    if openspiel_game(name) is None:  # a gymnasium id: one seat
        if battle:
            raise ConfigError("env.name", f"{name!r} names a gymnasium env, of one seat, but a battle league "
                              "(league.league_type: one_vs_one) seats two players per match: train it in a solo "
                              f"league (league.league_type: solo), or name a two-player game{_openspiel_hint(name)}")
        return
    for player in player_envs(env_kwargs, league):
        _check_openspiel_kwargs(name, player)
        game = load_game(name, player)
        if game.unsupported is not None:
            raise ConfigError("env.name", f"OpenSpiel's {openspiel_game(name)!r} {game.unsupported}")
        seats = game.num_players
        where = player.sources.get("game_params", "env.name")
        if battle and seats != BATTLE_SEATS:
            hint = "; a single-player game trains in a solo league (league.league_type: solo)" if seats == 1 else ""
            raise ConfigError(where, f"{name!r} gives a game of {seats} player(s) (for {player.player_type}), but "
                              "a battle league (league.league_type: one_vs_one) seats two players per match: it needs "
                              f"a two-player game{hint}")
        bots = player.kwargs.get("bots")
        if bots is not None and not isinstance(bots, Mapping):  # the env reads seat -> bot (`bots.items()`)
            raise ConfigError(player.sources.get("bots", "env.kwargs.bots"), f"expected a mapping of seat -> bot, "
                              f"e.g. {{1: random}}, got {type(bots).__name__} {bots!r}")
        if isinstance(bots, Mapping) and bots:
            from common.envs.openspiel_env import parse_bots

            try:  # (a misspelt bot, a seat out of range: loaded, then failed every env build on every worker)
                parse_bots(bots, seats)
            except ValueError as err:
                seats_note = f" ({name!r} seats {seats} players, numbered from 0)" if "seat" in str(err) else ""
                raise ConfigError(player.sources.get("bots", "env.kwargs.bots"), f"{err}{seats_note}") from None
        seated = len(bots) if isinstance(bots, Mapping) else 0
        if not battle and seats - 1 > seated:
            raise ConfigError(player.sources.get("bots", "env.kwargs.bots"), f"{name!r} gives a game of {seats} "
                              f"players and a solo league's job has one: the env's bots must take the other "
                              f"{seats - 1} seat(s), got {seated} (for {player.player_type}), e.g. env.kwargs.bots: "
                              "{1: random}; or train it in a battle league (league.league_type: one_vs_one)")


def check_battle_env(name: str, env_kwargs: Mapping[str, Any], league: LeagueConfig) -> None:
    """What a battle league's matches need of its env kwargs beyond seats (checked for training only: `league
    eval` reads older runs' configs, which these checks are newer than)."""
    if league.league_type == "solo" or openspiel_game(name) is None:
        return
    players = player_envs(env_kwargs, league)
    for player in players:
        if player.kwargs.get("bots"):
            # The env's bots take seats in every match: each of the two league players played seat 0 against
            # the bot, and the results were credited to the two as if they had played each other.
            raise ConfigError(player.sources.get("bots", "env.kwargs.bots"), "a battle league seats two league "
                              "players per match, so the env's own bots have no seat in it; a bot plays in the "
                              "league as a reference bot (league.reference_bots, e.g. [random, 'mcts:25']), "
                              "or train against one alone in a solo league (league.league_type: solo)")
    _check_one_view(players)


VIEW_KWARGS = ("game_params", "perspective")
"""The env kwargs that make a player's game and what it sees. A match is played in its launch player's env, and
every seat's network reads that env's observations: a type of its own (league.<type>.env_kwargs) reached only its
launch seats, and as an opponent the player saw the others' game (an absolute board for a network trained on
the relative one, or another board size)."""


VIEW_KWARG_DEFAULTS: dict[str, Any] = {"game_params": {}, "perspective": "absolute"}


def view_kwargs(env_kwargs: Mapping[str, Any], league: LeagueConfig) -> dict[str, Any]:
    """The VIEW_KWARGS a battle league's players play with (one for all of them: `_check_one_view`), as set."""
    players = player_envs(env_kwargs, league)
    if not players:
        return {}
    return {key: players[0].kwargs[key] for key in VIEW_KWARGS if key in players[0].kwargs}


def _check_one_view(players: list[PlayerEnv]) -> None:
    """A battle league's player types, which meet in matches, must play one game seen one way."""
    if not players:
        return
    first = players[0]
    for player in players[1:]:
        for key in VIEW_KWARGS:
            mine, theirs = (p.kwargs.get(key) or VIEW_KWARG_DEFAULTS[key] for p in (player, first))
            if mine != theirs:
                where = player.sources.get(key) or first.sources.get(key) or f"env.kwargs.{key}"
                raise ConfigError(where, f"{player.player_type}'s jobs would play with {key} "
                                  f"{mine!r}, {first.player_type}'s with {theirs!r}: "
                                  "the player types of a battle league meet in matches, each seen by every seat's "
                                  f"network, so {key} is one for all of them (set it in env.kwargs)")


def _check_openspiel_kwargs(name: str, player: PlayerEnv) -> None:
    """The env kwargs an OpenSpiel game's env takes (its keyword arguments), and its `perspective`: a typo in
    either loaded fine and failed every job in the workers (a short `league run` ended 0 before any worker said
    so)."""
    import inspect

    from common.envs.openspiel_env import OpenSpielEnv, perspective_problem

    takes = [kwarg for kwarg, parameter in inspect.signature(OpenSpielEnv).parameters.items()
             if parameter.kind is inspect.Parameter.KEYWORD_ONLY]
    for key in player.kwargs:
        if key not in takes:
            raise ConfigError(player.sources.get(key, f"env.kwargs.{key}"),
                              f"an OpenSpiel env takes {', '.join(takes)}, not {key!r}")
    problem = perspective_problem(openspiel_game(name) or name, player.kwargs.get("perspective", "absolute"),
                                  player.kwargs.get("game_params"))
    if problem is not None:
        raise ConfigError(player.sources.get("perspective", "env.kwargs.perspective"), problem)


def longest_episode(name: str, env_kwargs: Mapping[str, Any], league: LeagueConfig) -> int | None:
    """The most env steps an episode of any active player's jobs can take, where that is cheap to know: a gymnasium
    id's `max_episode_steps` (its spec's, or the one env kwargs give `gymnasium.make`), an OpenSpiel game's
    `max_game_length()` in a battle league (every move an env step). None otherwise: a python: env (known only
    once built), a gymnasium id without a step limit or unknown, a solo league's bots (their moves are no steps)."""
    if name.startswith(PYTHON_PREFIX) or (openspiel_game(name) is not None and league.league_type == "solo"):
        return None
    longest = None
    for player in player_envs(env_kwargs, league):
        if openspiel_game(name) is not None:
            steps = load_game(name, player).max_game_length
        else:
            steps = player.kwargs.get("max_episode_steps") or _gymnasium_limit(name)
        if not isinstance(steps, int) or isinstance(steps, bool):
            return None
        longest = max(steps, longest or 0)
    return longest


def _gymnasium_limit(name: str) -> int | None:
    import gymnasium

    try:
        return gymnasium.spec(name).max_episode_steps
    except gymnasium.error.Error:  # not registered: the workers say so
        return None


def cut_episodes_note(cfg: Config) -> str | None:
    """The start-up warning of `league run` and the coordinator when step-budget jobs (`env.episode_num: 0`) cut
    the episodes under way at their end. An actor's next job plays on from where its last one stopped only when
    it is the same match (a solo league of one player; actor_service/rollout.py, `EnvCarry`); otherwise each job
    reports the episodes that ended within its steps: the shorter ones favoured, and none longer than its steps
    per env."""
    env = cfg.env
    if env.episode_num or not env.env_steps:
        return None
    league = cfg.league
    if league.league_type == "solo" and league.active_player_total == 1:
        return None
    note = ("env.episode_num 0 ends jobs on a step budget, and an actor's next job is mostly another match, so the "
            "episodes under way when a job ends are cut and their results never reported: status and TensorBoard "
            "count the episodes that ended within a job's steps, the shorter ones favoured")
    longest = longest_episode(env.name, env.kwargs, league)
    per_env = env.env_steps / env.env_num
    if longest is not None and per_env < longest:
        note += (f", and none longer than env.env_steps / env.env_num = {env.env_steps} / {env.env_num} = "
                 f"{per_env:g} steps (episodes of {env.name} last up to {longest})")
    return note + "; end jobs after whole episodes (env.episode_num > 0)"
