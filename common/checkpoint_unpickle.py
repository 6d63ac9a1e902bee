"""``torch.load(weights_only=True)`` of a checkpoint already verified in memory, without copying its tensors.

The store reads a checkpoint file once into a private buffer and hashes that buffer; the tensors handed out
should *be* that buffer. Public torch can only do this for a file path (``mmap=True``), which would map the
shared file again after its check. ``torch.serialization._load(..., overall_storage=...)`` is what
``mmap=True`` calls with the file's mapping; here it gets the verified buffer instead. torch is pinned
(2.13.0): `zero_copy_available` says whether that private route exists (a unit test fails loudly when a torch
upgrade removes it) and every load falls back to the public, copying ``torch.load`` when it does not.
"""

from __future__ import annotations

import inspect
import io
import threading
import warnings
from typing import Any

import numpy as np
import torch
import torch.serialization as _serialization


class MemoryReader(io.RawIOBase):
    """A seekable read-only file over bytes in memory (torch's zip reader reads headers through it)."""

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


def _private_api_present() -> bool:
    try:
        parameters = inspect.signature(_serialization._load).parameters
        _serialization._open_zipfile_reader, _serialization._weights_only_unpickler  # noqa: B018
        _serialization._is_torchscript_zip  # noqa: B018
    except (AttributeError, TypeError, ValueError):
        return False
    return "overall_storage" in parameters


_ZERO_COPY_LOCK = threading.Lock()
_zero_copy = _private_api_present()


def zero_copy_available() -> bool:
    """Whether loads hand out the verified buffer itself (torch's private loader is there and has worked)."""
    return _zero_copy


def load_weights_only(buffer: np.ndarray) -> Any:
    """Unpickle the torch zip checkpoint in ``buffer`` (a writable, C-contiguous uint8 array) with torch's
    weights-only unpickler, onto the CPU. The tensors share ``buffer``'s memory (which they keep alive) when
    the private route works, else they are copies. Raises whatever torch raises for bad data."""
    if _zero_copy:
        try:
            return _load_sharing(buffer)
        except (AttributeError, TypeError) as private_error:
            result = _load_copying(buffer)  # bad data raises here too: then it was the data, not the API
            _disable_zero_copy(private_error)
            return result
    return _load_copying(buffer)


def _load_sharing(buffer: np.ndarray) -> Any:
    """The zero-copy route: what ``torch.load(path, mmap=True, weights_only=True)`` does for a zip file, with
    the verified buffer as the storage the tensors are cut from instead of a mapping of the file."""
    storage = torch.frombuffer(buffer, dtype=torch.uint8).untyped_storage()
    with _serialization._open_zipfile_reader(MemoryReader(memoryview(buffer))) as zip_file:
        if _serialization._is_torchscript_zip(zip_file):
            raise RuntimeError("a TorchScript archive is not a weights-only checkpoint")
        return _serialization._load(zip_file, "cpu", _serialization._weights_only_unpickler,
                                    overall_storage=_RecordBounds(storage, zip_file), encoding="utf-8")


class _RecordBounds:
    """The buffer's storage as `_load` cuts tensor storages from it (`storage[offset:offset + nbytes]`, the offset
    a record's, nbytes the pickle's), refusing a cut that is not one whole `data/` record. `torch.load` checks the
    pickle's sizes against the records; `_load` does not: a crafted pickle naming more bytes than its record
    handed out the zip's own headers as weights (and overlapping storages; a review)."""

    def __init__(self, storage: torch.UntypedStorage, zip_file: Any) -> None:
        self._storage = storage
        self._records = {zip_file.get_record_offset(name): zip_file.get_record_size(name)
                         for name in zip_file.get_all_records() if name.startswith("data/")}

    def __getitem__(self, cut: slice) -> torch.UntypedStorage:
        size = self._records.get(cut.start)
        if cut.step is not None or size is None or cut.stop - cut.start != size:
            raise RuntimeError(f"a tensor's storage of {cut.stop - cut.start} bytes at offset {cut.start} is not "
                               "one whole record of the archive")
        return self._storage[cut]


def _load_copying(buffer: np.ndarray) -> Any:
    return torch.load(MemoryReader(memoryview(buffer)), map_location="cpu", weights_only=True)


def _disable_zero_copy(error: BaseException) -> None:
    global _zero_copy
    with _ZERO_COPY_LOCK:
        if _zero_copy:
            _zero_copy = False
            warnings.warn(f"torch's private zero-copy loader failed ({type(error).__name__}: {error}); "
                          "checkpoint loads now copy their tensors (slower, still verified)", RuntimeWarning,
                          stacklevel=3)
