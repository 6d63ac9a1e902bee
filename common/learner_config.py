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

from common.config import MAX_DURATION_S
from common.typed_config import from_mapping

MAX_SEED = 2**53
"""The largest `learner.seed`: the section travels as a protobuf Struct, whose doubles hold integers exactly up to
2**53 (a larger seed would arrive changed; above 2**64 torch.manual_seed overflows, below 0 numpy refuses it)."""

MAX_LEARNER_BATCH_SIZE = 2**20
"""The largest `learner.batch_size`: a PPO learner holds every sample of a batch (observations included, rows
padded to the batch's longest) until it has that many; OpenAI Five's batches were about a million samples."""
MAX_REPLAY_RATIO = 1024.0
"""The largest `learner.replay_ratio`: every transition received owes replay_ratio / dqn.batch_size gradient
steps before the learner gets on (published agents train 1 to a few hundred samples per sample received)."""
MAX_PUBLISH_EVERY = 100_000
"""The most train iterations between published checkpoints (DQN's default is 100 gradient steps): until a
learner publishes, its actors play the old policy and the league sees no progress of the player."""
MAX_KEEP_LAST = 10_000
"""The most checkpoint versions kept per player: each is a whole checkpoint (and its training state) on the
shared filesystem, and every publish lists the player's versions. The league's snapshots (historical players)
are pinned and kept besides."""
MAX_QUEUE_CHUNKS = 4096
"""The most decoded chunks waiting for the trainer: a full queue is what slows the actors down (backpressure),
so a huge one lets them run far ahead of the policy they learn for."""
MAX_QUEUE_BYTES = 64 * 2**30
"""The most bytes of decoded chunks waiting for the trainer (64 GiB), held in the learner's memory."""
MAX_STALENESS = 2**31 - 1
"""The largest `learner.max_staleness` (policy versions are int64 on the wire; any bound past a few thousand
versions is none in practice)."""
_MAXIMA: dict[str, int] = {"batch_size": MAX_LEARNER_BATCH_SIZE, "publish_every": MAX_PUBLISH_EVERY,
                           "keep_last": MAX_KEEP_LAST, "queue_chunks": MAX_QUEUE_CHUNKS,
                           "queue_bytes": MAX_QUEUE_BYTES}

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
    """Checkpoint versions kept per player (older unpinned ones are removed). Each is a whole checkpoint and its
    training state on the shared filesystem, and each publish lists them: with thousands kept a small network's
    publish costs ~1.5x its cost with 5 (BENCHMARKS.md, "Checkpoint publish + load")."""
    queue_chunks: int = 64
    """Decoded chunks waiting for the trainer; a full queue blocks the pushing stream (backpressure)."""
    queue_bytes: int = 256 * 2**20
    """... and their total bytes."""
    seed: int | None = None
    """Seed of the initial weights and of minibatch order; None: derived from the player id."""
    average_decay: float = 0.0
    """Decay of a moving average of the network's weights the learner keeps over its updates (Polyak averaging,
    ``avg += (1 - decay) * (weights - avg)`` after each, a plain mean of the first ``1 / (1 - decay)``; 0: none). When the learner releases its player (the
    league's end, a stop), the average becomes the player's last checkpoint, one version after its last update:
    the run's final network is the average of its last ~1 / (1 - decay) updates rather than the last one, as
    stochastic weight averaging makes it, which smooths the update-to-update swings of a policy (BENCHMARKS.md,
    #6). A learner that resumes the player goes on training from that average."""
    max_staleness: int | None = None
    """Chunks acted by a policy more than this many versions behind the learner's (the staleness TensorBoard's
    ``staleness/*`` shows) are dropped, not trained on (Sample Factory's ``max_policy_lag``). None: every chunk
    is trained on. For an on-policy learner (PPO) with more actors than it keeps up with: the data the actors
    hold and the learner queues ages a version per update while it waits, and importance weights (V-trace)
    correct only some of that. Dropping what aged past the bound frees the queue at once, so the actors' next
    data is fresher; their dropped work is the cost (solo CartPole, 2 actors: mean staleness ~4.3 under a bound
    of 4, against ~7.5 without; BENCHMARKS.md)."""
    tensorboard_every_s: float = 5.0
    """Seconds between TensorBoard writes, each the mean of the iterations since the last (0: every iteration).
    Written at every iteration, a DQN learner's events grew ~200 MB an hour."""

    def __post_init__(self) -> None:
        for name, maximum in _MAXIMA.items():
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"learner.{name} must be >= 1, got {value}")
            if value is not None and value > maximum:
                raise ValueError(f"learner.{name} must be at most {maximum}, got {value}")
        if not (math.isfinite(self.replay_ratio) and 0 < self.replay_ratio <= MAX_REPLAY_RATIO):
            raise ValueError(f"learner.replay_ratio must be a finite number in (0, {MAX_REPLAY_RATIO:g}], "
                             f"got {self.replay_ratio}")
        if not (math.isfinite(self.tensorboard_every_s) and 0 <= self.tensorboard_every_s <= MAX_DURATION_S):
            raise ValueError(f"learner.tensorboard_every_s must be a number of seconds in [0, {MAX_DURATION_S:g}], "
                             f"got {self.tensorboard_every_s}")
        if not (math.isfinite(self.average_decay) and 0 <= self.average_decay < 1):
            raise ValueError(f"learner.average_decay must be a number in [0, 1) (0: no average), got "
                             f"{self.average_decay}")
        if self.max_staleness is not None and not 0 <= self.max_staleness <= MAX_STALENESS:
            raise ValueError(f"learner.max_staleness must be a number of versions in [0, {MAX_STALENESS}] or null "
                             f"(no bound), got {self.max_staleness}")
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
