"""Versioned checkpoints on the shared filesystem: atomic publish, verified load, snapshots, retention.

Layout under the shared root (every path in the API is relative to it)::

    <player_id>/v0000000012.pt        weights of version 12 (torch.save of plain tensors; never changed)
    <player_id>/v0000000012.pt.json   its manifest: version, sha256, size, metadata (written after the file)
    <player_id>/v0000000012.pt.pin    optional marker: retention keeps this version (a historical player uses it)
    <player_id>/latest.json           the newest version's manifest (written last)

Publishing writes each file to a temporary name in the same directory, fsyncs it, renames it into place and
fsyncs the directory, in the order weights -> manifest -> latest.json, so a reader that finds a manifest
finds complete weights. A reader verifies size and sha256 against the manifest *on the bytes it then
unpickles* (no window for a swap) and unpickles with ``torch.load(weights_only=True)``, which refuses any
object that is not plain tensors and containers: a crafted pickle on the share raises instead of running.
Snapshots (frozen copies for historical players) are hard links, or copies where linking fails.
One writer per player is assumed (its learner); any number of readers may load concurrently.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import os
import queue
import re
import secrets
import shutil
import threading
import time
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from common.paths import SharedRoot, check_component, check_relative
from common.trajectory import ALLOWED_DTYPES

FORMAT = "league-checkpoint/1"
LATEST = "latest.json"
MANIFEST_SUFFIX = ".json"
PIN_SUFFIX = ".pin"
_VERSION_FILE = re.compile(r"^v(\d{10})\.pt$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_MAX_MANIFEST_BYTES = 64 * 1024
_STALE_TEMP_S = 3600.0
_CHUNK = 1 << 20


class CheckpointError(Exception):
    """Base of the store's errors."""


class CorruptCheckpointError(CheckpointError, ValueError):
    """A manifest or weights file that is malformed, truncated, tampered with, or not plain tensors."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """No published checkpoint at that path (never published, or removed by retention)."""


@dataclass(frozen=True)
class CheckpointRef:
    """A published checkpoint: where it is (relative to the shared root) and what it must hash to."""

    path: str
    version: int
    sha256: str
    size: int
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Checkpoint:
    ref: CheckpointRef
    tensors: dict[str, np.ndarray]


def snapshot_path(checkpoint_path: str, step: int) -> str:
    """The league's name for a frozen copy: ``p/v0000000012.pt`` at step 5000 -> ``p/v0000000012_5000.pt``."""
    check_relative(checkpoint_path)
    if not checkpoint_path.endswith(".pt"):
        raise ValueError(f"checkpoint path {checkpoint_path!r} must end with .pt")
    return f"{checkpoint_path[:-3]}_{int(step)}.pt"


class CheckpointStore:
    def __init__(self, shared_root: str | os.PathLike[str], keep_last: int = 5) -> None:
        """``keep_last``: published versions retention keeps per player (besides pinned ones); >= 2 is
        advisable so a reader that just read ``latest.json`` still finds the file it names."""
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {keep_last}")
        self.root = SharedRoot(shared_root)
        self.keep_last = keep_last

    # ---- names ------------------------------------------------------------------------------------------
    @staticmethod
    def version_path(player_id: str, version: int) -> str:
        check_component(player_id, "player_id")
        if version < 0:
            raise ValueError(f"version must be >= 0, got {version}")
        return f"{player_id}/v{version:010d}.pt"

    # ---- publish ----------------------------------------------------------------------------------------
    def publish(
        self,
        player_id: str,
        tensors: Mapping[str, np.ndarray | torch.Tensor],
        version: int,
        metadata: Mapping[str, Any] | None = None,
    ) -> CheckpointRef:
        """Write version ``version`` (greater than any published before) and make it the player's latest."""
        relative = self.version_path(player_id, version)
        metadata = _check_metadata(metadata)
        latest = self.latest(player_id)
        if latest is not None and version <= latest.version:
            raise ValueError(f"version {version} of {player_id!r} must exceed the latest published {latest.version}")
        payload = {"format": FORMAT, "version": int(version), "tensors": _to_torch(tensors)}
        path = self.root.resolve(relative)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = _temp_name(path)
        try:
            with _HashingWriter(tmp) as writer, _without_zip_crc32():  # straight to disk, sha256 alongside
                torch.save(payload, writer)
            ref = CheckpointRef(relative, int(version), writer.sha256, writer.size, metadata)
            os.replace(tmp, path)
        except BaseException:
            _unlink_quietly(tmp)
            raise
        _fsync_dir(path.parent)  # the weights are durable before any manifest names them
        manifest = _manifest_bytes(ref)
        _atomic_write(path.with_name(path.name + MANIFEST_SUFFIX), manifest, sync_dir=False)
        _atomic_write(path.parent / LATEST, manifest)
        self.prune(player_id)
        return ref

    # ---- read -------------------------------------------------------------------------------------------
    def latest(self, player_id: str) -> CheckpointRef | None:
        """The newest published version's reference, or None before the first publish."""
        check_component(player_id, "player_id")
        path = self.root.resolve(f"{player_id}/{LATEST}")
        try:
            ref = _parse_manifest(_read_small(path), f"{player_id}/{LATEST}")
        except FileNotFoundError:
            return None
        if ref.path.split("/", 1)[0] != player_id:
            raise CorruptCheckpointError(f"{player_id}/{LATEST}: names {ref.path!r}, outside the player's directory")
        return ref

    def manifest(self, path: str) -> CheckpointRef:
        """The published manifest of the checkpoint at ``path``."""
        resolved = self.root.resolve(path)
        try:
            ref = _parse_manifest(_read_small(resolved.with_name(resolved.name + MANIFEST_SUFFIX)), path)
        except FileNotFoundError as e:
            raise CheckpointNotFoundError(f"{path}: no published checkpoint (no manifest)") from e
        if ref.path != path:
            raise CorruptCheckpointError(f"{path}: manifest describes {ref.path!r}")
        return ref

    def versions(self, player_id: str) -> list[CheckpointRef]:
        """Published versions of the player still on disk, oldest first."""
        check_component(player_id, "player_id")
        directory = self.root.resolve(player_id)
        if not directory.is_dir():
            return []
        refs = []
        for name in sorted(os.listdir(directory)):
            if _VERSION_FILE.match(name):
                try:
                    refs.append(self.manifest(f"{player_id}/{name}"))
                except CheckpointNotFoundError:
                    continue  # written but never published (crashed writer), or being removed
        return refs

    def load(self, path: str, expected_version: int | None = None) -> Checkpoint:
        """Load and verify the checkpoint at ``path``; raises `CorruptCheckpointError` on any mismatch."""
        ref = self.manifest(path)
        if expected_version is not None and ref.version != expected_version:
            raise CorruptCheckpointError(f"{path}: manifest version {ref.version} != expected {expected_version}")
        data = self._read_verified(path, ref)
        try:
            payload = torch.load(_MemoryReader(data), map_location="cpu", weights_only=True)
        except Exception as e:  # pickle errors come in many types; all mean "not a checkpoint of ours"
            raise CorruptCheckpointError(f"{path}: not a plain-tensor checkpoint ({type(e).__name__}: {e})") from e
        return Checkpoint(ref, _from_payload(payload, ref, path))

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
    def snapshot(self, source: str, dest: str, verify: bool = True) -> CheckpointRef:
        """Freeze ``source`` under the new name ``dest`` (hard link, or a copy where links fail)."""
        ref = self.manifest(source)
        if verify:
            self._read_verified(source, ref)
        if not dest.endswith(".pt"):
            raise ValueError(f"snapshot destination {dest!r} must end with .pt")
        src_path, dest_path = self.root.resolve(source), self.root.resolve(dest)
        dest_manifest = dest_path.with_name(dest_path.name + MANIFEST_SUFFIX)
        if dest_path.exists() or dest_manifest.exists():
            raise FileExistsError(f"snapshot destination {dest!r} exists")
        dest_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(src_path, dest_path, follow_symlinks=False)
        except OSError as e:
            if e.errno not in (errno.EXDEV, errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK, errno.EACCES):
                raise
            tmp = _temp_name(dest_path)
            shutil.copyfile(src_path, tmp, follow_symlinks=False)
            _fsync_file(tmp)
            os.replace(tmp, dest_path)
        _fsync_dir(dest_path.parent)
        snap = CheckpointRef(dest, ref.version, ref.sha256, ref.size, {**ref.metadata, "snapshot_of": source})
        _atomic_write(dest_manifest, _manifest_bytes(snap))
        return snap

    def pin(self, path: str) -> None:
        """Keep ``path`` through retention (a marker file, so every process sees it)."""
        self.manifest(path)
        resolved = self.root.resolve(path)
        _atomic_write(resolved.with_name(resolved.name + PIN_SUFFIX), b"")

    def unpin(self, path: str) -> None:
        resolved = self.root.resolve(path)
        try:
            os.unlink(resolved.with_name(resolved.name + PIN_SUFFIX))
        except FileNotFoundError:
            return
        _fsync_dir(resolved.parent)

    def prune(self, player_id: str, keep_last: int | None = None, pinned: Collection[str] = ()) -> list[str]:
        """Remove published versions beyond the newest ``keep_last``, except pinned ones; returns removed paths.

        Only ``v<10 digits>.pt`` files are versions: snapshots under other names are never touched.
        """
        keep_last = self.keep_last if keep_last is None else keep_last
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {keep_last}")
        check_component(player_id, "player_id")
        directory = self.root.resolve(player_id)
        if not directory.is_dir():
            return []
        names = sorted((n for n in os.listdir(directory) if _VERSION_FILE.match(n)), reverse=True)
        removed = []
        for name in names[keep_last:]:
            relative = f"{player_id}/{name}"
            if relative in pinned or (directory / (name + PIN_SUFFIX)).exists():
                continue
            # Manifest first: from then on the version is unpublished, so readers never see a half-removal.
            for victim in (directory / (name + MANIFEST_SUFFIX), directory / name):
                try:
                    os.unlink(victim)
                except FileNotFoundError:
                    pass
            removed.append(relative)
        now = time.time()
        for name in os.listdir(directory):
            if name.startswith(".") and name.endswith(".tmp"):
                try:
                    if now - os.stat(directory / name).st_mtime > _STALE_TEMP_S:
                        os.unlink(directory / name)  # left by a writer that crashed mid-publish
                except FileNotFoundError:
                    pass
        if removed:
            _fsync_dir(directory)
        return removed

    # ---- internals --------------------------------------------------------------------------------------
    def _read_verified(self, path: str, ref: CheckpointRef) -> memoryview:
        resolved = self.root.resolve(path)
        try:
            fd = os.open(resolved, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError as e:
            raise CheckpointNotFoundError(f"{path}: weights file missing") from e
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise CorruptCheckpointError(f"{path}: is a symlink") from e
            raise
        with os.fdopen(fd, "rb", buffering=0) as f:
            size = os.fstat(f.fileno()).st_size
            if size != ref.size:
                raise CorruptCheckpointError(f"{path}: size {size} != manifest size {ref.size}")
            view = memoryview(np.empty(size, dtype=np.uint8))  # not zero-filled, unlike bytearray(size)
            digest = _BackgroundSha256(slots=0)
            try:
                offset = 0
                while offset < size:  # hash chunk i on the helper thread while reading chunk i + 1
                    n = f.readinto(view[offset:offset + _CHUNK])
                    if not n:
                        break
                    digest.update_stable(view[offset:offset + n])
                    offset += n
                sha256 = digest.hexdigest()
            finally:
                digest.close()
            if offset != size or f.read(1):
                raise CorruptCheckpointError(f"{path}: file changed size while being read")
        if sha256 != ref.sha256:
            raise CorruptCheckpointError(f"{path}: sha256 does not match the manifest (corrupt or tampered)")
        return view


# ---- helpers ----------------------------------------------------------------------------------------------
def _to_torch(tensors: Mapping[str, np.ndarray | torch.Tensor]) -> dict[str, torch.Tensor]:
    if not isinstance(tensors, Mapping):
        raise TypeError(f"tensors must be a mapping of name -> array, got {type(tensors).__name__}")
    out = {}
    for name, value in tensors.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"tensor name {name!r} must be a non-empty string")
        if isinstance(value, torch.Tensor):
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
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CorruptCheckpointError(f"{path}: not a {FORMAT} payload")
    if payload.get("version") != ref.version:
        raise CorruptCheckpointError(f"{path}: payload version {payload.get('version')} != manifest {ref.version}")
    tensors = payload.get("tensors")
    if not isinstance(tensors, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in tensors.items()
    ):
        raise CorruptCheckpointError(f"{path}: tensors must map names to tensors")
    return {k: v.numpy() for k, v in tensors.items()}


def _check_metadata(metadata: Mapping[str, Any] | None) -> dict[str, Any]:
    metadata = dict(metadata or {})
    for key, value in metadata.items():
        if not isinstance(key, str) or not isinstance(value, str | int | float | bool | type(None)):
            raise ValueError(f"metadata[{key!r}]: only string keys and str/int/float/bool/None values")
    return metadata


def _manifest_bytes(ref: CheckpointRef) -> bytes:
    body = {
        "format": FORMAT,
        "path": ref.path,
        "version": ref.version,
        "sha256": ref.sha256,
        "size": ref.size,
        "created_at": time.time(),
        "metadata": dict(ref.metadata),
    }
    return json.dumps(body, sort_keys=True).encode()


def _parse_manifest(data: bytes, where: str) -> CheckpointRef:
    try:
        body = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CorruptCheckpointError(f"{where}: manifest is not JSON") from e
    if not isinstance(body, dict) or body.get("format") != FORMAT:
        raise CorruptCheckpointError(f"{where}: manifest format is not {FORMAT}")
    path, version, sha, size = body.get("path"), body.get("version"), body.get("sha256"), body.get("size")
    if not isinstance(path, str):
        raise CorruptCheckpointError(f"{where}: manifest path missing")
    try:
        check_relative(path)
    except ValueError as e:
        raise CorruptCheckpointError(f"{where}: manifest path {path!r} is unsafe") from e
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise CorruptCheckpointError(f"{where}: manifest version {version!r} invalid")
    if not isinstance(sha, str) or not _SHA256.match(sha):
        raise CorruptCheckpointError(f"{where}: manifest sha256 {sha!r} invalid")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise CorruptCheckpointError(f"{where}: manifest size {size!r} invalid")
    metadata = body.get("metadata", {})
    if not isinstance(metadata, dict):
        raise CorruptCheckpointError(f"{where}: manifest metadata must be an object")
    return CheckpointRef(path, version, sha, size, metadata)


def _read_small(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as f:
        data = f.read(_MAX_MANIFEST_BYTES + 1)
    if len(data) > _MAX_MANIFEST_BYTES:
        raise CorruptCheckpointError(f"{path.name}: manifest larger than {_MAX_MANIFEST_BYTES} bytes")
    return data


def _temp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


_CRC32_LOCK = threading.Lock()


@contextlib.contextmanager
def _without_zip_crc32() -> Iterator[None]:
    """torch.save's per-record CRC32 costs ~40% of a save and sha256 already covers every byte: skip it.

    The switch is process-wide in torch, so it is flipped under a lock and restored; a torch.save elsewhere
    running meanwhile merely writes a file without CRCs, which torch.load reads the same.
    """
    with _CRC32_LOCK:
        previous = torch.serialization.get_crc32_options()
        torch.serialization.set_crc32_options(False)
        try:
            yield
        finally:
            torch.serialization.set_crc32_options(previous)


def _unlink_quietly(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class _BackgroundSha256:
    """sha256 computed on a helper thread (hashlib releases the GIL), so hashing overlaps disk I/O.

    Chunks are hashed in the order given. `update_stable` hands over memory the caller keeps unchanged until
    `hexdigest`; `update_copy` copies into a small ring of reusable buffers first (for buffers the producer
    reuses, such as torch.save's), and blocks only while every ring slot still waits to be hashed.
    """

    def __init__(self, slots: int = 8) -> None:
        self._sha = hashlib.sha256()
        self._work: queue.SimpleQueue[tuple[memoryview, bytearray | None] | None] = queue.SimpleQueue()
        self._free: queue.SimpleQueue[bytearray] = queue.SimpleQueue()
        for _ in range(slots):
            self._free.put(bytearray(_CHUNK))
        self._digest: str | None = None
        self._thread = threading.Thread(target=self._run, name="ckpt-sha256", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (item := self._work.get()) is not None:
            view, slot = item
            self._sha.update(view)
            if slot is not None:
                self._free.put(slot)

    def update_stable(self, view: memoryview) -> None:
        self._work.put((view, None))

    def update_copy(self, view: memoryview) -> None:
        for offset in range(0, len(view), _CHUNK):
            piece = view[offset:offset + _CHUNK]
            slot = self._free.get()
            slot[: len(piece)] = piece
            self._work.put((memoryview(slot)[: len(piece)], slot))

    def hexdigest(self) -> str:
        """Wait for every chunk given so far and return the digest; the helper thread is then gone."""
        self.close()
        if self._digest is None:
            self._digest = self._sha.hexdigest()
        return self._digest

    def close(self) -> None:
        if self._thread.is_alive():
            self._work.put(None)
            self._thread.join()


class _HashingWriter(io.RawIOBase):
    """The write end torch.save streams into: a new temp file, fsynced on close, hashed as it is written."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
        self._file = os.fdopen(fd, "wb", buffering=0)
        self._hash = _BackgroundSha256()
        self.size = 0
        self.sha256 = ""

    def writable(self) -> bool:
        return True

    def write(self, data: bytes | memoryview) -> int:  # type: ignore[override]
        view = memoryview(data).cast("B")
        self._hash.update_copy(view)  # torch may reuse the buffer once write returns
        _write_all(self._file, view)
        self.size += len(view)
        return len(view)

    def close(self) -> None:
        if self.closed:
            return
        try:
            os.fsync(self._file.fileno())  # flushes to disk while the helper thread finishes hashing
            self.sha256 = self._hash.hexdigest()
        finally:
            self._hash.close()
            self._file.close()
            super().close()


class _MemoryReader(io.RawIOBase):
    """A seekable read-only file over verified bytes: torch.load reads records straight into tensors."""

    def __init__(self, view: memoryview) -> None:
        super().__init__()
        self._view = view
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        target = memoryview(buffer).cast("B")
        n = max(0, min(len(target), len(self._view) - self._pos))
        target[:n] = self._view[self._pos:self._pos + n]
        self._pos += n
        return n


def _write_all(file: io.FileIO, view: memoryview) -> None:
    while view:
        view = view[file.write(view):]


def _atomic_write(path: Path, data: bytes | memoryview, sync_dir: bool = True) -> None:
    """Temp file in the same directory, fsync, rename over ``path``, fsync the directory."""
    tmp = _temp_name(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        with os.fdopen(fd, "wb", buffering=0) as f:
            _write_all(f, memoryview(data))
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        _unlink_quietly(tmp)
        raise
    if sync_dir:
        _fsync_dir(path.parent)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
