"""Connect-four tactics of a league run's main player: does it take an immediate win, do its opponents block one?

Not a goal of its own: a diagnostic for issue 6's "main player beats random >= 95%", which the default league
misses by a few points. It measures, on a finished `league run` directory (`bench/bench_league.py --keep DIR`,
or `league run --run-dir DIR`):

1. The main player's newest checkpoint against uniform random (greedy, seats alternating, as `league eval`
   plays): games won, and how often it takes an immediate win when it has one, by the line's direction; the
   games it did not win, by its seat, and in how many it had let a single immediate threat stand.
2. The same player against its own league (itself and the two newest snapshots of every active player), both
   sampling their moves as in training: how often it takes an immediate win, and how often the opponent blocks
   one of its immediate threats (plays the column where it would complete four). A player learns to take a
   win now only as far as its opponents punish waiting.
3. With `--supervised`: the same network trained by supervision on positions from random games in which the
   player to move has a winning move; held-out accuracy by direction. Shows whether the model can represent
   the tactic at all.
4. With `--baseline`: what those two tactics alone are worth against random, by seat: a player with no
   learning that takes an immediate win when it has one, else blocks the opponent's immediate threat, else
   moves uniformly at random.

`python bench/connect_four_tactics.py RUN_DIR [--games N] [--supervised] [--baseline]`
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
from collections import Counter

import numpy as np
import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from actor_service.evaluation import load_policy, win_rate_interval  # noqa: E402
from common.checkpoint_store import CheckpointStore  # noqa: E402
from common.computation.algorithm import ForwardKwargs  # noqa: E402
from common.computation.computation_task import ComputationTask  # noqa: E402
from common.envs.openspiel_env import PIECE_PLANES  # noqa: E402
from common.envs.policy_view import player_view, to_play  # noqa: E402
from common.envs.registry import make_env  # noqa: E402

MAIN = "main_player_default_0"
ROWS, COLS = 6, 7
EMPTY_PLANE = 2
DIRECTIONS = {"vertical": (1, 0), "horizontal": (0, 1), "diagonal": (1, 1), "antidiagonal": (1, -1)}


def winning_columns(state, player: int) -> dict[int, str]:
    """Columns where `player` completes four by dropping a piece now (whoever is to move), each with the
    direction of a line it completes (diagonals of both slopes reported as "diagonal")."""
    planes = np.asarray(state.observation_tensor(player)).reshape(3, ROWS, COLS)  # row 0 is the bottom
    mine = planes[PIECE_PLANES["connect_four"][player]].astype(bool)
    empty = planes[EMPTY_PLANE].astype(bool)
    found = {}
    for col in range(COLS):
        open_rows = np.flatnonzero(empty[:, col])
        if not len(open_rows):
            continue
        row = int(open_rows.min())  # where a piece dropped in this column lands
        for name, (dr, dc) in DIRECTIONS.items():
            count = 1
            for sign in (1, -1):
                r, c = row + sign * dr, col + sign * dc
                while 0 <= r < ROWS and 0 <= c < COLS and mine[r, c]:
                    count += 1
                    r, c = r + sign * dr, c + sign * dc
            if count >= 4:
                found[col] = "diagonal" if name == "antidiagonal" else name
                break
    return found


class Tally:
    """What one series of games showed: the main player's immediate wins (available, taken, by direction), its
    threats the opponent faced and blocked, and the games it won."""

    def __init__(self) -> None:
        self.available: Counter[str] = Counter()
        self.taken: Counter[str] = Counter()
        self.threats = 0
        self.blocked = 0
        self.games = 0
        self.wins = 0
        self.not_won = [0, 0]  # games not won, as first and as second player
        self.not_won_unblocked = 0  # ... in which it had left one immediate threat of the opponent's unblocked

    def losses(self) -> str:
        return (f"not won {self.not_won[0]} as first player, {self.not_won[1]} as second; in "
                f"{self.not_won_unblocked} of them it had left a single immediate threat unblocked")

    def took(self) -> str:
        total, taken = sum(self.available.values()), sum(self.taken.values())
        by = ", ".join(f"{d} {self.taken[d]}/{self.available[d]}" for d in ("vertical", "horizontal", "diagonal"))
        return f"took {taken}/{total} immediate wins ({taken / max(total, 1):.0%}: {by})"


def play(env, info, main: ComputationTask, opponent: ComputationTask | None, games: int, greedy: bool,
         tally: Tally, seed: int) -> None:
    """`games` games of `main` against `opponent` (a task, or None for the env's uniform random bot)."""
    kwargs = ForwardKwargs(greedy=greedy)

    def act(task: ComputationTask, view) -> int:
        return int(task.predict({k: v[None] for k, v in view.items()}, forward_kwargs=kwargs).actions["action"][0])

    for game in range(games):
        seat = game % 2
        env.seed(seed + game)
        obs = env.reset(bots={1 - seat: "random"} if opponent is None else {})
        unblocked = False
        while True:
            mover = to_play(obs, info)
            state = env.state
            view = player_view(obs, mover, info)
            if mover == seat:
                action = act(main, view)
                wins = winning_columns(state, seat)
                if wins:
                    direction = next(iter(wins.values()))
                    tally.available[direction] += 1
                    tally.taken[direction] += action in wins
                else:
                    threats = winning_columns(state, 1 - seat)
                    unblocked |= len(threats) == 1 and action not in threats
            else:
                action = act(opponent, view)
                threats = winning_columns(state, seat)
                if threats and not winning_columns(state, mover):  # it has nothing better to do than block
                    tally.threats += 1
                    tally.blocked += action in threats
            ts = env.step(action)
            obs = ts.obs
            if ts.terminated or ts.truncated:
                break
        tally.games += 1
        won = bool(ts.info.outcome) and ts.info.outcome[seat].name == "WIN"
        tally.wins += won
        if not won:
            tally.not_won[seat] += 1
            tally.not_won_unblocked += unblocked


def supervised(policy_config: dict, info, steps: int = 3000) -> None:
    """Train a fresh network of the same config to play the winning move of random-game positions."""
    import torch

    from common.algorithms.registry import make_computation_task
    from common.envs.policy_view import policy_specs

    def positions(count: int, seed: int):
        env = make_env("connect_four")
        rng = np.random.default_rng(seed)
        observations, masks, targets, directions = [], [], [], []
        game = 0
        while len(observations) < count:
            env.seed(seed * 1_000_000 + game)
            game += 1
            obs = env.reset()
            while True:
                mover = to_play(obs, info)
                view = player_view(obs, mover, info)
                wins = winning_columns(env.state, mover)
                if wins:
                    target = np.zeros(COLS, np.float32)
                    target[list(wins)] = 1.0
                    observations.append(view["observation"])
                    masks.append(view["action_mask"])
                    targets.append(target)
                    directions.append(next(iter(wins.values())))
                ts = env.step(int(rng.choice(np.flatnonzero(view["action_mask"]))))
                obs = ts.obs
                if ts.terminated or ts.truncated:
                    break
        env.close()
        return (torch.tensor(np.array(observations)), torch.tensor(np.array(masks)), torch.tensor(np.array(targets)),
                np.array(directions))

    inputs, actions = policy_specs(info)
    model = make_computation_task(policy_config, inputs, actions, device="cpu", seed=0).algorithm.model
    train, test = positions(20_000, 1), positions(3_000, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(0)
    for step in range(1, steps + 1):
        rows = torch.randint(0, len(train[0]), (256,), generator=generator)
        logits, _ = model({"observation": train[0][rows], "action_mask": train[1][rows]})
        log_probs = torch.log_softmax(logits, -1).masked_fill(train[2][rows] == 0, -1e9)
        loss = -torch.logsumexp(log_probs, -1).mean()  # the probability of playing any winning move
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step in (100, 300, 1000, steps):
            with torch.no_grad():
                logits, _ = model({"observation": test[0], "action_mask": test[1]})
            hit = test[2].gather(1, logits.argmax(1, keepdim=True)).squeeze(1).numpy() > 0
            by = ", ".join(f"{d} {hit[test[3] == d].mean():.0%}" for d in ("vertical", "horizontal", "diagonal"))
            print(f"  supervised, {step} steps of 256: held-out winning move chosen {hit.mean():.0%} ({by})")


def baseline(games: int, seed: int = 30_000) -> None:
    """Win, else block, else a uniformly random move, against uniform random: `games` games per seat."""
    import pyspiel

    game = pyspiel.load_game("connect_four")
    rng = np.random.default_rng(seed)
    for seat in (0, 1):
        won = 0
        for _ in range(games):
            state = game.new_initial_state()
            while not state.is_terminal():
                move = int(rng.choice(state.legal_actions()))
                if state.current_player() == seat:
                    wins, threats = winning_columns(state, seat), winning_columns(state, 1 - seat)
                    move = next(iter(wins)) if wins else next(iter(threats)) if threats else move
                state.apply_action(move)
            won += state.returns()[seat] > 0
        print(f"  win-else-block-else-random as {'first' if seat == 0 else 'second'} player, {games} games: "
              f"won {won / games:.1%}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=pathlib.Path)
    parser.add_argument("--games", type=int, default=300, help="games against random (and half that per "
                        "league opponent)")
    parser.add_argument("--supervised", action="store_true", help="also train the network by supervision")
    parser.add_argument("--baseline", action="store_true", help="also play the win-else-block-else-random "
                        "player against random")
    args = parser.parse_args(argv)
    config = yaml.safe_load((args.run_dir / "config.yaml").read_text())
    if config["env"]["name"] != "connect_four":
        parser.error(f"{args.run_dir}: a connect-four league is needed, this one plays {config['env']['name']}")
    shared = args.run_dir / "shared"
    store = CheckpointStore(shared)
    env = make_env("connect_four", **(config["env"].get("kwargs") or {}))
    info = env.info()
    latest = json.loads((shared / MAIN / "latest.json").read_text())
    main_task, ref = load_policy(store, latest["path"], config["policy"], info, seed=1)
    print(f"{MAIN} v{ref.version} ({latest['metadata'].get('agent_steps', '?')} agent steps), {args.run_dir}")

    tally = Tally()
    play(env, info, main_task, None, args.games, True, tally, seed=10_000)
    low, high = win_rate_interval(tally.wins, tally.games)
    print(f"vs uniform random, greedy, {tally.games} games: won {tally.wins / tally.games:.1%} (95% interval "
          f"{low:.1%}-{high:.1%}); {tally.took()}; "
          f"{tally.losses()}")

    print(f"vs its league, both sampling, {args.games // 2} games each:")
    opponents = {"itself": main_task}
    for player_dir in sorted(p for p in shared.iterdir() if (p / "latest.json").exists()):
        for i, path in enumerate(sorted(player_dir.glob("v*_*.pt"))[-2:]):  # snapshots: v<version>_<steps>.pt
            opponents[f"{player_dir.name}/{path.stem}"], _ = load_policy(store, str(path.relative_to(shared)), config["policy"], info,
                                                  seed=2 + i)
    for name, opponent in opponents.items():
        tally = Tally()
        play(env, info, main_task, opponent, args.games // 2, False, tally, seed=20_000)
        print(f"  {name:<46} won {tally.wins / tally.games:5.1%}; {tally.took()}; the opponent blocked "
              f"{tally.blocked}/{tally.threats} of its threats ({tally.blocked / max(tally.threats, 1):.0%})")
    env.close()
    if args.supervised:
        supervised(config["policy"], info)
    if args.baseline:
        baseline(args.games)


if __name__ == "__main__":
    main()
