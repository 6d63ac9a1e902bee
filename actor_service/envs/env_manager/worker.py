"""The env worker process of SubprocessEnvManager, and the messages it exchanges with the parent.

A worker builds its group of envs from cloudpickled factories, then answers commands one at a time, in
order, with exactly one reply each. The step command and its reply are the hot path and are plain tuples
(pickling a NamedTuple or dataclass per env costs ~10x more, measured); the rare control messages are typed.

    step command:  (STEP, ((env_id, action, reset_on_done, obs_slot), ...))
    step reply:    (STEP, (env_id, reward, env_id, reward, ...), (StepResult, ...), (EnvFailure, ...))
    StepResult:    (env_id, reward, terminated, truncated, info or None, obs, was_reset, reset_obs)

The flat (env_id, reward) pairs are the usual steps: no episode end, no info, the observation in shared
memory. They cost a quarter of a StepResult to pickle and unpickle, per message and side.

`info` None stands for NO_INFO; `obs`/`reset_obs` are None when they were written to shared memory (`obs` to
the command's `obs_slot`, `reset_obs` to RESET_SLOT).
A finished episode is reset in the worker right after its last step when `reset_on_done` says so, so the
reset runs in parallel with the other workers and with the parent's own work.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import cloudpickle
import numpy as np

from actor_service.envs.env_manager.doorbell import DoorbellAddress, Doorbells, SpinBudget
from actor_service.envs.env_manager.failure import EnvFailure
from actor_service.envs.env_manager.pipe import MessagePipe
from actor_service.envs.env_manager.shared_memory import RESET_SLOT, ObsBuffer, ObsLayout
from common.envs.base import NO_INFO, Env, EnvInfo

logger = logging.getLogger(__name__)

STEP = "step"


@dataclass(frozen=True)
class ResetCommand:
    """Reset these envs (seeding those with a seed); `rebuild` first replaces each env with a new one."""

    env_ids: tuple[int, ...]
    seeds: tuple[int | None, ...]
    params: tuple[Mapping[str, Any], ...]
    rebuild: bool = False


@dataclass(frozen=True)
class AttachCommand:
    layout: ObsLayout


@dataclass(frozen=True)
class CloseCommand:
    pass


@dataclass(frozen=True)
class ReadyReply:
    """Sent once the worker's envs are built."""

    infos: tuple[EnvInfo, ...]


@dataclass(frozen=True)
class StartFailedReply:
    """Building an env failed; the worker exits after sending this."""

    failure: EnvFailure


@dataclass(frozen=True)
class ResetReply:
    """First observations by env (None where in shared memory), and the envs that failed."""

    observations: tuple[tuple[int, Any], ...]
    failures: tuple[EnvFailure, ...]


@dataclass(frozen=True)
class AckReply:
    pass


class _Worker:
    def __init__(self, conn: MessagePipe, env_ids: tuple[int, ...], spin_s: float = 0.0) -> None:
        self.conn = conn
        self.spin_s = spin_s
        self.env_ids = env_ids
        self.factories: Mapping[int, Callable[[], Env]] = {}
        self.buffer: ObsBuffer | None = None
        self.envs: dict[int, Env] = {}
        self.params: dict[int, Mapping[str, Any]] = {env_id: {} for env_id in env_ids}

    def serve(self, factories_blob: bytes, layout: ObsLayout | None) -> None:
        env_id = self.env_ids[0]  # whom a failure to unpickle the factories is charged to
        try:
            self.factories = cloudpickle.loads(factories_blob)
            self.buffer = ObsBuffer.attach(layout) if layout is not None else None
            for env_id in self.env_ids:
                self.envs[env_id] = self.factories[env_id]()
        except Exception as exc:
            self.conn.send(StartFailedReply(EnvFailure.capture(env_id, "build", exc, for_pickling=True)))
            return
        self.conn.send(ReadyReply(tuple(env.info() for env in self.envs.values())))
        budget = SpinBudget(self.spin_s) if self.spin_s > 0 else None
        while True:
            try:
                if budget is None:
                    command = self.conn.recv()
                elif self.conn.signalled():  # already here (the parent was quicker): no wait to time
                    command = self.conn.recv()
                    budget.waited(0.0)
                else:
                    start = time.monotonic()
                    budget.spin(self.conn.signalled)
                    command = self.conn.recv()
                    budget.waited(time.monotonic() - start)
            except EOFError:  # the parent is gone
                return
            if type(command) is tuple:
                reply: Any = self.step(command[1])
            elif type(command) is ResetCommand:
                reply = self.reset(command)
            elif type(command) is AttachCommand:
                self.buffer = ObsBuffer.attach(command.layout)
                reply = AckReply()
            elif type(command) is CloseCommand:
                return
            else:
                raise TypeError(f"env worker: unknown command {command!r}")
            self.conn.send(reply)

    def step(self, items: tuple[tuple[int, Any, bool, int], ...]) -> tuple:
        plain: list[Any] = []
        results = []
        failures = []
        buffer = self.buffer
        views = buffer.single_views if buffer is not None else None
        envs = self.envs
        for env_id, action, reset_on_done, slot in items:
            env = envs[env_id]
            try:
                ts = env.step(action)
                obs = ts.obs
                if views and type(obs) is np.ndarray and obs.shape == views[slot][env_id].shape:
                    views[slot][env_id][...] = obs  # the usual case, without the checks of buffer.write
                    obs = None
                elif buffer is not None:
                    buffer.write(env_id, slot, obs)
                    obs = None
            except Exception as exc:
                failures.append(EnvFailure.capture(env_id, "step", exc, for_pickling=True))
                continue
            terminated = ts.terminated
            truncated = ts.truncated
            info = ts.info
            if not (terminated or truncated):
                if obs is None and info is NO_INFO:
                    plain += (env_id, ts.reward)
                else:
                    results.append((env_id, ts.reward, False, False, None if info is NO_INFO else info, obs, False,
                                    None))
                continue
            was_reset = False
            reset_obs = None
            if reset_on_done:
                try:
                    reset_obs = env.reset(**self.params[env_id])
                    if buffer is not None:
                        buffer.write(env_id, RESET_SLOT, reset_obs)
                        reset_obs = None
                    was_reset = True
                except Exception as exc:
                    failures.append(EnvFailure.capture(env_id, "reset", exc, for_pickling=True))
            results.append((env_id, ts.reward, terminated, truncated, info, obs, was_reset, reset_obs))
        return (STEP, tuple(plain), tuple(results), tuple(failures))

    def reset(self, command: ResetCommand) -> ResetReply:
        observations = []
        failures = []
        for env_id, seed, params in zip(command.env_ids, command.seeds, command.params, strict=True):
            stage = "rebuild" if command.rebuild else "reset"
            try:
                if command.rebuild:
                    self._replace(env_id)
                env = self.envs[env_id]
                if seed is not None:
                    env.seed(seed)
                self.params[env_id] = params
                obs = env.reset(**params)
                if self.buffer is not None:
                    self.buffer.write(env_id, RESET_SLOT, obs)
                    obs = None
            except Exception as exc:
                failures.append(EnvFailure.capture(env_id, stage, exc, for_pickling=True))
                continue
            observations.append((env_id, obs))
        return ResetReply(tuple(observations), tuple(failures))

    def _replace(self, env_id: int) -> None:
        old = self.envs.pop(env_id, None)
        if old is not None:
            try:
                old.close()
            except Exception:
                logger.warning("closing failed env %d raised; building a new one anyway", env_id, exc_info=True)
        self.envs[env_id] = self.factories[env_id]()

    def close(self) -> None:
        for env_id, env in self.envs.items():
            try:
                env.close()
            except Exception:
                logger.exception("env worker: closing env %d raised", env_id)
        self.envs = {}
        if self.buffer is not None:
            self.buffer.close()
        self.conn.close()


def worker_main(
    ends: tuple[Connection, Connection],
    env_ids: tuple[int, ...],
    factories_blob: bytes,
    layout: ObsLayout | None,
    doorbell: tuple[DoorbellAddress, float] | None = None,
) -> None:
    """Process entry point. Ctrl-C is left to the parent, which closes the workers itself. `ends`: where
    commands come from and replies go to. `doorbell`: where this worker's message counters are, and how long
    it busy-waits on them for a command."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the parent closes us; a lost parent closes our pipe
    bells = Doorbells.attach(doorbell[0]) if doorbell is not None else None
    spin_s = doorbell[1] if doorbell is not None else 0.0
    pipe = MessagePipe(*ends, bells.worker_end(doorbell[0].index) if bells is not None else None)
    worker = _Worker(pipe, env_ids, spin_s)
    try:
        worker.serve(factories_blob, layout)
    except (BrokenPipeError, ConnectionResetError):  # the parent is gone: nobody to report to
        pass
    finally:
        worker.close()
        if bells is not None:
            bells.close()
