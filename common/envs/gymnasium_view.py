"""Our `Env` seen through gymnasium's API: for gymnasium's env checker and gymnasium-based tools."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

from common.envs.base import ArraySpec, DiscreteSpec, Env, ObsSpec, StepInfo


def space_from_spec(spec: ObsSpec) -> spaces.Space:
    if isinstance(spec, DiscreteSpec):
        return spaces.Discrete(spec.num_values)
    if isinstance(spec, ArraySpec):
        if spec.dtype == np.bool_:
            return spaces.Box(0, 1, spec.shape, np.bool_)
        if np.issubdtype(spec.dtype, np.integer):
            limits = np.iinfo(spec.dtype)
            low = limits.min if spec.minimum is None else spec.minimum
            high = limits.max if spec.maximum is None else spec.maximum
        else:
            low = -np.inf if spec.minimum is None else spec.minimum
            high = np.inf if spec.maximum is None else spec.maximum
        return spaces.Box(low, high, spec.shape, spec.dtype)
    if isinstance(spec, Mapping):
        return spaces.Dict({key: space_from_spec(leaf) for key, leaf in spec.items()})
    raise ValueError(f"no gymnasium space for spec {spec!r}")


def _info_dict(info: StepInfo) -> dict[str, Any]:
    out: dict[str, Any] = dict(info.extra)
    if info.episode is not None:
        out["episode"] = {"r": info.episode.episode_return, "l": info.episode.length}
    if info.outcome is not None:
        out["outcome"] = [o.value for o in info.outcome]
    return out


class GymnasiumView(gymnasium.Env):
    """Wraps an `Env`; for several players the reward is that of the player who acted."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, env: Env) -> None:
        self._env = env
        info = env.info()
        self._num_players = info.num_players
        self.observation_space = space_from_spec(info.obs_spec)
        self.action_space = space_from_spec(info.action_spec)
        self._to_play = 0
        # gymnasium wants Discrete observations as numpy integers, our adapters give 0-d arrays.
        self._convert_obs = (lambda obs: np.int64(obs)) if isinstance(info.obs_spec, DiscreteSpec) else (lambda obs: obs)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        if seed is not None:
            self._env.seed(seed)
        obs = self._env.reset(**(options or {}))
        self._remember_player(obs)
        return self._convert_obs(obs), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        acting = self._to_play
        ts = self._env.step(action)
        self._remember_player(ts.obs)
        reward = float(ts.reward) if self._num_players == 1 else float(ts.reward[acting])
        return self._convert_obs(ts.obs), reward, ts.terminated, ts.truncated, _info_dict(ts.info)

    def close(self) -> None:
        self._env.close()

    def _remember_player(self, obs: Any) -> None:
        if self._num_players > 1:
            self._to_play = int(obs["to_play"])
