"""One writer publishing in a loop, readers in threads and in another process loading in a loop:
no reader ever gets a torn or mismatched checkpoint, and each sees versions only move forward."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import threading

import numpy as np
import pytest

from common.checkpoint_store import CheckpointStore

ROOT = pathlib.Path(__file__).resolve().parents[2]
FINAL_VERSION = 30
SHAPES = {"a": (256, 256), "b": (256, 512), "c": (1024,)}  # ~0.8 MB per checkpoint: loads read into memory
LARGE_SHAPES = {"a": (256, 256), "b": (256, 512), "c": (1_200_000,)}  # ~5.6 MB: hashed on the helper thread


def tensors_for(version: int, shapes=SHAPES) -> dict[str, np.ndarray]:
    return {name: np.full(shape, version, np.float32) for name, shape in shapes.items()}


def check(checkpoint, shapes=SHAPES) -> str | None:
    """A mismatch description, or None when every tensor carries the manifest's version."""
    version = checkpoint.ref.version
    for name, shape in shapes.items():
        array = checkpoint.tensors.get(name)
        if array is None or array.shape != shape or not np.all(array == version):
            return f"version {version}: tensor {name} does not match"
    return None


READER_SCRIPT = """
import json, sys, time
import numpy as np
from common.checkpoint_store import CheckpointStore
store = CheckpointStore(sys.argv[1], keep_last=2)
final, deadline = int(sys.argv[2]), time.monotonic() + 120
loads, last, errors = 0, -1, []
while last < final and time.monotonic() < deadline:
    checkpoint = store.load_latest("player")
    if checkpoint is None:
        continue
    loads += 1
    version = checkpoint.ref.version
    if version < last:
        errors.append(f"went back from {last} to {version}")
    if any(not np.all(a == version) for a in checkpoint.tensors.values()) or len(checkpoint.tensors) != 3:
        errors.append(f"version {version}: mismatched tensors")
    last = version
print(json.dumps({"loads": loads, "last": last, "errors": errors}))
"""


@pytest.mark.parametrize("shapes", [SHAPES, LARGE_SHAPES], ids=["small", "large"])
def test_readers_never_see_torn_or_mismatched_checkpoints(tmp_path, shapes):
    store = CheckpointStore(tmp_path, keep_last=2)  # aggressive retention: files vanish under readers
    store.publish("player", tensors_for(0, shapes), 0)
    stop = threading.Event()  # the writer failed, or the test ends: readers that wait for the final version stop
    errors: list[str] = []
    loads = [0] * 3

    def writer() -> None:
        try:
            for version in range(1, FINAL_VERSION + 1):
                store.publish("player", tensors_for(version, shapes), version)
        except BaseException as e:  # reported by the assertion below
            errors.append(f"writer: {e!r}")
            stop.set()

    def reader(index: int) -> None:
        reader_store = CheckpointStore(tmp_path, keep_last=2)
        last = -1
        try:
            while last < FINAL_VERSION and not stop.is_set():
                checkpoint = reader_store.load_latest("player")
                loads[index] += 1
                if checkpoint.ref.version < last:
                    errors.append(f"reader {index}: went back from {last} to {checkpoint.ref.version}")
                if (problem := check(checkpoint, shapes)) is not None:
                    errors.append(f"reader {index}: {problem}")
                last = checkpoint.ref.version
        except BaseException as e:
            errors.append(f"reader {index}: {e!r}")

    process = subprocess.Popen(
        [sys.executable, "-c", READER_SCRIPT, str(tmp_path), str(FINAL_VERSION)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        threads = [threading.Thread(target=reader, args=(i,), daemon=True) for i in range(3)]
        for t in threads:
            t.start()
        writer_thread = threading.Thread(target=writer)
        writer_thread.start()
        writer_thread.join(120)
        for t in threads:
            t.join(120)
        out, err = process.communicate(timeout=150)
    finally:
        stop.set()
        if process.poll() is None:
            process.kill()
            process.wait()
    assert not errors, errors[:5]
    assert not any(t.is_alive() for t in threads)
    assert all(n > 0 for n in loads)
    assert process.returncode == 0, err
    result = json.loads(out)
    assert result["errors"] == [] and result["last"] == FINAL_VERSION and result["loads"] > 0
    assert [r.version for r in store.versions("player")] == [FINAL_VERSION - 1, FINAL_VERSION]
