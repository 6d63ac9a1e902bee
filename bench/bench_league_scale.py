"""Opponent choice as the league grows: the cost of each active player's `get_job` (PFSP, self-play,
verification: what the launch thread runs under the league's lock for every job) with N historical players,
against the same at the size of a 5-minute default league (~30 snapshots), measured in the same run.

A long league keeps every snapshot (the default makes ~400 an hour on 2 cores), and opponent choice reads a win
rate against each of them at every job. Run: `python bench/bench_league_scale.py [--players 1000 5000] [--quick]`.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # before bench/ (its common.py would shadow the project's `common`)

import numpy as np  # noqa: E402

from bench.common import BenchRow, print_rows  # noqa: E402
from league_service.config import config_from_dict, default_config_dict  # noqa: E402
from league_service.factory import create_league  # noqa: E402
from league_service.messages import Outcome  # noqa: E402
from league_service.players import HistoricalPlayer  # noqa: E402
from league_service.testing import battle_result  # noqa: E402

BASELINE_PLAYERS = 30


def job_costs_s(historical: int, calls: int) -> dict[str, float]:
    """Mean seconds of one `get_job` per active player type of the default league, with `historical` snapshots
    (each active player's in turn), a third of them played by the main player (9 wins in 10)."""
    cfg = config_from_dict(default_config_dict())
    league = create_league(cfg, lambda *a, **k: None, lambda spec: None, rng_seed=0, launch_thread=False)
    roster = league._roster  # (a benchmark: snapshots added directly, not trained for)
    active = list(roster.active.values())
    for i in range(historical):
        parent = active[i % len(active)]
        roster.add_historical(HistoricalPlayer(
            player_id=f"{parent.player_id}_{i + 1}", category="default", payoff=roster.payoff,
            parent_id=parent.player_id, parent_type=parent.player_type, total_agent_step=i + 1))
    main = next(p for p in active if p.player_type == "main_player")
    for snapshot in list(roster.historical.values())[::3]:
        roster.payoff.update(battle_result((main.player_id, snapshot.player_id), [Outcome.WIN] * 9 + [Outcome.LOSS]))
    rng = np.random.default_rng(0)
    costs = {}
    for player in active:
        player.get_job(rng)  # warm
        start = time.perf_counter()
        for _ in range(calls):
            player.get_job(rng)
        costs[player.player_type] = (time.perf_counter() - start) / calls
    league.close()
    return costs


def main(argv: list[str] | None = None) -> list[BenchRow]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--players", type=int, nargs="+", default=[1000, 5000], help="historical players")
    parser.add_argument("--calls", type=int, default=50, help="get_job calls timed per player")
    parser.add_argument("--quick", action="store_true", help="1,000 historical players only, 10 calls")
    args = parser.parse_args(argv)
    if args.quick:
        args.players, args.calls = [1000], 10
    baseline = job_costs_s(BASELINE_PLAYERS, args.calls)
    rows = []
    for n in args.players:
        costs = job_costs_s(n, args.calls)
        for player_type, cost in costs.items():
            rows.append(BenchRow(
                f"{player_type} get_job, {n:,} historical players", cost * 1e3, "ms",
                f"the same, {BASELINE_PLAYERS} historical players", baseline[player_type] * 1e3,
                "grows no faster than the league (ratio at most players / 30)", met=cost / baseline[player_type] <= n / BASELINE_PLAYERS))
    print_rows("Opponent choice as the league grows", rows)
    return rows


if __name__ == "__main__":
    main()
