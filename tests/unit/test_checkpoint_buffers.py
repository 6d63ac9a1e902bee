"""Load buffers are recycled only once everything sharing their memory is gone."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

from common.checkpoint_buffers import POOLED_MIN_BYTES, LoadBuffers
from common.checkpoint_store import CheckpointStore


def test_a_buffer_returns_to_the_pool_when_its_last_user_is_gone():
    pool = LoadBuffers(keep=1)
    size = 3 * POOLED_MIN_BYTES + 5
    first = pool.take(size)
    assert first.nbytes == size and first.flags.writeable and first.dtype == np.uint8
    tensor = torch.frombuffer(first, dtype=torch.uint8)[10:20]  # like the tensors a load hands out
    array = tensor.numpy()
    address = first.__array_interface__["data"][0]
    del first, tensor
    gc.collect()
    assert pool.idle_bytes() == 0, "recycled while a numpy view of a tensor still uses the memory"
    second = pool.take(size)
    assert second.__array_interface__["data"][0] != address
    del array
    gc.collect()
    assert pool.idle_bytes() >= size
    third = pool.take(size - 1000)  # about the same size: the idle block is reused
    assert third.__array_interface__["data"][0] == address and pool.idle_bytes() == 0
    del second, third
    gc.collect()
    assert pool.idle_bytes() == 4 << 20  # keep=1: one idle block (sizes round up to 2 MiB), the other freed
    large = pool.take(POOLED_MIN_BYTES * 8)  # no idle block fits: fresh memory
    assert large.nbytes == POOLED_MIN_BYTES * 8 and pool.idle_bytes() == 4 << 20


def test_small_sizes_and_keep_zero_take_fresh_memory():
    pool = LoadBuffers(keep=2)
    small = pool.take(100)
    del small
    gc.collect()
    assert pool.idle_bytes() == 0
    none = LoadBuffers(keep=0)
    big = none.take(2 * POOLED_MIN_BYTES)
    del big
    gc.collect()
    assert none.idle_bytes() == 0
    with pytest.raises(ValueError, match="keep"):
        LoadBuffers(keep=-1)


def test_loads_reading_into_recycled_memory_stay_correct(tmp_path):
    store = CheckpointStore(tmp_path, keep_last=2)
    rng = np.random.default_rng(0)
    for version in range(1, 5):
        weights = {"w": rng.random(600_000, dtype=np.float32), "b": np.full(3, version, np.int64)}
        ref = store.publish("p", weights, version)
        first = store.load(ref.path).tensors
        first["w"][:] = -1.0  # a caller writing into its arrays, then dropping them
        address = first["w"].__array_interface__["data"][0]
        del first
        gc.collect()
        second = store.load(ref.path).tensors  # into the memory just dropped
        assert second["w"].__array_interface__["data"][0] == address
        np.testing.assert_array_equal(second["w"], weights["w"])
        np.testing.assert_array_equal(second["b"], weights["b"])
    store.close()
