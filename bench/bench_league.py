"""Learning outcome of the default battle league (issue 6): `make run`'s league, judged against fixed bots.

Runs the embedded default league (connect four; main player, main exploiter, league exploiter) for its
budget exactly as `make run` does, then `league eval --run-dir` plays the main player's snapshots along the
run against random and OpenSpiel's MCTS bot at growing simulation counts. Goals: the final main player
beats random >= 95%, judged on FINAL_RANDOM_GAMES games of the final checkpoint (one standard error ~0.7
points there, ~2.4 on the ladder's 100); its results against MCTS improve over the run (the strongest MCTS it
beats more than half the time is reported). The league's own view (historical players, rated games, rating
spread) is reported from its last status, and, for context, the final main player's result against random when
each of its moves is a search of SEARCH simulations over its own policy and value (`league eval --search`).

`python bench/bench_league.py [--quick] [--seconds S] [--games N] [--config FILE]`
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import BenchRow, exit_on_sigterm, print_rows, run_until_done  # noqa: E402
from league_service.status import REFERENCE_BOT_TYPE  # noqa: E402

LADDER = ("random", "mcts:10", "mcts:25", "mcts:50", "mcts:100", "mcts:200")
FINAL_RANDOM_GAMES = 1000
"""Games of the final main player against random for the goal row (greedy games against random are cheap)."""
SEARCH = 50
"""Simulations a move of the context rows that play the final main player with lookahead (`league eval --search`)."""
SEARCH_LADDER = ("mcts:10", "mcts:25", "mcts:50", "mcts:100", "mcts:200", "mcts:400")


def _eval_lines(*argv: str) -> list[dict]:
    """`league eval ARGV --json`: its JSON lines (one per opponent; one document with --run-dir)."""
    out = subprocess.run([sys.executable, "-m", "league_cli", "eval", *argv, "--json"],
                         check=True, capture_output=True, text=True, timeout=3600)
    return [json.loads(line) for line in out.stdout.strip().splitlines()]


def _mcts_sims(opponent: str) -> int:
    return 0 if opponent == "random" else int(opponent.split(":")[1])


def main(argv: list[str] | None = None) -> list[BenchRow]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seconds", type=float, default=None, help="league run budget (default: the config's 300 s)")
    parser.add_argument("--games", type=int, default=None, help="games per checkpoint and opponent")
    parser.add_argument("--keep", type=pathlib.Path, default=None, help="keep the run directory here")
    parser.add_argument("--config", type=pathlib.Path, default=None,
                        help="a league config merged over the default (to compare a variant; default: none)")
    args = parser.parse_args(argv)
    if args.keep is not None and args.keep.exists() and (not args.keep.is_dir() or any(args.keep.iterdir())):
        # league run resumes a directory that holds a league: the rows would time the second run only, as if
        # fresh (a review)
        parser.error(f"--keep {args.keep} exists and is not an empty directory: league run would resume it")
    exit_on_sigterm()
    seconds = args.seconds or (60.0 if args.quick else None)
    games = args.games or (20 if args.quick else 100)
    with tempfile.TemporaryDirectory(prefix="bench-league-") as tmp:
        run_dir = args.keep or pathlib.Path(tmp) / "run"
        cmd = [sys.executable, "-m", "league_cli", "run", "--run-dir", str(run_dir), "--quiet"]
        if args.config:
            cmd.insert(4, str(args.config))
        if seconds:
            cmd += ["--seconds", str(seconds)]
        start = time.monotonic()
        run_until_done(cmd, stdout=subprocess.DEVNULL, timeout=(seconds or 300) + 300)
        run_s = time.monotonic() - start
        report = _eval_lines("--run-dir", str(run_dir), "--opponent", ",".join(LADDER), "--games", str(games),
                             "--points", "4")[-1]
        final_games = max(games, 100 if args.quick else FINAL_RANDOM_GAMES)
        final = ("--checkpoint", report["points"][-1]["checkpoint"], "--shared-root", str(run_dir / "shared"),
                 "--config", str(run_dir / "config.yaml"))
        final_random = _eval_lines(*final, "--opponent", "random", "--games", str(final_games), "--seed", "1")[-1]
        searched_random = _eval_lines(*final, "--opponent", "random", "--games", str(final_games), "--seed", "1",
                                      "--search", str(SEARCH))[-1]
        searched_ladder = _eval_lines(*final, "--opponent", ",".join(SEARCH_LADDER), "--games", str(games),
                                      "--search", str(SEARCH))
        history = (run_dir / "status_history.jsonl").read_text().splitlines()
        status = json.loads(history[-1])
    points = report["points"]
    first, last = points[0], points[-1]
    final_rate = final_random["win_rate"]
    low, high = final_random["win_rate_95"]
    rows = [
        BenchRow(f"main player after {run_s:.0f} s (v{last['version']}, {last['agent_steps']:,} agent steps) "
                 f"vs uniform random, {final_games:,} games (95% interval {low:.1%}-{high:.1%})",
                 final_rate * 100, "% won", "goal", 95.0, "≥ 95%", final_rate >= 0.95),
        BenchRow(f"the same checkpoint, each move a search of {SEARCH} simulations over its policy and value "
                 f"(`league eval --search {SEARCH}`), {final_games:,} games", searched_random["win_rate"] * 100,
                 "% won", "its greedy moves (the row above)", final_rate * 100, "(context: with lookahead)", None),
    ]
    for opponent in LADDER[1:]:
        rows.append(BenchRow(f"main player vs {opponent}: first snapshot (v{first['version']}, "
                             f"{first['agent_steps']:,} steps) -> final", last["win_rate"][opponent] * 100, "% won",
                             "first snapshot", first["win_rate"][opponent] * 100, "improves over the run",
                             last["win_rate"][opponent] > first["win_rate"][opponent]
                             or last["win_rate"][opponent] == 1.0))
    strongest_last = _mcts_sims(last["strongest_beaten"]) if last["strongest_beaten"] != "-" else -1
    strongest_first = _mcts_sims(first["strongest_beaten"]) if first["strongest_beaten"] != "-" else -1
    rows.append(BenchRow("largest MCTS simulation count the final main player beats > 50% (0: random only)",
                         strongest_last, "simulations", "the same for the first snapshot", strongest_first,
                         "reported (and not below the first snapshot's)", strongest_last >= strongest_first))
    searched_beaten = max((_mcts_sims(r["opponent"]) for r in searched_ladder if r.get("score", r["win_rate"]) > 0.5),
                          default=0)  # (by score, draws half, as the greedy row's strongest_beaten)
    rows.append(BenchRow(f"largest MCTS count the final main player beats > 50% with `--search {SEARCH}` ({games} "
                         "games each: " + ", ".join(f"{r['opponent']} {r['win_rate']:.0%}" for r in searched_ladder)
                         + ")", searched_beaten, "simulations", "greedy (the row above)", max(strongest_last, 0),
                         "(context: with lookahead)", None))
    historical = sum(1 for p in status["players"] if not p.get("active") and p.get("player_type") != REFERENCE_BOT_TYPE)
    elos = [p.get("elo", 0.0) for p in status["players"]]
    c = status["counters"]
    rows.append(BenchRow("historical players (snapshots) at the end", historical, "players", "active players",
                         sum(1 for p in status["players"] if p.get("active")), "> 0", historical > 0))
    rows.append(BenchRow("matches counted into the payoff", int(c.get("matches", 0)), "matches", "env steps",
                         int(c.get("env_steps", 0)), "(context)", None))
    rows.append(BenchRow("Elo spread across players (max - min)", max(elos) - min(elos), "Elo", "initial Elo",
                         1200.0, "ratings move (> 0)", max(elos) - min(elos) > 0))
    progression = " | ".join(
        f"v{p['version']} ({p['agent_steps']:,} steps): " + ", ".join(f"{o} {p['win_rate'][o]:.0%}" for o in LADDER)
        for p in points)
    print(f"progression: {progression}")
    print_rows("Default connect-four league: learning outcome", rows)
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
