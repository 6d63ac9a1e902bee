"""Files that other processes read, written so that a reader finds them whole or not at all.

The pattern: write a temporary name in the same directory, fsync it, rename it over the final name, fsync the
directory (so the rename itself survives a power loss). Used by the checkpoint store and for small files that
tools poll (port files).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import io
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


_MAX_NAME_BYTES = 255
"""The longest file name most filesystems take (NAME_MAX)."""


def temp_name(path: Path, suffix: str = ".tmp") -> Path:
    """A hidden name beside `path`, unique to this process and call; `path`'s name is shortened in it where the
    whole would pass the file name limit (a legal name of 233-255 bytes failed every atomic write of it with
    ENAMETOOLONG, naming the temporary file; a review)."""
    tail = f".{os.getpid()}.{secrets.token_hex(4)}{suffix}"
    name = path.name.encode("utf-8", "surrogateescape")
    room = _MAX_NAME_BYTES - 1 - len(tail.encode())
    if len(name) > room:
        name = name[:room]
    return path.with_name("." + name.decode("utf-8", "ignore") + tail)


def create_new(path: Path) -> io.FileIO:
    """Open `path` for writing; it must not exist (O_EXCL: never writes through someone else's file or link)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _CLOEXEC, 0o644)
    return os.fdopen(fd, "wb", buffering=0)


def write_all(file: io.FileIO, view: memoryview) -> None:
    while view:
        view = view[file.write(view):]


def write_new_file(path: Path, data: bytes | memoryview) -> None:
    """Create `path` (it must not exist), write `data` and fsync it."""
    with create_new(path) as f:
        write_all(f, memoryview(data))
        os.fsync(f.fileno())


def atomic_write(path: Path, data: bytes | memoryview, sync_dir: bool = True) -> None:
    """Temp file in the same directory, fsync, rename over `path`, fsync the directory."""
    tmp = temp_name(path)
    try:
        write_new_file(tmp, data)
        with contextlib.suppress(OSError):  # a file replaced keeps its mode (a private 0600 one turned 0644)
            os.chmod(tmp, stat.S_IMODE(os.stat(path).st_mode))
        os.replace(tmp, path)
    except BaseException:
        unlink_quietly(tmp)
        raise
    if sync_dir:
        fsync_dir(path.parent)


def atomic_create(path: Path, data: bytes | memoryview, sync_dir: bool = True) -> None:
    """As `atomic_write`, but FileExistsError when `path` exists, also when another writer makes it while this
    one writes: the temporary file is hard-linked to `path` (which fails where it exists) instead of renamed over
    it, so a check before the write cannot be outrun. Where the filesystem has no hard links, `path` is checked
    and the temporary file renamed (a writer in between is not seen there)."""
    tmp = temp_name(path)
    try:
        write_new_file(tmp, data)
        try:
            os.link(tmp, path, follow_symlinks=False)
        except FileExistsError:
            raise
        except OSError as err:
            if err.errno not in (errno.EXDEV, errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
                raise
            if os.path.lexists(path):
                raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(path)) from None
            os.replace(tmp, path)
    finally:
        unlink_quietly(tmp)
    if sync_dir:
        fsync_dir(path.parent)


FULL_DISK_BYTES = 1 << 20
"""Free space under which `full_disk_note` calls a disk full."""


def full_disk_note(path: Path) -> str:
    """"; the disk of PATH is full (N bytes free)" when the filesystem holding `path` has (next to) no space or no
    inodes left, or when a small write there fails for want of space (a quota: statvfs shows the filesystem's
    space, not what a user may still write, and SQLite reports a write refused by a quota as "disk I/O error",
    as it does a full disk's); else "". For the message of a failure a full disk may explain (a process whose log
    lies on that disk, SQLite's "disk I/O error" when it cannot make its WAL files). `path`: a directory, or a
    file (existing or not) whose directory is looked at."""
    directory = path if path.is_dir() else path.parent
    try:
        fs = os.statvfs(directory)
    except OSError:
        return ""
    root = os.geteuid() == 0  # (root may use the blocks and inodes reserved for it)
    free = (fs.f_bfree if root else fs.f_bavail) * fs.f_frsize
    # A filesystem without a size or an inode limit (a tmpfs mounted size=0 / nr_inodes=0, ramfs) reports 0
    # blocks or 0 inodes in all, and so 0 free: not full.
    no_space = fs.f_blocks > 0 and free < FULL_DISK_BYTES
    no_inodes = fs.f_files > 0 and (fs.f_ffree if root else fs.f_favail) == 0
    if no_space or no_inodes:
        return f"; the disk of {path} is full ({'no inodes left' if no_inodes else f'{free:,} bytes free'})"
    refused = _write_refused(directory)
    return f"; the disk of {path} is full ({refused})" if refused else ""


PROBE_BYTES = 64 << 10
"""What `full_disk_note` writes (and removes) to learn whether writes still find space."""


def _write_refused(directory: Path) -> str | None:
    """Why a write of PROBE_BYTES (fsynced, then removed) in `directory` fails for want of space ("Disk quota
    exceeded"), else None (it succeeds, or fails for another reason)."""
    probe = temp_name(directory / "league-space-probe")
    try:
        write_new_file(probe, bytes(PROBE_BYTES))  # (fsynced: a network filesystem may refuse at the flush)
    except OSError as err:
        return (err.strerror or os.strerror(err.errno)) if out_of_space(err) else None
    finally:
        unlink_quietly(probe)
    return None


def out_of_space(err: OSError) -> bool:
    """Whether `err` is a write refused for want of space: the disk full, or the user's quota spent."""
    return err.errno in (errno.ENOSPC, errno.EDQUOT)


def unlink_quietly(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | _CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _load_sync_file_range() -> Callable[[int, int, int, int], int] | None:
    try:
        function = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):  # not Linux
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


_SYNC_FILE_RANGE = _load_sync_file_range()
_SYNC_FILE_RANGE_WRITE = 2
CAN_START_WRITEBACK = _SYNC_FILE_RANGE is not None


def start_writeback(fd: int, offset: int, length: int) -> bool:
    """Ask the kernel to start writing a just-written range to disk (Linux ``sync_file_range``, a hint that
    does not wait; the fsync at the end still guarantees durability). False where the filesystem refuses (or
    the platform has no such call), so the caller stops asking; a real I/O error surfaces at that fsync."""
    if _SYNC_FILE_RANGE is None:
        return False
    return _SYNC_FILE_RANGE(fd, offset, length, _SYNC_FILE_RANGE_WRITE) == 0
