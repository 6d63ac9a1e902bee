
import errno
import os
import stat

import numpy as np
import pytest

from common.paths import SharedRoot, UnsafePathError
from league_service.checkpoint_copy import SnapshotCopier


@pytest.fixture
def copier(tmp_path):
    return SnapshotCopier(SharedRoot(tmp_path))


def test_a_plain_file_is_copied_and_refreezing_is_fine(tmp_path, copier):
    """Not hard-linked: a writer that saves to one fixed path (torch.save opens the same inode) rewrote every
    snapshot linked to it."""
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "ckpt.pt").write_bytes(b"weights at step 100")
    copier("p/ckpt.pt", "p/ckpt_100.pt")
    copier("p/ckpt.pt", "p/ckpt_100.pt")
    frozen = tmp_path / "p" / "ckpt_100.pt"
    assert frozen.read_bytes() == b"weights at step 100"
    with open(tmp_path / "p" / "ckpt.pt", "wb") as rewritten:  # in place, as torch.save(m, "ckpt.pt") does
        rewritten.write(b"weights at step 5000")
    assert frozen.read_bytes() == b"weights at step 100"
    assert sorted(p.name for p in (tmp_path / "p").iterdir()) == ["ckpt.pt", "ckpt_100.pt"]


def test_a_directory_checkpoint_is_copied_whole(tmp_path, copier):
    (tmp_path / "p" / "ckpt").mkdir(parents=True)
    (tmp_path / "p" / "ckpt" / "a.bin").write_bytes(b"a")
    copier("p/ckpt", "p/ckpt_100")
    copier("p/ckpt", "p/ckpt_100")
    assert (tmp_path / "p" / "ckpt_100" / "a.bin").read_bytes() == b"a"


def test_symlinks_in_a_directory_checkpoint_are_frozen_as_the_files_they_name_inside_the_root(tmp_path, copier):
    """Linux's link() links a symlink itself: the "frozen" snapshot held a live link, to outside the root too."""
    root = tmp_path / "root"
    ckpt = root / "p" / "ckpt"
    ckpt.mkdir(parents=True)
    (ckpt / "weights.bin").write_bytes(b"w")
    (ckpt / "alias.bin").symlink_to(ckpt / "weights.bin")
    copier = SnapshotCopier(SharedRoot(root))
    copier("p/ckpt", "p/ckpt_100")
    frozen = root / "p" / "ckpt_100" / "alias.bin"
    assert not frozen.is_symlink() and frozen.read_bytes() == b"w"
    (tmp_path / "outside.txt").write_text("outside the root")
    (ckpt / "extra").symlink_to(tmp_path / "outside.txt")
    with pytest.raises(UnsafePathError, match="outside the shared root"):
        copier("p/ckpt", "p/ckpt_200")
    assert not (root / "p" / "ckpt_200").exists()


def test_paths_outside_the_root_and_missing_sources_are_refused(tmp_path, copier):
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "ckpt.pt").write_bytes(b"w")
    with pytest.raises(UnsafePathError):
        copier("../etc/passwd", "p/x.pt")
    with pytest.raises(UnsafePathError):
        copier("p/ckpt.pt", "/tmp/elsewhere.pt")
    with pytest.raises(FileNotFoundError, match="checkpoint_path"):
        copier("p/missing.pt", "p/missing_1.pt")


def test_a_published_checkpoint_is_frozen_by_the_checkpoint_store(tmp_path, copier):
    from common.checkpoint_store import CheckpointStore

    store = CheckpointStore(tmp_path)
    ref = store.publish("main", {"w": np.arange(4, dtype=np.float32)}, version=3)
    dst = ref.path[:-3] + "_500.pt"
    copier(ref.path, dst)
    copier(ref.path, dst)  # a restart repeating the snapshot
    snap = store.manifest(dst)
    assert snap.path == dst and snap.digest == ref.digest and snap.version == 3
    np.testing.assert_array_equal(store.load(dst).tensors["w"], np.arange(4, dtype=np.float32))

    other = store.publish("main", {"w": np.ones(4, dtype=np.float32)}, version=4)
    with pytest.raises(FileExistsError, match="other weights"):
        copier(other.path, dst)


def test_the_coordinator_snapshots_a_published_checkpoint_without_importing_torch(tmp_path):
    """Snapshots are hard links plus a manifest: the coordinator process never needs torch (~200 MB of
    memory and a second or two of import in the snapshot thread when it did)."""
    import subprocess
    import sys

    from common.checkpoint_store import CheckpointStore

    CheckpointStore(tmp_path).publish("p", {"w": np.ones(3, np.float32)}, 7)
    code = (
        "import sys\n"
        "from common.paths import SharedRoot\n"
        "from league_service.checkpoint_copy import SnapshotCopier\n"
        "from league_service.coordinator import Coordinator\n"
        f"SnapshotCopier(SharedRoot({str(tmp_path)!r}))('p/v0000000007.pt', 'p/v0000000007_100.pt')\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert CheckpointStore(tmp_path).load("p/v0000000007_100.pt").tensors["w"].tolist() == [1.0, 1.0, 1.0]


def test_a_copied_snapshot_is_fsynced_before_and_after_its_rename(tmp_path, copier, monkeypatch):
    """Copies were renamed into place unsynced: a crash could leave a snapshot the league's state names with
    bytes that never reached the disk (the project's rule: temp file, fsync, rename)."""
    import league_service.checkpoint_copy as checkpoint_copy

    synced: list[str] = []
    monkeypatch.setattr(checkpoint_copy, "fsync_file", lambda p: synced.append(f"file {p.name}"))
    monkeypatch.setattr(checkpoint_copy, "fsync_dir", lambda p: synced.append(f"dir {p.name}"))
    (tmp_path / "p" / "ckpt" / "sub").mkdir(parents=True)
    (tmp_path / "p" / "ckpt" / "a.bin").write_bytes(b"a")
    (tmp_path / "p" / "ckpt" / "sub" / "b.bin").write_bytes(b"b")
    (tmp_path / "p" / "one.pt").write_bytes(b"w")
    copier("p/ckpt", "p/ckpt_100")
    assert {"file a.bin", "file b.bin", "dir ckpt_100", "dir sub"} <= set(synced) and synced[-1] == "dir p"
    synced.clear()
    copier("p/one.pt", "p/one_100.pt")
    assert synced == ["file one_100.pt", "dir p"]


def test_a_symlink_at_the_destination_never_sends_a_copy_or_its_cleanup_elsewhere(tmp_path, copier):
    """dst resolved through a symlink planted at its name: the copy replaced (rmtree) the directory it named,
    another player's (a review). The link is replaced like an old copy; what it named is untouched."""
    (tmp_path / "ext" / "ckpt").mkdir(parents=True)
    (tmp_path / "ext" / "ckpt" / "a.bin").write_bytes(b"new")
    (tmp_path / "q").mkdir()
    (tmp_path / "q" / "precious.bin").write_bytes(b"q's")
    (tmp_path / "ext" / "ckpt_100").symlink_to("../q")
    copier("ext/ckpt", "ext/ckpt_100")
    assert (tmp_path / "q" / "precious.bin").read_bytes() == b"q's"
    assert not (tmp_path / "ext" / "ckpt_100").is_symlink()
    assert (tmp_path / "ext" / "ckpt_100" / "a.bin").read_bytes() == b"new"


def test_a_store_version_retired_mid_snapshot_is_missing_not_copied_without_a_manifest(tmp_path, copier):
    """Retention unpublishes a version (manifest first) before moving its file: a snapshot in between copied the
    file as a plain one, with no manifest, and the historical player could never be loaded (a review)."""
    from common.checkpoint_store import CheckpointStore

    store = CheckpointStore(tmp_path)
    ref = store.publish("main", {"w": np.arange(4, dtype=np.float32)}, version=3)
    (tmp_path / (ref.path + ".json")).unlink()  # the moment between the two steps of its retirement
    with pytest.raises(FileNotFoundError, match="retired"):
        copier(ref.path, ref.path[:-3] + "_500.pt")
    assert not (tmp_path / (ref.path[:-3] + "_500.pt")).exists()


def test_a_snapshot_destination_that_is_a_symlink_is_replaced_not_followed(tmp_path):
    """The store's snapshot resolved its destination through a symlink: the weights and manifest landed in
    another player's directory as one of its versions, and an unfinished snapshot's cleanup deleted the file
    the link named (a review)."""
    from common.checkpoint_store import CheckpointStore

    store = CheckpointStore(tmp_path)
    ref = store.publish("p", {"w": np.arange(4, dtype=np.float32)}, version=12)
    store.publish("q", {"w": np.ones(4, dtype=np.float32)}, version=3)
    (tmp_path / "q" / "precious.pt").write_bytes(b"q's")
    (tmp_path / "p" / "v0000000012_5000.pt").symlink_to("../q/precious.pt")
    snap = store.snapshot(ref.path, "p/v0000000012_5000.pt")
    assert (tmp_path / "q" / "precious.pt").read_bytes() == b"q's"
    assert store.versions_on_disk("q") == [3] and not (tmp_path / "q" / "precious.pt.json").exists()
    assert not (tmp_path / "p" / "v0000000012_5000.pt").is_symlink() and store.load(snap.path).ref == snap


def test_a_fifo_or_a_symlinked_commit_lock_in_a_players_directory_cannot_hang_or_redirect_a_publish(tmp_path):
    """A FIFO under an old version's name hung the publish that dropped its page cache, holding the commit lock;
    a symlink at .publish.lock made the learner create a file outside the shared root (a review)."""
    import os
    import threading

    from common.checkpoint_store import CheckpointStore
    from common.paths import UnsafePathError

    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    store = CheckpointStore(root, keep_last=2)
    store.publish("p", {"w": np.zeros(2, np.float32)}, 1)
    store.publish("p", {"w": np.zeros(2, np.float32)}, 2)
    os.unlink(root / "p" / "v0000000001.pt.train") if (root / "p" / "v0000000001.pt.train").exists() else None
    os.mkfifo(root / "p" / "v0000000001.pt.train")
    done = []
    thread = threading.Thread(target=lambda: done.append(store.publish("p", {"w": np.ones(2, np.float32)}, 3)),
                              daemon=True)
    thread.start()
    thread.join(20)
    assert done and done[0].version == 3
    (root / "q").mkdir()
    (root / "q" / ".publish.lock").symlink_to(outside / "created_by_learner")
    with pytest.raises(UnsafePathError, match="symlink"):
        store.publish("q", {"w": np.zeros(2, np.float32)}, 1)
    assert not (outside / "created_by_learner").exists()


def test_a_destination_that_leaves_its_folder_is_refused(tmp_path, copier):
    """Only the destination's folder is resolved now: its name must still be a plain one (the whole path was
    checked when it was resolved)."""
    (tmp_path / "ext" / "ckpt").mkdir(parents=True)
    for bad in ("ext/..", "ext/.", "/abs/x"):
        with pytest.raises(UnsafePathError):
            copier("ext/ckpt", bad)


def test_the_staging_directory_a_crashed_copy_left_is_swept_by_a_later_copy(tmp_path, copier):
    """A copy stages under `.<name>.<random>` and removes it in a `finally` that a SIGKILL skips: the directory,
    a whole checkpoint's size, stayed for good (no sweep matched it)."""
    import os
    import time

    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "ckpt.pt").write_bytes(b"weights")
    crashed = tmp_path / "p" / ".ckpt_100.pt.abc123"  # as the coordinator died mid-copy left it
    crashed.mkdir()
    (crashed / "ckpt_100.pt").write_bytes(b"half a copy")
    recent = tmp_path / "p" / ".ckpt_200.pt.def456"  # a copy under way (or just crashed): not an hour old
    recent.mkdir()
    kept = tmp_path / "p" / ".settings.d"  # something else hidden: not a staging directory's shape
    kept.mkdir()
    (kept / "notes").write_text("mine")
    an_hour_ago = time.time() - 3700
    for folder in (crashed, kept):
        os.utime(folder, (an_hour_ago, an_hour_ago))
    copier("p/ckpt.pt", "p/ckpt_300.pt")
    assert not crashed.exists() and recent.exists() and kept.exists()
    assert (tmp_path / "p" / "ckpt_300.pt").read_bytes() == b"weights"


def _swap_after_check(monkeypatch, swap):
    """The attacker's move at the worst moment: right after the copier checked the path (a peer with write access
    to the share swapping names in a loop hit it 15 times in 3,000 snapshots; a review)."""
    checked, swaps = SharedRoot.resolve, [swap]

    def resolve_then_swap(self, relative):
        resolved = checked(self, relative)
        while swaps:
            swaps.pop()()
        return resolved

    monkeypatch.setattr(SharedRoot, "resolve", resolve_then_swap)


@pytest.mark.parametrize("swapped", ["the file", "its folder"])
def test_a_file_swapped_for_a_symlink_out_of_the_root_after_the_check_is_not_copied(tmp_path, monkeypatch, swapped):
    """shutil.copy2 opened the checked path by name again and followed the link put there meanwhile: a file from
    outside the root became a historical player's checkpoint inside it."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "p").mkdir(parents=True)
    outside.mkdir()
    (outside / "ckpt.pt").write_bytes(b"a secret outside the root")
    (root / "p" / "ckpt.pt").write_bytes(b"weights")

    def swap():
        if swapped == "the file":
            (root / "p" / "ckpt.pt").unlink()
            (root / "p" / "ckpt.pt").symlink_to(outside / "ckpt.pt")
        else:
            (root / "p").rename(root / "q")
            (root / "p").symlink_to(outside)

    copier = SnapshotCopier(SharedRoot(root))
    _swap_after_check(monkeypatch, swap)
    with pytest.raises(UnsafePathError, match="changed while being copied"):
        copier("p/ckpt.pt", "x/ckpt_100.pt" if swapped == "its folder" else "p/ckpt_100.pt")
    copies = [p for p in root.rglob("*") if not p.is_symlink() and p.is_file()
              and p.read_bytes() == b"a secret outside the root"]
    assert copies == [] and list(root.rglob(".ckpt_100.pt.*")) == []  # nor a staging folder left


def test_a_file_in_a_directory_checkpoint_swapped_for_a_symlink_after_the_check_is_not_copied(tmp_path, monkeypatch):
    import league_service.checkpoint_copy as checkpoint_copy

    root, outside = tmp_path / "root", tmp_path / "outside.bin"
    (root / "p" / "ckpt").mkdir(parents=True)
    (root / "p" / "ckpt" / "w.bin").write_bytes(b"w")
    outside.write_bytes(b"a secret outside the root")
    copy_beneath = checkpoint_copy._copy_beneath

    def swap_then_copy(root_path, source, dst):
        source.unlink()
        source.symlink_to(outside)
        copy_beneath(root_path, source, dst)

    monkeypatch.setattr(checkpoint_copy, "_copy_beneath", swap_then_copy)
    with pytest.raises(UnsafePathError, match="changed while being copied"):
        SnapshotCopier(SharedRoot(root))("p/ckpt", "p/ckpt_100")
    assert not (root / "p" / "ckpt_100").exists()


def test_a_plain_file_copy_keeps_its_mode_and_times(tmp_path, copier):
    (tmp_path / "p").mkdir()
    source = tmp_path / "p" / "ckpt.pt"
    source.write_bytes(b"w")
    source.chmod(0o640)
    os.utime(source, ns=(1_600_000_000_000_000_000, 1_600_000_000_000_000_000))
    copier("p/ckpt.pt", "p/ckpt_100.pt")
    frozen = (tmp_path / "p" / "ckpt_100.pt").stat()
    assert stat.S_IMODE(frozen.st_mode) == 0o640 and frozen.st_mtime_ns == 1_600_000_000_000_000_000


def test_open_beneath_follows_no_symlink_below_the_root(tmp_path):
    from common.paths import open_beneath

    real_root, outside = tmp_path / "share", tmp_path / "outside"
    (real_root / "a").mkdir(parents=True)
    outside.mkdir()
    (real_root / "a" / "f").write_bytes(b"inside")
    (outside / "f").write_bytes(b"outside")
    linked_root = tmp_path / "root-link"  # the operator's own link to the share: followed
    linked_root.symlink_to(real_root)
    fd = open_beneath(linked_root, linked_root / "a" / "f")
    with open(fd, "rb") as f:
        assert f.read() == b"inside"
    (real_root / "b").symlink_to(outside)
    (real_root / "a" / "g").symlink_to(outside / "f")
    for path in (real_root / "b" / "f", real_root / "a" / "g"):
        with pytest.raises(OSError) as err:
            open_beneath(real_root, path)
        assert err.value.errno in (errno.ELOOP, errno.ENOTDIR)


@pytest.mark.parametrize("kind", ["file", "directory"])
def test_an_existing_snapshot_of_other_bytes_is_never_replaced(tmp_path, copier, kind):
    """A plain checkpoint's snapshot replaced whatever lay at its name: a client naming a checkpoint beside a
    historical player's (`h/ckpt.pt` at step 500 freezes to `h/ckpt_500.pt`) rewrote that player's frozen
    weights. Other bytes there are refused (the snapshot is retried at the next update, under another step's
    name); the same bytes are the same snapshot again (a restart), a no-op."""
    (tmp_path / "h").mkdir()
    if kind == "file":
        source, frozen = tmp_path / "h" / "ckpt.pt", tmp_path / "h" / "ckpt_500.pt"
        frozen.write_bytes(b"historical player's weights")
        source.write_bytes(b"a client's weights")
        names = ("h/ckpt.pt", "h/ckpt_500.pt")
    else:
        source, frozen = tmp_path / "h" / "ckpt", tmp_path / "h" / "ckpt_500"
        (frozen / "sub").mkdir(parents=True)
        (frozen / "sub" / "w.bin").write_bytes(b"historical player's weights")
        (source / "sub").mkdir(parents=True)
        (source / "sub" / "w.bin").write_bytes(b"a client's weights")
        names = ("h/ckpt", "h/ckpt_500")
    with pytest.raises(FileExistsError, match="holds other bytes"):
        copier(*names)
    held = frozen if kind == "file" else frozen / "sub" / "w.bin"
    assert held.read_bytes() == b"historical player's weights"
    assert sorted(p.name for p in (tmp_path / "h").iterdir()) == sorted([source.name, frozen.name])
    (source if kind == "file" else source / "sub" / "w.bin").write_bytes(b"historical player's weights")
    copier(*names)  # the same bytes: frozen before
    assert held.read_bytes() == b"historical player's weights"


def test_a_plain_file_rewritten_while_it_is_copied_is_not_frozen(tmp_path, copier, monkeypatch):
    """A writer rewriting its file in place (torch.save to one path) during the copy: the snapshot mixed two
    versions' bytes, and the league recorded it as a historical player's weights (a review)."""
    import shutil

    import league_service.checkpoint_copy as checkpoint_copy

    (tmp_path / "p").mkdir()
    source = tmp_path / "p" / "ckpt.pt"
    source.write_bytes(b"A" * (3 << 20))
    copy = shutil.copyfileobj

    def rewritten_meanwhile(src, dst, length=0):
        dst.write(src.read(1 << 20))
        with open(source, "r+b") as writer:  # the next version, written over the same inode
            writer.write(b"B" * (4 << 20))
        copy(src, dst, length)

    monkeypatch.setattr(checkpoint_copy.shutil, "copyfileobj", rewritten_meanwhile)
    with pytest.raises(OSError, match="changed while being copied") as raised:
        copier("p/ckpt.pt", "p/ckpt_100.pt")
    assert raised.value.errno == errno.EAGAIN
    assert sorted(p.name for p in (tmp_path / "p").iterdir()) == ["ckpt.pt"]  # nothing frozen, no staging left
    monkeypatch.setattr(checkpoint_copy.shutil, "copyfileobj", copy)
    copier("p/ckpt.pt", "p/ckpt_100.pt")  # between writes: frozen
    assert (tmp_path / "p" / "ckpt_100.pt").read_bytes() == b"B" * (4 << 20)


def test_a_published_checkpoint_that_fails_its_digest_is_one_line_not_a_traceback(tmp_path, copier):
    """A CorruptCheckpointError is a ValueError: the snapshot thread logged it with a traceback at every update
    of the player; as an OSError it is the one ERROR line of a failed copy."""
    from common.checkpoint_store import CheckpointStore

    ref = CheckpointStore(tmp_path).publish("main", {"w": np.arange(4, dtype=np.float32)}, version=3)
    path = tmp_path / ref.path
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(OSError, match="digest"):
        copier(ref.path, ref.path[:-3] + "_500.pt")
