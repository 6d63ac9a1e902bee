"""Any gymnasium env behind the `Env` interface."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

from common.envs.base import (
    NO_INFO,
    ArraySpec,
    DiscreteSpec,
    Env,
    EnvInfo,
    EpisodeStats,
    ObsSpec,
    Spec,
    StepInfo,
    TimeStep,
)


def spec_from_space(space: spaces.Space) -> ObsSpec:
    """The spec of a Box, Discrete, MultiBinary, MultiDiscrete or flat Dict space; None for other spaces."""
    if isinstance(space, spaces.Box):
        return ArraySpec(space.shape, space.dtype, minimum=space.low, maximum=space.high)
    if isinstance(space, spaces.Discrete):
        if int(space.start) != 0:
            return ArraySpec((), space.dtype, minimum=int(space.start), maximum=int(space.start + space.n - 1))
        return DiscreteSpec(int(space.n), space.dtype)
    if isinstance(space, spaces.MultiBinary):
        return ArraySpec(space.shape, space.dtype, minimum=0, maximum=1)
    if isinstance(space, spaces.MultiDiscrete):  # bounds per entry: a policy's choice counts are nvec
        start = np.asarray(space.start)
        return ArraySpec(space.shape, space.dtype, minimum=start, maximum=start + np.asarray(space.nvec) - 1)
    if isinstance(space, spaces.Dict):
        leaves = {key: spec_from_space(sub) for key, sub in space.spaces.items()}
        if all(isinstance(leaf, (ArraySpec, DiscreteSpec)) for leaf in leaves.values()):
            return leaves
    return None


def _obs_converter(spec: ObsSpec) -> Callable[[Any], Any] | None:
    """Discrete observations come back from gymnasium as Python ints: make them arrays, so an observation
    looks the same whether it came straight from the env or through shared memory."""
    if isinstance(spec, DiscreteSpec) or (isinstance(spec, ArraySpec) and spec.shape == ()):
        dtype = spec.dtype
        return lambda obs: np.asarray(obs, dtype=dtype)
    if isinstance(spec, Mapping) and any(leaf.shape == () for leaf in spec.values()):
        scalar_keys = {key: leaf.dtype for key, leaf in spec.items() if leaf.shape == ()}

        def convert(obs: Mapping[str, Any]) -> dict[str, Any]:
            out = dict(obs)
            for key, dtype in scalar_keys.items():
                out[key] = np.asarray(out[key], dtype=dtype)
            return out

        return convert
    return None


class GymEnv(Env):
    """Wraps a gymnasium env given by id (`GymEnv("CartPole-v1")`, kwargs go to `gymnasium.make`) or factory."""

    def __init__(self, env: str | Callable[[], gymnasium.Env], *, env_name: str | None = None,
                 **make_kwargs: Any) -> None:
        """`env_name`: what messages call a factory's env (its league name, `python:<module>:<callable>`)."""
        if isinstance(env, str):
            self._env = gymnasium.make(env, **make_kwargs)
            name = env
        else:
            if make_kwargs:
                raise ValueError(f"GymEnv: make_kwargs {sorted(make_kwargs)} only apply to an env id")
            self._env = env()
            name = env_name or (self._env.spec.id if self._env.spec is not None
                                else type(self._env.unwrapped).__name__)
        obs_spec = spec_from_space(self._env.observation_space)
        action_spec: Spec | None = spec_from_space(self._env.action_space)  # type: ignore[assignment]
        if isinstance(action_spec, Mapping):
            action_spec = None
        self._info = EnvInfo(name=name, obs_spec=obs_spec, action_spec=action_spec)
        self._convert_obs = _obs_converter(obs_spec)
        self._pending_seed: int | None = None
        self._episode_return = 0.0
        self._episode_length = 0

    @property
    def gymnasium_env(self) -> gymnasium.Env:
        return self._env

    def info(self) -> EnvInfo:
        return self._info

    def seed(self, seed: int) -> None:
        self._pending_seed = int(seed)
        self._env.action_space.seed(int(seed))

    def reset(self, **params: Any) -> Any:
        seed, self._pending_seed = self._pending_seed, None
        obs, _ = self._env.reset(seed=seed, options=params or None)
        self._episode_return = 0.0
        self._episode_length = 0
        return obs if self._convert_obs is None else self._convert_obs(obs)

    def step(self, action: Any) -> TimeStep:
        obs, reward, terminated, truncated, extra = self._env.step(action)
        reward = float(reward)
        self._episode_return += reward
        self._episode_length += 1
        if terminated or truncated:
            info = StepInfo(episode=EpisodeStats(self._episode_return, self._episode_length), extra=extra)
        elif extra:
            info = StepInfo(extra=extra)
        else:
            info = NO_INFO
        if self._convert_obs is not None:
            obs = self._convert_obs(obs)
        return TimeStep(obs, reward, bool(terminated), bool(truncated), info)

    def close(self) -> None:
        self._env.close()
