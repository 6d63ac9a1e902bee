"""IdleStreamGuard: a wait for a client's next chunk that lasts too long cancels the stream; other waits don't."""

from __future__ import annotations

import threading
import time

import pytest

from learner_service.idle_streams import IdleStreamGuard
from tests.manual_clock import ManualClock


def _quiet_after(items, release: threading.Event):
    yield from items
    release.wait(30)


def test_a_quiet_stream_is_cancelled_and_the_items_before_it_pass():
    guard = IdleStreamGuard(0.2)
    release = threading.Event()
    cancelled = threading.Event()

    def cancel():
        cancelled.set()
        release.set()  # as gRPC does: the cancelled call's iterator ends

    got = list(guard.watch(_quiet_after([1, 2], release), cancel, peer="ipv4:127.0.0.1:1"))
    assert got == [1, 2]
    assert cancelled.is_set()
    assert guard.streams_ended == 1


def test_a_stream_that_keeps_sending_is_not_cancelled_however_long_it_lasts():
    # A clock the test moves: on the real one, with a 0.05 s sleep between chunks against a 0.2 s limit, one sleep
    # under CPU load (2 cores, load average ~15) woke past the limit and the steady stream was cancelled. A
    # thread's late wake-up is not the client going quiet.
    clock = ManualClock()
    guard = IdleStreamGuard(0.2, clock=clock)

    def steady():  # 8 waits of 0.05 s each: 0.4 s in all, twice the limit
        for i in range(8):
            time.sleep(0.05)  # real time too, for the watcher thread to run meanwhile
            clock.now += 0.05
            yield i

    assert list(guard.watch(steady(), lambda: pytest.fail("cancelled a stream that kept sending"))) == list(range(8))
    assert guard.streams_ended == 0


def test_time_the_caller_spends_on_an_item_is_not_idle_time():
    # A stream blocked on the learner's own full queue (backpressure) between two chunks is not quiet.
    clock = ManualClock()
    guard = IdleStreamGuard(0.1, clock=clock)
    seen = []
    for item in guard.watch(iter([1, 2]), lambda: pytest.fail("cancelled during the caller's own wait")):
        time.sleep(0.3)  # real time too, for the watcher thread to run meanwhile
        clock.now += 0.3
        seen.append(item)
    assert seen == [1, 2]


def test_only_the_quiet_one_of_several_streams_is_cancelled():
    clock = ManualClock()
    guard = IdleStreamGuard(0.3, clock=clock)
    release = threading.Event()
    cancelled = []

    def busy():  # 1 s in all: the quiet stream's 0.3 s run out meanwhile
        for i in range(20):
            time.sleep(0.05)
            clock.now += 0.05
            yield i

    quiet_waiting = threading.Event()

    def quiet():
        yield 0
        quiet_waiting.set()  # inside the wait for the next chunk: its deadline is set, on the clock busy() moves
        release.wait(30)

    quiet_done = threading.Thread(target=lambda: list(guard.watch(
        quiet(), lambda: (cancelled.append("quiet"), release.set()))))
    quiet_done.start()
    assert quiet_waiting.wait(30)
    assert list(guard.watch(busy(), lambda: cancelled.append("busy"))) == list(range(20))
    quiet_done.join(10)
    assert cancelled == ["quiet"]


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), float("nan")])
def test_a_bad_limit_is_refused(bad):
    with pytest.raises(ValueError, match="idle_s"):
        IdleStreamGuard(bad)
