"""Returns a solo player's step-budget jobs report, against the env's true mean (~10 s).

A step-budget job (`env.episode_num: 0`) that cut its envs' episodes at its end reported only those that had
ended within its steps: short ones favoured. Its actor now plays the next job of the same match on from where
the last stopped (`actor_service.rollout.EnvCarry`). This plays `solo_cartpole.yaml`'s job shape (8 envs, 4,096
steps a job) on an env whose episodes last 50 or 500 steps with equal chance (a return of 1 a step: a true mean
of 275), once resetting the envs at every job as before, once playing on, and reports the mean return of the
episodes each reported.

    python bench/bench_episode_returns.py [--jobs 30]
"""

from __future__ import annotations

import argparse
import math
import pathlib
import sys
from functools import partial

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from actor_service.envs.env_manager import BaseEnvManager, EnvManagerConfig  # noqa: E402
from actor_service.policy_pool import Policy  # noqa: E402
from actor_service.rollout import Rollout, RolloutTarget  # noqa: E402
from actor_service.stop import StopSignal  # noqa: E402
from bench.common import BenchRow, print_rows  # noqa: E402
from common.algorithms.registry import make_computation_task  # noqa: E402
from common.computation.algorithm import ForwardKwargs  # noqa: E402
from common.envs import NO_INFO, ArraySpec, DiscreteSpec, Env, EnvInfo, TimeStep  # noqa: E402
from common.envs.policy_view import policy_specs  # noqa: E402

SHORT, LONG = 50, 500
TRUE_MEAN = (SHORT + LONG) / 2
ENV_NUM, JOB_STEPS = 8, 4096  # configs/solo_cartpole.yaml's jobs


class TwoLengthEnv(Env):
    """Episodes of SHORT or LONG steps (a coin flip at reset), 1 a step."""

    def __init__(self) -> None:
        self._rng = np.random.default_rng(0)
        self._t = 0
        self._length = SHORT

    def info(self) -> EnvInfo:
        return EnvInfo("two_lengths", ArraySpec((2,), np.float32), DiscreteSpec(2))

    def seed(self, seed: int) -> None:
        self._rng = np.random.default_rng(seed)

    def reset(self) -> np.ndarray:
        self._t = 0
        self._length = SHORT if self._rng.random() < 0.5 else LONG
        return np.zeros(2, np.float32)

    def step(self, action: int) -> TimeStep:
        self._t += 1
        return TimeStep(np.array([self._t / LONG, action], np.float32), 1.0, self._t >= self._length, False, NO_INFO)


def reported_returns(jobs: int, play_on: bool) -> list[float]:
    """The returns `jobs` consecutive jobs of one actor report, its envs reset at each job or played on."""
    manager = BaseEnvManager([partial(TwoLengthEnv)] * ENV_NUM, EnvManagerConfig(episode_num=math.inf))
    manager.seed(0)
    manager.launch()
    try:
        inputs, actions = policy_specs(manager.env_info)
        task = make_computation_task({"algorithm": "ppo", "model": {"hidden": [8]}}, inputs, actions, "cpu", 1)
        policy = Policy("solo", task, 1, "")
        target = RolloutTarget(("solo",), 0, JOB_STEPS, ForwardKwargs(), 32)
        carry, returns = None, []
        for job in range(jobs):
            if not play_on:
                manager.seed(job + 1)
                manager.reset()
            rollout = Rollout(manager, manager.env_info, target, [policy], stop=StopSignal(), carry=carry)
            returns += [episode.returns[0] for episode in rollout.run().episodes]
            carry = rollout.carry_out() if play_on and manager.play_on() else None
        return returns
    finally:
        manager.close()


def main(argv: list[str] | None = None) -> list[BenchRow]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=30)
    parser.add_argument("--quick", action="store_true", help="8 jobs")
    args = parser.parse_args(argv)
    if args.quick:
        args.jobs = 8
    rows = []
    for play_on, name in ((False, "envs reset at every job (before)"), (True, "episodes played on (now)")):
        returns = reported_returns(args.jobs, play_on)
        mean = float(np.mean(returns))
        rows.append(BenchRow(f"mean reported return, {name}, {len(returns)} episodes of {args.jobs} jobs", mean,
                             "return", "the env's true mean", TRUE_MEAN, "within 5% of the true mean",
                             abs(mean / TRUE_MEAN - 1) <= 0.05))
    print_rows("Returns reported by step-budget jobs", rows)
    return rows


if __name__ == "__main__":
    main()
