"""CartPole-v1 whose every step also spends a fixed amount of CPU: a stand-in for a real simulator.

CartPole itself costs ~7 µs a step, less than a policy's forward pass, so a system that learns can never step
it near the speed of a bare env loop. Real environments (physics, games, renderers) cost far more; this one
lets the system benchmark ask how much of the machine the league leaves to environments that do. The work is
measured in thread CPU time, so it costs the same CPU however busy the machine is.

Named in a league config as `python:bench.costly_env:CostlyCartPole` with `env.kwargs: {work_us: 1000}`.
"""

from __future__ import annotations

import time
from typing import Any

from common.envs.base import Env, EnvInfo, TimeStep
from common.envs.gym_env import GymEnv


class CostlyCartPole(Env):
    def __init__(self, work_us: float = 1000.0) -> None:
        if not work_us >= 0:
            raise ValueError(f"work_us must be >= 0, got {work_us}")
        self._work_s = work_us / 1e6
        self._env = GymEnv("CartPole-v1")

    def _work(self) -> None:
        start = time.thread_time()
        while time.thread_time() - start < self._work_s:
            pass

    def info(self) -> EnvInfo:
        return self._env.info()

    def seed(self, seed: int) -> None:
        self._env.seed(seed)

    def reset(self, **params: Any) -> Any:
        return self._env.reset(**params)

    def step(self, action: Any) -> TimeStep:
        self._work()
        return self._env.step(action)

    def close(self) -> None:
        self._env.close()
