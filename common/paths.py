"""The shared-root path guard: every path a peer hands us stays inside the shared root.

Checkpoint paths travel over RPC (jobs, UpdatePlayer) as strings relative to the shared root. A peer that
sends ``../../etc/passwd``, an absolute path, or a path through a symlink that points outside the root must
get an error, never a file. Lexical checks catch the first two; resolving the real path catches the third.
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path, PurePosixPath

# One path component a name may use (player ids, file names): no separators, no leading dot tricks.
MAX_COMPONENT_CHARS = 200
_COMPONENT = re.compile(rf"[A-Za-z0-9_][A-Za-z0-9_.\-]{{0,{MAX_COMPONENT_CHARS - 1}}}")  # fullmatch, not `$` ("p\n")


class UnsafePathError(ValueError):
    """A path that would resolve outside the shared root, or is malformed."""


def check_component(name: str, what: str = "name") -> str:
    """Return ``name`` if it is one safe path component (letters, digits, ``_.-``, not starting with a dot)."""
    if not isinstance(name, str) or not _COMPONENT.fullmatch(name):
        raise UnsafePathError(f"{what} {name!r} must match {_COMPONENT.pattern}")
    return name


def check_relative(relative: str) -> PurePosixPath:
    """Lexical checks: a non-empty relative POSIX path without ``.``/``..``/empty components or odd bytes."""
    if not isinstance(relative, str) or not relative:
        raise UnsafePathError(f"path {relative!r} must be a non-empty string")
    if "\x00" in relative or "\\" in relative:
        raise UnsafePathError(f"path {relative!r} contains a NUL byte or a backslash")
    if not relative.isascii() and not utf8_encodable(relative):
        raise UnsafePathError(f"path {relative!r} is not valid Unicode (a lone surrogate): no file has that name")
    if relative.startswith("/") or re.match(r"^[A-Za-z]:", relative):
        raise UnsafePathError(f"path {relative!r} is absolute; paths are relative to the shared root")
    parts = relative.split("/")
    for part in parts:
        if part in ("", ".", ".."):
            raise UnsafePathError(f"path {relative!r} has an empty, '.' or '..' component")
    return PurePosixPath(*parts)


def utf8_encodable(text: str) -> bool:
    """Whether `text` encodes as UTF-8 (a path decoded from other bytes holds surrogates that do not)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class SharedRoot:
    """A directory that relative paths are resolved against, refusing anything that escapes it."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        path = Path(root)
        if not path.is_dir():
            raise FileNotFoundError(f"shared root {str(path)!r} is not a directory")
        self._root = path.resolve(strict=True)

    @property
    def root(self) -> Path:
        return self._root

    def resolve(self, relative: str) -> Path:
        """The absolute path of ``relative`` after symlinks, guaranteed to lie inside the root.

        The target need not exist. Symlinks inside the root that stay inside it are allowed; one to the root
        itself is not (a checkpoint named by it had the league's snapshot copy the root into itself, for ever).
        """
        pure = check_relative(relative)
        try:
            candidate = (self._root / pure).resolve(strict=False)
        except (RuntimeError, OSError) as err:  # Python 3.11 raises RuntimeError for a symlink loop
            raise UnsafePathError(f"path {relative!r} cannot be resolved: {err}") from None
        if not candidate.is_relative_to(self._root):
            raise UnsafePathError(f"path {relative!r} resolves outside the shared root (symlink?)")
        if candidate == self._root:
            raise UnsafePathError(f"path {relative!r} resolves to the shared root itself (symlink?)")
        return candidate

    def relative(self, path: str | os.PathLike[str]) -> str:
        """The root-relative POSIX string of an absolute path inside the root."""
        resolved = Path(path).resolve(strict=False)
        if not resolved.is_relative_to(self._root):
            raise UnsafePathError(f"path {str(path)!r} is outside the shared root")
        return resolved.relative_to(self._root).as_posix()


READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)
"""How files of the shared root are opened for reading (the checkpoint store's, and `open_beneath`'s last
component): never through a symlink, and without blocking, so a FIFO put where a file should be (whose plain open
waits for a writer for ever) opens at once and its reader's fstat refuses it. On a regular file O_NONBLOCK changes
nothing."""
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def open_beneath(root: Path, path: Path) -> int:
    """A read descriptor of `path` (absolute, inside `root`, its symlinks already resolved), opened one component
    at a time from `root` with none followed as a symlink: OSError (ELOOP or ENOTDIR) where one is a symlink now.

    Why: `SharedRoot.resolve` checks a path, and opening it later by name follows whatever symlink was put in its
    place meanwhile (a peer with write access to the share swapping a file or a folder for a link out of it).
    Opening beneath the root without following links makes the check and the open one step. The file is opened
    without blocking (a FIFO opens at once; callers check what they got with fstat)."""
    parts = path.relative_to(root).parts
    if not parts:
        raise IsADirectoryError(errno.EISDIR, "the shared root itself", str(path))
    dir_fd = os.open(root, _DIR_FLAGS & ~os.O_NOFOLLOW)  # the root is the operator's: a link to it is fine
    try:
        for part in parts[:-1]:
            inner = os.open(part, _DIR_FLAGS, dir_fd=dir_fd)
            os.close(dir_fd)
            dir_fd = inner
        return os.open(parts[-1], READ_FLAGS, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
