"""Versioned checkpoints on the shared filesystem: atomic publish, verified load, snapshots, retention.

Layout under the shared root (every path in the API is relative to it)::

    <player_id>/v0000000012.pt        weights of version 12 (torch.save of plain tensors; never changed)
    <player_id>/v0000000012.pt.train  optional: the learner's training state of version 12 (optimizer moments,
                                      target network, counters), read only by a resuming learner, never by actors
    <player_id>/v0000000012.pt.json   its manifest: version, digests and sizes, metadata (written after the files)
    <player_id>/v0000000012.pt.pin    optional marker: retention keeps this version (a historical player uses it)
    <player_id>/latest.json           the newest version's manifest (written last; a hard link to the
                                      version's manifest file until the next publish renames a new one over it)

Publishing writes each file to a temporary name in the same directory, fsyncs it, renames it into place and
fsyncs the directory, in the order files -> manifest -> latest.json, so a reader that finds a manifest finds
complete files. A reader reads the file once into private memory, verifies size and digest of that memory
against the manifest, and unpickles exactly those bytes (no window for a swap; the tensors are that memory,
see `common.checkpoint_unpickle`) with torch's weights-only unpickler, which refuses any object that is not
plain tensors and containers: a crafted pickle on the share raises instead of running.
Retention runs at the end of a publish: the versions beyond ``keep_last`` lose their manifests, their files get
hidden ``.retired`` names, and deleting those (which waits for the disk) finishes in the background; the next
publish, `CheckpointStore.close` and interpreter exit wait for it.
Snapshots (frozen copies for historical players) are hard links, or copies where linking fails.
One writer per player is intended (its learner). Should a second one write (a learner frozen mid-publish past its
lease, then thawed), each commit (the check that the version is above the latest, the renames, the manifest,
latest.json and retention) runs under the player's ``.publish.lock``, so nothing is published over a newer
version and latest.json never goes back; the writer's `publish_guard` can withdraw the publish at that point.
Any number of readers may load concurrently.

Digest: BLAKE3-256 (manifest format ``league-checkpoint/2``, ``"digest": "blake3:<hex>"``; why BLAKE3:
`common.checkpoint_hashing`). Manifests of format ``league-checkpoint/1`` (``"sha256": "<hex>"``) still load
and are verified with sha256. Files are written the way of `common.durable_files`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import re
import shutil
import stat
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from common.checkpoint_buffers import LoadBuffers
from common.checkpoint_hashing import FileDigest, Hasher, save_hashed
from common.durable_files import (
    atomic_write,
    fsync_dir,
    fsync_file,
    temp_name,
    unlink_quietly,
    write_new_file,
)
from common.job_limits import (
    MANIFEST_SUFFIX,
    MAX_CHECKPOINT_VERSION,
    PIN_SUFFIX,
    TRAINING_STATE_SUFFIX,
    VERSION_FILE,
)
from common.paths import READ_FLAGS, SharedRoot, UnsafePathError, check_component, check_relative
from common.trajectory import ALLOWED_DTYPES

if TYPE_CHECKING:  # torch is imported where tensors are saved or loaded: the coordinator only snapshots
    import torch

log = logging.getLogger(__name__)

MANIFEST_FORMAT = "league-checkpoint/2"
LEGACY_MANIFEST_FORMAT = "league-checkpoint/1"
"""Manifests before BLAKE3: ``"sha256": "<hex>"`` instead of ``"digest"``; still read, never written."""
FORMAT = "league-checkpoint/1"
"""The ``format`` of the dict inside a weights file (unchanged by the manifest's move to BLAKE3)."""
TRAINING_STATE_FORMAT = "league-training-state/1"
LATEST = "latest.json"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_DIGEST = re.compile(r"^(blake3|sha256):[0-9a-f]{64}$")
_MAX_MANIFEST_BYTES = 64 * 1024
MAX_CHECKPOINT_BYTES = 16 << 30
"""The largest weights or training-state file a manifest may name: 4x what the largest network a config allows
takes with its Adam state in float64. A load allocates the manifest's size before the digest can fail: a sparse
file of 8 TiB under a forged manifest raised a raw MemoryError out of every reader (a review)."""
_STALE_TEMP_S = 3600.0
_RETIRED_SUFFIX = ".retired"
"""Hidden name of a retired version's file until its deletion (in the background after a publish) is done."""
_CHUNK = 4 << 20
"""Read size of a load (the hash of one chunk overlaps the read of the next)."""
_LOAD_BUFFERS = LoadBuffers(keep=2)
"""Loads read into memory that earlier loads' dropped arrays left (see `common.checkpoint_buffers`)."""


class CheckpointError(Exception):
    """Base of the store's errors."""


class CorruptCheckpointError(CheckpointError, ValueError):
    """A manifest or weights file that is malformed, truncated, tampered with, or not plain tensors."""


class UnreadableCheckpointError(CorruptCheckpointError):
    """A manifest that is there but cannot be read now (no permission, an I/O error, a stale NFS handle). Readers
    that walk versions skip it as they skip a damaged one; but it is not known to be damaged, and may read once
    the share is fixed: nothing should give up on the checkpoint for good because of it."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """No published checkpoint at that path (never published, or removed by retention)."""


class VersionConflictError(ValueError):
    """A publish numbered at or below the player's latest version: someone else published it meanwhile (the
    store has one writer per player, the learner bound to it)."""


class PublishWithdrawn(CheckpointError):
    """The store's `publish_guard` said no at the moment of committing: nothing was published."""


@dataclass(frozen=True)
class CheckpointRef:
    """A published checkpoint: where it is (relative to the shared root) and what it must hash to."""

    path: str
    version: int
    digest: str
    """``"<algorithm>:<hex>"`` of the weights file: ``"blake3:…"`` (``"sha256:…"`` from a legacy manifest)."""
    size: int
    metadata: Mapping[str, Any] = field(default_factory=dict)
    training_state: FileDigest | None = None
    """The training state published with the weights (``<path>.train``), if any."""


@dataclass(frozen=True)
class Checkpoint:
    ref: CheckpointRef
    tensors: dict[str, np.ndarray]


def check_free_standing(path: str) -> None:
    """Raise ValueError unless ``path`` can name a checkpoint of no player's series (`CheckpointStore.publish_at`):
    relative, inside the root, a ``.pt`` file, and not named as a player's version, which actors would take for a
    version of the player its folder names."""
    check_relative(path)
    name = path.rpartition("/")[2]
    if not name.endswith(".pt"):
        raise ValueError(f"checkpoint path {path!r} must end with .pt")
    if VERSION_FILE.fullmatch(name):
        raise ValueError(f"checkpoint path {path!r}: {name!r} is the name of a player's version; choose another")


def snapshot_path(checkpoint_path: str, step: int) -> str:
    """The league's name for a frozen copy: ``p/v0000000012.pt`` at step 5000 -> ``p/v0000000012_5000.pt``."""
    check_relative(checkpoint_path)
    if not checkpoint_path.endswith(".pt"):
        raise ValueError(f"checkpoint path {checkpoint_path!r} must end with .pt")
    return f"{checkpoint_path[:-3]}_{int(step)}.pt"


class CheckpointStore:
    def __init__(
        self, shared_root: str | os.PathLike[str], keep_last: int = 5,
        publish_guard: Callable[[], bool] | None = None,
    ) -> None:
        """``keep_last``: published versions retention keeps per player (besides pinned ones); >= 2 is
        advisable so a reader that just read ``latest.json`` still finds the file it names.
        ``publish_guard``: asked under the player's commit lock, after the files are written and before
        anything becomes visible; False withdraws the publish (`PublishWithdrawn`). A learner passes "my lease
        on the player still holds": a learner frozen mid-publish (SIGSTOP, a paused VM, a slow share) past its
        lease must not publish over the learner that took the player over."""
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {keep_last}")
        self.root = SharedRoot(shared_root)
        self.keep_last = keep_last
        self.publish_guard = publish_guard
        self._retiring: list[_InThread] = []
        self._retiring_lock = threading.Lock()
        self._latest_fallbacks: dict[str, tuple[str, ...]] = {}
        """player id -> the fallback `latest` last logged at ERROR for it: an actor looks the latest version up
        every 50 ms, and one line per lookup filled its log until the next publish."""

    def wait_for_retention(self) -> None:
        """Wait until the files earlier publishes retired are deleted. Each publish waits for its predecessors',
        and interpreter exit waits as well. A deletion the filesystem refuses (an OSError) is logged where it
        happens, not raised here: raised, it failed the next publish (however much later) for a fault not its own;
        anything else it raised (a bug) is raised here."""
        with self._retiring_lock:
            retiring, self._retiring = self._retiring, []
        errors = []
        for deletion in retiring:
            try:
                deletion.join()
            except Exception as e:
                errors.append(e)
        if errors:
            raise errors[0]

    def close(self) -> None:
        """`wait_for_retention`: nothing of this store is left running afterwards."""
        self.wait_for_retention()

    # ---- names ------------------------------------------------------------------------------------------
    @staticmethod
    def version_path(player_id: str, version: int) -> str:
        check_component(player_id, "player_id")
        if not 0 <= version <= MAX_CHECKPOINT_VERSION:
            raise ValueError(f"version must be in [0, {MAX_CHECKPOINT_VERSION}], got {version}")
        return f"{player_id}/v{version:010d}.pt"

    # ---- publish ----------------------------------------------------------------------------------------
    def publish(
        self,
        player_id: str,
        tensors: Mapping[str, np.ndarray | torch.Tensor],
        version: int,
        metadata: Mapping[str, Any] | None = None,
        training_state: Mapping[str, Any] | None = None,
    ) -> CheckpointRef:
        """Write version ``version`` (greater than any published before) and make it the player's latest.

        ``training_state``: what a learner needs besides the weights to resume exactly (optimizer state dicts,
        a target network, counters): tensors, numbers, strings, None, and dicts/lists/tuples of them. It goes
        to a file of its own that only `load_training_state` reads, so actors never pay for it.
        """
        relative = self.version_path(player_id, version)
        metadata = _check_metadata(metadata)
        self.wait_for_retention()
        self._latest_below(player_id, version, log_corrupt=True)  # before the slow writes; again in the commit
        payload = {"format": FORMAT, "version": int(version), "tensors": _to_torch(tensors)}
        state_payload = None
        if training_state is not None:
            if not isinstance(training_state, Mapping):
                raise TypeError(f"training_state must be a mapping, got {type(training_state).__name__}")
            state_payload = {"format": TRAINING_STATE_FORMAT, "version": int(version),
                             "state": _training_state_to_cpu(training_state, "training_state")}
        path = self._publish_path(player_id, relative)
        path.parent.mkdir(parents=True, exist_ok=True)
        state_path = path.with_name(path.name + TRAINING_STATE_SUFFIX)
        temps: list[Path] = []
        try:
            # The slow part (serialising, hashing, fsyncing the weights) outside the lock.
            weights_tmp = temp_name(path)
            temps.append(weights_tmp)
            weights = save_hashed(payload, weights_tmp)
            state = state_tmp = None
            if state_payload is not None:
                state_tmp = temp_name(state_path)
                temps.append(state_tmp)
                state = save_hashed(state_payload, state_tmp)
            ref = CheckpointRef(relative, int(version), weights.digest, weights.size, metadata, state)
            with _commit_lock(path.parent, player_id):
                self._commit(ref, weights_tmp, state_tmp)
        finally:
            for tmp in temps:
                unlink_quietly(tmp)
        return ref

    def _publish_path(self, player_id: str, relative: str) -> Path:
        """Where a publish writes ``relative`` (a version of ``player_id``): the name in the player's directory,
        itself never resolved. Resolved, a symlink planted under a version's name (inside the root) sent the
        weights, the manifest and latest.json into the directory it names, over another player's files. The
        player's directory may be a symlink (inside the root), but not to another directory of the root: that
        is another player's, and its versions, manifests and latest.json would be written over."""
        directory = self.root.resolve(player_id)
        if directory.parent == self.root.root and directory.name != player_id:
            raise UnsafePathError(f"player_id: the directory of {player_id!r} is a symlink to {directory.name!r} at "
                                  "the top of the shared root, where each player has its directory: publishing "
                                  f"there could write over player {directory.name!r}'s checkpoints (link to a "
                                  f"directory below the top, such as disks/{player_id})")
        return directory / relative.rsplit("/", 1)[1]

    def _commit(self, ref: CheckpointRef, weights_tmp: Path, state_tmp: Path | None) -> None:
        """Under the player's commit lock: check again that the version is above the latest (another writer may
        have committed since the check before writing) and ask the guard; then rename the files into place,
        publish the manifest and latest.json, and retire what is beyond ``keep_last``. The lock makes the
        check and the commit one step for every writer of the player, so nothing is ever published over a
        newer version, and latest.json never goes back."""
        player_id = ref.path.split("/", 1)[0]
        path = self._publish_path(player_id, ref.path)
        state_path = path.with_name(path.name + TRAINING_STATE_SUFFIX)
        manifest_path = path.with_name(path.name + MANIFEST_SUFFIX)
        latest = self._latest_below(player_id, ref.version, log_corrupt=False)  # logged by the check before
        if self.publish_guard is not None and not self.publish_guard():
            raise PublishWithdrawn(f"version {ref.version} of {player_id!r} withdrawn before it became visible: "
                                   "its writer may no longer publish this player")
        try:
            before = _DirectoryListing.of(path.parent)
        except OSError:
            before = None  # retention lists the directory itself after the commit (and logs what fails there)
        if latest is not None and before is not None:
            self._drop_cache_of_retiring(path.parent, before, latest.version)
        renamed: list[Path] = []
        try:
            if state_tmp is not None:
                os.replace(state_tmp, state_path)
                renamed.append(state_path)
            os.replace(weights_tmp, path)
            renamed.append(path)
            fsync_dir(path.parent)  # the files are durable under their names before any manifest names them
            _publish_manifest(_manifest_bytes(ref), manifest_path, path.parent / LATEST)
        except BaseException:
            # Not published after all (a full disk, say): leave no files or manifest behind that latest.json
            # does not name (they would hold space and count as versions for retention). Still under the
            # lock, so these are this publish's own files.
            for victim in (manifest_path, *renamed):
                unlink_quietly(victim)
            raise
        # latest.json names the version now: readers load it, so nothing below may report the publish as
        # failed (the publisher would say "actors keep the version before", retry the same version and take
        # the VersionConflictError for another learner's publish). What fails here is logged instead.
        try:
            fsync_dir(path.parent)
        except OSError as err:
            log.error("version %d of %r is published, but syncing its directory failed (%s): a crash of the "
                      "machine now may lose it", ref.version, player_id, err)
        # Retention: the versions now beyond keep_last are unpublished and their files renamed out of the way
        # here; deleting those files (which waits for the disk: ext4 discards their blocks) goes on in the
        # background while the caller moves on.
        try:
            listing = None if before is None else before.with_newest(path.name)
            retired = self._retire_beyond(player_id, self.keep_last, (), listing)[1]
        except OSError as err:
            log.error("version %d of %r is published, but retiring the versions beyond keep_last=%d failed (%s); "
                      "retried at the next publish", ref.version, player_id, self.keep_last, err)
            return
        if retired:
            with self._retiring_lock:
                self._retiring.append(_InThread(_delete_retired_in_background, path.parent, retired))

    def _latest_below(self, player_id: str, version: int, *, log_corrupt: bool) -> CheckpointRef | None:
        """The player's latest version, which `version` must exceed (else `VersionConflictError`); None when
        there is none, or when no manifest of the player reads (this publish writes good ones)."""
        try:
            latest = self.latest(player_id)
        except CorruptCheckpointError as err:
            if log_corrupt:
                log.error("%s; publishing version %d over it", err, version)
            return None
        if latest is not None and version <= latest.version:
            raise VersionConflictError(
                f"version {version} of {player_id!r} must exceed the latest published {latest.version} "
                f"(published by {latest.metadata.get('worker_id', 'another writer')})")
        return latest

    # ---- read -------------------------------------------------------------------------------------------
    def latest(self, player_id: str) -> CheckpointRef | None:
        """The newest published version's reference, or None before the first publish.

        `latest.json` is a shortcut: every version's own manifest is published before it. So when it is
        missing (a writer that died between the two, a deleted file) or unreadable (a damaged or tampered
        file), the newest version manifest that parses stands in for it, with an error logged; the next
        publish writes a good `latest.json` again."""
        check_component(player_id, "player_id")
        where = f"{player_id}/{LATEST}"
        try:
            try:
                ref = self._read_latest(player_id, where)
            except FileNotFoundError:
                fallback, damaged = self._newest_version_manifest(player_id)
                reread = None
                if fallback is not None and player_id not in self._latest_fallbacks:
                    reread = self._latest_after_its_manifest(player_id, where)  # a damaged one raises here
                if reread is None:
                    said = [*damaged]
                    if fallback is not None:
                        said.append(f"{where} is missing; using the newest version manifest, {fallback.path}")
                    self._log_fallback(player_id, said)
                    return fallback
                ref = reread
            self._latest_fallbacks.pop(player_id, None)
            return ref
        except CorruptCheckpointError as err:
            fallback, damaged = self._newest_version_manifest(player_id)
            if fallback is None:
                self._log_fallback(player_id, damaged)
                raise
            self._log_fallback(player_id, [*damaged, f"{err}; using the newest version manifest instead, {fallback.path}"])
            return fallback

    def _read_latest(self, player_id: str, where: str) -> CheckpointRef:
        try:
            path = self.root.resolve(where)
        except UnsafePathError as err:  # latest.json a symlink out of the root: damaged, like any other
            raise CorruptCheckpointError(f"{where}: {err}") from err
        ref = _parse_manifest(_read_small(path), where)
        if ref.path.split("/", 1)[0] != player_id:
            raise CorruptCheckpointError(f"{where}: names {ref.path!r}, outside the player's directory")
        named = VERSION_FILE.fullmatch(ref.path.rsplit("/", 1)[-1])
        if named is None or int(named.group(1)) != ref.version:
            # No digest covers latest.json: a version of 2**62 in it made every later publish a version
            # conflict, and the player's learner never published again.
            raise CorruptCheckpointError(f"{where}: says version {ref.version} of {ref.path!r}")
        return ref

    def _latest_after_its_manifest(self, player_id: str, where: str) -> CheckpointRef | None:
        """latest.json read again, briefly, after it was missing beside a version manifest: a commit renames
        the manifest and then latest.json, so a lookup between the two (an actor's, as the learner publishes
        the player's first version) finds the manifest but not yet latest.json, with nothing lost. Asked only
        before a fallback is logged, so a latest.json really gone costs this wait once, not at every lookup.
        No lock is taken: a writer asks its publish guard (an RPC) under the commit lock, so a reader waiting
        on that lock waits on the network, and a lookup inside the commit would wait on its own lock."""
        for pause in LATEST_REREAD_PAUSES_S:
            time.sleep(pause)
            try:
                return self._read_latest(player_id, where)  # CorruptCheckpointError: damaged, as any other
            except FileNotFoundError:
                continue
        return None

    def _log_fallback(self, player_id: str, messages: list[str]) -> None:
        """ERRORs once per fallback (until `latest.json` reads again or the fallback changes), DEBUG after.
        `messages` include the damaged version manifests the fallback left out: `versions` logged each at every
        lookup, 20 times a second in an actor."""
        key = tuple(messages)
        if not key:
            return
        level = logging.DEBUG if self._latest_fallbacks.get(player_id) == key else logging.ERROR
        self._latest_fallbacks[player_id] = key
        for message in messages:
            log.log(level, "%s", message)

    def _newest_version_manifest(self, player_id: str) -> tuple[CheckpointRef | None, list[str]]:
        """The newest version manifest that parses, and what is said of each damaged one left out."""
        damaged: list[str] = []
        refs = self._versions(player_id, lambda err: damaged.append(f"{err}; left out of the player's versions"))
        return (refs[-1] if refs else None), damaged

    def manifest(self, path: str) -> CheckpointRef:
        """The published manifest of the checkpoint at ``path``."""
        ref = self._manifest_as_written(path)
        if ref.path != path:
            raise CorruptCheckpointError(f"{path}: manifest describes {ref.path!r}")
        return ref

    def _manifest_as_written(self, path: str) -> CheckpointRef:
        """The manifest beside ``path``, whatever path it names (`manifest` refuses another; `adopt` records it)."""
        resolved = self.root.resolve(path)
        try:
            return _parse_manifest(_read_small(resolved.with_name(resolved.name + MANIFEST_SUFFIX)), path)
        except FileNotFoundError as e:
            raise CheckpointNotFoundError(f"{path}: no published checkpoint (no manifest)") from e

    def versions(self, player_id: str, *, skip_unreadable: bool = True) -> list[CheckpointRef]:
        """Published versions of the player still on disk, oldest first. A version whose manifest is damaged is
        left out (logged), as `latest` does: the readers that walk back through versions (a resuming learner,
        an actor whose newest version does not verify) go on to the ones that remain. Not `skip_unreadable`: a
        manifest that cannot be read now (`UnreadableCheckpointError`: no permission, EIO) is raised instead,
        for a reader that must not go on without it (a resuming learner would start below it, or afresh)."""

        def on_damaged(err: CorruptCheckpointError) -> None:
            if not skip_unreadable and isinstance(err, UnreadableCheckpointError):
                raise err
            log.error("%s; left out of the player's versions", err)

        return self._versions(player_id, on_damaged)

    def _versions(self, player_id: str, on_damaged: Callable[[CorruptCheckpointError], None]) -> list[CheckpointRef]:
        check_component(player_id, "player_id")
        refs = []
        for name in self._version_files(player_id):
            try:
                refs.append(self.manifest(f"{player_id}/{name}"))
            except CheckpointNotFoundError:
                continue  # written but never published (crashed writer), or being removed
            except CorruptCheckpointError as err:
                on_damaged(err)
        return refs

    def versions_on_disk(self, player_id: str) -> list[int]:
        """The version numbers of the player's weight files on disk, oldest first, published or not and readable
        or not: whether the player ever had weights here (a damaged store), unlike `versions`."""
        return [int(VERSION_FILE.fullmatch(name).group(1)) for name in self._version_files(player_id)]

    def _version_files(self, player_id: str) -> list[str]:
        """Names of the player's versioned weight files on disk, oldest first ([] without its directory)."""
        directory = self.root.resolve(player_id)
        if not directory.is_dir():
            return []
        return sorted(name for name in os.listdir(directory) if VERSION_FILE.fullmatch(name))

    def load(self, path: str, expected_version: int | None = None) -> Checkpoint:
        """Load and verify the checkpoint at ``path``; raises `CorruptCheckpointError` on any mismatch."""
        ref = self.manifest(path)
        if expected_version is not None and ref.version != expected_version:
            raise CorruptCheckpointError(f"{path}: manifest version {ref.version} != expected {expected_version}")
        payload = _load_verified(path, self.root.resolve(path), ref.digest, ref.size)
        return Checkpoint(ref, _from_payload(payload, ref, path))

    def load_training_state(self, path: str, expected_version: int | None = None) -> dict[str, Any] | None:
        """The training state published with the checkpoint at ``path`` (verified like the weights; tensors on
        the CPU), or None when it was published without one."""
        ref = self.manifest(path)
        if expected_version is not None and ref.version != expected_version:
            raise CorruptCheckpointError(f"{path}: manifest version {ref.version} != expected {expected_version}")
        if ref.training_state is None:
            return None
        where = path + TRAINING_STATE_SUFFIX
        resolved = self.root.resolve(where)
        payload = _load_verified(where, resolved, ref.training_state.digest, ref.training_state.size)
        if not isinstance(payload, dict) or payload.get("format") != TRAINING_STATE_FORMAT:
            raise CorruptCheckpointError(f"{where}: not a {TRAINING_STATE_FORMAT} payload")
        _check_payload_version(payload, ref, where)
        state = payload.get("state")
        if not isinstance(state, dict):
            raise CorruptCheckpointError(f"{where}: state must be a dict")
        return state

    def load_latest(self, player_id: str, attempts: int = 5) -> Checkpoint | None:
        """The newest version, re-reading ``latest.json`` if retention removed the file in between."""
        last_error: CheckpointNotFoundError | None = None
        for _ in range(attempts):
            ref = self.latest(player_id)
            if ref is None:
                return None
            try:
                return self.load(ref.path, ref.version)
            except CheckpointNotFoundError as e:
                last_error = e
        assert last_error is not None
        raise last_error

    # ---- snapshots, pins, retention ---------------------------------------------------------------------
    def verify(self, path: str) -> CheckpointRef:
        """The manifest of ``path`` once its file matches it (size and digest); raises `CheckpointError`."""
        ref = self.manifest(path)
        self._check_file(path, ref)
        return ref

    def _check_file(self, path: str, ref: CheckpointRef) -> None:
        """Raise `CheckpointError` unless the file at ``path`` has ``ref``'s size and digest."""
        with _opened(path, self.root.resolve(path), ref.size) as fd:
            _read_hashed(fd, path, ref.digest, ref.size, keep=False)

    def snapshot(self, source: str, dest: str, verify: bool = True) -> CheckpointRef:
        """Freeze ``source`` under the new name ``dest`` (hard link, or a copy where links fail)."""
        ref = self.verify(source) if verify else self.manifest(source)
        if not dest.endswith(".pt"):
            raise ValueError(f"snapshot destination {dest!r} must end with .pt")
        check_relative(dest)
        folder, _, name = dest.rpartition("/")
        # The destination's own name is never resolved: a symlink planted there sent the snapshot's weights and
        # manifest into another player's directory (as one of its versions), and the cleanup of an unfinished
        # snapshot below deleted the file the link named. Only its directory is.
        src_path, dest_path = self.root.resolve(source), (self.root.resolve(folder) if folder else self.root.root) / name
        dest_manifest = dest_path.with_name(dest_path.name + MANIFEST_SUFFIX)
        if dest_manifest.exists():
            raise FileExistsError(f"snapshot destination {dest!r} exists")
        if os.path.lexists(dest_path):
            # Weights without a manifest: an earlier attempt that failed (a full disk) or was killed between the
            # two writes. Never published, so no reader uses it; this attempt replaces it.
            log.warning("%s: weights left by an unfinished snapshot; replacing them", dest)
            dest_path.unlink()  # (the name itself: a symlink there is removed, not what it names)
        dest_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(src_path, dest_path, follow_symlinks=False)
        except OSError as e:
            if e.errno not in (errno.EXDEV, errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK, errno.EACCES):
                raise
            tmp = temp_name(dest_path)
            try:
                shutil.copyfile(src_path, tmp, follow_symlinks=False)
                fsync_file(tmp)
                os.replace(tmp, dest_path)
            except BaseException:
                unlink_quietly(tmp)  # a partial copy (a full disk) would hold its space and pile up at each retry
                raise
        # Weights only: a snapshot is a frozen opponent, never resumed as a learner.
        snap = CheckpointRef(dest, ref.version, ref.digest, ref.size, {**ref.metadata, "snapshot_of": source})
        try:
            fsync_dir(dest_path.parent)
            atomic_write(dest_manifest, _manifest_bytes(snap))
        except BaseException:
            if not dest_manifest.exists():  # no weights left that no manifest publishes (a hard link keeps space);
                unlink_quietly(dest_path)  # a manifest renamed in place before a later step failed keeps them
            raise
        return snap

    def adopt(self, path: str) -> CheckpointRef:
        """Record at ``path`` a checkpoint copied there with its manifest from another place (another league's
        shared root, as a league's pretrained start): that manifest names the old path, which `manifest` refuses
        (readers would never load the copy). The file is verified against it (size and digest), then a manifest
        naming ``path``, the old one in its metadata (``copied_from``), replaces it; weights only, as a
        snapshot's. A manifest that names ``path`` already is returned as it is."""
        try:
            ref = self._manifest_as_written(path)
        except CheckpointNotFoundError as e:
            raise CheckpointNotFoundError(f"{e}: copy a checkpoint with its manifest") from e
        if ref.path == path:
            return ref
        self._check_file(path, ref)
        adopted = CheckpointRef(path, ref.version, ref.digest, ref.size, {**ref.metadata, "copied_from": ref.path})
        resolved = self.root.resolve(path)
        atomic_write(resolved.with_name(resolved.name + MANIFEST_SUFFIX), _manifest_bytes(adopted))
        return adopted

    def publish_at(self, path: str, tensors: Mapping[str, np.ndarray | torch.Tensor],
                   metadata: Mapping[str, Any] | None = None, *, replace: bool = False) -> CheckpointRef:
        """Publish weights at the free-standing ``path`` (no player's series of versions: a league's pretrained
        start, say), as version 0: the file, then its manifest. ``replace``: over a checkpoint published there
        (its manifest goes first, so no reader pairs it with the new file). Weights only, as a snapshot's."""
        check_free_standing(path)
        folder, _, name = path.rpartition("/")
        metadata = _check_metadata(metadata)
        # Not the name itself: a symlink planted there would have the weights written where it points.
        target = (self.root.resolve(folder) if folder else self.root.root) / name
        manifest_path = target.with_name(name + MANIFEST_SUFFIX)
        if manifest_path.exists() and not replace:
            raise FileExistsError(f"{path} is a published checkpoint already")
        target.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_temps(target)
        tmp = temp_name(target)
        try:
            written = save_hashed({"format": FORMAT, "version": 0, "tensors": _to_torch(tensors)}, tmp)
            ref = CheckpointRef(path, 0, written.digest, written.size, metadata)
            unlink_quietly(manifest_path)
            os.replace(tmp, target)
            fsync_dir(target.parent)  # the file is durable under its name before a manifest names it
            atomic_write(manifest_path, _manifest_bytes(ref))
        finally:
            unlink_quietly(tmp)
        return ref

    def pin(self, path: str) -> None:
        """Keep ``path`` through retention (a marker file, so every process sees it)."""
        self.manifest(path)
        resolved = self.root.resolve(path)
        atomic_write(resolved.with_name(resolved.name + PIN_SUFFIX), b"")

    def unpin(self, path: str) -> None:
        resolved = self.root.resolve(path)
        try:
            os.unlink(resolved.with_name(resolved.name + PIN_SUFFIX))
        except FileNotFoundError:
            return
        fsync_dir(resolved.parent)

    def prune(self, player_id: str, keep_last: int | None = None, pinned: Collection[str] = ()) -> list[str]:
        """Remove published versions beyond the newest ``keep_last``, except pinned ones; returns removed paths.

        Only ``v<10 digits>.pt`` files are versions: snapshots under other names are never touched.
        """
        keep_last = self.keep_last if keep_last is None else keep_last
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {keep_last}")
        check_component(player_id, "player_id")
        removed, retired = self._retire_beyond(player_id, keep_last, pinned)
        _delete_retired(self.root.resolve(player_id), retired)
        return removed

    def _drop_cache_of_retiring(self, directory: Path, listing: _DirectoryListing, newest: int) -> None:
        """Drop the page cache of the versions the coming publish will retire (a hint: they stay published and
        readable, from disk). The new files' page cache is then built from memory freed just now: on a VM
        that hands free memory back to its host (free page reporting, as here), memory that has been free
        for a few seconds must be backed by the host again on first touch, which made writing 100 MB cost
        60-140 ms of CPU instead of ~25 ms."""
        names = [n for n in listing.published if int(n[1:11]) <= newest]
        for name in names[self.keep_last - 1:]:
            if not (directory / (name + PIN_SUFFIX)).exists():
                for victim in (name, name + TRAINING_STATE_SUFFIX):
                    _drop_page_cache(directory / victim)

    def _retire_beyond(self, player_id: str, keep_last: int, pinned: Collection[str],
                       listing: _DirectoryListing | None = None) -> tuple[list[str], list[Path]]:
        """Unpublish the versions beyond the newest ``keep_last`` (except pinned ones) and rename their files
        to hidden ``.retired`` names for `_delete_retired`, and remove what crashed writers left long ago;
        returns the versions' paths and those files. ``listing``: the directory as the caller's commit left it
        (the player's commit lock held since it was listed); None: listed here."""
        directory = self.root.resolve(player_id)
        if not directory.is_dir():
            return [], []
        if listing is None:
            listing = _DirectoryListing.of(directory)
        removed: list[str] = []
        retired: list[Path] = []
        for name in listing.published[keep_last:] + listing.orphans:
            relative = f"{player_id}/{name}"
            if relative in pinned or (directory / (name + PIN_SUFFIX)).exists():
                continue
            # Manifest first: from then on the version is unpublished, so readers never see a half-removal.
            unlink_quietly(directory / (name + MANIFEST_SUFFIX))
            for victim in (directory / name, directory / (name + TRAINING_STATE_SUFFIX)):
                hidden = temp_name(victim, _RETIRED_SUFFIX)
                try:
                    os.rename(victim, hidden)
                except FileNotFoundError:
                    continue
                retired.append(hidden)
            removed.append(relative)
        now = time.time()
        present = listing.entries
        for name in present:  # the cheap tests first: every version's files are listed here
            if name.startswith("."):
                if name.endswith(_RETIRED_SUFFIX) and directory / name not in retired:
                    stale = "left by a process that exited while deleting it"
                elif name.endswith(".tmp"):
                    stale = "left by a writer that crashed mid-publish"
                else:
                    continue
            elif (name.endswith(TRAINING_STATE_SUFFIX) and name[:-len(TRAINING_STATE_SUFFIX)] not in present
                  and VERSION_FILE.fullmatch(name[:-len(TRAINING_STATE_SUFFIX)])):
                stale = "a training state whose weights a crash never put beside it"
            else:
                continue
            try:
                if not name.endswith(_RETIRED_SUFFIX) and now - os.lstat(directory / name).st_mtime <= _STALE_TEMP_S:
                    continue  # (maybe a publish under way)
                os.unlink(directory / name)
            except FileNotFoundError:
                pass
            except OSError as err:  # one entry that cannot go (a directory, another user's) stops nothing else:
                # it raised, after the versions above were unpublished, and their files were never deleted
                log.warning("%s: cannot remove %s (%s): %s", player_id, name, stale, err)
        return removed, retired


# ---- helpers ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _DirectoryListing:
    """A player's directory as one listing: its entries, the version files that are published (they have a
    manifest), newest first, and the orphans below the newest of them: weights whose publish a crash (kill -9)
    cut between the file's rename and its manifest. Retention counted those as versions: a restarted learner
    publishing below such an orphan (its versions count updates; a reset goes back to the job's) saw each new
    version retired at once with keep_last 1, latest.json naming a deleted file. Orphans above the newest are
    left for the publish of their number to replace.

    Why one listing, looked up: a publish listed the directory three times and stat'ed each version's manifest,
    and scanned a list per version for the orphans; with many versions kept (keep_last up to 10,000, as the
    benchmarks keep every version) a publish cost 125 ms of CPU at 2,000 versions, against 6 ms with 5."""

    entries: frozenset[str]
    versions: list[str]
    """Every version file, newest first."""
    published: list[str]
    orphans: list[str]

    @classmethod
    def of(cls, directory: Path) -> _DirectoryListing:
        entries = frozenset(os.listdir(directory))
        names = sorted((n for n in entries if n.endswith(".pt") and VERSION_FILE.fullmatch(n)), reverse=True)
        return cls._of(entries, names, [n for n in names if n + MANIFEST_SUFFIX in entries])

    @classmethod
    def _of(cls, entries: frozenset[str], names: list[str], published: list[str]) -> _DirectoryListing:
        newest = published[0] if published else None
        kept = set(published)
        orphans = [n for n in names if newest is not None and n < newest and n not in kept]
        return cls(entries, names, published, orphans)

    def with_newest(self, name: str) -> _DirectoryListing:
        """The listing once the version file ``name`` is published and latest.json names it: first of the
        published, the one retention keeps first (a newer manifest that a crash left without latest.json naming
        it counts after it), and the orphans are those below it. The entries stay as listed: the sweep of stale
        files reads only what was there before."""
        names = self.versions if name in self.versions else sorted([name, *self.versions], reverse=True)
        return self._of(self.entries, names, [name, *(n for n in self.published if n != name)])


def _to_torch(tensors: Mapping[str, np.ndarray | torch.Tensor]) -> dict[str, torch.Tensor]:
    import torch

    if not isinstance(tensors, Mapping):
        raise TypeError(f"tensors must be a mapping of name -> array, got {type(tensors).__name__}")
    out = {}
    for name, value in tensors.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"tensor name {name!r} must be a non-empty string")
        if isinstance(value, torch.Tensor):
            if value.layout == torch.strided:  # a lazy negated or conjugated view is stored as its values
                value = value.resolve_neg().resolve_conj()
            problem = _tensor_problem(value)
            if problem is not None:  # a load could not give it back (bfloat16, sparse) or it is not allowed
                raise ValueError(f"tensors[{name!r}]: {problem}")
            out[name] = value.detach().to("cpu")
            continue
        array = np.asarray(value)
        if array.dtype.name not in ALLOWED_DTYPES:
            raise ValueError(f"tensors[{name!r}]: dtype {array.dtype} is not allowed")
        if not array.flags.writeable or not array.flags.c_contiguous:
            array = np.ascontiguousarray(array).copy()
        out[name] = torch.from_numpy(array)
    return out


def _from_payload(payload: Any, ref: CheckpointRef, path: str) -> dict[str, np.ndarray]:
    import torch

    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CorruptCheckpointError(f"{path}: not a {FORMAT} payload")
    _check_payload_version(payload, ref, path)
    tensors = payload.get("tensors")
    if not isinstance(tensors, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in tensors.items()
    ):
        raise CorruptCheckpointError(f"{path}: tensors must map names to tensors")
    for name, value in tensors.items():
        problem = _tensor_problem(value) or ("needs gradients" if value.requires_grad else None)
        if problem is not None:
            raise CorruptCheckpointError(f"{path}: tensors[{name!r}]: {problem}")
    try:
        return {k: v.numpy() for k, v in tensors.items()}
    except (RuntimeError, TypeError) as e:  # whatever else numpy cannot take is a damaged checkpoint too
        raise CorruptCheckpointError(f"{path}: a tensor cannot be read as an array ({e})") from e


def _check_payload_version(payload: dict, ref: CheckpointRef, where: str) -> None:
    """The payload's version is the manifest's: compared as an int (a tensor there made the comparison raise a raw
    RuntimeError, which readers did not take for a damaged checkpoint: a review)."""
    version = payload.get("version")
    if type(version) is not int or version != ref.version:
        shown = version if type(version) is int else type(version).__name__
        raise CorruptCheckpointError(f"{where}: payload version {shown} != manifest {ref.version}")


def _tensor_problem(value: Any) -> str | None:
    """Why a torch tensor cannot be a checkpoint's tensor (None when it can): published and loaded, it must come
    back as a numpy array of an allowed dtype."""
    import torch

    if value.layout != torch.strided:
        return f"a {value.layout} tensor; only dense tensors are stored"
    if value.is_neg() or value.is_conj():  # (lazy views: `.numpy()` refuses them at every load)
        return "a negated or conjugated view; resolve it (resolve_neg, resolve_conj) first"
    name = str(value.dtype).removeprefix("torch.")
    if name not in ALLOWED_DTYPES:
        return f"dtype {name} is not allowed"
    return None


def _check_metadata(metadata: Mapping[str, Any] | None) -> dict[str, Any]:
    metadata = dict(metadata or {})
    for key, value in metadata.items():
        if not isinstance(key, str) or not isinstance(value, str | int | float | bool | type(None)):
            raise ValueError(f"metadata[{key!r}]: only string keys and str/int/float/bool/None values")
    return metadata


def _training_state_to_cpu(value: Any, where: str) -> Any:
    """A copy of the training state's containers with every tensor on the CPU; anything that
    ``torch.load(weights_only=True)`` would refuse raises here, at publish, naming where it is."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu")
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str | int) or isinstance(key, bool):
                raise ValueError(f"{where}: key {key!r} must be a string or an int")
            out[key] = _training_state_to_cpu(item, f"{where}[{key!r}]")
        return out
    if isinstance(value, list | tuple):
        items = [_training_state_to_cpu(item, f"{where}[{i}]") for i, item in enumerate(value)]
        return items if isinstance(value, list) else tuple(items)
    raise ValueError(f"{where}: {type(value).__name__} is not allowed (tensors, numbers, strings, None, "
                     "and dicts/lists/tuples of them)")


def _load_verified(where: str, resolved: Path, digest: str, size: int) -> Any:
    """Unpickle the file once its bytes are exactly ``size`` bytes hashing to ``digest``: the file is read once
    into private memory, that memory is hashed, and the tensors unpickled are that same memory (no second
    copy, and a file swapped or rewritten after the read changes nothing)."""
    with _opened(where, resolved, size) as fd:
        try:
            data = _read_hashed(fd, where, digest, size, keep=True)
        except MemoryError as e:  # not damage: a machine short of memory now (a retry may load it)
            raise UnreadableCheckpointError(f"{where}: cannot be read now (no memory for its {size:,} bytes)") from e
    from common.checkpoint_unpickle import load_weights_only  # torch: imported by loaders only

    try:
        return load_weights_only(data)
    except Exception as e:  # pickle errors come in many types; all mean "not a checkpoint of ours"
        raise CorruptCheckpointError(f"{where}: not a plain-tensor checkpoint ({type(e).__name__}: {e})") from e


def _read_failure(where: str, resolved: Path, err: OSError) -> CheckpointError:
    """What a file of a published checkpoint that cannot be opened or read means to its readers. ESTALE (NFS) on a
    version retention removes (a player's `v<N>.pt` and its training state): removed on another machine while this
    one read it. Anything else, ESTALE on a snapshot (never retired) included: no permission, an I/O error, a stale
    handle now: `UnreadableCheckpointError`, so that readers walking versions skip it this time, and nothing
    gives up on it for good (as a raw OSError it failed an actor's job where a manifest's same error was skipped;
    as NotFound, a snapshot's ESTALE set the historical player aside for good: a review)."""
    name = resolved.name.removesuffix(TRAINING_STATE_SUFFIX)
    if err.errno == errno.ESTALE and VERSION_FILE.fullmatch(name):
        return CheckpointNotFoundError(f"{where}: removed while being read (stale file handle)")
    return UnreadableCheckpointError(f"{where}: cannot be read now ({err.strerror or type(err).__name__})")


def _open_regular(path: Path) -> int:
    """A read descriptor of `path`; OSError(EINVAL) when it is no regular file (a FIFO, a device, a directory):
    nothing of the store is, and reading one could block or never end."""
    fd = os.open(path, READ_FLAGS)
    try:
        mode = os.fstat(fd).st_mode
    except BaseException:
        os.close(fd)
        raise
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise OSError(errno.EINVAL, f"not a regular file ({_file_kind(mode)})", str(path))
    return fd


def _file_kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a plain file"


@contextlib.contextmanager
def _opened(where: str, resolved: Path, size: int) -> Iterator[int]:
    """The file's descriptor (never through a symlink, never a FIFO or device), once its size is the manifest's.
    Any error opening or reading it (in the block too) is a `CheckpointError` (`_read_failure`)."""
    try:
        fd = _open_regular(resolved)
    except FileNotFoundError as e:
        raise CheckpointNotFoundError(f"{where}: file missing") from e
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise CorruptCheckpointError(f"{where}: is a symlink") from e
        if e.errno in (errno.EINVAL, errno.EISDIR):
            raise CorruptCheckpointError(f"{where}: {e.strerror}") from e
        raise _read_failure(where, resolved, e) from e
    try:
        on_disk = os.fstat(fd).st_size
        if on_disk != size:
            raise CorruptCheckpointError(f"{where}: size {on_disk} != manifest size {size}")
        yield fd
    except CheckpointError:  # (CheckpointNotFoundError is an OSError)
        raise
    except OSError as e:
        raise _read_failure(where, resolved, e) from e
    finally:
        os.close(fd)


def _read_hashed(fd: int, where: str, digest: str, size: int, keep: bool) -> np.ndarray:
    """Read the file and check its digest; ``keep``: into one buffer that is returned (the helper thread
    hashes chunk i while chunk i + 1 is read), else through one reused chunk (only the check is wanted)."""
    buffer = _LOAD_BUFFERS.take(size) if keep else np.empty(min(size, _CHUNK), dtype=np.uint8)
    view = memoryview(buffer)
    hasher = Hasher(digest.split(":", 1)[0], background=keep and size > _CHUNK)
    try:
        offset = 0
        while offset < size:
            target = view[offset:offset + _CHUNK] if keep else view[:min(_CHUNK, size - offset)]
            n = os.preadv(fd, [target], offset)
            if not n:
                break
            hasher.update(target[:n])
            offset += n
        actual = hasher.digest()
    finally:
        hasher.close()
    _check_complete(fd, where, offset, size, actual, digest)
    return buffer


def _check_complete(fd: int, where: str, read: int, size: int, actual: str, digest: str) -> None:
    if read != size or os.pread(fd, 1, size):
        raise CorruptCheckpointError(f"{where}: file changed size while being read")
    if actual != digest:
        raise CorruptCheckpointError(f"{where}: digest does not match the manifest (corrupt or tampered)")


def _remove_stale_temps(target: Path) -> None:
    """Remove the temporary files of earlier writes of `target` (`temp_name`'s) older than `_STALE_TEMP_S`: a
    writer killed mid-write leaves one as large as the weights, which no publish of a player's versions sweeps
    (retention does that in players' folders only)."""
    prefix = "." + target.name + "."
    now = time.time()
    with contextlib.suppress(OSError):
        for entry in os.scandir(target.parent):
            if entry.name.startswith(prefix) and entry.name.endswith(".tmp"):
                with contextlib.suppress(OSError):
                    if now - entry.stat(follow_symlinks=False).st_mtime > _STALE_TEMP_S:
                        os.unlink(entry.path)


def _manifest_bytes(ref: CheckpointRef) -> bytes:
    body: dict[str, Any] = {
        "format": MANIFEST_FORMAT,
        "path": ref.path,
        "version": ref.version,
        "digest": ref.digest,
        "size": ref.size,
        "created_at": time.time(),
        "metadata": dict(ref.metadata),
    }
    if ref.training_state is not None:
        body["training_state"] = {"digest": ref.training_state.digest, "size": ref.training_state.size}
    return json.dumps(body, sort_keys=True).encode()


def verify_beside(path: Path) -> CheckpointRef | None:
    """A weights file anywhere (`league import`'s input, a checkpoint copied out of a league): None when no
    manifest of ours lies beside it (a user's own ``<file>.json`` is none), else that manifest once the file
    matches its size and digest; `CorruptCheckpointError` when it does not (a file corrupted or tampered with
    since its publish: imported, it was published again under a fresh, valid digest; a review)."""
    manifest = path.with_name(path.name + MANIFEST_SUFFIX)
    data = _manifest_of_ours(manifest)
    if data is None:
        return None
    ref = _parse_manifest(data, str(manifest))
    with _opened(str(path), path, ref.size) as fd:
        _read_hashed(fd, str(path), ref.digest, ref.size, keep=False)
    return ref


def is_manifest(path: Path) -> bool:
    """Whether `path` is a checkpoint manifest of ours (not any JSON file, such as a user's own ``<file>.json``)."""
    return _manifest_of_ours(path) is not None


def _manifest_of_ours(path: Path) -> bytes | None:
    """The bytes of the manifest at `path`; None when there is none of ours there (no file, no regular file, or
    JSON of another format)."""
    try:
        data = _read_small(path)
    except (FileNotFoundError, CorruptCheckpointError):  # (none, or no file of ours: a directory, a link)
        return None
    try:
        body = json.loads(data)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(body, dict) or body.get("format") not in (MANIFEST_FORMAT, LEGACY_MANIFEST_FORMAT):
        return None
    return data


def _parse_manifest(data: bytes, where: str) -> CheckpointRef:
    try:
        body = json.loads(data)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:  # (deep nesting; an int of 5,000 digits)
        raise CorruptCheckpointError(f"{where}: manifest is not JSON ({type(e).__name__})") from e
    form = body.get("format") if isinstance(body, dict) else None
    if form == MANIFEST_FORMAT:
        digest = body.get("digest")
    elif form == LEGACY_MANIFEST_FORMAT:
        sha = body.get("sha256")
        if not isinstance(sha, str) or not _SHA256.match(sha):
            raise CorruptCheckpointError(f"{where}: manifest sha256 {sha!r} invalid")
        digest = f"sha256:{sha}"
    else:
        raise CorruptCheckpointError(f"{where}: manifest format is not {MANIFEST_FORMAT}")
    path, version, size = body.get("path"), body.get("version"), body.get("size")
    if not isinstance(path, str):
        raise CorruptCheckpointError(f"{where}: manifest path missing")
    try:
        check_relative(path)
    except ValueError as e:
        raise CorruptCheckpointError(f"{where}: manifest path {path!r} is unsafe") from e
    if not isinstance(version, int) or isinstance(version, bool) or not 0 <= version <= MAX_CHECKPOINT_VERSION:
        raise CorruptCheckpointError(f"{where}: manifest version {version!r} invalid")
    _check_digest(digest, size, f"{where}: manifest")
    metadata = body.get("metadata", {})
    if not isinstance(metadata, dict):
        raise CorruptCheckpointError(f"{where}: manifest metadata must be an object")
    training = body.get("training_state")
    state = None
    if training is not None:
        if not isinstance(training, dict):
            raise CorruptCheckpointError(f"{where}: manifest training_state must be an object")
        _check_digest(training.get("digest"), training.get("size"), f"{where}: manifest training_state")
        state = FileDigest(training["digest"], training["size"])
    return CheckpointRef(path, version, digest, size, metadata, state)


def _check_digest(digest: Any, size: Any, where: str) -> None:
    if not isinstance(digest, str) or not _DIGEST.match(digest):
        raise CorruptCheckpointError(f"{where} digest {digest!r} invalid (want blake3:<64 hex>)")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise CorruptCheckpointError(f"{where} size {size!r} invalid")
    if size > MAX_CHECKPOINT_BYTES:
        raise CorruptCheckpointError(f"{where} size {size:,} bytes is more than a checkpoint may hold "
                                     f"({MAX_CHECKPOINT_BYTES:,})")


def _read_small(path: Path) -> bytes:
    """A manifest's bytes. Missing (a path through a file too): FileNotFoundError; any other reason it cannot be
    read (a symlink, a directory, no permission, an I/O error): CorruptCheckpointError, so that readers skip
    it as a damaged version instead of failing on a raw OSError (`UnreadableCheckpointError` for no permission
    or an I/O error: not known to be damaged)."""
    try:
        fd = _open_regular(path)
        with os.fdopen(fd, "rb") as f:
            data = f.read(_MAX_MANIFEST_BYTES + 1)
    except (FileNotFoundError, NotADirectoryError) as err:
        raise FileNotFoundError(err.errno, err.strerror, str(path)) from err
    except OSError as err:
        reason = "a symlink" if err.errno == errno.ELOOP else err.strerror or type(err).__name__
        # A symlink, a FIFO or device, a directory: damaged. Anything else (no permission, EIO) may pass.
        damaged = err.errno in (errno.ELOOP, errno.EINVAL, errno.EISDIR)
        error = CorruptCheckpointError if damaged else UnreadableCheckpointError
        raise error(f"{path.name}: manifest cannot be read ({reason})") from err
    if len(data) > _MAX_MANIFEST_BYTES:
        raise CorruptCheckpointError(f"{path.name}: manifest larger than {_MAX_MANIFEST_BYTES} bytes")
    return data


def _drop_page_cache(path: Path) -> None:
    """Ask the kernel to drop the file's cached pages (clean ones go; nothing changes for readers)."""
    if not hasattr(os, "posix_fadvise"):
        return
    try:
        fd = os.open(path, READ_FLAGS)  # (non-blocking: a FIFO planted under an old version's name hung the
    except FileNotFoundError:  # gone meanwhile: nothing to drop     publish here, holding the commit lock)
        return
    except OSError as e:
        if e.errno == errno.ELOOP:  # a symlink where a version should be: not ours to touch
            return
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ESPIPE, errno.ENOSYS):  # a filesystem without the hint
            raise
    finally:
        os.close(fd)


def _delete_retired(directory: Path, retired: list[Path]) -> None:
    """Delete files `CheckpointStore._retire_beyond` renamed away, then make their removal durable."""
    for path in retired:
        unlink_quietly(path)
    fsync_dir(directory)


def _delete_retired_in_background(directory: Path, retired: list[Path]) -> None:
    """`_delete_retired` after a publish. Its versions are unpublished already, so a failure here loses nothing
    a reader can see: logged, and what is left under its hidden name is swept by a later publish."""
    try:
        _delete_retired(directory, retired)
    except OSError as err:
        log.error("deleting %d retired checkpoint file(s) in %s failed (%s); a later publish removes what is left",
                  len(retired), directory, err)


LATEST_REREAD_PAUSES_S = (0.0, 0.005, 0.02, 0.1)
"""Pauses before each new read of a latest.json missing beside a version manifest: the commit renames it right
after the manifest (no disk wait between), so the first read again nearly always finds it; the longer pauses
cover a writer descheduled between the two renames on a loaded machine."""

COMMIT_LOCK_WAIT_S = 30.0
"""How long a publish waits for another writer's commit of the same player (a commit takes milliseconds; one
held longer belongs to a frozen process). Then it fails as storage does, and the learner retries later."""
COMMIT_LOCK = ".publish.lock"


@contextlib.contextmanager
def _commit_lock(directory: Path, player_id: str) -> Iterator[None]:
    """An exclusive `flock` on the player's ``.publish.lock`` for one commit. The kernel releases it when its
    holder dies; on NFS, Linux clients take it as a lock on the server (unless mounted with ``local_lock``)."""
    try:  # never through a symlink (it created a file outside the shared root), nor a FIFO or device
        fd = os.open(directory / COMMIT_LOCK,
                     os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0), 0o644)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise UnsafePathError(f"{directory / COMMIT_LOCK} is a symlink: the commit lock must be a file of the "
                                  "player's own directory") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafePathError(f"{directory / COMMIT_LOCK} is not a regular file")
    wait_s = COMMIT_LOCK_WAIT_S
    try:
        deadline = time.monotonic() + wait_s
        pause = 0.002
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise TimeoutError(errno.ETIMEDOUT, f"another writer of {player_id!r} held its commit lock "
                                       f"for over {wait_s:.0f} s (a frozen process?)",
                                       str(directory / COMMIT_LOCK)) from None
                time.sleep(pause)
                pause = min(pause * 2, 0.05)
            except OSError as err:
                if err.errno not in _NO_LOCKS:
                    raise
                # A filesystem without locks (some FUSE and SMB mounts): publishing must go on. The version
                # check and the guard still run; only their atomicity against a second writer is lost.
                _warn_no_locks(directory, err)
                break
        yield
    finally:
        os.close(fd)  # releases the lock


_NO_LOCKS = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EINVAL})
_warned_no_locks: set[str] = set()


def _warn_no_locks(directory: Path, err: OSError) -> None:
    where = str(directory.parent)
    if where not in _warned_no_locks:
        _warned_no_locks.add(where)
        log.warning("the shared root %s takes no file locks (%s): checkpoints are published without the commit "
                    "lock that keeps a second writer of a player (a learner frozen past its lease) from "
                    "publishing over the first", where, err.strerror or err)


def _publish_manifest(manifest: bytes, manifest_path: Path, latest_path: Path) -> None:
    """The version's manifest, then latest.json: one file written and fsynced, hard-linked under the first
    name and renamed to the second (a second write where the filesystem has no hard links). Raises only
    before latest.json is renamed; the caller fsyncs the directory."""
    tmp = temp_name(latest_path)
    try:
        write_new_file(tmp, manifest)
        linked = temp_name(manifest_path)
        try:
            os.link(tmp, linked, follow_symlinks=False)
        except OSError as e:
            if e.errno not in (errno.EXDEV, errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK, errno.EACCES):
                raise
            atomic_write(manifest_path, manifest, sync_dir=False)
        else:
            try:
                os.replace(linked, manifest_path)  # over a leftover of a crashed publish of this version
            except BaseException:
                unlink_quietly(linked)
                raise
        os.replace(tmp, latest_path)
    except BaseException:
        unlink_quietly(tmp)
        raise


class _InThread:
    """``function(*args)`` on a helper thread (not a daemon: interpreter exit waits for it); `join` waits for
    it and raises what it raised."""

    def __init__(self, function: Callable[..., Any], *args: Any) -> None:
        self._error: BaseException | None = None

        def run() -> None:
            try:
                function(*args)
            except BaseException as e:  # raised again by join(); logged in case nobody joins
                log.error("%s failed: %r", getattr(function, "__name__", function), e)
                self._error = e

        self._thread = threading.Thread(target=run, name="ckpt-retire", daemon=False)
        self._thread.start()

    def join(self) -> None:
        self._thread.join()
        if self._error is not None:
            raise self._error
