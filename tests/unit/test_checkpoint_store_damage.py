"""The checkpoint store reads damaged or odd files as damaged versions (never a raw OSError past its readers),
and stores only tensors a load gives back."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from common.checkpoint_store import CheckpointError, CheckpointStore


def _store(tmp_path, n=3):
    store = CheckpointStore(tmp_path, keep_last=10)
    for v in range(1, n + 1):
        store.publish("p", {"w": np.full(4, v, dtype=np.float32)}, v)
    store.close()
    return store


def test_versions_leaves_out_a_symlinked_manifest(tmp_path):
    store = _store(tmp_path)
    d = tmp_path / "p"
    m = d / "v0000000002.pt.json"
    target = d / "copy.json"
    os.replace(m, target)
    os.symlink("copy.json", m)          # a symlink inside the root (cp -s / rsync -l of a run dir, say)
    refs = store.versions("p")          # a raw OSError (ELOOP) escaped instead of version 2 being left out
    assert [r.version for r in refs] == [1, 3]


def test_versions_leaves_out_a_manifest_that_is_a_directory(tmp_path):
    store = _store(tmp_path)
    d = tmp_path / "p"
    (d / "v0000000002.pt.json").unlink()
    (d / "v0000000002.pt.json").mkdir()
    refs = store.versions("p")          # IsADirectoryError escaped
    assert [r.version for r in refs] == [1, 3]


def test_latest_falls_back_when_latest_json_is_a_symlink_out_of_root(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    store = _store(root)
    latest = root / "p" / "latest.json"
    latest.unlink()
    os.symlink("/etc/hostname", latest)
    ref = store.latest("p")             # UnsafePathError escaped instead of the documented fallback
    assert ref.version == 3


def test_manifest_of_path_through_a_file_is_not_found(tmp_path):
    store = _store(tmp_path)
    with pytest.raises(CheckpointError):   # NotADirectoryError escaped
        store.manifest("p/v0000000001.pt/x.pt")


def test_manifest_path_with_lone_surrogate_is_refused_as_corrupt(tmp_path):
    store = _store(tmp_path)
    latest = tmp_path / "p" / "latest.json"
    body = json.loads(latest.read_text())
    body["path"] = "p/\ud800.pt"                 # valid JSON ("\\ud800" escape), not encodable as a file name
    latest.unlink()
    latest.write_text(json.dumps(body))
    ref = store.latest("p")  # the damaged latest.json is left for the newest version manifest
    assert ref.version == 3 and store.load_latest("p").ref.version == 3  # (a UnicodeEncodeError escaped)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.complex64])
def test_a_tensor_a_load_cannot_give_back_is_refused_at_publish(tmp_path, dtype):
    store = CheckpointStore(tmp_path)
    with pytest.raises(ValueError, match="dtype .* is not allowed"):
        store.publish("p", {"w": torch.zeros(3, dtype=dtype)}, 1)
    with pytest.raises(ValueError, match="only dense tensors"):
        store.publish("p", {"w": torch.zeros(3, 3).to_sparse()}, 1)
    store.publish("p", {"w": torch.zeros(3)}, 1)  # a dense float32 tensor is fine
    assert store.load_latest("p").tensors["w"].shape == (3,)
    store.close()


def test_a_version_removed_on_another_machine_while_read_over_nfs_is_not_found(tmp_path, monkeypatch):
    """NFS answers ESTALE to a read of a file another client removed (retention); the readers that walk on to
    the newest version (load_latest) retry on not-found, but a raw OSError ended them."""
    import errno

    from common import checkpoint_store
    from common.checkpoint_store import CheckpointNotFoundError

    store = _store(tmp_path)

    def stale(*_args):
        raise OSError(errno.ESTALE, "Stale file handle")

    monkeypatch.setattr(checkpoint_store.os, "preadv", stale)
    with pytest.raises(CheckpointNotFoundError, match="removed while being read"):
        store.load("p/v0000000003.pt")


def _in_thread(fn, timeout_s: float = 20.0):
    """fn() in a daemon thread: (finished, result or exception). A plain open of a FIFO waits for a writer for
    ever, so the test must not run it on its own thread."""
    import threading
    box: list = []

    def run():
        try:
            box.append(fn())
        except BaseException as err:  # noqa: BLE001 (handed back to the test)
            box.append(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout_s)
    return (not thread.is_alive()), (box[0] if box else None)


def test_a_fifo_where_the_weights_should_be_is_refused_at_once_not_waited_on(tmp_path):
    """An actor or learner reading it waited for a writer for ever (a hung job the heartbeat kept alive)."""
    store = _store(tmp_path)
    weights = tmp_path / "p" / "v0000000003.pt"
    weights.unlink()
    os.mkfifo(weights)
    finished, result = _in_thread(lambda: store.load("p/v0000000003.pt", 3))
    assert finished, "the load blocked on the FIFO"
    assert isinstance(result, CheckpointError) and "FIFO" in str(result), result
    finished, result = _in_thread(lambda: store.verify("p/v0000000003.pt"))
    assert finished and isinstance(result, CheckpointError), result


def test_a_fifo_for_a_manifest_is_a_damaged_version(tmp_path):
    store = _store(tmp_path)
    latest = tmp_path / "p" / "latest.json"
    manifest = tmp_path / "p" / "v0000000002.pt.json"
    for path in (latest, manifest):
        path.unlink()
        os.mkfifo(path)
    finished, result = _in_thread(lambda: (store.latest("p").version, [r.version for r in store.versions("p")]))
    assert finished, "reading a manifest blocked on the FIFO"
    assert result == (3, [1, 3]), result
