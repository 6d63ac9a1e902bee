"""BusyClock: how long the operation under way has taken, read from another thread."""

from __future__ import annotations

import threading
import time

import pytest

from common.busy_clock import BusyClock


def test_idle_is_zero_and_a_block_counts_from_its_start():
    clock = BusyClock()
    assert clock.busy_s() == 0.0
    with clock.timed():
        time.sleep(0.05)
        assert clock.busy_s() >= 0.05
    assert clock.busy_s() == 0.0


def test_a_nested_block_does_not_restart_the_count_and_an_error_still_ends_it():
    clock = BusyClock()
    with pytest.raises(RuntimeError), clock.timed():
        time.sleep(0.05)
        with clock.timed():  # a timed call inside a timed call (a store read inside a load)
            assert clock.busy_s() >= 0.05
        assert clock.busy_s() >= 0.05  # the inner block's end did not end the outer one
        raise RuntimeError("the read failed")
    assert clock.busy_s() == 0.0


def test_another_thread_sees_an_operation_that_hangs():
    clock, release, entered = BusyClock(), threading.Event(), threading.Event()

    def hangs():
        with clock.timed():
            entered.set()
            release.wait(30)

    worker = threading.Thread(target=hangs)
    worker.start()
    try:
        assert entered.wait(30)
        time.sleep(0.05)
        assert clock.busy_s() >= 0.05
    finally:
        release.set()
        worker.join(30)
    assert clock.busy_s() == 0.0
