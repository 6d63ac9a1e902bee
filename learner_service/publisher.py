"""Checkpoints of the bound player: where training starts from, and publishing what it produced.

Start rule (resume): of the store's newest readable version of the player and the checkpoint the job names
(the league's view: after a mutation it names the reset checkpoint, "" for a fresh start), the higher version
wins; a tie goes to the store (its weights exist). The counters (agent steps, train iterations) are the
highest any source knows, so they never go back. When the winner is not already the store's latest version of
this player (a fresh start, a reset), it is published at once, numbered above everything published before,
so actors always find the weights the learner trains.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from common.checkpoint_store import CheckpointError, CheckpointRef, CheckpointStore
from learner_service.trainer import Progress, Trainer

log = logging.getLogger(__name__)

META_AGENT_STEPS = "agent_steps"
META_TRAIN_ITERATION = "train_iteration"
META_ALGORITHM_UPDATES = "algorithm_updates"


@dataclass(frozen=True)
class StartPoint:
    """The weights a session starts from: ``weights`` None means the seeded fresh initialisation."""

    version: int
    weights: Mapping[str, np.ndarray] | None
    source: str
    """Where they came from, for the log: a checkpoint path or "fresh"."""
    progress: Progress
    algorithm_updates: int
    published: CheckpointRef | None
    """The store's latest version of the player when it *is* the start point (nothing to publish)."""


def _meta_int(metadata: Mapping[str, Any], key: str) -> int:
    value = metadata.get(key, 0)
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0 else 0


class CheckpointPublisher:
    """Publishes one player's versions (the player's only writer while the learner holds its learn job)."""

    def __init__(self, store: CheckpointStore, player_id: str, worker_id: str) -> None:
        self.store = store
        self.player_id = player_id
        self.worker_id = worker_id
        latest = store.latest(player_id)
        self.last: CheckpointRef | None = latest
        """The newest version in the store (ours or a previous learner's)."""

    @property
    def last_version(self) -> int:
        return -1 if self.last is None else self.last.version

    def next_version(self, at_least: int) -> int:
        """A version number >= ``at_least`` and above every published one."""
        return max(at_least, self.last_version + 1)

    def publish(self, trainer: Trainer) -> CheckpointRef:
        metadata = {
            META_AGENT_STEPS: trainer.progress.agent_steps,
            META_TRAIN_ITERATION: trainer.progress.train_iteration,
            META_ALGORITHM_UPDATES: trainer.algorithm_updates,
            "worker_id": self.worker_id,
            "algorithm": trainer.spec.policy.algorithm,
        }
        ref = trainer.task.publish(self.store, self.player_id, metadata)
        self.last = ref
        return ref

    # ---- where to start -------------------------------------------------------------------------------
    def choose_start(self, job_path: str, job_version: int, league_progress: Progress) -> StartPoint:
        """The start point of a session (see the module docstring)."""
        own, own_weights = self._newest_readable()
        progress = Progress(league_progress.agent_steps, league_progress.train_iteration)
        updates = 0
        if own is not None:
            progress.agent_steps = max(progress.agent_steps, _meta_int(own.metadata, META_AGENT_STEPS))
            progress.train_iteration = max(progress.train_iteration, _meta_int(own.metadata, META_TRAIN_ITERATION))
            updates = _meta_int(own.metadata, META_ALGORITHM_UPDATES)
        if own is not None and own.version >= job_version:
            latest_is_own = self.last is not None and self.last.version == own.version
            return StartPoint(own.version, own_weights, own.path, progress, updates, own if latest_is_own else None)
        if job_path:
            weights = self.store.load(job_path).tensors
            return StartPoint(job_version, weights, job_path, progress, 0, None)
        return StartPoint(job_version, None, "fresh", progress, 0, None)

    def _newest_readable(self) -> tuple[CheckpointRef | None, Mapping[str, np.ndarray] | None]:
        """The player's newest version that loads; a corrupt one is logged and skipped for the one before."""
        for ref in reversed(self.store.versions(self.player_id)):
            try:
                checkpoint = self.store.load(ref.path, ref.version)
            except CheckpointError as err:
                log.error("%s: cannot resume from it (%s); trying an older version", ref.path, err)
                continue
            return checkpoint.ref, checkpoint.tensors
        return None, None

    def load_reset(self, path: str) -> Mapping[str, np.ndarray] | None:
        """The weights a mutation resets to: the checkpoint at ``path``, or None (fresh) for an empty path."""
        return self.store.load(path).tensors if path else None
