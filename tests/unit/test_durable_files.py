"""durable_files: a file others read is written to a temp name, fsynced, renamed over, and its directory fsynced."""

from __future__ import annotations

import errno
import os

import pytest

from common import durable_files
from common.durable_files import atomic_write, create_new, write_new_file


def _record_syncs(monkeypatch) -> list[tuple[str, str]]:
    """Patch os.fsync / os.replace to log (what, path) in call order, then do the real thing."""
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", f"{src} -> {dst}"))
        return real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    return events


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc to name an fd's file")
def test_atomic_write_syncs_the_data_then_renames_then_syncs_the_directory(tmp_path, monkeypatch):
    target = tmp_path / "port"
    target.write_bytes(b"old\n")
    events = _record_syncs(monkeypatch)
    atomic_write(target, b"4242\n")
    assert target.read_bytes() == b"4242\n"
    assert [kind for kind, _ in events] == ["fsync", "replace", "fsync"], events
    (_, synced_file), (_, renamed), (_, synced_dir) = events
    assert renamed == f"{synced_file} -> {target}"  # the temp file is whole on disk before it takes the name
    assert os.path.dirname(synced_file) == str(tmp_path) and synced_file != str(target)
    assert synced_dir == str(tmp_path)  # and the rename itself survives a power loss
    assert sorted(p.name for p in tmp_path.iterdir()) == ["port"]


def test_a_failed_atomic_write_leaves_the_old_file_and_no_temp_file(tmp_path, monkeypatch):
    target = tmp_path / "config.pending.yaml"
    target.write_bytes(b"old")

    def full(file, view):
        file.write(view[:1])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(durable_files, "write_all", full)
    with pytest.raises(OSError, match="No space left"):
        atomic_write(target, b"new contents")
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.pending.yaml"]


def test_new_files_never_write_through_an_existing_file_or_link(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    link = tmp_path / "link"
    link.symlink_to(victim)
    for existing in (victim, link):
        with pytest.raises(FileExistsError):
            create_new(existing)
        with pytest.raises(FileExistsError):
            write_new_file(existing, b"overwritten")
    assert victim.read_bytes() == b"keep"


@pytest.mark.parametrize("fields, note", [
    ((4096, 4096, 512, 0, 0, 1000, 900, 900, 0, 255), "0 bytes free"),  # no block left
    ((4096, 4096, 512, 400, 400, 1000, 0, 0, 0, 255), "no inodes left"),
    ((4096, 4096, 0, 0, 0, 0, 0, 0, 0, 255), ""),  # a tmpfs mounted size=0,nr_inodes=0 (no limits), ramfs
    ((4096, 4096, 0, 0, 0, 1000, 900, 900, 0, 255), ""),  # no size limit, inodes left
])
def test_full_disk_note_names_a_full_disk_not_one_without_a_size_limit(tmp_path, monkeypatch, fields, note):
    """A tmpfs mounted without a size limit (size=0) reports 0 blocks in all and 0 free: it was called full
    ("0 bytes free"), so a coordinator refusing a bad state there exited 1 (retried) instead of 2, and every
    failure of `league run` on it blamed a full disk."""
    monkeypatch.setattr(os, "statvfs", lambda path: os.statvfs_result(fields))
    got = durable_files.full_disk_note(tmp_path)
    assert (note in got and got) if note else got == "", got


@pytest.mark.parametrize("failing", ["open", "fsync"])
def test_full_disk_note_names_a_spent_quota_which_statvfs_does_not_show(tmp_path, monkeypatch, failing):
    """Under a disk quota (EDQUOT) statvfs shows the filesystem's free space, and SQLite reports the refused write
    as "disk I/O error": a coordinator that could not open its state on a spent quota exited 2 ("the league
    cannot run as configured") and `league run` gave up, where a full disk is a failure space coming back mends
    (a review injected EDQUOT with strace). A small write probes for it (some filesystems refuse at the flush);
    the probe's file is gone after."""
    real_open, real_fsync = os.open, os.fsync

    def quota(*args):
        raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))

    if failing == "open":
        monkeypatch.setattr(os, "open", lambda path, *a, **k: quota() if ".league-space-probe." in str(path)
                            else real_open(path, *a, **k))
    else:
        monkeypatch.setattr(os, "fsync", quota)
    note = durable_files.full_disk_note(tmp_path / "league_state.sqlite")  # (a file: its directory is probed)
    assert note == f"; the disk of {tmp_path / 'league_state.sqlite'} is full (Disk quota exceeded)", note
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(os, "open", real_open)
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert durable_files.full_disk_note(tmp_path) == "" and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("hard_links", [True, False])
def test_atomic_create_writes_a_new_file_whole_and_keeps_an_existing_one(tmp_path, monkeypatch, hard_links):
    if not hard_links:  # a filesystem without them: checked, then renamed
        def no_link(*args, **kwargs):
            raise OSError(errno.EPERM, "Operation not permitted")
        monkeypatch.setattr(os, "link", no_link)
    target = tmp_path / "policy.pt2"
    durable_files.atomic_create(target, b"first")
    assert target.read_bytes() == b"first"
    with pytest.raises(FileExistsError):
        durable_files.atomic_create(target, b"second")
    assert target.read_bytes() == b"first" and sorted(p.name for p in tmp_path.iterdir()) == ["policy.pt2"]


def test_a_long_legal_name_is_written_atomically_and_a_replaced_file_keeps_its_mode(tmp_path):
    """The temporary name added ~23 characters: names of 233-255 bytes failed with ENAMETOOLONG, naming the
    temporary file. And a private (0600) file replaced became 0644, readable by all (a review)."""
    long = tmp_path / ("é" * 100 + "x" * 50)  # 250 bytes in UTF-8
    atomic_write(long, b"hi")
    assert long.read_bytes() == b"hi" and [p.name for p in tmp_path.iterdir()] == [long.name]
    private = tmp_path / "policy.pt2"
    atomic_write(private, b"one")
    os.chmod(private, 0o600)
    atomic_write(private, b"two")
    assert private.read_bytes() == b"two" and (private.stat().st_mode & 0o777) == 0o600
