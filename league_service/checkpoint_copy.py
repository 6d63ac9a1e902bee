"""Freeze a checkpoint for a snapshot: the league's `save_checkpoint_fn(src, dst)`, paths relative to the shared root.

- A checkpoint published by the checkpoint store (it has a `<path>.json` manifest) is frozen by
  `CheckpointStore.snapshot`: a hard link (a copy where linking fails) with a manifest of its own, verified
  against the source's hash.
- Any other file or directory is copied under a temporary name, fsynced and renamed into place, so a reader
  never sees half a checkpoint, nor a crash leaves one. Not hard-linked: a writer of its own format may rewrite its file in place (`torch.save` to
  one fixed path opens the same inode), and every snapshot linked to it changed with it. A file that changes
  while it is copied is not frozen (the snapshot is retried at the player's next update). Symlinks in a
  directory are frozen as the files they name, which must lie inside the shared root.

Both paths go through the shared-root guard. Freezing again onto an existing snapshot of the same bytes is a
no-op, so a restart that repeats a snapshot whose league state was not yet saved does not fail; onto one of other
bytes it is refused (`FileExistsError`), since that file may be another historical player's frozen checkpoint (a
client naming a checkpoint beside it could have replaced it). The snapshot is retried at the player's next update,
whose step names another file.
"""

from __future__ import annotations

import errno
import filecmp
import os
import shutil
import stat
import tempfile
from pathlib import Path

from common.checkpoint_store import CheckpointNotFoundError, CheckpointStore, CorruptCheckpointError
from common.durable_files import fsync_dir, fsync_file
from common.job_limits import MANIFEST_SUFFIX, VERSION_FILE
from common.paths import SharedRoot, UnsafePathError, check_relative, open_beneath


class SnapshotCopier:
    """`save_checkpoint_fn` for the league: freeze `<root>/<src>` as `<root>/<dst>`."""

    def __init__(self, shared_root: SharedRoot) -> None:
        self._root = shared_root

    def __call__(self, src: str, dst: str) -> None:
        source = self._root.resolve(src)
        check_relative(dst)  # (what resolving it whole checked: no "..", nothing absolute, no NUL)
        folder, _, name = dst.rpartition("/")
        # Not the destination's own name: a symlink planted there made the copy replace (rmtree) the directory
        # it named, another player's. A link there is replaced like any old copy.
        target = (self._root.resolve(folder) if folder else self._root.root) / name
        if not source.exists():
            raise FileNotFoundError(f"checkpoint_path: {src!r} does not exist under the shared root")
        if source.with_name(source.name + MANIFEST_SUFFIX).is_file():
            self._snapshot_published(src, dst)
        elif VERSION_FILE.fullmatch(source.name) and (source.parent / "latest.json").exists():  # a player's
            # A store version whose manifest is gone: retention unpublished it a moment ago (manifest first, then
            # the file). Copied as a plain file, the snapshot had no manifest and could never be loaded.
            raise FileNotFoundError(f"checkpoint_path: {src!r} was retired (no manifest)")
        else:
            self._copy_tree(source, target, self._root.root)

    def _snapshot_published(self, src: str, dst: str) -> None:
        store = CheckpointStore(self._root.root)
        try:
            existing = store.manifest(dst)
        except CheckpointNotFoundError:
            try:
                store.snapshot(src, dst)
            except CorruptCheckpointError as err:  # no permission, EIO, a damaged file: one line, as a failed
                raise OSError(str(err)) from err  # copy's, not a traceback at every update of the player
            return
        if existing.digest != store.manifest(src).digest:
            raise FileExistsError(f"snapshot {dst!r} exists and holds other weights than {src!r}")

    @staticmethod
    def _copy_tree(source: Path, target: Path, root: Path) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        _sweep_stale_staging(target.parent)
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}."))

        def copy_target(src: str, dst: str) -> None:
            # A symlink is frozen as the file it names, inside the root only: copied as a link, the snapshot
            # would follow whatever the link comes to name, outside the root too.
            real = Path(src).resolve(strict=True)
            if not real.is_relative_to(root):
                raise UnsafePathError(f"{src} links to {real}, outside the shared root")
            _copy_beneath(root, real, Path(dst))

        try:
            staged = tmp / target.name
            if source.is_dir():
                shutil.copytree(source, staged, copy_function=copy_target, symlinks=False)
                for folder, _, _ in os.walk(staged):  # the copies' names, durable before the rename names them
                    fsync_dir(Path(folder))
            else:
                _copy_beneath(root, source, staged)
            if target.is_symlink():  # (planted: never followed, replaced like a stale name)
                target.unlink()
            elif target.exists():
                if not _same_content(staged, target):
                    raise FileExistsError(f"snapshot {target.relative_to(root)} exists and holds other bytes than "
                                          f"{source.relative_to(root)}; not replaced")
                return  # frozen before (a restart repeating a snapshot its state had not saved)
            # Durable before it is named (and after): a crash must not leave a snapshot the league's state names
            # whose bytes never reached the disk.
            os.replace(staged, target)
            fsync_dir(target.parent)
        finally:
            shutil.rmtree(tmp)


def _copy_beneath(root: Path, source: Path, dst: Path) -> None:
    """Copy the regular file `source` (resolved, inside `root`) to the new file `dst` with its mode and times,
    fsynced. The source is opened beneath the root without following a symlink (`open_beneath`): by name, as
    `shutil.copy2` opens it, a file swapped for a link after the path was checked had the snapshot copy a file
    from outside the root into it (a review: 15 leaks in 3,000 copies)."""
    try:
        fd = open_beneath(root, source)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafePathError(f"{source} changed while being copied: a symlink (or a file) now stands in its "
                                  "path; refused, as it may lead out of the shared root") from err
        raise
    with open(fd, "rb") as src_file:
        st = os.fstat(src_file.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(source))
        with open(dst, "xb") as out:
            shutil.copyfileobj(src_file, out, 1 << 20)
        after = os.fstat(src_file.fileno())
    if (after.st_size, after.st_mtime_ns, after.st_ctime_ns) != (st.st_size, st.st_mtime_ns, st.st_ctime_ns):
        # A writer of its own format rewriting the file in place (`torch.save` to one path): the copy mixed two
        # versions, and the league froze it as a historical player's weights (a review).
        raise OSError(errno.EAGAIN, "it changed while being copied (a writer rewriting it in place: it is frozen "
                                    "between writes)", str(source))
    os.chmod(dst, stat.S_IMODE(st.st_mode))
    os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
    fsync_file(dst)


def _same_content(staged: Path, existing: Path) -> bool:
    """Whether `existing` holds what `staged` does: the same regular files and folders with the same bytes. A
    symlink in `existing` is no match (not followed: it may lead out of the shared root)."""
    if existing.is_symlink() or staged.is_dir() != existing.is_dir():
        return False
    if staged.is_dir():
        names = sorted(os.listdir(staged))
        return names == sorted(os.listdir(existing)) and all(
            _same_content(staged / name, existing / name) for name in names)
    return existing.is_file() and filecmp.cmp(staged, existing, shallow=False)


STALE_STAGING_S = 3600.0
"""A staging directory this old is a copy's whose process died (a copy takes seconds to minutes)."""


def _sweep_stale_staging(folder: Path, now: float | None = None) -> list[Path]:
    """Remove the staging directories of copies into `folder` that a crash left (`.<name>.<random>` holding at
    most `<name>`, older than STALE_STAGING_S): each is a whole checkpoint's size, and nothing else removed
    them. Returns those removed; one that cannot be removed is left for the next sweep."""
    import time

    now = time.time() if now is None else now
    removed = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        name = entry.name
        if not name.startswith(".") or name.count(".") < 2 or not entry.is_dir(follow_symlinks=False):
            continue
        copied = name[1:].rsplit(".", 1)[0]  # `.<name>.<random>` -> <name>
        try:
            inside = os.listdir(entry.path)
            if inside not in ([], [copied]) or now - entry.stat(follow_symlinks=False).st_mtime < STALE_STAGING_S:
                continue
            shutil.rmtree(entry.path)
        except OSError:
            continue
        removed.append(Path(entry.path))
    return removed
