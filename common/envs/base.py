"""The environment interface every actor runs through, and the values it returns.

One small interface (reset / step / seed / info / close) that gymnasium envs, OpenSpiel games and test envs
all implement, so env managers and actors never need to know which kind of env they drive.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class ArraySpec:
    """Shape and dtype of one numpy array (what shared-memory buffers and batching are sized from).

    `minimum`/`maximum` are optional bounds (a scalar or an array of `shape`); they do not take part in
    equality, so two envs with the same layout compare equal whatever their bounds.
    """

    shape: tuple[int, ...]
    dtype: np.dtype
    minimum: float | np.ndarray | None = field(default=None, compare=False)
    maximum: float | np.ndarray | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        object.__setattr__(self, "dtype", np.dtype(self.dtype))
        if any(d < 0 for d in self.shape):
            raise ValueError(f"ArraySpec.shape must not be negative, got {self.shape}")

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


@dataclass(frozen=True)
class DiscreteSpec:
    """A single integer in [0, num_values): a discrete action (or observation)."""

    num_values: int
    dtype: np.dtype = np.dtype(np.int64)

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", np.dtype(self.dtype))
        if self.num_values < 1:
            raise ValueError(f"DiscreteSpec.num_values must be >= 1, got {self.num_values}")

    @property
    def shape(self) -> tuple[int, ...]:
        return ()


Spec = ArraySpec | DiscreteSpec
# An observation is one array or a flat dict of named arrays; None where the env's observations are not
# numpy arrays (then managers pickle them instead of using shared memory).
ObsSpec = Spec | Mapping[str, Spec] | None


@dataclass(frozen=True)
class EnvInfo:
    """What an env looks like from outside: used to size networks, shared memory and batches."""

    name: str
    obs_spec: ObsSpec
    action_spec: Spec | None
    reward_spec: ArraySpec = ArraySpec((), np.float32)
    num_players: int = 1
    channels_first: bool = False
    """Its 3-D observations are (C, H, W) by construction (an OpenSpiel board's planes): the check for pictures
    laid out (H, W, C), a guess from the shape, is skipped (it took a 4-column board's 5 planes for rows)."""


class Outcome(enum.Enum):
    """The result of a finished game for one player."""

    WIN = "win"
    DRAW = "draw"
    LOSS = "loss"


@dataclass(frozen=True)
class EpisodeStats:
    """Summary of a finished episode: `episode_return` is a float, or an array with one entry per player."""

    episode_return: float | np.ndarray
    length: int


@dataclass(frozen=True)  # no slots: slotted dataclasses pickle several times slower
class StepInfo:
    """Typed side information of a step.

    - `episode`: set on the last step of an episode.
    - `outcome`: per-player win/draw/loss, set on the last step of a game.
    - `failure`: set when the env failed and was rebuilt; the episode was cut short here (the timestep is
      marked truncated and carries the last good observation), so its transition should be dropped.
    - `extra`: anything else the underlying env reported (gymnasium's `info` dict), untouched.
    """

    episode: EpisodeStats | None = None
    outcome: tuple[Outcome, ...] | None = None
    failure: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)


# The info of an ordinary step: adapters return this one object, so managers can skip sending it.
NO_INFO = StepInfo()


@dataclass(frozen=True, slots=True)
class TimeStep:
    """What one `step` returns.

    `terminated` (the MDP reached a terminal state: do not bootstrap) and `truncated` (the episode was cut,
    e.g. by a time limit: bootstrap from `obs`) are kept apart so learners get value targets right.
    `obs` is the observation reached by this step, also on the last step of an episode.
    """

    obs: Any
    reward: float | np.ndarray
    terminated: bool
    truncated: bool
    info: StepInfo = NO_INFO

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated


class Env(abc.ABC):
    """The interface env managers drive. Implementations must be deterministic given `seed`."""

    @abc.abstractmethod
    def reset(self, **params: Any) -> Any:
        """Start a new episode and return its first observation; `params` are env-specific reset options."""

    @abc.abstractmethod
    def step(self, action: Any) -> TimeStep:
        """Apply `action` and return the resulting timestep."""

    @abc.abstractmethod
    def seed(self, seed: int) -> None:
        """Seed the env; the seed takes effect at the next `reset` (as gymnasium's `reset(seed=...)`)."""

    @abc.abstractmethod
    def info(self) -> EnvInfo:
        """Describe observation, action and reward layout."""

    def close(self) -> None:
        """Release resources; calling it twice is allowed. Envs holding nothing need not override it."""
        return None
