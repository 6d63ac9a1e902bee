"""The checkpoint store with every read and publish timed by a `BusyClock`, for both workers.

Why: a read or write on a shared filesystem that hangs (a hard NFS mount whose server went away) never returns.
The worker's heartbeat thread watches the clock (`StallWatch`) and lets its job's lease go once the operation
under way has taken too long, so the league gives the job to someone else. Timing the store itself, rather than
its call sites, leaves no read to forget: an actor's policy loads, a learner's binding, reset, roll-back and
resume all go through it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from common.busy_clock import BusyClock
from common.checkpoint_store import Checkpoint, CheckpointRef, CheckpointStore

if TYPE_CHECKING:
    import torch


class TimedCheckpointStore(CheckpointStore):
    """A `CheckpointStore` whose I/O methods run inside ``clock.timed()`` (nested calls count once, from the
    outermost). One thread at a time uses it (the worker's job thread); `busy_s` is safe from any thread."""

    def __init__(
        self, shared_root: str | os.PathLike[str], keep_last: int = 5, clock: BusyClock | None = None,
        publish_guard: Callable[[], bool] | None = None,
    ) -> None:
        """``clock``: shared with the lease keeper's watch, and with the stores of later jobs of the same worker.
        ``publish_guard``: as `CheckpointStore`'s."""
        super().__init__(shared_root, keep_last, publish_guard)
        self.clock = clock or BusyClock()

    def busy_s(self) -> float:
        """How long the read or publish under way has taken so far; 0 if none."""
        return self.clock.busy_s()

    def publish(
        self,
        player_id: str,
        tensors: Mapping[str, np.ndarray | torch.Tensor],
        version: int,
        metadata: Mapping[str, Any] | None = None,
        training_state: Mapping[str, Any] | None = None,
    ) -> CheckpointRef:
        with self.clock.timed():
            return super().publish(player_id, tensors, version, metadata, training_state)

    def latest(self, player_id: str) -> CheckpointRef | None:
        with self.clock.timed():
            return super().latest(player_id)

    def manifest(self, path: str) -> CheckpointRef:
        with self.clock.timed():
            return super().manifest(path)

    def versions(self, player_id: str, *, skip_unreadable: bool = True) -> list[CheckpointRef]:
        with self.clock.timed():
            return super().versions(player_id, skip_unreadable=skip_unreadable)

    def versions_on_disk(self, player_id: str) -> list[int]:
        with self.clock.timed():
            return super().versions_on_disk(player_id)

    def load(self, path: str, expected_version: int | None = None) -> Checkpoint:
        with self.clock.timed():
            return super().load(path, expected_version)

    def load_training_state(self, path: str, expected_version: int | None = None) -> dict[str, Any] | None:
        with self.clock.timed():
            return super().load_training_state(path, expected_version)

    def load_latest(self, player_id: str, attempts: int = 5) -> Checkpoint | None:
        with self.clock.timed():
            return super().load_latest(player_id, attempts)

    def verify(self, path: str) -> CheckpointRef:
        with self.clock.timed():
            return super().verify(path)

    def snapshot(self, source: str, dest: str, verify: bool = True) -> CheckpointRef:
        with self.clock.timed():
            return super().snapshot(source, dest, verify)
