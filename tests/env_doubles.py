"""A tiny deterministic env the env-manager tests drive through real managers (moolib/TorchBeast style).

Shared by the serial and subprocess manager tests so both check the same behaviour on the same env; it lives
in an importable module so spawned env workers can unpickle it.
"""

from __future__ import annotations

import os
import threading

import numpy as np

from common.envs import NO_INFO, ArraySpec, DiscreteSpec, Env, EnvInfo, EpisodeStats, StepInfo, TimeStep


class CountingEnv(Env):
    """Observation [t, episode, noise]; an episode lasts `length` steps (reset param `length` overrides);
    reward is action + noise; `step_delay` (seconds, an Event wait) makes the env slow."""

    def __init__(self, length: int = 3, step_delay: float = 0.0) -> None:
        self._default_length = length
        self._step_delay = step_delay
        self._rng = np.random.default_rng()
        self._episode = -1
        self._t = 0
        self._length = length

    def info(self) -> EnvInfo:
        return EnvInfo("counting", ArraySpec((3,), np.float32), DiscreteSpec(3))

    def seed(self, seed: int) -> None:
        self._rng = np.random.default_rng(seed)

    def reset(self, length: int | None = None) -> np.ndarray:
        self._episode += 1
        self._t = 0
        self._length = length or self._default_length
        return self._obs()

    def step(self, action: int) -> TimeStep:
        if self._step_delay:
            threading.Event().wait(self._step_delay)
        self._t += 1
        obs = self._obs()
        done = self._t >= self._length
        info = StepInfo(episode=EpisodeStats(float(self._t), self._t)) if done else NO_INFO
        return TimeStep(obs, float(action) + float(obs[2]), done, False, info)

    def _obs(self) -> np.ndarray:
        return np.array([self._t, self._episode, self._rng.random()], np.float32)


HANGS_RELEASED = threading.Event()
"""Set by a test to let the hung FlakyEnvs of its process return (and clear it afterwards)."""


class InjectedEnvFault(RuntimeError):
    """What a FlakyEnv raises: an env bug, as far as the env manager and the actor can tell."""


class FlakyEnv(Env):
    """A real env (`make_env(inner, **inner_kwargs)`) that raises InjectedEnvFault at every `crash_every`-th
    step and hangs at every `hang_every`-th (0: never) until HANGS_RELEASED is set (never, in an env worker
    process). Steps are counted per process, over every FlakyEnv in it: a rebuilt env carries on the count of
    the one it replaces (so faults keep their rhythm), a restarted env worker process starts from 0.
    `crash_every=1`: no step ever succeeds.

    `hang_kind`: "wait" blocks in a lock wait (like an env waiting on a socket: the serial manager interrupts
    it only in the main thread), "spin" loops in Python code (interruptible in any thread). The subprocess
    manager kills the worker of either after `step_timeout`. `hang_marker`: a file created as a hang begins
    (for tests in another process). `build_s`: seconds the env takes to build (a wait, like an env loading its
    assets).

    A league config names it like any env, e.g. `env: {name: "python:tests.env_doubles:FlakyEnv", kwargs:
    {inner: CartPole-v1, crash_every: 50}}`; every env worker process builds it by that name.
    """

    _process_steps = 0  # steps taken by the FlakyEnvs of this process

    def __init__(self, inner: str = "CartPole-v1", crash_every: int = 0, hang_every: int = 0,
                 inner_kwargs: dict | None = None, hang_kind: str = "wait", build_s: float = 0.0,
                 hang_marker: str = "") -> None:
        from common.envs.registry import make_env

        if build_s:
            threading.Event().wait(build_s)
        for name, value in (("crash_every", crash_every), ("hang_every", hang_every)):
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{name}: must be an int >= 0, got {value!r}")
        if hang_kind not in ("wait", "spin"):
            raise ValueError(f"hang_kind: must be 'wait' or 'spin', got {hang_kind!r}")
        self._env = make_env(inner, **(inner_kwargs or {}))
        self._crash_every = crash_every
        self._hang_every = hang_every
        self._hang_kind = hang_kind
        self._hang_marker = hang_marker

    def info(self) -> EnvInfo:
        return self._env.info()

    def seed(self, seed: int) -> None:
        self._env.seed(seed)

    def reset(self, **params):
        return self._env.reset(**params)

    def step(self, action) -> TimeStep:
        FlakyEnv._process_steps += 1
        steps = FlakyEnv._process_steps
        if self._hang_every and steps % self._hang_every == 0:
            self._hang()
        if self._crash_every and steps % self._crash_every == 0:
            raise InjectedEnvFault(f"injected env fault at step {steps} of this process (every {self._crash_every})")
        return self._env.step(action)

    def close(self) -> None:
        self._env.close()

    def _hang(self) -> None:
        if self._hang_marker:
            open(self._hang_marker, "a").close()
        if self._hang_kind == "wait":
            HANGS_RELEASED.wait()
            return
        spins = 0
        while not HANGS_RELEASED.is_set():
            spins += 1


def hanging_constructor(**kwargs):
    """An env whose constructor waits (for a simulator, say) until a test sets HANGS_RELEASED: a CountingEnv then."""
    HANGS_RELEASED.wait()
    return CountingEnv(**kwargs)


class HangingCloseEnv(CountingEnv):
    """A CountingEnv whose close waits until a test sets HANGS_RELEASED."""

    def close(self) -> None:
        HANGS_RELEASED.wait()


def flat_frozen_lake(**kwargs):
    """FrozenLake-v1 (a Discrete observation no model takes) one-hot, as a user's `python:` env would give it:
    a gymnasium env, not an `Env`."""
    import gymnasium
    from gymnasium.wrappers import FlattenObservation

    return FlattenObservation(gymnasium.make("FrozenLake-v1", **kwargs))


def copy_digits(**kwargs):
    """A gymnasium env with a MultiDiscrete action: copy the two digits the observation shows (one-hot, 3 and 4
    values), one point per digit copied, one step per episode."""
    import gymnasium

    class CopyDigits(gymnasium.Env):
        observation_space = gymnasium.spaces.Box(0.0, 1.0, (7,), np.float32)
        action_space = gymnasium.spaces.MultiDiscrete([3, 4])

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.digits = (int(self.np_random.integers(3)), int(self.np_random.integers(4)))
            obs = np.zeros(7, np.float32)
            obs[self.digits[0]] = obs[3 + self.digits[1]] = 1.0
            return obs, {}

        def step(self, action):
            reward = float(sum(int(a) == d for a, d in zip(action, self.digits, strict=True)))
            return self.reset()[0], reward, True, False, {}

    return CopyDigits(**kwargs)


class UndecodableErrorEnv(CountingEnv):
    """A CountingEnv whose step fails naming a file whose name is no UTF-8 (os.fsdecode keeps the byte as a
    surrogate escape), as an env reading `caf\\xe9.bin` from a Latin-1 disk does."""

    def step(self, action) -> TimeStep:
        raise FileNotFoundError(f"no such file: /data/{os.fsdecode(b'caf' + bytes([0xE9]) + b'.bin')}")


class FailingCloseEnv(CountingEnv):
    """A CountingEnv whose close raises (a simulator's handle already gone)."""

    def close(self) -> None:
        raise RuntimeError("the simulator's handle is gone")
