"""A memory task a feed-forward policy cannot solve: recall a cue shown only at the episode's first step.

Named in a league config as ``python:common.envs.cue_memory:CueMemoryEnv`` (kwargs ``num_cues``, ``delay``).
It checks that recurrent policies work end to end: the optimal return is 1, while a policy without memory
sees the same observation at the query step whatever the cue was and earns 1/num_cues on average.
"""

from __future__ import annotations

import numpy as np

from common.envs.base import NO_INFO, ArraySpec, DiscreteSpec, Env, EnvInfo, EpisodeStats, StepInfo, TimeStep


class CueMemoryEnv(Env):
    """Episodes of ``delay + 1`` steps. Observation (num_cues + 1,) float32: the cue one-hot at step 0, zeros
    in between, and the last entry 1 at step ``delay`` (the query). Actions: num_cues. At the query, choosing
    the cue pays 1 (else 0) and the episode terminates; actions before the query do nothing."""

    def __init__(self, num_cues: int = 2, delay: int = 5) -> None:
        self.num_cues = _whole("num_cues", num_cues, 2)
        self.delay = _whole("delay", delay, 1)
        self._rng = np.random.default_rng()
        self._cue = 0
        self._t = 0

    def info(self) -> EnvInfo:
        return EnvInfo("cue_memory", ArraySpec((self.num_cues + 1,), np.float32), DiscreteSpec(self.num_cues))

    def seed(self, seed: int) -> None:
        self._rng = np.random.default_rng(seed)

    def reset(self) -> np.ndarray:
        self._cue = int(self._rng.integers(self.num_cues))
        self._t = 0
        return self._obs()

    def step(self, action: int) -> TimeStep:
        if self._t > self.delay:
            raise RuntimeError("CueMemoryEnv: step after the episode ended; reset first")
        if not 0 <= int(action) < self.num_cues:
            raise ValueError(f"action {action!r} is not in [0, {self.num_cues})")
        query = self._t == self.delay
        reward = float(int(action) == self._cue) if query else 0.0
        self._t += 1
        if query:
            return TimeStep(self._obs(), reward, True, False, StepInfo(episode=EpisodeStats(reward, self._t)))
        return TimeStep(self._obs(), reward, False, False, NO_INFO)

    def _obs(self) -> np.ndarray:
        obs = np.zeros(self.num_cues + 1, np.float32)
        if self._t == 0:
            obs[self._cue] = 1.0
        elif self._t == self.delay:
            obs[-1] = 1.0
        return obs


def _whole(name: str, value: object, minimum: int) -> int:
    """An int kwarg; a job's env kwargs arrive as a protobuf Struct, where 4 is the double 4.0."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value) or value < minimum:
        raise ValueError(f"{name}: must be an int >= {minimum}, got {value!r}")
    return int(value)
