"""Coordinator restart as the league grows: the seconds from `Coordinator(...)` to started on a state holding N
historical players (each with a checkpoint file and games against the main player), against the same at the size
of a 5-minute default league (~30 snapshots), measured in the same run.

What it guards: deploy/docker-compose.yml gives the coordinator a 60 s start period before its healthcheck counts
(k8s's startup probe 120 s); a restore slower than that would stop `compose up` or restart the pod in a loop.
Run: `python bench/bench_restore.py [--players 1000 5000] [--quick]`.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # before bench/ (its common.py would shadow the project's `common`)

from bench.common import BenchRow, exit_on_sigterm, print_rows  # noqa: E402
from league_service.config import config_from_dict, default_config_dict  # noqa: E402
from league_service.coordinator import Coordinator, CoordinatorSettings  # noqa: E402
from league_service.messages import Outcome  # noqa: E402
from league_service.players import HistoricalPlayer  # noqa: E402
from league_service.testing import battle_result  # noqa: E402

BASELINE_PLAYERS = 30
START_PERIOD_S = 60.0
"""deploy/docker-compose.yml's coordinator healthcheck `start_period`."""


def restore_s(historical: int) -> float:
    """Seconds to restore and start a coordinator whose saved default league holds `historical` snapshots."""
    cfg = config_from_dict(default_config_dict())
    with tempfile.TemporaryDirectory(prefix="bench_restore.") as tmp:
        root = pathlib.Path(tmp)
        settings = CoordinatorSettings(shared_root=root, lease_timeout_s=60.0, needs_learner=False)
        coordinator = Coordinator(cfg, settings)
        roster = coordinator._league._roster  # (a benchmark: snapshots added directly, not trained for)
        active = list(roster.active.values())
        for i in range(historical):
            parent = active[i % len(active)]
            path = f"{parent.player_id}/v{i:010d}_{i + 1}.pt"
            (root / parent.player_id).mkdir(exist_ok=True)
            (root / path).write_bytes(b"weights")
            roster.add_historical(HistoricalPlayer(
                player_id=f"{parent.player_id}_{i + 1}", category="default", payoff=roster.payoff,
                parent_id=parent.player_id, parent_type=parent.player_type, total_agent_step=i + 1,
                checkpoint_path=path))
        main = next(p for p in active if p.player_type == "main_player")
        for snapshot in list(roster.historical.values()):
            roster.payoff.update(battle_result((main.player_id, snapshot.player_id),
                                               [Outcome.WIN] * 9 + [Outcome.LOSS]))
        coordinator._league._all_changed = True  # the whole league goes to the store at the next commit
        with coordinator._lock:
            coordinator._persist(league_state=True)
        coordinator.close()
        start = time.perf_counter()
        restored = Coordinator(cfg, settings)
        restored.start()
        seconds = time.perf_counter() - start
        players = len(restored.status().league.players)
        restored.close()
    if players < historical:
        raise RuntimeError(f"restored {players} players of {historical} historical ones and more active")
    return seconds


def main(argv: list[str] | None = None) -> list[BenchRow]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--players", type=int, nargs="+", default=[1000, 5000], help="historical players")
    parser.add_argument("--quick", action="store_true", help="1,000 historical players only")
    args = parser.parse_args(argv)
    exit_on_sigterm()  # (its temporary files are removed when stopped so, not only at Ctrl-C)
    if args.quick:
        args.players = [1000]
    baseline = restore_s(BASELINE_PLAYERS)
    rows = []
    for n in args.players:
        seconds = restore_s(n)
        rows.append(BenchRow(
            f"coordinator restore + start, {n:,} historical players", seconds * 1e3, "ms",
            f"the same, {BASELINE_PLAYERS} historical players", baseline * 1e3,
            f"under the compose healthcheck's {START_PERIOD_S:.0f} s start period", met=seconds < START_PERIOD_S))
    print_rows("Coordinator restart as the league grows", rows)
    return rows


if __name__ == "__main__":
    main()
