"""The checkpoint store as the actor reads it, with how long the read under way has taken.

Why: a read from a network filesystem whose server went away (a hard NFS mount) never returns, and no
interrupt reaches a thread waiting in the kernel. The job's heartbeat thread runs on meanwhile and would renew
the lease of a job that makes no progress for ever. With `reading_s` it sees the read stuck past the actor's
`--checkpoint-read-timeout` and lets the lease go, so the league issues the job to another actor.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from common.checkpoint_store import Checkpoint, CheckpointRef, CheckpointStore


class TimedStore:
    """The reads `PolicyPool` makes, each timed; one reader thread at a time (the job thread)."""

    def __init__(self, store: CheckpointStore) -> None:
        self._store = store
        self._since: float | None = None  # time.monotonic() when the read under way began

    def reading_s(self) -> float:
        """How long the read under way has taken so far; 0 if none. Safe from any thread."""
        since = self._since
        return 0.0 if since is None else max(0.0, time.monotonic() - since)

    @contextlib.contextmanager
    def _timed(self) -> Iterator[None]:
        self._since = time.monotonic()
        try:
            yield
        finally:
            self._since = None

    def latest(self, player_id: str) -> CheckpointRef | None:
        with self._timed():
            return self._store.latest(player_id)

    def manifest(self, path: str) -> CheckpointRef:
        with self._timed():
            return self._store.manifest(path)

    def versions(self, player_id: str) -> list[CheckpointRef]:
        with self._timed():
            return self._store.versions(player_id)

    def load(self, path: str, expected_version: int | None = None) -> Checkpoint:
        with self._timed():
            return self._store.load(path, expected_version)

    def load_latest(self, player_id: str) -> Checkpoint | None:
        with self._timed():
            return self._store.load_latest(player_id)
