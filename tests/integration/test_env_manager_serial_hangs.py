"""BaseEnvManager and hung envs: the watchdog thread interrupts an env past `step_timeout`/`reset_timeout` (a
signal in the main thread, an async exception elsewhere), the env counts as failed and is rebuilt; what no
interrupt reaches (a blocking wait outside the main thread) shows in `stalled_s` and counts once it returns.
Real threads, real signals; nothing here is timed (timeouts are short only so the tests end soon)."""

from __future__ import annotations

import logging
import signal
import threading
import time
from functools import partial

import pytest

from actor_service.envs import BaseEnvManager, EnvError, EnvManagerConfig, EnvState
from actor_service.envs.env_manager.watchdog import INTERRUPT_SIGNAL, EnvHangInterrupt
from common.envs import TimeStep
from tests.env_doubles import HANGS_RELEASED, CountingEnv, FlakyEnv
from tests.polling import wait_until

TEN_STEPS = {"inner": "python:tests.env_doubles:CountingEnv", "inner_kwargs": {"length": 10}}
TIMEOUT_S = 0.3


@pytest.fixture(autouse=True)
def fresh_flaky_envs():
    """FlakyEnv counts steps per process and hangs until released; every test starts from 0, unreleased."""
    FlakyEnv._process_steps = 0
    HANGS_RELEASED.clear()
    yield
    HANGS_RELEASED.set()  # let anything still hung return
    FlakyEnv._process_steps = 0


@pytest.fixture
def managers():
    """Builds serial managers with short timeouts; closes them and checks that no watchdog thread is left."""
    built: list[BaseEnvManager] = []

    def make(env_fns, **config) -> BaseEnvManager:
        config = {"step_timeout": TIMEOUT_S, "reset_timeout": TIMEOUT_S, "max_retry": 2, **config}
        manager = BaseEnvManager(env_fns, EnvManagerConfig(**config))
        built.append(manager)
        return manager

    try:
        yield make
    finally:
        HANGS_RELEASED.set()
        for manager in built:
            manager.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("env-watchdog")], "watchdog thread left"


def play(manager: BaseEnvManager, steps: int) -> list[TimeStep]:
    """Step every ready env `steps` times; returns the timesteps of episodes cut by a failure."""
    failed = []
    for _ in range(steps):
        failed += [ts for ts in manager.step(dict.fromkeys(manager.ready_env, 0)).values() if ts.info.failure]
    return failed


def in_thread(fn, *args):
    """Run `fn(*args)` in a new thread; returns (thread, outcome) where outcome fills with the result or error."""
    outcome: dict = {}

    def target() -> None:
        try:
            outcome["result"] = fn(*args)
        except BaseException as exc:  # handed to the test thread
            outcome["error"] = exc

    thread = threading.Thread(target=target, name="stepping", daemon=True)  # a hang fails the test, not the run
    thread.start()
    return thread, outcome


def joined(thread: threading.Thread) -> None:
    """Wait for a stepping thread; one still stuck after a minute is a watchdog that failed."""
    thread.join(60)
    assert not thread.is_alive(), "the stepping thread is still stuck"


@pytest.mark.parametrize("hang_kind", ["wait", "spin"])
def test_a_hang_in_the_main_thread_is_interrupted_and_the_env_rebuilt(managers, hang_kind, caplog):
    caplog.set_level(logging.WARNING)
    hung = partial(FlakyEnv, hang_every=3, hang_kind=hang_kind, **TEN_STEPS)
    manager = managers([hung, CountingEnv])
    manager.launch()
    failed = play(manager, 3)  # FlakyEnv's 3rd step hangs
    assert len(failed) == 1 and failed[0].truncated and "hung" in failed[0].info.failure, failed
    assert manager.failure_counts == {0: 1, 1: 0}
    assert manager.env_states == {0: EnvState.RUN, 1: EnvState.RUN} and manager.ready_env == [0, 1]
    assert play(manager, 2) == []  # the rebuilt env plays on (steps 4 and 5)
    assert "signalled the main thread" in caplog.text and manager.stalled_s() == 0.0


def test_a_hang_in_python_code_outside_the_main_thread_is_interrupted(managers, caplog):
    caplog.set_level(logging.WARNING)
    manager = managers([partial(FlakyEnv, hang_every=2, hang_kind="spin", **TEN_STEPS)])

    def launch_and_play() -> list[TimeStep]:
        manager.launch()  # launched here too: only the main thread can take a signal
        return play(manager, 3)

    thread, outcome = in_thread(launch_and_play)
    joined(thread)
    assert "error" not in outcome, outcome
    (failed,) = outcome["result"]
    assert "hung" in failed.info.failure and manager.failure_counts == {0: 1}
    assert "raised EnvHangInterrupt in thread" in caplog.text


def test_a_blocked_env_outside_the_main_thread_shows_as_stalled_and_fails_once_it_returns(managers, caplog):
    """A lock wait in another thread is out of any interrupt's reach: the step stays stuck, `stalled_s` grows
    (what the actor's heartbeat watches), and when the env does return it counts as hung and is rebuilt."""
    caplog.set_level(logging.WARNING)
    manager = managers([partial(FlakyEnv, hang_every=2, hang_kind="wait", **TEN_STEPS), CountingEnv])
    manager.launch()
    play(manager, 1)
    thread, outcome = in_thread(play, manager, 1)  # FlakyEnv's 2nd step blocks
    wait_until("the watchdog to report the hang it cannot break", lambda: "no interrupt gets in" in caplog.text,
               30, lambda: caplog.text)
    assert thread.is_alive() and manager.stalled_s() > 0
    HANGS_RELEASED.set()
    joined(thread)
    assert "error" not in outcome, outcome
    (failed,) = outcome["result"]
    assert "hung" in failed.info.failure and manager.failure_counts == {0: 1, 1: 0}
    assert manager.stalled_s() == 0.0 and manager.ready_env == [0, 1]
    assert play(manager, 2) == []


class ResetHangEnv(CountingEnv):
    """Episodes of 2 steps; resets number `hang_at` (counted over all instances, from 1) block until released."""

    resets = 0

    def __init__(self, hang_at: tuple[int, ...]) -> None:
        super().__init__(length=2)
        self._hang_at = hang_at

    def reset(self, length: int | None = None):
        ResetHangEnv.resets += 1
        if ResetHangEnv.resets in self._hang_at:
            HANGS_RELEASED.wait()
        return super().reset(length)


def test_hung_resets_at_launch_and_after_an_episode_are_interrupted(managers):
    ResetHangEnv.resets = 0
    manager = managers([partial(ResetHangEnv, hang_at=(1, 4))], max_retry=2)
    manager.launch()  # reset 1 hangs: rebuilt, reset 2 starts the episode
    assert manager.failure_counts == {0: 1} and manager.ready_env == [0]
    play(manager, 1)
    last = manager.step({0: 0})[0]  # the episode ends; the automatic reset (3) works
    assert last.terminated and last.info.failure is None
    play(manager, 1)
    last = manager.step({0: 0})[0]  # the next automatic reset (4) hangs: the env is rebuilt (reset 5)
    assert last.terminated and manager.failure_counts == {0: 2} and manager.ready_env == [0]
    assert ResetHangEnv.resets == 5


class SwallowingEnv(CountingEnv):
    """Catches everything, the interrupt included, and carries on: still a hang."""

    def step(self, action: int) -> TimeStep:
        try:
            HANGS_RELEASED.wait()
        except BaseException:
            pass
        return super().step(action)


def test_an_env_that_swallows_the_interrupt_still_counts_as_hung(managers):
    manager = managers([SwallowingEnv], max_retry=1)
    manager.launch()
    (failed,) = play(manager, 1)
    assert "hung" in failed.info.failure and manager.failure_counts == {0: 1}


def test_hangs_past_max_retry_raise_with_where_the_env_hung_and_close(managers):
    manager = managers([partial(FlakyEnv, hang_every=1, **TEN_STEPS)], max_retry=1)
    manager.launch()
    assert signal.getsignal(INTERRUPT_SIGNAL) is not signal.SIG_DFL
    with pytest.raises(EnvError, match="more than max_retry=1") as raised:
        play(manager, 3)
    assert "hung" in str(raised.value) and "_hang" in str(raised.value)  # the env's traceback: where it hung
    assert isinstance(raised.value.__cause__, EnvHangInterrupt)
    assert manager.closed
    assert signal.getsignal(INTERRUPT_SIGNAL) is signal.SIG_DFL  # the handler is given back


class JitterEnv(CountingEnv):
    """Steps that take about as long as the timeout: some finish just in time, some just too late."""

    def step(self, action: int) -> TimeStep:
        time.sleep(self._rng.uniform(0.0, 0.003))
        return super().step(action)


@pytest.mark.parametrize("where", ["main thread", "other thread"])
def test_interrupts_never_escape_when_steps_end_at_the_deadline(managers, where):
    """Steps ending right at their deadline race the watchdog; whichever wins, an interrupt surfaces only as
    that env's failure, never in the caller's code or in another env's step."""
    manager = managers([JitterEnv] * 3, step_timeout=0.002, max_retry=10**6)
    manager.seed(0)

    def run() -> int:
        manager.launch()
        failures = 0
        for _ in range(200):
            timesteps = manager.step(dict.fromkeys(manager.ready_env, 0))
            assert sorted(timesteps) == [0, 1, 2] and manager.ready_env == [0, 1, 2]
            failures += sum(ts.info.failure is not None for ts in timesteps.values())
        busy = sum(range(100_000))  # plain Python code after the steps: a stray interrupt would land here
        return failures + 0 * busy

    if where == "main thread":
        failures = run()
    else:
        thread, outcome = in_thread(run)
        joined(thread)
        assert "error" not in outcome, outcome
        failures = outcome["result"]
    assert failures == sum(manager.failure_counts.values())
    manager.close()


def test_steps_do_not_wake_the_watchdog_thread(managers, monkeypatch):
    """Light env steps run back to back must not wake the watchdog thread each time (measured once: a
    wake-up per step cost ~10% of a CartPole step); only an operation with a shorter timeout than any
    before it does."""
    from actor_service.envs.env_manager.watchdog import Watchdog

    wakes = []
    poll_for = Watchdog.poll_for

    def counting(self, timeout_s):
        wakes.append(timeout_s)
        poll_for(self, timeout_s)

    monkeypatch.setattr(Watchdog, "poll_for", counting)
    manager = managers([CountingEnv] * 4, step_timeout=60.0, reset_timeout=300.0)
    manager.launch()
    play(manager, 500)  # 2,000 steps and, with CountingEnv's short episodes, many watched resets
    assert wakes == [300.0, 60.0]
