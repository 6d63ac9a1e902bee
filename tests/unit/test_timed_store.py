"""TimedCheckpointStore: every read and publish of a worker's checkpoint store is timed, with no call site to
forget (the lease keepers of both workers watch its clock for I/O that hangs)."""

from __future__ import annotations

import contextlib
import inspect
import threading
from collections.abc import Iterator

import numpy as np

from common.busy_clock import BusyClock
from common.checkpoint_store import CheckpointStore
from common.timed_store import TimedCheckpointStore

UNTIMED = {"version_path", "wait_for_retention", "close", "pin", "unpin", "prune", "adopt", "publish_at"}
"""Names, retention, pins, adopting a copied checkpoint and publishing a free-standing one: no read of a
checkpoint a worker waits on (pin/unpin/prune are the coordinator's, as `adopt` is at its start, `publish_at` is
`league import`'s, and `pin` reads through `manifest`, which is timed)."""


class CountingClock(BusyClock):
    """Counts the outermost timed blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = 0

    @contextlib.contextmanager
    def timed(self) -> Iterator[None]:
        outermost = self._since is None
        with super().timed():
            if outermost:
                self.blocks += 1
            yield


def test_every_public_io_method_of_the_store_is_timed():
    public = {name for name, _ in inspect.getmembers(CheckpointStore, inspect.isfunction) if not name.startswith("_")}
    overridden = {name for name in public if TimedCheckpointStore.__dict__.get(name) is not None}
    assert public - UNTIMED == overridden - {"busy_s"}, "a new store method must be timed, or listed in UNTIMED"


def test_each_call_is_one_timed_block_however_many_reads_it_makes(tmp_path):
    clock = CountingClock()
    store = TimedCheckpointStore(tmp_path, clock=clock)
    weights = {"w": np.arange(4, dtype=np.float32)}
    ref = store.publish("p", weights, 1, training_state={"step": 3})
    calls = [
        lambda: store.latest("p"),
        lambda: store.manifest(ref.path),
        lambda: store.versions("p"),
        lambda: store.versions_on_disk("p"),
        lambda: store.load(ref.path, 1),
        lambda: store.load_training_state(ref.path, 1),
        lambda: store.load_latest("p"),  # latest + load inside: one block
        lambda: store.verify(ref.path),
        lambda: store.snapshot(ref.path, "p/v0000000001_10.pt"),
    ]
    assert clock.blocks == 1  # the publish
    for n, call in enumerate(calls, start=2):
        call()
        assert clock.blocks == n
        assert clock.busy_s() == 0.0
    assert np.array_equal(store.load_latest("p").tensors["w"], weights["w"])


def test_another_thread_sees_a_read_that_hangs(tmp_path, monkeypatch):
    store = TimedCheckpointStore(tmp_path)
    ref = store.publish("p", {"w": np.zeros(2, dtype=np.float32)}, 1)
    entered, release = threading.Event(), threading.Event()
    real_load = CheckpointStore.load

    def hanging_load(self, path, expected_version=None):
        entered.set()
        release.wait(30)
        return real_load(self, path, expected_version)

    monkeypatch.setattr(CheckpointStore, "load", hanging_load)
    reader = threading.Thread(target=store.load, args=(ref.path,))
    reader.start()
    try:
        assert entered.wait(10)
        assert store.busy_s() > 0.0
    finally:
        release.set()
        reader.join(10)
    assert store.busy_s() == 0.0


def test_later_stores_of_the_same_worker_share_its_clock(tmp_path):
    clock = BusyClock()
    assert TimedCheckpointStore(tmp_path, clock=clock).clock is TimedCheckpointStore(tmp_path, clock=clock).clock
