"""Checkpoint store on real files: publish/load, retention, snapshots, tampering, pickle payloads, path guard."""

from __future__ import annotations

import errno
import io
import json
import os
import pickle

import numpy as np
import pytest
import torch

from common.algorithms import make_computation_task
from common.checkpoint_store import (
    CheckpointNotFoundError,
    CheckpointStore,
    CorruptCheckpointError,
    snapshot_path,
)
from common.computation import TensorSpec
from common.paths import SharedRoot, UnsafePathError


def weights(value: float = 1.0) -> dict[str, np.ndarray]:
    return {
        "layer.weight": np.full((4, 3), value, np.float32),
        "layer.bias": np.arange(4, dtype=np.int64),
        "mask": np.array([True, False]),
        "pixels": np.full((2, 2), 7, np.uint8),
    }


@pytest.fixture
def store(tmp_path):
    root = tmp_path / "share"
    root.mkdir()
    return CheckpointStore(root, keep_last=3)


def test_publish_then_load_round_trip(store):
    assert store.latest("p0") is None and store.load_latest("p0") is None
    ref = store.publish("p0", weights(2.0), version=7, metadata={"train_iteration": 70})
    assert ref.path == "p0/v0000000007.pt" and ref.version == 7 and len(ref.sha256) == 64
    assert store.latest("p0") == ref
    checkpoint = store.load(ref.path, expected_version=7)
    assert checkpoint.ref.metadata == {"train_iteration": 70}
    for key, value in weights(2.0).items():
        np.testing.assert_array_equal(checkpoint.tensors[key], value)
        assert checkpoint.tensors[key].dtype == value.dtype
    files = sorted(os.listdir(store.root.root / "p0"))
    assert files == ["latest.json", "v0000000007.pt", "v0000000007.pt.json"]  # no temp files left behind
    with pytest.raises(CorruptCheckpointError, match="expected 8"):
        store.load(ref.path, expected_version=8)


def test_versions_only_move_forward(store):
    store.publish("p0", weights(), 3)
    for version in (3, 2):
        with pytest.raises(ValueError, match="must exceed"):
            store.publish("p0", weights(), version)
    with pytest.raises(ValueError, match="metadata"):
        store.publish("p0", weights(), 4, metadata={"x": [1]})
    with pytest.raises(ValueError, match="dtype"):
        store.publish("p0", {"x": np.array(["a"])}, 4)


def test_torch_tensors_are_accepted_and_task_weights_round_trip(store):
    store.publish("t", {"w": torch.ones(3)}, 1)
    np.testing.assert_array_equal(store.load_latest("t").tensors["w"], np.ones(3, np.float32))
    obs = TensorSpec("observation", (4,))
    learner = make_computation_task({"algorithm": "ppo"}, obs, 2, device="cpu", seed=1)
    actor = make_computation_task({"algorithm": "ppo"}, obs, 2, device="cpu", seed=2)
    learner.set_weights(learner.get_weights(), 5)
    ref = learner.publish(store, "main_player_0", metadata={"agent_steps": 1000})
    assert actor.restore(store, ref.path) == ref
    assert actor.version == 5
    for key, value in learner.get_weights().items():
        np.testing.assert_array_equal(actor.get_weights()[key], value)


def test_retention_keeps_newest_and_pinned_versions(store):
    for version in range(1, 4):
        store.publish("p0", weights(version), version)
    store.pin("p0/v0000000001.pt")
    for version in range(4, 7):
        store.publish("p0", weights(version), version)
    assert [r.version for r in store.versions("p0")] == [1, 4, 5, 6]
    removed = store.prune("p0", keep_last=1, pinned={"p0/v0000000005.pt"})
    assert removed == ["p0/v0000000004.pt"]
    assert [r.version for r in store.versions("p0")] == [1, 5, 6]
    store.unpin("p0/v0000000001.pt")
    store.prune("p0", keep_last=1)
    assert [r.version for r in store.versions("p0")] == [6]
    with pytest.raises(CheckpointNotFoundError):
        store.load("p0/v0000000004.pt")
    with pytest.raises(CheckpointNotFoundError):
        store.pin("p0/v0000000004.pt")


def test_snapshot_is_a_hard_link_that_survives_retention(store):
    ref = store.publish("p0", weights(1.0), 1)
    name = snapshot_path(ref.path, 5000)
    assert name == "p0/v0000000001_5000.pt"
    snap = store.snapshot(ref.path, name)
    assert snap.version == 1 and snap.sha256 == ref.sha256 and snap.metadata["snapshot_of"] == ref.path
    source, copy = store.root.resolve(ref.path), store.root.resolve(name)
    assert os.stat(source).st_ino == os.stat(copy).st_ino
    for version in range(2, 8):
        store.publish("p0", weights(version), version)
    assert not source.exists()
    np.testing.assert_array_equal(store.load(name).tensors["layer.weight"], weights(1.0)["layer.weight"])
    with pytest.raises(FileExistsError):
        store.snapshot("p0/v0000000007.pt", name)
    other_dir = store.snapshot("p0/v0000000007.pt", "historical/main_7000.pt")
    assert store.load(other_dir.path).ref.version == 7


def test_snapshot_copies_when_linking_fails(store, monkeypatch):
    ref = store.publish("p0", weights(3.0), 1)

    def no_links(*args, **kwargs):
        raise OSError(errno.EXDEV, "cross-device link")

    monkeypatch.setattr(os, "link", no_links)
    snap = store.snapshot(ref.path, "p0/frozen.pt")
    assert os.stat(store.root.resolve(snap.path)).st_ino != os.stat(store.root.resolve(ref.path)).st_ino
    np.testing.assert_array_equal(store.load(snap.path).tensors["layer.weight"], weights(3.0)["layer.weight"])


# ---- corruption and tampering -------------------------------------------------------------------------------
def test_flipped_byte_is_detected(store):
    ref = store.publish("p0", weights(), 1)
    path = store.root.resolve(ref.path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpointError, match="sha256"):
        store.load(ref.path)
    with pytest.raises(CorruptCheckpointError):
        store.snapshot(ref.path, "p0/copy.pt")


def test_truncated_file_and_bad_manifests_are_detected(store):
    ref = store.publish("p0", weights(), 1)
    second = store.publish("p0", weights(2.0), 2)
    path = store.root.resolve(ref.path)
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(CorruptCheckpointError, match="size"):
        store.load(ref.path)

    manifest = store.root.resolve(second.path + ".json")
    body = json.loads(manifest.read_text())
    for tampered, match in [
        ({**body, "sha256": "0" * 64}, "sha256"),
        ({**body, "sha256": "nothex"}, "sha256"),
        ({**body, "version": -1}, "version"),
        ({**body, "path": "p0/v0000000001.pt"}, "describes"),
        ({**body, "path": "../outside.pt"}, "unsafe"),
        ({**body, "format": "other"}, "format"),
    ]:
        manifest.write_text(json.dumps(tampered))
        with pytest.raises(CorruptCheckpointError, match=match):
            store.load(second.path)
    manifest.write_text("{not json")
    with pytest.raises(CorruptCheckpointError, match="JSON"):
        store.load(second.path)
    manifest.write_bytes(b" " * 70_000)
    with pytest.raises(CorruptCheckpointError, match="larger"):
        store.load(second.path)
    manifest.unlink()
    with pytest.raises(CheckpointNotFoundError):
        store.load(second.path)


class Payload:
    """Unpickling this runs os.mkdir(marker): what an attacker with write access to the share would plant."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def plant(store: CheckpointStore, relative: str, data: bytes) -> None:
    """Place ``data`` with a *valid* manifest, as if the attacker also rewrote the manifest."""
    import hashlib

    path = store.root.resolve(relative)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    manifest = {"format": "league-checkpoint/1", "path": relative, "version": 1,
                "sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "created_at": 0.0, "metadata": {}}
    (path.parent / (path.name + ".json")).write_text(json.dumps(manifest))


@pytest.mark.parametrize("container", ["raw_pickle", "torch_zip"])
def test_pickle_payload_on_the_share_does_nothing(store, tmp_path, container):
    marker = tmp_path / f"pwned_{container}"
    evil = {"format": "league-checkpoint/1", "version": 1, "tensors": {"w": Payload(str(marker))}}
    if container == "raw_pickle":
        data = pickle.dumps(evil, protocol=2)
    else:
        buffer = io.BytesIO()
        torch.save(evil, buffer)
        data = buffer.getvalue()
    plant(store, "evil/v0000000001.pt", data)
    with pytest.raises(CorruptCheckpointError, match="not a plain-tensor checkpoint"):
        store.load("evil/v0000000001.pt")
    assert not marker.exists()


def test_plain_but_foreign_payloads_are_rejected(store):
    for payload, match in [([1, 2], "payload"), ({"format": "league-checkpoint/1", "version": 2, "tensors": {}},
                                                 "version"),
                           ({"format": "league-checkpoint/1", "version": 1, "tensors": {"w": 3}}, "tensors")]:
        buffer = io.BytesIO()
        torch.save(payload, buffer)
        plant(store, "odd/v0000000001.pt", buffer.getvalue())
        with pytest.raises(CorruptCheckpointError, match=match):
            store.load("odd/v0000000001.pt")


# ---- the path guard ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "path",
    ["/etc/passwd", "../outside.pt", "p0/../../outside.pt", "p0/./v.pt", "p0//v.pt", "p0\\v.pt", "", "C:/x.pt",
     "p0/v.pt\x00"],
)
def test_paths_outside_or_malformed_are_rejected(store, path):
    with pytest.raises(UnsafePathError):
        store.load(path)


@pytest.mark.parametrize("player_id", ["../p", "a/b", ".hidden", "", "x" * 300])
def test_player_ids_must_be_one_safe_component(store, player_id):
    with pytest.raises(UnsafePathError):
        store.publish(player_id, weights(), 1)


def test_symlinks_escaping_the_root_are_rejected(store, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    other = CheckpointStore(outside)
    other.publish("victim", weights(), 1)
    os.symlink(outside / "victim", store.root.root / "linked")
    with pytest.raises(UnsafePathError, match="outside"):
        store.load("linked/v0000000001.pt")
    with pytest.raises(UnsafePathError):
        store.publish("linked", weights(), 2)
    # A symlink that stays inside the root is fine.
    store.publish("real", weights(), 1)
    os.symlink(store.root.root / "real", store.root.root / "alias")
    assert SharedRoot(store.root.root).resolve("alias/v0000000001.pt").name == "v0000000001.pt"


def test_shared_root_relative_paths(tmp_path):
    root = SharedRoot(tmp_path)
    assert root.relative(tmp_path / "a" / "b.pt") == "a/b.pt"
    with pytest.raises(UnsafePathError):
        root.relative(tmp_path.parent / "x")
    with pytest.raises(FileNotFoundError):
        SharedRoot(tmp_path / "missing")
