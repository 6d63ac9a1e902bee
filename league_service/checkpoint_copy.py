"""Freeze a checkpoint for a snapshot: the league's `save_checkpoint_fn(src, dst)`, paths relative to the shared root.

- A checkpoint published by the checkpoint store (it has a `<path>.json` manifest) is frozen by
  `CheckpointStore.snapshot`: a hard link (a copy where linking fails) with a manifest of its own, verified
  against the source's hash. The store (and torch with it) is imported only then.
- Any other file or directory is hard-linked (copied where linking fails) under a temporary name and renamed
  into place, so a reader never sees half a checkpoint. Symlinks in a directory are frozen as the files they
  name, which must lie inside the shared root.

Both paths go through the shared-root guard. Freezing again onto an existing snapshot of the same bytes is a
no-op, so a restart that repeats a snapshot whose league state was not yet saved does not fail.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path

from common.paths import SharedRoot, UnsafePathError

MANIFEST_SUFFIX = ".json"  # the checkpoint store's manifest beside each published file


def link_or_copy(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    """Hard-link `src` to `dst`, or copy with metadata when linking is not possible."""
    try:
        os.link(src, dst)
    except OSError as err:
        if err.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EACCES):
            raise
        shutil.copy2(src, dst)


class SnapshotCopier:
    """`save_checkpoint_fn` for the league: freeze `<root>/<src>` as `<root>/<dst>`."""

    def __init__(self, shared_root: SharedRoot) -> None:
        self._root = shared_root

    def __call__(self, src: str, dst: str) -> None:
        source = self._root.resolve(src)
        target = self._root.resolve(dst)
        if not source.exists():
            raise FileNotFoundError(f"checkpoint_path: {src!r} does not exist under the shared root")
        if source.with_name(source.name + MANIFEST_SUFFIX).is_file():
            self._snapshot_published(src, dst)
        else:
            self._link_tree(source, target, self._root.root)

    def _snapshot_published(self, src: str, dst: str) -> None:
        from common.checkpoint_store import CheckpointNotFoundError, CheckpointStore

        store = CheckpointStore(self._root.root)
        try:
            existing = store.manifest(dst)
        except CheckpointNotFoundError:
            store.snapshot(src, dst)
            return
        if existing.digest != store.manifest(src).digest:
            raise FileExistsError(f"snapshot {dst!r} exists and holds other weights than {src!r}")

    @staticmethod
    def _link_tree(source: Path, target: Path, root: Path) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}."))

        def link_target(src: str, dst: str) -> None:
            # Linux's link() links a symlink itself, not its target: the snapshot would follow whatever the
            # link comes to name, outside the root too. Link (or copy) the file it names, inside the root only.
            real = Path(src).resolve(strict=True)
            if not real.is_relative_to(root):
                raise UnsafePathError(f"{src} links to {real}, outside the shared root")
            link_or_copy(real, dst)

        try:
            staged = tmp / target.name
            if source.is_dir():
                shutil.copytree(source, staged, copy_function=link_target, symlinks=False)
                if target.is_dir():
                    shutil.rmtree(target)
            else:
                link_or_copy(source, staged)
            os.replace(staged, target)
        finally:
            shutil.rmtree(tmp)
