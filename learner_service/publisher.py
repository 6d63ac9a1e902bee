"""Checkpoints of the bound player: where training starts from, and publishing what it produced.

Start rule (resume): of the store's newest readable version of the player and the checkpoint the job names
(the league's view: after a mutation it names the reset checkpoint, "" for a fresh start), the higher version
wins; a tie goes to the store (its weights exist). The counters (agent steps, train iterations) are the
highest any source knows, so they never go back. When the winner is not already the store's latest version of
this player (a fresh start, a reset), it is published at once, numbered above everything published before,
so actors always find the weights the learner trains.

Storage failures (a full shared filesystem, a quota, an I/O error) do not stop training: `try_publish` logs a
clear error and returns None; the store leaves nothing of the failed version visible (no torn file, no
manifest naming a missing one, no temp file), and while publishing fails it is retried on a backoff
(1 s doubling to 30 s) instead of at every scheduled iteration, so a full disk is not hammered. The first
publish that works again is logged and numbered above everything before it. Training runs only a few
updates ahead of the last published version meanwhile (`session.MIN_UNPUBLISHED_UPDATES`), then waits.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from common.checkpoint_store import (
    CheckpointError,
    CheckpointNotFoundError,
    CheckpointRef,
    CheckpointStore,
    CorruptCheckpointError,
    PublishWithdrawn,
    UnreadableCheckpointError,
    VersionConflictError,
)
from common.durable_files import out_of_space
from common.policy_config import FRESH_INIT_METADATA, PolicyConfig, obs_norm_in_scale, play_metadata
from learner_service.league_client import BindingLost
from learner_service.trainer import Progress, Trainer

log = logging.getLogger(__name__)

META_AGENT_STEPS = "agent_steps"
META_TRAIN_ITERATION = "train_iteration"
META_ALGORITHM_UPDATES = "algorithm_updates"

RETRY_FIRST_S = 1.0
RETRY_MAX_S = 30.0


class PublishError(Exception):
    """Publishing failed for lack of storage (disk full, quota, I/O error); nothing was published."""

    def __init__(self, message: str, cause: OSError) -> None:
        super().__init__(message)
        self.cause = cause

    @property
    def disk_full(self) -> bool:
        return out_of_space(self.cause)


def storage_error(err: BaseException) -> OSError | None:
    """The OSError behind ``err``, if any: torch.save reports a failed write of its file object as a
    RuntimeError whose context is the OSError, so the chain is followed."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        if isinstance(current, OSError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


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
    resumed: CheckpointRef | None = None
    """The player's own version whose weights these are (the latest or, when newer ones are damaged, an older
    one): its training state (optimizer, target network) is resumed with them. None for the league's checkpoint
    or a fresh start."""
    lineage_from: int = 0
    """Chunks acted with an older version are not these weights' games (the trainer's `lineage_from`): the
    league's version when the session starts from the checkpoint it names (a reset, a pretrained one) or a fresh
    start under its number; 0 when it resumes the player's own weights, whose older versions actors may play."""
    metadata: Mapping[str, Any] = field(default_factory=dict)
    """The metadata of the checkpoint the weights come from (the play settings it was trained with)."""


_MAX_META_INT = 2**63 - 1  # UpdatePlayer's int64 fields


def _meta_int(metadata: Mapping[str, Any], key: str) -> int:
    """A counter from a manifest's metadata; 0 for anything else (JSON reads `Infinity` and 1e400 as inf, which
    int() refuses with an OverflowError: every session start crashed on such a manifest)."""
    value = metadata.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0
    return int(value) if math.isfinite(value) and 0 <= value <= _MAX_META_INT else 0


class CheckpointPublisher:
    """Publishes one player's versions (the player's only writer while the learner holds its learn job)."""

    def __init__(
        self, store: CheckpointStore, player_id: str, worker_id: str, clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``store``: a `TimedCheckpointStore` in a learner, whose clock the lease keeper watches for checkpoint
        I/O that hangs."""
        self.store = store
        self.player_id = player_id
        self.worker_id = worker_id
        try:
            latest = store.latest(player_id)
        except CorruptCheckpointError as err:  # no readable manifest left: `choose_start` decides what follows
            log.error("%s: %s", player_id, err)
            latest = None
        self.last: CheckpointRef | None = latest
        """The newest version in the store (ours or a previous learner's)."""
        self.failures = 0
        """Publishes that failed in a row (0: the last one worked)."""
        self.last_error: PublishError | None = None
        self._clock = clock
        self._retry_at = 0.0

    @property
    def last_version(self) -> int:
        return -1 if self.last is None else self.last.version

    def next_version(self, at_least: int) -> int:
        """A version number >= ``at_least`` and above every published one."""
        return max(at_least, self.last_version + 1)

    @property
    def failing(self) -> bool:
        """The last publish failed (the store's latest is older than what the trainer holds)."""
        return self.failures > 0

    def retry_in(self) -> float:
        """Seconds until a failing publisher's backoff lets it try again (0 when it may now)."""
        return max(0.0, self._retry_at - self._clock()) if self.failing else 0.0

    def due(self, train_iteration: int, publish_every: int) -> bool:
        """Whether to publish after ``train_iteration``: on schedule, or while failing once the backoff passed."""
        if self.failing:
            return self._clock() >= self._retry_at
        return train_iteration % publish_every == 0

    def publish(self, trainer: Trainer) -> CheckpointRef:
        """Publish the trainer's weights as its version; raises `PublishError` when storage fails."""
        metadata = {
            META_AGENT_STEPS: trainer.progress.agent_steps,
            META_TRAIN_ITERATION: trainer.progress.train_iteration,
            META_ALGORITHM_UPDATES: trainer.algorithm_updates,
            "worker_id": self.worker_id,
            "algorithm": trainer.spec.policy.algorithm,
            **play_metadata(trainer.spec.policy),
        }
        if trainer.holds_fresh_init:
            # Its seed may be learner.seed: actors playing the league's reset to a fresh initialisation take this
            # version, not their own player_seed initialisation, when it has the reset's number.
            metadata[FRESH_INIT_METADATA] = True
        try:
            ref = trainer.publish(self.store, self.player_id, metadata)  # weights + training state
        except VersionConflictError as err:
            # Another learner published this player meanwhile (a late publish of the learner before us, which
            # started within its lease): the player is not ours to write any more.
            self.last = self.store.latest(self.player_id)
            raise BindingLost(f"{err}: another learner publishes this player now") from err
        except Exception as err:
            cause = storage_error(err)
            if cause is None:
                raise
            self.failures += 1
            # The exponent is capped before the power: 2 ** 1024 overflows a float (~9 hours of failures).
            self._retry_at = self._clock() + min(RETRY_MAX_S, RETRY_FIRST_S * 2.0 ** min(self.failures - 1, 64))
            where = self.store.root.root
            self.last_error = PublishError(
                f"{self.player_id}: publishing version {trainer.version} under {where} failed: {cause}", cause
            )
            raise self.last_error from err
        if self.failing:
            log.warning("%s: publishing works again: version %d published after %d failed attempt(s)",
                        self.player_id, ref.version, self.failures)
        self.failures = 0
        self.last_error = None
        self.last = ref
        return ref

    def try_publish(self, trainer: Trainer) -> CheckpointRef | None:
        """`publish`, but a storage failure is logged (an ERROR line) and gives None: training goes on. So does a
        publish the lease withdrew at its commit (a warning): the next one is tried when the lease is confirmed."""
        try:
            return self.publish(trainer)
        except PublishWithdrawn as err:
            log.warning("%s: %s (no heartbeat was confirmed within the lease while it was written: the player may "
                        "be another learner's by now)", self.player_id, err)
            return None
        except PublishError as err:
            delay = max(0.0, self._retry_at - self._clock())
            log.error("%s; nothing of it is visible, actors keep version %s; training goes on, next attempt in "
                      "%.0f s (%d failed in a row)%s", err, self.last_version if self.last else "none", delay,
                      self.failures, " - the shared filesystem is full" if err.disk_full else "")
            return None

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
            if self.last is None or own.version > self.last.version:
                # A crash between the version's manifest and latest.json: the version is complete (it verified),
                # so it is the latest; resuming it resumes its training state too, and nothing is rewritten.
                self.last = own
            latest_is_own = self.last.version == own.version
            return StartPoint(own.version, own_weights, own.path, progress, updates, own if latest_is_own else None,
                              resumed=own, metadata=own.metadata)
        if job_path:
            try:
                checkpoint = self.store.load(job_path)
                weights, metadata = checkpoint.tensors, checkpoint.ref.metadata
            except UnreadableCheckpointError:
                raise  # (see `_newest_readable`)
            except CheckpointError as err:
                if own is None:
                    stored = [r.version for r in self.store.versions(self.player_id)]
                    stored += self.store.versions_on_disk(self.player_id)
                    if stored or self.last is not None:
                        # Every version the player has is damaged or lost (one kept: `keep_last: 1`, or a young
                        # player): refusing would stop the whole league at every restart. It starts afresh,
                        # numbered above them all, loudly; its counters stay.
                        newest = max([*stored, self.last_version, job_version])
                        log.error("%s: no version of %s can be loaded (%s); it starts afresh at version %d, its "
                                  "training so far is lost", job_path, self.player_id, err, newest + 1)
                        return StartPoint(newest + 1, None, "fresh (no loadable version)", progress, 0, None)
                    if isinstance(err, CheckpointNotFoundError):
                        raise CheckpointNotFoundError(f"{err}; {self._not_found_hint(job_path)}") from err
                    raise
                # A tampered, corrupt or lost file is never loaded: the newest own version that verifies is the
                # best left; it is republished above the league's version, so nothing goes back.
                log.error("%s: the league's checkpoint cannot be used (%s); resuming from %s instead", job_path,
                          err, own.path)
                return StartPoint(max(own.version, job_version + 1), own_weights, own.path, progress, updates, None,
                                  resumed=own, metadata=own.metadata)
            return StartPoint(job_version, weights, job_path, progress, 0, None, lineage_from=job_version,
                              metadata=metadata)
        return StartPoint(job_version, None, "fresh", progress, 0, None, lineage_from=job_version)

    def _not_found_hint(self, job_path: str) -> str:
        """What a league-named checkpoint that is not published (and no own version) most likely means."""
        try:
            there = self.store.root.resolve(job_path).is_file()
        except (OSError, ValueError):
            there = False
        if there:  # weights trained elsewhere, copied in without a manifest
            return (f"the file is there but was never published: publish weights trained elsewhere with `league "
                    f"import FILE --to {job_path}`")
        return (f"the shared root {self.store.root.root} holds no readable version of {self.player_id} either (is "
                "it the league's shared root?)")

    def _newest_readable(self) -> tuple[CheckpointRef | None, Mapping[str, np.ndarray] | None]:
        """The player's newest version that loads; a corrupt one is logged and skipped for the one before.

        A manifest that cannot be read now (`UnreadableCheckpointError`: no permission, an NFS I/O error) is
        raised, as the same error on a weights file (a PermissionError) always was: skipped as damaged, the
        learner resumed from an older version or, with none readable, started the player afresh above them all
        ("its training so far is lost"), and retention then deleted the versions that were intact all along.
        Raised, the session fails and is retried once the share reads again."""
        for ref in reversed(self.store.versions(self.player_id, skip_unreadable=False)):
            try:
                checkpoint = self.store.load(ref.path, ref.version)
            except UnreadableCheckpointError:
                raise
            except CheckpointError as err:
                log.error("%s: cannot resume from it (%s); trying an older version", ref.path, err)
                continue
            return checkpoint.ref, checkpoint.tensors
        return None, None

    def load_reset(self, path: str, policy: PolicyConfig) -> Mapping[str, np.ndarray] | None:
        """The weights a mutation resets to: the checkpoint at ``path``, or None (fresh) for an empty path; its
        observation statistics carried into `policy`'s `obs_scale` (`obs_norm_in_scale`)."""
        if not path:
            return None
        return self.load_for(path, policy)

    def load_for(self, path: str, policy: PolicyConfig) -> Mapping[str, np.ndarray]:
        """The weights of the checkpoint at ``path`` for a network of `policy` (`obs_norm_in_scale`)."""
        checkpoint = self.store.load(path)
        weights, _ = obs_norm_in_scale(checkpoint.tensors, checkpoint.ref.metadata, policy)
        return weights
