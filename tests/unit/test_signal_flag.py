"""`SignalFlag` (and the actor's `StopSignal`, one of them): set from a signal handler that runs while the main
thread holds the flag's lock (inside `wait`, or inside an earlier handler's `set`), where `threading.Event`
waits for itself forever."""

import subprocess
import sys
import textwrap
import threading

import pytest

from common.signal_flag import SignalFlag

HANDLER_WHILE_LOCKED = textwrap.dedent("""
    import os, signal, sys, threading, time
    from actor_service.stop import StopSignal
    from common.signal_flag import SignalFlag
    flag = {"SignalFlag": SignalFlag, "StopSignal": StopSignal, "Event": threading.Event}[sys.argv[1]]()
    signal.signal(signal.SIGUSR1, lambda *_: flag.set())
    with flag._cond:  # the moment a nested handler meets: this thread holds the lock
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.05)  # the handler runs here, on this thread
    assert flag.wait(5)
    print("set")
""")


def _run(kind: str, timeout_s: float) -> subprocess.CompletedProcess[str] | None:
    try:
        return subprocess.run([sys.executable, "-c", HANDLER_WHILE_LOCKED, kind], capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:  # subprocess.run kills the hung child
        return None


@pytest.mark.parametrize("kind", ["SignalFlag", "StopSignal"])
def test_a_handler_can_set_it_while_the_main_thread_holds_its_lock(kind):
    done = _run(kind, 30)
    assert done is not None and done.returncode == 0 and done.stdout.strip() == "set", done


def test_threading_event_hangs_there_which_is_why_the_flag_exists():
    assert _run("Event", 5) is None  # the same script, hung


def test_set_wakes_a_waiter_in_another_thread_and_wait_times_out_otherwise():
    flag = SignalFlag()
    assert flag.wait(0.01) is False and not flag.is_set()
    waiter_saw: list[bool] = []
    waiter = threading.Thread(target=lambda: waiter_saw.append(flag.wait(30)))
    waiter.start()
    flag.set()
    waiter.join(30)
    assert waiter_saw == [True] and flag.is_set() and flag.wait() is True


def test_setting_twice_is_harmless():
    flag = SignalFlag()
    flag.set()
    flag.set()
    assert flag.is_set()
