"""A real-valued action end to end: `league run configs/solo_pendulum.yaml` against Stable-Baselines3 PPO.

1. Learning: the final checkpoint of the league run, played greedily for 100 Pendulum-v1 episodes (the same
   seeds for both trainers). Goal (ours, no issue sets one): a mean return >= GOAL, Pendulum's usual "solved".
2. Wall-clock to that goal against SB3 PPO with rl-baselines3-zoo's tuned Pendulum settings (gSDE included),
   run as its own process in the same benchmark and judged offline by the same code (bench/learning_clock.py),
   as bench_system does for CartPole. Goal: the league is not slower.
3. Env steps/s of the league run against SB3's training rate (context).

`python bench/bench_pendulum.py [--quick] [--seconds S]`
"""

from __future__ import annotations

import pathlib
import sys
import tempfile

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_system import (  # noqa: E402
    evaluate,
    league_snapshots,
    race_met,
    run_league,
    run_sb3,
    steady_rate,
)
from bench.common import BenchRow, league_bench_args, print_rows  # noqa: E402
from bench.learning_clock import first_to_reach  # noqa: E402
from common.learner_config import MAX_KEEP_LAST  # noqa: E402

CONFIG = ROOT / "configs" / "solo_pendulum.yaml"
ENV = "Pendulum-v1"
GOAL = -200.0
SB3_STEPS = 100_000
"""The zoo's budget for PPO on Pendulum-v1 (n_timesteps 1e5)."""


def league_config(seconds: float) -> dict:
    """configs/solo_pendulum.yaml for `seconds`, every version kept for the offline judging."""
    config = yaml.safe_load(CONFIG.read_text())
    config["run"].update(seconds=seconds, status_interval_s=1.0)
    config["learner"]["keep_last"] = MAX_KEEP_LAST
    return config


def main(argv: list[str] | None = None) -> list[BenchRow]:
    quick, seconds = league_bench_args(__doc__, argv, quick_s=60.0, full_s=180.0)
    episodes = 20 if quick else 100
    config = league_config(seconds)
    rows: list[BenchRow] = []
    with tempfile.TemporaryDirectory(prefix="bench-pendulum-") as tmp:
        run_dir = pathlib.Path(tmp) / "run"
        history, launched = run_league(config, run_dir, seconds)
        system = steady_rate(history)
        mean = evaluate(run_dir, config, episodes=episodes)
        rows.append(BenchRow(f"league run solo Pendulum: greedy mean return, {episodes} episodes, after "
                             f"{seconds:.0f} s", mean, "return",
                             # (no ratio: of two negative returns the better one gave the smaller; a review)
                             f"goal {GOAL:g} (a negative return: no ratio)", float("nan"), f"≥ {GOAL:g}",
                             mean >= GOAL))
        league_reached = first_to_reach(league_snapshots(run_dir, config, launched), GOAL, env_id=ENV)
    league_s = league_reached.seconds if league_reached else float("nan")
    sb3 = run_sb3(steps=SB3_STEPS // 2 if quick else SB3_STEPS, env=ENV, goal=GOAL)
    metric = f"seconds from launch to a greedy mean ≥ {GOAL:g} (100 episodes)"
    goal = "not slower than SB3 (ratio ≤ 1)"
    if sb3 is None:
        rows.append(BenchRow(metric, league_s, "s", "SB3 not installed (pip install -e '.[bench]')",
                             float("nan"), goal, None))
    else:
        sb3_s = sb3["reached_s"] if sb3["reached_s"] is not None else float("nan")
        met = race_met(league_reached.seconds if league_reached else None, sb3["reached_s"])
        rows.append(BenchRow(metric, league_s, "s", "SB3 PPO, rl-zoo settings (gSDE), same judging", sb3_s, goal,
                             met))
        # (The league's figure first, as in every row: SB3's as the value read its ratio backwards; a review.)
        rows.append(BenchRow("league run env steps/s (context)", system, "steps/s",
                             "SB3 PPO training env steps/s", sb3["steps_per_s"], "(context)", None))
    print_rows("A Box action: solo Pendulum against SB3", rows)
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
