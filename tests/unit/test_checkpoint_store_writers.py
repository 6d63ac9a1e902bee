"""Two writers of one player: a learner that resumed after its lease passed (frozen mid-publish by SIGSTOP, a
paused VM, a slow share) and the learner that took the player over. A reviewer froze the first between writing
its weights and renaming them: on thaw it replaced a version the second had published, and moved latest.json
back to a version its own retention then deleted. Every commit now runs under the player's commit lock, checks
the version against the latest again, and asks the writer's guard."""

from __future__ import annotations

import fcntl
import os

import numpy as np
import pytest

import common.checkpoint_store as checkpoint_store
from common.checkpoint_store import COMMIT_LOCK, CheckpointStore, PublishWithdrawn, VersionConflictError


def weights(value: float) -> dict[str, np.ndarray]:
    return {"w": np.full((4, 4), value, dtype=np.float32)}


def files(store: CheckpointStore, player: str = "p") -> list[str]:
    return sorted(os.listdir(store.root.resolve(player)))


def test_a_version_published_by_another_writer_while_this_one_wrote_its_files_is_never_replaced(tmp_path,
                                                                                                 monkeypatch):
    stale, owner = CheckpointStore(tmp_path, keep_last=2), CheckpointStore(tmp_path, keep_last=2)
    stale.publish("p", weights(4.0), 4, metadata={"worker_id": "stale"})
    real_save = checkpoint_store.save_hashed
    calls = []

    def save_then_let_the_owner_publish(payload, path):
        digest = real_save(payload, path)
        if not calls:  # the stale writer is "frozen" here; the owner publishes versions 5 and 6 meanwhile
            calls.append(path)
            owner.publish("p", weights(5.0), 5, metadata={"worker_id": "owner"})
            owner.publish("p", weights(6.0), 6, metadata={"worker_id": "owner"})
        return digest

    monkeypatch.setattr(checkpoint_store, "save_hashed", save_then_let_the_owner_publish)
    with pytest.raises(VersionConflictError, match="must exceed the latest published 6 .published by owner.$"):
        stale.publish("p", weights(-1.0), 5, metadata={"worker_id": "stale"})
    assert owner.latest("p").version == 6  # latest.json did not go back
    np.testing.assert_array_equal(owner.load("p/v0000000005.pt").tensors["w"], weights(5.0)["w"])
    np.testing.assert_array_equal(owner.load_latest("p").tensors["w"], weights(6.0)["w"])
    assert not [n for n in files(owner) if n.endswith(".tmp")]  # the stale writer's files are gone


def test_a_guard_that_says_no_at_the_commit_leaves_nothing_visible(tmp_path):
    allowed = [True]
    store = CheckpointStore(tmp_path, publish_guard=lambda: allowed[0])
    store.publish("p", weights(1.0), 1)
    before = files(store)
    allowed[0] = False
    with pytest.raises(PublishWithdrawn, match="version 2 of 'p' withdrawn"):
        store.publish("p", weights(2.0), 2, training_state={"step": 2})
    assert files(store) == before and store.latest("p").version == 1
    allowed[0] = True
    assert store.publish("p", weights(2.0), 2).version == 2


def test_a_commit_lock_held_too_long_fails_the_publish_as_storage_does(tmp_path, monkeypatch):
    store = CheckpointStore(tmp_path)
    store.publish("p", weights(1.0), 1)
    monkeypatch.setattr(checkpoint_store, "COMMIT_LOCK_WAIT_S", 0.2)
    fd = os.open(store.root.resolve("p") / COMMIT_LOCK, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # another open file: as another process holding it
        with pytest.raises(TimeoutError, match="held its commit lock"):
            store.publish("p", weights(2.0), 2)
    finally:
        os.close(fd)
    assert store.latest("p").version == 1 and not [n for n in files(store) if n.endswith(".tmp")]
    assert store.publish("p", weights(2.0), 2).version == 2  # released: publishing goes on


def test_a_filesystem_without_locks_still_publishes_and_says_so_once(tmp_path, monkeypatch, caplog):
    import errno

    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(checkpoint_store.fcntl, "flock", no_locks)
    store = CheckpointStore(tmp_path)
    assert store.publish("p", weights(1.0), 1).version == 1
    assert store.publish("p", weights(2.0), 2).version == 2
    assert caplog.text.count("takes no file locks") == 1
    with pytest.raises(VersionConflictError):  # the version check still runs
        store.publish("p", weights(3.0), 2)
