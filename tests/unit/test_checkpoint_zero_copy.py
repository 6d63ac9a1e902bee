"""Loads hand out the verified buffer itself through torch's private loader, and fall back when torch changes;
retention after a publish deletes the retired files in the background."""

from __future__ import annotations

import io
import os
import types
import warnings

import numpy as np
import pytest
import torch

from common import checkpoint_unpickle
from common.checkpoint_store import CheckpointNotFoundError, CheckpointStore, CorruptCheckpointError


@pytest.fixture
def store(tmp_path):
    return CheckpointStore(tmp_path, keep_last=2)


def big_weights(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"a": rng.random(1_500_000, dtype=np.float32), "b": rng.random(600_000, dtype=np.float32),
            "c": np.arange(7, dtype=np.int64)}  # ~8.4 MB: several read chunks, hashed on the helper thread


def address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


def test_torch_still_has_the_private_zero_copy_loader():
    """torch is pinned; when an upgrade changes torch.serialization._load(..., overall_storage=...), loads
    silently copy again (slower): this test is the loud signal to port common/checkpoint_unpickle.py."""
    assert checkpoint_unpickle.zero_copy_available(), (
        f"torch {torch.__version__}: torch.serialization._load(overall_storage=...) is gone or changed")
    raw = io.BytesIO()
    torch.save({"w": torch.arange(1000, dtype=torch.float32), "n": 3}, raw)
    buffer = np.frombuffer(bytearray(raw.getvalue()), dtype=np.uint8)
    loaded = checkpoint_unpickle._load_sharing(buffer)  # the private route itself, no fallback
    assert loaded["n"] == 3
    torch.testing.assert_close(loaded["w"], torch.arange(1000, dtype=torch.float32))
    start = address(buffer)
    assert start <= loaded["w"].data_ptr() < start + buffer.nbytes, "the tensor is a copy, not the buffer"


def test_a_load_hands_out_one_verified_buffer_not_copies(store):
    weights = big_weights()
    ref = store.publish("p", weights, 1)
    tensors = store.load(ref.path).tensors
    starts = {name: address(array) for name, array in tensors.items()}
    low = min(starts.values())
    for name, array in tensors.items():
        np.testing.assert_array_equal(array, weights[name])
        assert starts[name] + array.nbytes <= low + ref.size, f"{name} lies outside the one loaded buffer"
        assert array.flags.writeable
    del store  # the arrays keep their buffer alive on their own
    np.testing.assert_array_equal(tensors["a"], weights["a"])


@pytest.mark.parametrize("breakage", ["removed", "signature"])
def test_loads_fall_back_to_copying_when_the_private_loader_breaks(store, monkeypatch, breakage):
    real = torch.serialization
    if breakage == "removed":
        fake = types.SimpleNamespace()  # every private name gone: AttributeError
    else:
        def old_load(zip_file, map_location, pickle_module, pickle_file="data.pkl", **pickle_load_args):
            raise TypeError("_load() got an unexpected keyword argument 'overall_storage'")
        fake = types.SimpleNamespace(_load=old_load, _open_zipfile_reader=real._open_zipfile_reader,
                                     _is_torchscript_zip=real._is_torchscript_zip,
                                     _weights_only_unpickler=real._weights_only_unpickler)
    monkeypatch.setattr(checkpoint_unpickle, "_serialization", fake)
    monkeypatch.setattr(checkpoint_unpickle, "_zero_copy", True)  # restored after the test
    weights = big_weights(1)
    ref = store.publish("p", weights, 1)
    with pytest.warns(RuntimeWarning, match="copy their tensors"):
        tensors = store.load(ref.path).tensors
    assert not checkpoint_unpickle.zero_copy_available()
    for name, value in weights.items():
        np.testing.assert_array_equal(tensors[name], value)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once only
        np.testing.assert_array_equal(store.load(ref.path).tensors["b"], weights["b"])
    path = store.root.resolve(ref.path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpointError, match="digest does not match"):
        store.load(ref.path)


def test_bad_data_on_the_private_route_does_not_disable_it(monkeypatch):
    monkeypatch.setattr(checkpoint_unpickle, "_zero_copy", True)
    raw = io.BytesIO()
    torch.save({"w": torch.ones(3)}, raw)
    data = bytearray(raw.getvalue())
    broken = np.frombuffer(data[: len(data) // 2] + bytes(8), dtype=np.uint8)
    with pytest.raises(Exception):  # noqa: B017 - torch raises several types for a broken zip
        checkpoint_unpickle.load_weights_only(broken)
    assert checkpoint_unpickle.zero_copy_available()


def test_retention_unpublishes_at_once_and_deletes_the_files_in_the_background(store):
    """A publish retires what falls out of keep_last before it returns (manifest gone, files renamed away);
    deleting the files finishes in the background, and a file such a deletion left behind goes next time."""
    directory = store.root.resolve("p")
    for version in (1, 2, 3):
        store.publish("p", big_weights(version), version, training_state={"step": version})
    assert [r.version for r in store.versions("p")] == [2, 3]
    with pytest.raises(CheckpointNotFoundError):
        store.load("p/v0000000001.pt")
    assert not (directory / "v0000000001.pt").exists()
    store.close()
    published = [".publish.lock", "latest.json"] + [f"v000000000{v}.pt{s}" for v in (2, 3)
                                                    for s in ("", ".json", ".train")]
    assert sorted(os.listdir(directory)) == sorted(published)
    (directory / ".v0000000000.pt.99.0badf00d.retired").write_bytes(b"left by a process that exited")
    store.publish("p", big_weights(4), 4)
    store.close()
    assert sorted(os.listdir(directory)) == sorted(
        [".publish.lock", "latest.json", "v0000000003.pt", "v0000000003.pt.json", "v0000000003.pt.train",
         "v0000000004.pt", "v0000000004.pt.json"])
    np.testing.assert_array_equal(store.load_latest("p").tensors["a"], big_weights(4)["a"])
