"""The learner's typed settings: the league config's ``learner`` section and the process flags.

The ``learner`` section travels inside every learn job as a protobuf Struct (numbers as doubles), so it is
parsed with `common.computation.typed_config.from_mapping`: ``256.0`` becomes the int 256, a typo is an
error naming ``learner.<field>``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.computation.typed_config import from_mapping

MAX_CHUNK_BYTES = 64 * 2**20
"""Largest TrajectoryChunk the learner's server accepts (its gRPC receive limit; fixed before any job)."""


@dataclass(frozen=True)
class LearnerConfig:
    """The ``learner`` section of the league config."""

    batch_size: int = 1024
    """PPO: agent steps (samples) per train iteration, gathered from whole pushed (B, T) segments."""
    replay_ratio: float = 8.0
    """DQN: samples trained per sample received (learn calls = received × ratio / policy.dqn.batch_size)."""
    publish_every: int = 1
    """Train iterations between published checkpoints (each followed by UpdatePlayer)."""
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
            if getattr(self, name) < 1:
                raise ValueError(f"learner.{name} must be >= 1, got {getattr(self, name)}")
        if not self.replay_ratio > 0:
            raise ValueError(f"learner.replay_ratio must be > 0, got {self.replay_ratio}")

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any] | LearnerConfig | None) -> LearnerConfig:
        return from_mapping(cls, mapping, "learner")


def player_seed(player_id: str) -> int:
    """The seed of a player's fresh initialisation: the same in every process (``hash()`` is salted).

    Actors that must initialise a player without a checkpoint use the same formula, so both build the same
    weights: the first 4 bytes of sha256(player_id), little-endian.
    """
    return int.from_bytes(hashlib.sha256(player_id.encode()).digest()[:4], "little")


@dataclass(frozen=True)
class LearnerSettings:
    """What the process is told on its command line."""

    coordinator: str
    shared_root: Path
    worker_id: str
    host: str = "127.0.0.1"
    port: int = 0
    advertise: str = ""
    """The address actors stream to; empty: host:bound_port (the machine's hostname for a wildcard host)."""
    token: str | None = None
    tls_ca: Path | None = None
    device: str = "auto"
    get_job_wait_s: float = 5.0
    """Long-poll of one GetJob call."""
    max_backoff_s: float = 10.0
    """Cap of the exponential backoff while the coordinator is away."""

    def __post_init__(self) -> None:
        if not self.coordinator:
            raise ValueError("coordinator: HOST:PORT is required (--coordinator or $LEAGUE_COORDINATOR)")
        if not self.worker_id:
            raise ValueError("worker_id: must not be empty")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port: must be within [0, 65535], got {self.port}")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"device: expected auto, cpu or cuda[:N], got {self.device!r}")
