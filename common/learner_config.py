"""The ``learner`` section of a league config: the learner process's own training settings.

It travels inside every learn job as a protobuf Struct (numbers as doubles), so it is parsed with
`common.typed_config.from_mapping`: ``256.0`` becomes the int 256, a typo is an error naming
``learner.<field>``. It lives in common (not learner_service) because the coordinator and `league run` parse
it at startup too, so a typo fails there.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from common.typed_config import from_mapping

MAX_SEED = 2**53
"""The largest `learner.seed`: the section travels as a protobuf Struct, whose doubles hold integers exactly up to
2**53 (a larger seed would arrive changed; above 2**64 torch.manual_seed overflows, below 0 numpy refuses it)."""

DEFAULT_PUBLISH_EVERY: dict[str, int] = {"ppo": 1, "dqn": 100}
"""`learner.publish_every` when the config leaves it out, by `policy.algorithm`."""


@dataclass(frozen=True)
class LearnerConfig:
    """The ``learner`` section of the league config."""

    batch_size: int = 1024
    """PPO: agent steps (samples) per train iteration, gathered from whole pushed (B, T) segments."""
    replay_ratio: float = 8.0
    """DQN: samples trained per sample received (learn calls = received × ratio / policy.dqn.batch_size)."""
    publish_every: int | None = None
    """Train iterations between published checkpoints (each followed by UpdatePlayer). None: the algorithm's
    default (`DEFAULT_PUBLISH_EVERY`): 1 for PPO, whose iteration is a whole batch, 100 for DQN, whose
    iteration is one gradient step; publishing every DQN step meant ~100 checkpoints, UpdatePlayer calls and
    actor reloads a second, and a third of the env steps and of the learning (measured on CartPole)."""
    keep_last: int = 5
    """Checkpoint versions kept per player (older unpinned ones are removed)."""
    queue_chunks: int = 64
    """Decoded chunks waiting for the trainer; a full queue blocks the pushing stream (backpressure)."""
    queue_bytes: int = 256 * 2**20
    """... and their total bytes."""
    seed: int | None = None
    """Seed of the initial weights and of minibatch order; None: derived from the player id."""

    def __post_init__(self) -> None:
        for name in ("batch_size", "publish_every", "keep_last", "queue_chunks", "queue_bytes"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"learner.{name} must be >= 1, got {getattr(self, name)}")
        if not (math.isfinite(self.replay_ratio) and self.replay_ratio > 0):
            raise ValueError(f"learner.replay_ratio must be a finite number > 0, got {self.replay_ratio}")
        if self.seed is not None and not 0 <= self.seed <= MAX_SEED:
            raise ValueError(f"learner.seed must be within [0, 2**53] or null, got {self.seed}")

    def publish_period(self, algorithm: str) -> int:
        """Train iterations between checkpoints for a learner of `algorithm`."""
        if self.publish_every is not None:
            return self.publish_every
        return DEFAULT_PUBLISH_EVERY.get(algorithm, 1)

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any] | LearnerConfig | None) -> LearnerConfig:
        return from_mapping(cls, mapping, "learner")
