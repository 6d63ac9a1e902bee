"""Digests of checkpoint files, and `save_hashed`: torch.save into a new file, hashed on the bytes' way out.

Digest: BLAKE3-256 (``"blake3:<hex>"``), a cryptographic hash like sha256 but ~3x faster here (single thread
~4.7 GB/s with AVX2/AVX-512 against sha256's ~1.7 GB/s with SHA-NI): every load hashes every byte, so the hash
is most of a load's cost. ``"sha256:<hex>"`` digests of legacy manifests are still verified.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import queue
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import blake3
import numpy as np

from common.durable_files import CAN_START_WRITEBACK, create_new, start_writeback, write_all

DIGEST_ALGORITHM = "blake3"
HASHES: dict[str, Callable[[], Any]] = {"blake3": blake3.blake3, "sha256": hashlib.sha256}
GATHER_BYTES = 4 << 20
"""torch.save's headers and small records are gathered up to this before one write (fewer syscalls)."""
_SMALL_WRITE = 64 << 10
"""A write below this is gathered; one at or above it goes out as it is."""
BACKGROUND_HASH_BYTES = 4 << 20
"""A save whose tensors hold at least this much is hashed on a helper thread (overlapping the writes); a smaller
one inline, where starting the thread cost more than the hashing (a solo CartPole learner publishes a ~40 KB
network and its training state ~5 times a second: ~8% of a publish's CPU)."""


@dataclass(frozen=True)
class FileDigest:
    """What a published file must hash to."""

    digest: str
    """``"<algorithm>:<hex>"``, e.g. ``"blake3:…"``."""
    size: int


class Hasher:
    """One digest (``"<algorithm>:<hex>"``), computed on a helper thread when ``background`` (both hashes
    release the GIL), so hashing overlaps disk I/O; chunks are hashed in the order given. Every chunk must stay
    unchanged until `digest` returns."""

    def __init__(self, algorithm: str = DIGEST_ALGORITHM, background: bool = True) -> None:
        if algorithm not in HASHES:
            raise ValueError(f"unknown digest algorithm {algorithm!r}")
        self._algorithm = algorithm
        self._hash = HASHES[algorithm]()
        self._error: BaseException | None = None
        self._work: queue.SimpleQueue[memoryview | bytes | None] | None = None
        self._thread: threading.Thread | None = None
        if background:
            self._work = queue.SimpleQueue()
            self._thread = threading.Thread(target=self._run, name="ckpt-hash", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        assert self._work is not None
        while (chunk := self._work.get()) is not None:
            if self._error is None:
                try:
                    self._hash.update(chunk)
                except BaseException as e:  # handed to the caller by digest()
                    self._error = e

    def update(self, chunk: memoryview | bytes) -> None:
        if self._work is None:
            self._hash.update(chunk)
        else:
            self._work.put(chunk)

    def digest(self) -> str:
        """Wait for every chunk given so far; the helper thread is then gone."""
        self.close()
        if self._error is not None:
            raise self._error
        return f"{self._algorithm}:{self._hash.hexdigest()}"

    def close(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            assert self._work is not None
            self._work.put(None)
            self._thread.join()


def save_hashed(payload: dict[str, Any], tmp: Path) -> FileDigest:
    """torch.save ``payload`` into the new file ``tmp`` (fsynced), hashing the bytes on their way out."""
    import torch

    with _HashingWriter(tmp, _storage_ranges(payload)) as writer:
        with _without_zip_crc32():
            try:
                torch.save(payload, writer)
            except Exception as err:
                # A Ctrl-C (or SystemExit) mid-save: torch's zip writer, closing on the way out, raises a
                # RuntimeError ("unexpected pos") of its own that took the interrupt's place.
                if isinstance(err.__context__, (KeyboardInterrupt, SystemExit)):
                    raise err.__context__ from None
                raise
        return writer.finish()


_CRC32_LOCK = threading.Lock()


@contextlib.contextmanager
def _without_zip_crc32() -> Iterator[None]:
    """torch.save's per-record CRC32 costs ~40% of a save and the digest already covers every byte: skip it.

    The switch is process-wide in torch, so it is flipped under a lock and restored; a torch.save elsewhere
    running meanwhile merely writes a file without CRCs, which torch.load reads the same.
    """
    import torch

    with _CRC32_LOCK:
        previous = torch.serialization.get_crc32_options()
        torch.serialization.set_crc32_options(False)
        try:
            yield
        finally:
            torch.serialization.set_crc32_options(previous)


def _storage_ranges(payload: Any) -> list[tuple[int, int]]:
    """Address ranges of the tensors' memory in ``payload``: bytes torch.save hands over from inside them stay
    unchanged while the payload lives, so they are hashed in place instead of copied."""
    import torch

    ranges = []
    stack = [payload]
    while stack:
        value = stack.pop()
        if isinstance(value, torch.Tensor):
            storage = value.untyped_storage()
            ranges.append((storage.data_ptr(), storage.data_ptr() + storage.nbytes()))
        elif isinstance(value, Mapping):
            stack.extend(value.values())
        elif isinstance(value, list | tuple):
            stack.extend(value)
    return ranges


class _HashingWriter(io.RawIOBase):
    """The write end torch.save streams into: a new temp file, hashed as it is written, fsynced by `finish`.

    Records from inside the payload's tensors are written straight from the tensor and hashed in place (on the
    helper thread when the tensors hold `BACKGROUND_HASH_BYTES` or more); torch's small headers are gathered into
    one buffer first (fewer syscalls; torch reuses its own buffers once ``write`` returns, so those bytes are
    hashed from the gathered copy).
    """

    def __init__(self, path: Path, stable: list[tuple[int, int]]) -> None:
        super().__init__()
        self._file = create_new(path)
        self._stable = stable
        self._inline = sum(high - low for low, high in stable) < BACKGROUND_HASH_BYTES
        self._hash = Hasher(background=not self._inline)
        self._pending = bytearray()
        self._writeback = CAN_START_WRITEBACK
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: bytes | memoryview) -> int:  # type: ignore[override]
        view = memoryview(data).cast("B")
        n = len(view)
        if n < _SMALL_WRITE:
            self._pending += view
            if len(self._pending) >= GATHER_BYTES:
                self._flush_pending()
            return n
        self._flush_pending()
        # Hashed now (inline) or later on the helper thread: then only bytes that stay unchanged are not copied.
        self._hash.update(view if self._inline or self._is_stable(view) else bytes(view))
        self._write(view)
        return n

    def _write(self, view: memoryview) -> None:
        write_all(self._file, view)
        if self._writeback:  # start writing these pages to disk now, so the final fsync has little left to do
            self._writeback = start_writeback(self._file.fileno(), self.size, len(view))
        self.size += len(view)

    def _is_stable(self, view: memoryview) -> bool:
        start = np.frombuffer(view, dtype=np.uint8).__array_interface__["data"][0]
        end = start + len(view)
        return any(low <= start and end <= high for low, high in self._stable)

    def _flush_pending(self) -> None:
        if self._pending:
            block = bytes(self._pending)
            self._pending.clear()
            self._hash.update(block)
            self._write(memoryview(block))

    def finish(self) -> FileDigest:
        """Everything written: flush it to disk and return its digest."""
        self._flush_pending()
        os.fsync(self._file.fileno())  # the helper thread finishes hashing meanwhile
        return FileDigest(self._hash.digest(), self.size)

    def close(self) -> None:
        if self.closed:
            return
        try:
            self._hash.close()
            self._file.close()
        finally:
            super().close()
