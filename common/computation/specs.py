"""Typed descriptions of the arrays a model consumes and produces (FLARE's ``(name, props)`` specs).

A spec names an array and gives its per-row shape and dtype; arrays carry extra *leading* dimensions
(batch, or batch and time) in front of ``shape``. `ComputationTask` converts numpy arrays by these specs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from common.trajectory import ALLOWED_DTYPES, OBSERVATION

ACTION_MASK = "action_mask"
"""The optional input naming legal actions (bool, one entry per action); board-game envs provide it."""

_SPEC_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    optional: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _SPEC_NAME.match(self.name):
            raise ValueError(f"spec name {self.name!r} must match {_SPEC_NAME.pattern}")
        shape = tuple(self.shape)
        if any(not isinstance(d, int | np.integer) or d < 0 for d in shape):
            raise ValueError(f"spec {self.name}: shape {self.shape} must hold non-negative ints")
        object.__setattr__(self, "shape", tuple(int(d) for d in shape))
        if self.dtype not in ALLOWED_DTYPES:
            raise ValueError(f"spec {self.name}: dtype {self.dtype!r} is not one of {sorted(ALLOWED_DTYPES)}")

    def check(self, array: np.ndarray, leading_dims: int | None = None) -> np.ndarray:
        """``array`` cast to this spec's dtype (same-kind casts only) after checking its trailing shape."""
        array = np.asarray(array)
        n = len(self.shape)
        if array.ndim < n + 1 or array.shape[array.ndim - n:] != self.shape:
            raise ValueError(
                f"{self.name}: shape {array.shape} must be (leading dims..., {', '.join(map(str, self.shape))})"
            )
        if leading_dims is not None and array.ndim != n + leading_dims:
            raise ValueError(f"{self.name}: expected {leading_dims} leading dim(s), got shape {array.shape}")
        if array.dtype != np.dtype(self.dtype):
            if not np.can_cast(array.dtype, self.dtype, casting="same_kind"):
                raise ValueError(f"{self.name}: dtype {array.dtype} cannot be cast to {self.dtype}")
            array = array.astype(self.dtype)
        return array


@dataclass(frozen=True)
class DiscreteActionSpec:
    """``num_actions`` choices, encoded as int64 indices."""

    num_actions: int

    def __post_init__(self) -> None:
        if not isinstance(self.num_actions, int) or self.num_actions < 1:
            raise ValueError(f"num_actions must be a positive int, got {self.num_actions!r}")


ObsSpec = TensorSpec | Mapping[str, TensorSpec]


def observation_specs(obs_spec: ObsSpec) -> dict[str, TensorSpec]:
    """Model-input specs by name: a single spec becomes the input ``observation``."""
    if isinstance(obs_spec, TensorSpec):
        return {OBSERVATION: TensorSpec(OBSERVATION, obs_spec.shape, obs_spec.dtype)}
    specs = {}
    for name, spec in obs_spec.items():
        if not isinstance(spec, TensorSpec):
            raise ValueError(f"obs_spec[{name!r}]: expected a TensorSpec, got {type(spec).__name__}")
        specs[name] = TensorSpec(name, spec.shape, spec.dtype, spec.optional)
    return specs


def specs_from_gym(observation_space: Any, action_space: Any) -> tuple[dict[str, TensorSpec], DiscreteActionSpec]:
    """Specs for a gymnasium Box/Discrete/MultiBinary observation (or a Dict of them) and a Discrete action."""
    import gymnasium.spaces as spaces

    def one(name: str, space: Any) -> TensorSpec:
        if isinstance(space, spaces.Box | spaces.MultiBinary):
            return TensorSpec(name, tuple(space.shape), np.dtype(space.dtype).name)
        if isinstance(space, spaces.Discrete):
            return TensorSpec(name, (), "int64")
        raise ValueError(f"observation {name}: unsupported gymnasium space {space!r}")

    if isinstance(observation_space, spaces.Dict):
        obs = {k: one(k, s) for k, s in observation_space.spaces.items()}
    else:
        obs = {OBSERVATION: one(OBSERVATION, observation_space)}
    if not isinstance(action_space, spaces.Discrete):
        raise ValueError(f"action space {action_space!r}: only Discrete actions are supported")
    return obs, DiscreteActionSpec(int(action_space.n))
