"""A tiny deterministic env the env-manager tests drive through real managers (moolib/TorchBeast style).

Shared by the serial and subprocess manager tests so both check the same behaviour on the same env; it lives
in an importable module so spawned env workers can unpickle it.
"""

from __future__ import annotations

import threading

import numpy as np

from common.envs import NO_INFO, ArraySpec, DiscreteSpec, Env, EnvInfo, EpisodeStats, StepInfo, TimeStep


class CountingEnv(Env):
    """Observation [t, episode, noise]; an episode lasts `length` steps (reset param `length` overrides);
    reward is action + noise; `step_delay` (seconds, an Event wait) makes the env slow."""

    def __init__(self, length: int = 3, step_delay: float = 0.0) -> None:
        self._default_length = length
        self._step_delay = step_delay
        self._rng = np.random.default_rng()
        self._episode = -1
        self._t = 0
        self._length = length

    def info(self) -> EnvInfo:
        return EnvInfo("counting", ArraySpec((3,), np.float32), DiscreteSpec(3))

    def seed(self, seed: int) -> None:
        self._rng = np.random.default_rng(seed)

    def reset(self, length: int | None = None) -> np.ndarray:
        self._episode += 1
        self._t = 0
        self._length = length or self._default_length
        return self._obs()

    def step(self, action: int) -> TimeStep:
        if self._step_delay:
            threading.Event().wait(self._step_delay)
        self._t += 1
        obs = self._obs()
        done = self._t >= self._length
        info = StepInfo(episode=EpisodeStats(float(self._t), self._t)) if done else NO_INFO
        return TimeStep(obs, float(action) + float(obs[2]), done, False, info)

    def _obs(self) -> np.ndarray:
        return np.array([self._t, self._episode, self._rng.random()], np.float32)
