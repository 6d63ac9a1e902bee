"""The actor's side of env faults, piece by piece: every job gets a fresh env retry budget, env workers leave
SIGTERM to their parent, FinishJob's error carries the traceback, FlakyEnv is built by name from a config."""

from __future__ import annotations

import os
import signal
from functools import partial

import pytest

from actor_service.actor import ActorSettings, bounded_text, failure_text
from actor_service.envs import (
    BaseEnvManager,
    EnvError,
    EnvManagerConfig,
    SubprocessEnvManager,
    SubprocessEnvManagerConfig,
)
from common.envs.policy_view import UnsupportedEnvError
from common.envs.registry import make_env
from tests.env_doubles import CountingEnv, FlakyEnv, InjectedEnvFault

TEN_STEPS = {"inner": "python:tests.env_doubles:CountingEnv", "inner_kwargs": {"length": 10}}


@pytest.fixture(autouse=True)
def fresh_step_count():
    """FlakyEnv counts steps per process; tests in this process start from 0."""
    FlakyEnv._process_steps = 0
    yield
    FlakyEnv._process_steps = 0


def play(manager: BaseEnvManager, steps: int) -> int:
    """Step every ready env `steps` times; returns the env failures seen (episodes cut short)."""
    failures = 0
    for _ in range(steps):
        for ts in manager.step(dict.fromkeys(manager.ready_env, 0)).values():
            failures += ts.info.failure is not None
    return failures


def test_every_reset_starts_a_fresh_retry_budget():
    """An env failing at every 5th step, max_retry=1: a "job" of 5 steps meets one failure, within budget;
    without the reset between two such jobs the second failure would exceed it."""
    factory = partial(FlakyEnv, crash_every=5, **TEN_STEPS)
    with BaseEnvManager([factory], EnvManagerConfig(max_retry=1)) as manager:
        manager.launch()
        assert play(manager, 5) == 1
        manager.reset()
        assert manager.failure_counts == {0: 0}
        assert play(manager, 5) == 1
        manager.reset()
        with pytest.raises(EnvError, match="more than max_retry=1"):
            play(manager, 10)  # two failures in one job: over budget


def test_env_workers_leave_sigterm_to_their_parent():
    """SIGTERM to an actor's process group must not kill its env workers mid-step: the actor finishes the
    step, releases its job and closes them itself."""
    manager = SubprocessEnvManager([CountingEnv, CountingEnv], SubprocessEnvManagerConfig(num_workers=2,
                                                                                          wait_num=2))
    try:
        manager.launch()
        pids = manager.worker_pids
        for pid in pids:
            os.kill(pid, signal.SIGTERM)
        assert play(manager, 5) == 0
        assert manager.worker_pids == pids and manager.failure_counts == {0: 0, 1: 0}
    finally:
        manager.close()
    assert not [pid for pid in pids if os.path.exists(f"/proc/{pid}")]


def test_a_failed_jobs_error_carries_the_traceback():
    def deep() -> None:
        raise KeyError("the missing piece")

    try:
        deep()
    except KeyError as err:
        text = failure_text(err)
    assert text.startswith("Traceback") and "in deep" in text and text.endswith("KeyError: 'the missing piece'")
    env_error = EnvError("env 0 failed 3 time(s)\n--- env traceback ---\nTraceback ...\nValueError: x", 0)
    assert failure_text(env_error) == f"EnvError: {env_error}"  # the env's own traceback is in its message
    # The manager knows its envs by index: the actor names the env.
    assert failure_text(env_error, "python:my_envs:Racer") == f"EnvError (python:my_envs:Racer): {env_error}"
    unsupported = UnsupportedEnvError("env 'FrozenLake-v1': its observation is one integer")
    assert failure_text(unsupported) == f"UnsupportedEnvError: {unsupported}"  # a config problem, no traceback
    long = "First line\n" + "x" * 10_000 + "\nValueError: the cause"
    cut = bounded_text(long, 4096)
    assert len(cut) == 4096 and cut.startswith("First line") and cut.endswith("ValueError: the cause")


def test_flaky_env_by_name_from_a_config():
    env = make_env("python:tests.env_doubles:FlakyEnv", crash_every=3, **TEN_STEPS)
    env.reset()
    env.step(0)
    env.step(0)
    with pytest.raises(InjectedEnvFault, match="step 3"):
        env.step(0)
    with pytest.raises(ValueError, match="crash_every"):
        FlakyEnv(crash_every=-1)
    with pytest.raises(ValueError, match="cannot import 'Nope'"):
        make_env("python:tests.env_doubles:Nope")
    with pytest.raises(ValueError, match="expected python:<module>:<callable>"):
        make_env("python:tests.env_doubles")
    with pytest.raises(TypeError, match="not an Env"):
        make_env("python:tests.env_doubles:InjectedEnvFault")


@pytest.mark.parametrize(("field", "value"), [("env_max_retry", -1), ("env_step_timeout_s", 0.0),
                                              ("env_reset_timeout_s", -5.0)])
def test_bad_env_fault_settings_name_the_field(tmp_path, field, value):
    with pytest.raises(ValueError, match=field):
        ActorSettings(coordinator="127.0.0.1:1", shared_root=tmp_path, **{field: value})
