"""`league eval`: play a published checkpoint against an OpenSpiel reference bot and print W/D/L.

With `--run-dir` instead of `--checkpoint` it evaluates a player's snapshots along a `league run` against a
ladder of bots (league_cli/progression.py): how the player's strength grew over the run.

`add_arguments(parser)` / `main(args) -> int` for league_cli/main.py; the work is in `actor_service.evaluation`
(imported only when the command runs, so building the `league` parser does not import torch).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common import cli_args
from common.envs.bot_spec import MAX_SIMULATIONS
from common.rpc import SHARED_ROOT_ENV_VAR, env_path
from league_cli.progression import DEFAULT_LADDER  # light: no torch

DEFAULT_POINTS = 6
"""Checkpoints along a run that `--run-dir` evaluates, evenly spaced, ending at the latest."""

if TYPE_CHECKING:
    from actor_service.evaluation import EvalResult, ReturnResult
    from actor_service.search import SearchConfig
    from common.checkpoint_store import CheckpointRef
    from common.computation import ComputationTask
    from common.envs.base import EnvInfo



def add_arguments(parser: argparse.ArgumentParser) -> None:
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--checkpoint", type=cli_args.path_text,
                        help="checkpoint path relative to --shared-root, or an absolute path inside a shared root; "
                             "a player's folder stands for its newest version")
    target.add_argument("--run-dir", type=cli_args.path,
                        help="a `league run` directory: evaluate a player's snapshots along the run (progression)")
    parser.add_argument("--opponent", default=None,
                        help="reference bot: random or mcts:N (N simulations), or a comma-separated list of them "
                             f"(default: random; with --run-dir {','.join(DEFAULT_LADDER)})")
    parser.add_argument("--against", type=cli_args.path_text, default=None, metavar="CHECKPOINT",
                        help="with --checkpoint: play another checkpoint instead of bots (found as --checkpoint is); "
                             "both sample their moves from their policies, as the league's matches are played")
    parser.add_argument("--against-config", type=cli_args.path, default=None, metavar="FILE",
                        help="the league of the --against checkpoint (default: --config if given, else the "
                             "config.yaml of the league run directory it lies in, else the embedded league)")
    parser.add_argument("--opening", type=cli_args.non_negative_int, default=None, metavar="K",
                        help="with --against: the first K moves of every game (both players') are uniformly random "
                             "legal moves, for distinct games between players that do not sample (DQN's argmax, "
                             "--search) (default 0)")
    parser.add_argument("--player", default=None,
                        help="with --run-dir: the active player whose snapshots to evaluate (default: the main player)")
    parser.add_argument("--points", type=cli_args.positive_int, default=None,
                        help="with --run-dir: how many of the player's checkpoints, evenly spaced, ending at its "
                             f"latest (default {DEFAULT_POINTS})")
    parser.add_argument("--games", type=cli_args.positive_int, default=20,
                        help="games to play (seats alternate); episodes, in a single-player env (default 20)")
    parser.add_argument("--max-episode-steps", type=cli_args.positive_int, default=None, metavar="N",
                        help="a single-player env's episode is ended after N steps if the env has not ended it (an "
                             "env without a time limit), and counted as cut (default 100,000)")
    parser.add_argument("--config", type=cli_args.path, default=None,
                        help="league YAML whose policy and env to use (default: the config.yaml of the league run "
                             "directory the checkpoint lies in, else the embedded league)")
    parser.add_argument("--shared-root", type=cli_args.path, default=None,
                        help=f"the checkpoints' shared root (default: with --run-dir RUN/shared, else "
                             f"${SHARED_ROOT_ENV_VAR})")
    parser.add_argument("--search", type=cli_args.int_within(1, MAX_SIMULATIONS), default=None, metavar="N",
                        help="play the checkpoint's moves by a search of N simulations over its own policy and "
                             "value (AlphaZero's PUCT; two-player zero-sum games of perfect information), not its "
                             "greedy moves: how strong the network is with lookahead (default: no search)")
    parser.add_argument("--seed", type=cli_args.seed, default=0, help="seed of the games (bots, env) (default 0)")
    parser.add_argument("--json", action="store_true",
                        help="print JSON instead of a table: with --checkpoint, one line of JSON per opponent "
                             "(JSON Lines: several opponents give several lines); with --run-dir, one document")


def main(args: argparse.Namespace) -> int:
    if args.run_dir is not None:
        for flag, value in (("--against", args.against), ("--against-config", args.against_config),
                            ("--opening", args.opening), ("--max-episode-steps", args.max_episode_steps)):
            if value is not None:
                return _refuse(f"{flag} goes with --checkpoint (--run-dir plays the player's snapshots against bots)")
        return _progression_main(args)
    for flag, value in (("--player", args.player), ("--points", args.points)):
        if value is not None:  # they choose along a run's snapshots: with a checkpoint they went unheard
            return _refuse(f"{flag} goes with --run-dir (--checkpoint evaluates the one checkpoint it names)")
    for flag, value in (("--against-config", args.against_config), ("--opening", args.opening)):
        if value is not None and args.against is None:
            return _refuse(f"{flag} goes with --against (a game against another checkpoint)")
    if args.against is not None and args.opponent is not None:
        return _refuse("--against plays another checkpoint, --opponent reference bots: give one of them")
    import torch

    from actor_service.evaluation import DEFAULT_MAX_EPISODE_STEPS, play_against_bot, play_episodes

    torch.set_num_threads(1)
    opponents = _opponents("random" if args.opponent is None else args.opponent)
    if (bad := _bad_opponent(opponents)) is not None:
        return _refuse(bad)
    opponents = _spelled_out(opponents)
    search = _search(args)
    try:
        loaded = load_checkpoint(args, "eval")
    except CheckpointRefused as err:
        return _refuse(str(err))
    task, ref, info, env_name, env_kwargs = loaded.task, loaded.ref, loaded.info, loaded.env_name, loaded.env_kwargs
    if info.num_players == 1:  # CartPole and the like: no opponent, the episodes' returns
        given = next((flag for flag, value in (("--opponent", args.opponent), ("--against", args.against),
                                               ("--search", search)) if value is not None), None)
        if given is not None:
            return _refuse(f"{given}: {env_name} is a single-player env; eval plays --games episodes of it alone and "
                           "reports their returns")
        max_steps = args.max_episode_steps or DEFAULT_MAX_EPISODE_STEPS
        try:
            with _games_progress(f"{env_name} alone", args.games) as on_episode:
                returns = play_episodes(task, env_name, env_kwargs, args.games, seed=args.seed,
                                        on_episode=on_episode, max_steps=max_steps)
        except (ValueError, OSError) as err:
            return _refuse(str(err))
        if returns.cut_episodes:
            print(f"league eval: {returns.cut_episodes} of {returns.episodes} episodes were ended at {max_steps:,} "
                  f"steps, which {env_name} had not ended (--max-episode-steps)", file=sys.stderr)
        if args.json:
            print(json.dumps({"checkpoint": ref.path, "version": ref.version, "env": env_name,
                              **returns.to_dict()}))
        else:
            _print_returns(ref, env_name, returns)
        return 0
    if args.max_episode_steps is not None:  # (taken and ignored: a game's length is its rules'; a review)
        return _refuse(f"--max-episode-steps: {env_name} is a game of {info.num_players} players, whose games end "
                       "by its rules; the flag bounds a single-player env's episodes")
    if args.against is not None:
        return _against_main(args, loaded, search)
    for opponent in opponents:
        try:
            with _games_progress(f"vs {opponent}", args.games) as on_game:
                result = play_against_bot(task, env_name, env_kwargs, opponent, args.games, seed=args.seed,
                                          on_game=on_game, search=search)
        except (ValueError, OSError) as err:
            return _refuse(str(err))
        if args.json:  # one line per opponent
            print(json.dumps({"checkpoint": ref.path, "version": ref.version, "env": env_name,
                              **result.to_dict()}), flush=True)
        else:
            _print_table(ref, env_name, result)
    return 0


def _search(args: argparse.Namespace) -> SearchConfig | None:
    """The search `--search N` asks each move to be chosen by, or None (the policy's own moves)."""
    from actor_service.search import SearchConfig

    return None if args.search is None else SearchConfig(args.search)


def _against_main(args: argparse.Namespace, loaded: LoadedCheckpoint, search: SearchConfig | None) -> int:
    """`--against`: the checkpoint against another one, both sampling their moves."""
    from actor_service.evaluation import play_against_policy

    against_args = argparse.Namespace(**{**vars(args), "checkpoint": args.against,
                                         "config": args.against_config or args.config,
                                         "seed": opponent_seed(args.seed)})
    try:
        other = load_checkpoint(against_args, "eval", flag="--against", config_flag="--against-config")
    except CheckpointRefused as err:
        return _refuse(str(err) if str(err).startswith("--against") else f"--against: {err}")
    if _env_identity(other.env_name, other.env_kwargs) != _env_identity(loaded.env_name, loaded.env_kwargs):
        return _refuse(f"--against: its league plays {other.env_name} {other.env_kwargs}, the checkpoint's "
                       f"{loaded.env_name} {loaded.env_kwargs}: the two must play the same env")
    label = f"{other.ref.path} (v{other.ref.version})"
    try:
        with _games_progress(f"vs {label}", args.games) as on_game:
            result = play_against_policy(loaded.task, other.task, loaded.env_name, loaded.env_kwargs, args.games,
                                         seed=args.seed, opponent=label, on_game=on_game, search=search,
                                         opening=args.opening or 0)
    except (ValueError, OSError) as err:
        return _refuse(str(err))
    if args.json:
        print(json.dumps({"checkpoint": loaded.ref.path, "version": loaded.ref.version, "env": loaded.env_name,
                          **result.to_dict(), "opponent_checkpoint": other.ref.path,
                          "opponent_version": other.ref.version, "opening": args.opening or 0}), flush=True)
    else:
        _print_table(loaded.ref, loaded.env_name, result)

        opening = f"after {args.opening} random opening moves, " if args.opening else ""
        searched = "; the checkpoint's chosen by search" if search is not None else ""
        _console().print(f"{opening}moves drawn from each player's policy (a DQN's: its argmax{searched})")
    return 0


def opponent_seed(seed: int) -> int:
    """The seed of the `--against` policy's move sampling: another stream than the checkpoint's. With the same
    seed both drew the same numbers move by move, and two similar policies played the same move 84% of the time
    where 1 in 7 is chance (a review, one checkpoint against itself in connect four)."""
    import numpy as np

    return int(np.random.SeedSequence([seed, 1]).generate_state(1)[0])


def _env_identity(name: str, kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """What makes two leagues' envs the same game seen the same way, however their files spell it
    (`connect_four` and `openspiel:connect_four`; `{}` and `{perspective: absolute}`)."""
    from common.envs.openspiel_env import OpenSpielEnv
    from common.envs.registry import make_env

    env = make_env(name, **kwargs)
    try:
        if isinstance(env, OpenSpielEnv):
            return str(env.game), env.perspective
        return name, sorted(kwargs.items()), env.info()
    finally:
        env.close()


class CheckpointRefused(Exception):
    """What `load_checkpoint` could not load, said for the user (the command exits 2 with it)."""


@dataclass(frozen=True)
class LoadedCheckpoint:
    """A checkpoint's policy, built for its league's env: what `league eval` plays and `league export` writes."""

    task: ComputationTask
    ref: CheckpointRef
    info: EnvInfo
    env_name: str
    env_kwargs: dict[str, Any]
    policy: dict[str, Any]
    config: Path | None
    """The league file whose policy and env were used (None: the embedded league)."""
    file: Path | None = None
    """The checkpoint's file (its manifest beside it, `<file>.json`)."""
    shared_root: Path | None = None
    """The shared root it was found in."""


def load_checkpoint(args: argparse.Namespace, command: str, flag: str = "--checkpoint",
                    config_flag: str = "--config") -> LoadedCheckpoint:
    """The policy of ``args.checkpoint`` (``--shared-root``, ``--config``, ``--seed``), as `league <command>`
    resolves them: a relative path is under the shared root (``$LEAGUE_SHARED_ROOT``), or a path from here; the
    league is ``--config``, else the config.yaml of the run directory the checkpoint lies in, else the embedded
    one. CheckpointRefused says what is wrong, naming the checkpoint as `flag` and the league as `config_flag`.
    ``args`` is left as it was (`--against` loads a second checkpoint from the same flags)."""
    args = argparse.Namespace(**vars(args))
    from_variable = args.shared_root is None
    if from_variable:  # the variable only where no --run-dir names the root (the image sets it)
        args.shared_root = _variable_root_for(args.checkpoint)
    with contextlib.suppress(OSError):  # (a root that cannot be looked at: refused below, naming the checkpoint)
        if args.shared_root is not None and not Path(args.shared_root).is_dir():
            # Named as it was given: "shared root '/x' is not a directory" named no flag where the variable set it.
            given = f"${SHARED_ROOT_ENV_VAR}" if from_variable else "--shared-root"
            raise CheckpointRefused(f"{given} {args.shared_root} is not a directory")
    from actor_service.evaluation import load_policy, resolve_checkpoint
    from common.checkpoint_store import CheckpointNotFoundError
    from common.computation import WeightsMismatchError
    from common.envs.registry import env_info
    from common.policy_config import as_published

    if not Path(args.checkpoint).is_absolute() and args.shared_root is None:
        # A path from here: it exists, or its directory does (a version retired by keep_last, a typo in the
        # file name): then resolving it says what is missing. Only a path that leads nowhere from here needs a
        # shared root.
        parent = Path(args.checkpoint).parent
        try:
            here = Path(args.checkpoint).exists() or (parent != Path(".") and parent.is_dir())
        except OSError as err:  # a directory on the way that may not be searched: PermissionError, not False
            raise CheckpointRefused(f"{flag} {args.checkpoint!r}: {err.strerror or err}") from err
        if not here:
            raise CheckpointRefused(f"{flag} {args.checkpoint!r} is relative and not a path from here: give "
                                    f"--shared-root (or ${SHARED_ROOT_ENV_VAR})")
        args.checkpoint = str(Path(args.checkpoint).absolute())  # a path from the current directory
    config = args.config
    if config is None:
        config = _run_dir_config(Path(args.checkpoint) if args.shared_root is None
                                 else Path(args.shared_root) / args.checkpoint)
        if config is not None:
            print(f"league {command}: the league of {config}", file=sys.stderr)
    store = None
    try:
        league = _load_league(config)  # (before the checkpoint: a config error is said first)
        store, path = resolve_checkpoint(args.checkpoint, args.shared_root)
        policy, env_name, env_kwargs = _policy_and_env(league, path)
        info = env_info(env_name, **env_kwargs)
        for attempt in range(1, _NEWEST_ATTEMPTS + 1):
            try:
                task, ref = load_policy(store, path, policy, info, seed=args.seed)
                break
            except CheckpointNotFoundError:
                # A player's folder (or latest.json) names its newest version: on a live run retention may
                # remove the one read above before it is loaded (keep_last versions last a fraction of a
                # second under a fast learner), then the newest is the one now.
                if attempt == _NEWEST_ATTEMPTS or Path(args.checkpoint).name.startswith(Path(path).name):
                    raise  # (named by its file or manifest: that version only)
                store, path = resolve_checkpoint(args.checkpoint, args.shared_root)
    except CheckpointNotFoundError as err:  # a file with no manifest: in which root
        raise CheckpointRefused(f"{err}, in shared root "
                                f"{store.root.root if store is not None else args.shared_root}") from err
    except PermissionError as err:  # the checkpoint, or a directory on its way, the user may not read or search
        # (--config's own errors are ConfigErrors naming the file; only the checkpoint's path is left to fail so)
        raise CheckpointRefused(f"{flag} {args.checkpoint!r}: {err.strerror or err}") from err
    except (ValueError, OSError) as err:  # config, path, checkpoint (corrupt / missing) or model mismatch
        hint = ""
        if isinstance(err, WeightsMismatchError):  # layer names or shapes: another league's network
            hint = (f" (the model of {'the embedded league' if config is None else config}; give {config_flag} with the "
                    "league the checkpoint comes from, e.g. its run directory's config.yaml)")
        raise CheckpointRefused(f"{err}{hint}") from err
    policy, changed = as_published(policy, ref.metadata)  # what `load_policy` built
    if changed:
        print(f"league {command}: {ref.path} is played with the settings it was trained with, which "
              f"{'the embedded league' if config is None else config} changes ({'; '.join(changed)})", file=sys.stderr)
    return LoadedCheckpoint(task, ref, info, env_name, env_kwargs, policy, config, store.root.resolve(ref.path),
                            Path(store.root.root))


_NEWEST_ATTEMPTS = 5
"""Loads of a folder's newest version tried when retention removes each before it is loaded."""


def _variable_root_for(checkpoint: str) -> Path | None:
    """$LEAGUE_SHARED_ROOT as the root of `checkpoint`: for a relative path, or an absolute one inside it. An
    absolute path elsewhere (another run's checkpoint, say for `--against`, where the image sets the variable)
    is the checkpoint's own: its root is found from the path, as with no variable set."""
    root = env_path(SHARED_ROOT_ENV_VAR)
    path = Path(checkpoint)
    if root is None or not path.is_absolute():
        return root
    return root if Path(os.path.abspath(path)).is_relative_to(os.path.abspath(root)) else None


@contextlib.contextmanager
def _games_progress(description: str, total: int) -> Iterator[Callable[..., None]]:
    """A progress bar on stderr while games are played (a strong bot takes seconds a game: 1,000 games against
    mcts:5000 take minutes), gone once they are done; shown on a terminal only. Yields the callback to call with
    (games played[, games won])."""
    if not sys.stderr.isatty():
        yield lambda *_: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[won]}"),
               TimeRemainingColumn())
    with Progress(*columns, console=_console(stderr=True, emoji=False), transient=True) as progress:
        task = progress.add_task(description, total=total, won="")

        def update(played: int, won: int | None = None) -> None:
            progress.update(task, completed=played, won="" if won is None else f"won {won / played:.0%}")

        yield update


def _run_dir_config(checkpoint: Path) -> Path | None:
    """The config of the `league run` directory a checkpoint lies in (RUN/shared/...), if it is in one: the
    league whose model the checkpoint has. Without it the embedded connect-four league's model is assumed."""
    # (Also where a link to the checkpoint leads: best.pt -> RUN/shared/<player>/v7.pt is that run's.)
    for parent in (*checkpoint.absolute().parents, *Path(os.path.realpath(checkpoint)).parents):
        if parent.name == "shared" and (parent.parent / "config.yaml").is_file():
            return parent.parent / "config.yaml"
    return None


def _bad_opponent(opponents: tuple[str, ...]) -> str | None:
    """What is wrong with the first --opponent that names no bot, or None."""
    from common.envs.bot_spec import BotSpec

    if not any(opponents):
        return "--opponent names no bot"
    if "" in opponents:  # "random,,mcts:50" or a trailing comma: an item left out, or a typo
        return f"--opponent {','.join(opponents)!r}: an empty item in the list"
    seen: dict[BotSpec, str] = {}
    for opponent in opponents:
        try:
            spec = BotSpec.parse(opponent)
        except ValueError as err:
            return f"--opponent {opponent!r}: {err}"
        if spec in seen:  # "random,random", "mcts,mcts:100": the same games again, in a column of their own
            return f"--opponent {','.join(opponents)!r}: {opponent!r} is the same bot as {seen[spec]!r}"
        seen[spec] = opponent
    return None


def _ladder_for(env_name: str, ladder: tuple[str, ...], *, given: bool) -> tuple[str, ...]:
    """The ladder the game can be played against: in a game of imperfect information (poker) pyspiel's MCTS would
    see the hidden cards, and the env refuses it: the default ladder keeps `random` only (it played the first
    checkpoint, then stopped with no table at the first MCTS bot; a review), and a given one is refused before
    any game."""
    from common.envs.bot_spec import BotSpec
    from league_service.config import imperfect_information
    from league_service.env_fit import openspiel_game

    game = openspiel_game(env_name)
    searching = [o for o in ladder if BotSpec.parse(o).kind == "mcts"]
    if game is None or not searching or not imperfect_information(game):
        return ladder
    if given:
        raise ValueError(f"--opponent {','.join(searching)}: {game!r} is a game of imperfect information, which "
                         "pyspiel's MCTS would play seeing the hidden information; play it against random")
    print(f"league eval: {game} is a game of imperfect information: against random only (pyspiel's MCTS would see "
          "the hidden information)", file=sys.stderr)
    return tuple(o for o in ladder if o not in searching)


def _opponents(text: str) -> tuple[str, ...]:
    return tuple(o.strip() for o in text.split(","))


def _spelled_out(opponents: tuple[str, ...]) -> tuple[str, ...]:
    """Valid bot specs as tables and JSON name them: "mcts" alone is "mcts:100" (its strength never showed)."""
    from common.envs.bot_spec import BotSpec

    return tuple(BotSpec.parse(opponent).text for opponent in opponents)


def _progression_main(args: argparse.Namespace) -> int:
    import torch

    from actor_service.evaluation import load_policy, play_against_bot
    from common.checkpoint_store import CheckpointNotFoundError, CheckpointStore
    from common.envs.registry import env_info
    from league_cli.progression import (
        LineagePoint,
        PointResult,
        choose_player,
        evaluate_lineage,
        last_status,
        lineage,
        progression_to_dict,
        with_latest_published,
    )

    torch.set_num_threads(1)
    console = _console(stderr=args.json, emoji=False)  # "mcts:100:" is no emoji code
    ladder = _opponents(",".join(DEFAULT_LADDER) if args.opponent is None else args.opponent)
    if (bad := _bad_opponent(ladder)) is not None:
        return _refuse(bad)
    ladder = _spelled_out(ladder)
    search = _search(args)
    shared_root = args.shared_root or args.run_dir / "shared"  # not $LEAGUE_SHARED_ROOT: the run's own root
    try:
        own = args.run_dir / "config.yaml"  # a --config given must be read (a typo ran the embedded league)
        config = args.config if args.config is not None else own if own.exists() else None
        league = _load_league(config)  # (before the history: a config error is said first)
        status = last_status(args.run_dir / "status_history.jsonl")
        player_id = choose_player(status, args.player)
        policy, env_name, env_kwargs = _policy_and_env(league, player_id)
        points = args.points or DEFAULT_POINTS
        line = lineage(status, player_id, points)
        store = CheckpointStore(shared_root)

        def with_newest(line: list[LineagePoint]) -> list[LineagePoint]:
            latest = store.latest(player_id)
            if latest is None:
                return line
            steps = latest.metadata.get("agent_steps")
            steps = int(steps) if isinstance(steps, int) else None
            return with_latest_published(line, player_id, latest.version, latest.path, steps, points)

        line = with_newest(line)
        if not line:
            raise ValueError(f"player {player_id!r} has no published checkpoint in the run's status, nor in shared "
                             f"root {shared_root}")
        info = env_info(env_name, **env_kwargs)
        if info.num_players == 1:
            return _refuse(f"{env_name} is a single-player env: --run-dir plays two-player games against bots; "
                           f"evaluate one of its checkpoints with --checkpoint {args.run_dir / 'shared' / '<player id>'} (a "
                           "checkpoint of a run directory is played with the run's own config)")
        ladder = _ladder_for(env_name, ladder, given=args.opponent is not None)
        # Each point is loaded once for its whole ladder, the active one first: on a live run retention retires
        # an active player's versions within seconds (keep_last), and loaded again for each rung, minutes later, it
        # was gone, which failed the whole evaluation (a review). Retired before its first load, the newest is
        # taken instead, as --checkpoint does.
        loaded: dict[str, ComputationTask] = {}
        for attempt in range(1, _NEWEST_ATTEMPTS + 1):
            if not line[-1].active:
                break
            try:
                loaded[line[-1].checkpoint_path], _ = load_policy(store, line[-1].checkpoint_path, policy, info,
                                                                  seed=args.seed)
                break
            except CheckpointNotFoundError:
                if attempt == _NEWEST_ATTEMPTS:
                    raise
                line = with_newest(line)
        active = line[-1].checkpoint_path if line[-1].active else None

        def play(point: LineagePoint, opponent: str) -> dict[str, Any]:
            if point.checkpoint_path not in loaded:
                for path in [p for p in loaded if p != active]:  # the previous snapshot's: done with it
                    del loaded[path]
                loaded[point.checkpoint_path], _ = load_policy(store, point.checkpoint_path, policy, info,
                                                               seed=args.seed)
            task = loaded[point.checkpoint_path]
            with _games_progress(f"v{point.checkpoint_version} vs {opponent}", args.games) as on_game:
                return play_against_bot(task, env_name, env_kwargs, opponent, args.games, seed=args.seed,
                                        on_game=on_game, search=search).to_dict()

        def progress(result: PointResult, opponent: str) -> None:
            console.print(f"{result.point.checkpoint_path} ({result.point.agent_steps:,} steps) vs {opponent}: "
                          f"{result.results[opponent]['win_rate']:.0%}", markup=False, soft_wrap=True)

        results = evaluate_lineage(line, ladder, play, on_result=progress)
    except CheckpointNotFoundError as err:  # the status names it, the root lacks it: which root was searched
        given = "--shared-root" if args.shared_root is not None else "the run's; give --shared-root for another"
        return _refuse(f"{err}, in shared root {shared_root} ({given})")
    except BrokenPipeError:
        raise  # the output's reader went away (`| head`): main's quiet exit, not a refusal with no text
    except (ValueError, OSError) as err:
        return _refuse(str(err))
    report = {**progression_to_dict(player_id, results, args.games), "search": args.search or 0}
    if args.json:
        print(json.dumps(report))
    else:
        _print_progression(report, ladder)
    return 0


def _print_progression(report: dict[str, Any], ladder: tuple[str, ...]) -> None:
    from league_service.plain_table import PlainTable

    def cell(point: dict[str, Any], opponent: str) -> str:
        rate, score = point["win_rate"][opponent], point["score"][opponent]
        return f"{rate:.0%}" if f"{rate:.0%}" == f"{score:.0%}" else f"{rate:.0%} / {score:.0%}"

    table = PlainTable(title=f"{report['player_id']}: win rate over {report['games']} games per cell, along the run")
    for column in ("version", "agent steps", *ladder, "strongest beaten > 50%"):
        table.add_column(column, justify="left" if column == "version" else "right")
    for point in report["points"]:
        kind = "snapshot" if point["snapshot"] else "latest"
        table.add_row(f"v{point['version']} ({kind})", f"{point['agent_steps']:,}",
                      *(cell(point, o) for o in ladder), point["strongest_beaten"])
    if any(cell(point, o) != f"{point['win_rate'][o]:.0%}" for point in report["points"] for o in ladder):
        table.caption = ("win rate / score where they differ: the score (wins plus half the draws) is what "
                         "\"beaten > 50%\" goes by")
        table.caption_justify = "left"
    console = _console()
    console.print(table)
    if report["search"]:
        console.print(f"each of the player's moves: a search of {report['search']} simulations over its policy and "
                      "value")


def _load_league(config: Path | None) -> Any:
    # The league config (and its embedded default) belongs to league_service; the CLI layer may read it.
    from league_service.config import load_config

    return load_config(config, for_training=False)  # an older run's league, refused now, still has its checkpoints


def _policy_and_env(cfg: Any, checkpoint: str) -> tuple[dict[str, Any], str, dict[str, Any]]:
    """The league's policy, env name and the env kwargs the checkpoint at `checkpoint` (relative to the shared
    root: `<player id>/...`) was trained with (`checkpoint_env_kwargs`)."""
    from league_service.env_fit import checkpoint_env_kwargs

    # The game and view its player trained on, also where its type's own sections set them (a relative
    # perspective set under league.main_player.env_kwargs was evaluated on the absolute board; a solo type's
    # env_kwargs were not played at all).
    return dict(cfg.policy), cfg.env.name, checkpoint_env_kwargs(cfg.env.kwargs, cfg.league, checkpoint)


def _console(**kwargs: Any) -> Any:
    """A rich Console whose closed output ends the command as any other does (`league_cli.main`: exit 0, nowhere
    to write), not with rich's exit 1."""
    from rich.console import Console

    from common.closed_output import raise_broken_pipe

    console = Console(**kwargs)
    console.on_broken_pipe = raise_broken_pipe
    return console


def _interval(bounds: tuple[float, float]) -> str:
    return f"{bounds[0]:.1%}-{bounds[1]:.1%}"


def _print_table(ref: CheckpointRef, env_name: str, result: EvalResult) -> None:
    from league_service.plain_table import PlainTable

    table = PlainTable(title=f"{ref.path} (v{ref.version}) vs {result.opponent} on {env_name}")
    for column in ("seat", "games", "wins", "draws", "losses", "win rate", "95% interval", "score"):
        table.add_column(column, justify="left" if column == "seat" else "right")
    for s in result.seats:
        table.add_row("first" if s.seat == 0 else f"seat {s.seat}" if s.seat > 1 else "second", str(s.games),
                      str(s.wins), str(s.draws), str(s.losses), f"{s.win_rate:.1%}",
                      _interval(s.win_rate_interval), f"{s.score:.1%}")
    table.add_row("total", str(result.games), str(result.wins), str(result.draws), str(result.losses),
                  f"{result.win_rate:.1%}", _interval(result.win_rate_interval), f"{result.score:.1%}", style="bold")
    console = _console()
    console.print(table)
    if result.draws:  # (the league's payoff counts a draw as half a win, as the score does)
        console.print("score: wins plus half the draws, as the league's payoff counts them")
    console.print(f"mean game length: {result.mean_length:.1f} moves of the evaluated policy")
    if result.search:
        console.print(f"each of its moves: a search of {result.search} simulations over its policy and value")


def _print_returns(ref: CheckpointRef, env_name: str, result: ReturnResult) -> None:
    from league_service.plain_table import PlainTable

    table = PlainTable(title=f"{ref.path} (v{ref.version}) on {env_name}, greedy")
    for column in ("episodes", "mean return", "std", "min", "max", "mean length"):
        table.add_column(column, justify="right")
    table.add_row(str(result.episodes), f"{result.mean_return:.2f}", f"{result.std_return:.2f}",
                  f"{result.min_return:.2f}", f"{result.max_return:.2f}", f"{result.mean_length:.1f}")
    _console().print(table)


def _refuse(message: str) -> int:
    print(f"league eval: {message}", file=sys.stderr)
    return 2
