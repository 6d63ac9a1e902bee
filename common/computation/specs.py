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
            target = np.dtype(self.dtype)
            if (target.kind in "iu" and array.dtype.kind in "iu" and array.size
                    and not np.can_cast(array.dtype, target, casting="safe")):
                # A narrowing integer cast wraps (uint16 300 -> uint8 44): only values the target holds pass.
                info = np.iinfo(target)
                low, high = int(array.min()), int(array.max())
                if low < info.min or high > info.max:
                    raise ValueError(f"{self.name}: values {low}..{high} do not fit {self.dtype}")
            array = array.astype(self.dtype)
        return array


@dataclass(frozen=True)
class DiscreteActionSpec:
    """``num_actions`` choices, encoded as int64 indices."""

    num_actions: int

    def __post_init__(self) -> None:
        if not isinstance(self.num_actions, int) or self.num_actions < 1:
            raise ValueError(f"num_actions must be a positive int, got {self.num_actions!r}")


MAX_ABS_BOX_ACTION = 1e6
"""Box (real-valued) actions beyond this magnitude are refused. Unclipped draws may leave the Box, but a draw is
the policy's mean plus a few standard deviations (at most e^2 each); an action of 1e20 (finite in float32, or a
float64 beyond float32) has a float32 log-density of -inf under the learner's Gaussian, and the update it is in
went NaN. Within ±1e6, with a mean as large and the smallest std (e^-20), the density of any Box size is finite.
ε-exploration draws uniformly in the Box, so it takes Boxes within these bounds only."""


@dataclass(frozen=True)
class BoxActionSpec:
    """A real-valued action of ``shape`` (float32; () for one number), each entry within [``low``, ``high``] (per entry, flattened
    row-major; ±inf where unbounded): a gymnasium Box action. Policies sample it unbounded and actors clip what
    the env receives to the bounds (`clip`), so the recorded action keeps the probability it was drawn with."""

    shape: tuple[int, ...]
    low: tuple[float, ...]
    high: tuple[float, ...]

    def __post_init__(self) -> None:
        shape = tuple(int(d) for d in self.shape)
        object.__setattr__(self, "shape", shape)
        if any(d < 1 for d in shape):
            raise ValueError(f"a Box action's dimensions must be positive, got shape {self.shape}")
        size = self.size
        low, high = _flat_bounds(self.low, size, shape), _flat_bounds(self.high, size, shape)
        if np.isnan(low).any() or np.isnan(high).any() or (low > high).any():
            raise ValueError(f"Box action bounds must be numbers with low <= high, got low {low.tolist()} and "
                             f"high {high.tolist()}")
        object.__setattr__(self, "low", tuple(float(x) for x in low))
        object.__setattr__(self, "high", tuple(float(x) for x in high))

    @property
    def size(self) -> int:
        """Entries of one action (the policy's mean is this wide)."""
        return int(np.prod(self.shape))

    @property
    def bounded(self) -> bool:
        """Every entry has finite bounds (so a uniform draw over them exists)."""
        return all(np.isfinite(self.low)) and all(np.isfinite(self.high))

    def clip(self, action: np.ndarray, dtype: Any = np.float32) -> np.ndarray:
        """``action`` (``shape``) as the env takes it: `dtype` (the env's), each entry clipped to its bounds.
        Clipped in float64 and then cast to the env's dtype, whose bounds are exact there: clipped in float32 and
        cast up, a float64 Box's bound of 0.1 became 0.10000000149, outside the Box."""
        flat = np.clip(np.asarray(action, np.float64).reshape(-1), self.low, self.high)
        return flat.astype(dtype).reshape(self.shape)


def _flat_bounds(value: Any, size: int, shape: tuple[int, ...]) -> np.ndarray:
    """Bounds as `size` float64 entries: one number for every entry, or one per entry (any layout)."""
    flat = np.asarray(value, np.float64).reshape(-1)
    if flat.size == 1:
        return np.full(size, flat[0])
    if flat.size != size:
        raise ValueError(f"Box action bounds must have {size} entries (shape {shape}) or one, got {flat.size}")
    return flat


@dataclass(frozen=True)
class MultiDiscreteActionSpec:
    """Several discrete choices made together, one per entry of an int64 array of ``shape``: entry i (flattened
    row-major) is one of ``nvec[i]`` values, from 0. A gymnasium MultiDiscrete (from 0) or MultiBinary action."""

    shape: tuple[int, ...]
    nvec: tuple[int, ...]

    def __post_init__(self) -> None:
        shape = tuple(int(d) for d in self.shape)
        nvec = tuple(int(n) for n in np.asarray(self.nvec).reshape(-1))
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "nvec", nvec)
        if not shape or any(d < 1 for d in shape):
            raise ValueError(f"a MultiDiscrete action needs a shape of positive dimensions, got {self.shape}")
        if len(nvec) != int(np.prod(shape)) or any(n < 1 for n in nvec):
            raise ValueError(f"a MultiDiscrete action of shape {shape} needs {int(np.prod(shape))} choice counts >= 1, "
                             f"got {list(nvec)}")


ActionSpec = DiscreteActionSpec | BoxActionSpec | MultiDiscreteActionSpec
"""What a policy's action is: one of N choices, several such choices at once, or a real vector."""


def as_action_spec(spec: ActionSpec | int) -> ActionSpec:
    """An action spec; a bare int is that many discrete actions (the form earlier callers pass)."""
    if isinstance(spec, DiscreteActionSpec | BoxActionSpec | MultiDiscreteActionSpec):
        return spec
    if isinstance(spec, int | np.integer) and not isinstance(spec, bool):
        return DiscreteActionSpec(int(spec))
    raise TypeError(f"expected an action spec (DiscreteActionSpec, MultiDiscreteActionSpec, BoxActionSpec) or an int, "
                    f"got {type(spec).__name__}")


def action_tensor_spec(spec: ActionSpec) -> TensorSpec:
    """How one action is stored: an int64 index, an int64 array of choices, or a float32 array of the Box's
    shape."""
    if isinstance(spec, DiscreteActionSpec):
        return TensorSpec("action", (), "int64")
    if isinstance(spec, MultiDiscreteActionSpec):
        return TensorSpec("action", spec.shape, "int64")
    return TensorSpec("action", spec.shape, "float32")


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


def specs_from_gym(observation_space: Any, action_space: Any) -> tuple[dict[str, TensorSpec], ActionSpec]:
    """Specs for a gymnasium Box/Discrete/MultiBinary observation (or a Dict of them) and a Discrete,
    MultiDiscrete, MultiBinary or float Box action."""
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
    if isinstance(action_space, spaces.Box) and np.dtype(action_space.dtype).kind == "f":
        return obs, BoxActionSpec(tuple(action_space.shape), action_space.low, action_space.high)
    if isinstance(action_space, spaces.MultiBinary):
        return obs, MultiDiscreteActionSpec(tuple(action_space.shape), np.full(action_space.shape, 2))
    if isinstance(action_space, spaces.MultiDiscrete) and not np.any(action_space.start):
        return obs, MultiDiscreteActionSpec(tuple(action_space.shape), action_space.nvec)
    if not isinstance(action_space, spaces.Discrete):
        raise ValueError(f"action space {action_space!r}: only Discrete, MultiDiscrete (from 0), MultiBinary and "
                         "float Box actions are supported")
    return obs, DiscreteActionSpec(int(action_space.n))
