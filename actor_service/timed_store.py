"""The checkpoint store as the actor reads it, with how long the read under way has taken (`BusyClock`).

The job's heartbeat thread sees a read stuck past the actor's `--checkpoint-read-timeout` (a hung network
filesystem) and lets the lease go, so the league issues the job to another actor.
"""

from __future__ import annotations

from common.busy_clock import BusyClock
from common.checkpoint_store import Checkpoint, CheckpointRef, CheckpointStore


class TimedStore:
    """The reads `PolicyPool` makes, each timed; one reader thread at a time (the job thread)."""

    def __init__(self, store: CheckpointStore) -> None:
        self._store = store
        self._clock = BusyClock()

    def reading_s(self) -> float:
        """How long the read under way has taken so far; 0 if none. Safe from any thread."""
        return self._clock.busy_s()

    def latest(self, player_id: str) -> CheckpointRef | None:
        with self._clock.timed():
            return self._store.latest(player_id)

    def manifest(self, path: str) -> CheckpointRef:
        with self._clock.timed():
            return self._store.manifest(path)

    def versions(self, player_id: str) -> list[CheckpointRef]:
        with self._clock.timed():
            return self._store.versions(player_id)

    def load(self, path: str, expected_version: int | None = None) -> Checkpoint:
        with self._clock.timed():
            return self._store.load(path, expected_version)

    def load_latest(self, player_id: str) -> Checkpoint | None:
        with self._clock.timed():
            return self._store.load_latest(player_id)
