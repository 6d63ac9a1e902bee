"""The env worker process of SubprocessEnvManager, and the messages it exchanges with the parent.

A worker builds its group of envs from cloudpickled factories, then answers commands one at a time, in
order, with exactly one reply each. The step command and its reply are the hot path and are plain tuples
(pickling a NamedTuple or dataclass per env costs ~10x more, measured); the rare control messages are typed.

    step command:  (STEP, ((env_id, action, reset_on_done, obs_slot), ...))
    step reply:    (STEP, (env_id, reward, env_id, reward, ...), (StepResult, ...), (EnvFailure, ...))
    StepResult:    (env_id, reward, terminated, truncated, info or None, obs, reset, reset_obs)

The flat (env_id, reward) pairs are the usual steps: no episode end, no info, the observation written to
shared memory. They cost a quarter of a StepResult to pickle and unpickle, per message and side. Without
shared memory every step is a StepResult, so an observation that is None is sent as it is.

`info` None stands for NO_INFO; `obs`/`reset_obs` are None when they were written to shared memory (`obs` to
the command's `obs_slot`, `reset_obs` to RESET_SLOT), which the parent knows from having a buffer.
A finished episode is reset in the worker when `reset_on_done` says so; `reset` says how:
- RESET_DONE: the env's last reset took under SLOW_RESET_S (a board game's: microseconds), so it was reset
  within the step command and `reset_obs` is its first observation: no extra message per episode.
- RESET_FOLLOWS: its last reset was slower (a level to load), so it is reset right after the step reply has
  gone, and its observation follows in a ResetReply of its own, the one reply that answers no command. The
  parent then holds the episode's last timestep before the reset starts and times the reset with
  `reset_timeout`, as every other reset: a slow reset is not taken for a hung step, and a hung one costs no
  finished episode.
- RESET_NONE: no reset (the episode count is reached), or the inline reset failed (its failure is sent).
The reset then runs in parallel with the other workers and with the parent's own work.

An env's own error anywhere in the worker is that env's failure, sent back with its traceback: in `info()`
too, or in pickling what it returned (a lock in an info dict): the reply then goes with that env's entry
replaced by its failure. Only a worker that dies (or hangs) costs every env of its group a failure.

A worker dies with the process that started it (Linux: a parent-death signal), even when it is stuck in an
env or, started with `fork`, holds the parent's ends of the pipes and so never reads EOF. The kernel ties
that signal to the parent's *thread* that started the worker, so the manager starts workers from a thread
that lives as long as its process (subprocess._Launcher), whichever thread launches it or finds a worker dead.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import os
import pickle
import signal
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import cloudpickle
import numpy as np

from actor_service.envs.env_manager.doorbell import DoorbellAddress, Doorbells, SpinBudget
from actor_service.envs.env_manager.failure import EnvFailure
from actor_service.envs.env_manager.obs_check import ObsConform
from actor_service.envs.env_manager.pipe import MessagePipe
from actor_service.envs.env_manager.shared_memory import RESET_SLOT, ObsBuffer, ObsLayout
from common.envs.base import NO_INFO, Env, EnvInfo, StepInfo

logger = logging.getLogger(__name__)

STEP = "step"
RESET_NONE, RESET_DONE, RESET_FOLLOWS = 0, 1, 2
SLOW_RESET_S = 1e-3
"""A reset slower than this (the env's last) runs after the step's reply, not inside the step command."""
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


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
        self.resets_due: list[int] = []  # envs whose episode the last step command ended, to reset after its reply
        self.reset_s: dict[int, float] = dict.fromkeys(env_ids, 0.0)  # how long each env's last reset took
        # Each env's observation check (obs_check.py), applied where no shared memory does it (`buffer` None:
        # shared memory off, or envs of different specs): the serial manager's rule, so both hand on the same.
        self.conforms: dict[int, ObsConform | None] = {}

    def serve(self, factories_blob: bytes, layout: ObsLayout | None) -> None:
        env_id = self.env_ids[0]  # whom a failure to unpickle the factories is charged to
        infos = []
        try:
            self.factories = cloudpickle.loads(factories_blob)
            self.buffer = ObsBuffer.attach(layout) if layout is not None else None
            for env_id in self.env_ids:
                env = self.envs[env_id] = self.factories[env_id]()
                info = env.info()
                pickle.dumps(info)  # it goes to the parent: an env whose info cannot is the one that failed
                infos.append(info)
                self.conforms[env_id] = ObsConform.for_spec(info.obs_spec)
        except Exception as exc:
            self.conn.send(StartFailedReply(EnvFailure.capture(env_id, "build", exc, for_pickling=True)))
            return
        self.conn.send(ReadyReply(tuple(infos)))
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
            self._reply(reply)
            if self.resets_due:
                due, self.resets_due = self.resets_due, []
                self._reply(self.reset_envs(due))

    def _reply(self, reply: Any) -> None:
        try:
            self.conn.send(reply)
        except OSError:  # the pipe: the parent is gone
            raise
        except Exception as exc:  # an env returned something that cannot be pickled
            reply = _without_unpicklable(reply, exc)
            if type(reply) is tuple:  # an env whose step is now a failure is rebuilt, not reset
                failed = {failure.env_id for failure in reply[3]}
                self.resets_due = [env_id for env_id in self.resets_due if env_id not in failed]
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
                shared = buffer is not None
                if shared:
                    view = views[slot][env_id] if views else None
                    if view is not None and type(obs) is np.ndarray and obs.shape == view.shape and \
                            obs.dtype == view.dtype:
                        view[...] = obs  # the usual case, without the checks of buffer.write
                    else:
                        buffer.write(env_id, slot, obs)
                    obs = None
                else:
                    conform = self.conforms.get(env_id)
                    if conform is not None and not conform.fits(obs):
                        obs = conform(obs, env_id)  # ValueError: the env's step failure
            except Exception as exc:
                failures.append(EnvFailure.capture(env_id, "step", exc, for_pickling=True))
                continue
            terminated = ts.terminated
            truncated = ts.truncated
            info = ts.info
            if not (terminated or truncated):
                if shared and info is NO_INFO:
                    plain += (env_id, ts.reward)
                else:
                    results.append((env_id, ts.reward, False, False, None if info is NO_INFO else info, obs,
                                    RESET_NONE, None))
                continue
            reset = RESET_NONE
            reset_obs = None
            if reset_on_done:
                if self.reset_s[env_id] >= SLOW_RESET_S:
                    self.resets_due.append(env_id)
                    reset = RESET_FOLLOWS
                else:
                    try:
                        reset_obs = self._reset_env(env_id)
                        reset = RESET_DONE
                    except Exception as exc:
                        failures.append(EnvFailure.capture(env_id, "reset", exc, for_pickling=True))
            results.append((env_id, ts.reward, terminated, truncated, info, obs, reset, reset_obs))
        return (STEP, tuple(plain), tuple(results), tuple(failures))

    def _reset_env(self, env_id: int) -> Any:
        """Reset an env with its reset parameters and time it; its observation (None: in shared memory)."""
        start = time.perf_counter()
        obs = self.envs[env_id].reset(**self.params[env_id])
        self.reset_s[env_id] = time.perf_counter() - start
        if self.buffer is not None:
            self.buffer.write(env_id, RESET_SLOT, obs)
            return None
        conform = self.conforms.get(env_id)
        return obs if conform is None or conform.fits(obs) else conform(obs, env_id)

    def reset_envs(self, env_ids: list[int]) -> ResetReply:
        """The automatic reset of envs whose episode ended (RESET_FOLLOWS), after the step's reply: a reset
        command's, with no seed and the reset parameters they were last given."""
        ids = tuple(env_ids)
        return self.reset(ResetCommand(ids, (None,) * len(ids), tuple(self.params[env_id] for env_id in ids)))

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
                obs = self._reset_env(env_id)
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
        env = self.envs[env_id] = self.factories[env_id]()
        self.conforms[env_id] = ObsConform.for_spec(env.info().obs_spec)

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


def _without_unpicklable(reply: Any, error: Exception) -> Any:
    """`reply`, which failed to pickle with `error`, with each env entry that cannot be pickled replaced by
    that env's failure (with the pickling error's traceback)."""
    if type(reply) is tuple:
        _, plain, results, failures = reply
        kept_plain: list[Any] = []
        kept_results = []
        lost = {}
        pairs = iter(plain)
        for env_id, reward in zip(pairs, pairs, strict=True):
            failure = _pickling_failure(env_id, "step", (("reward", reward),))
            if failure is None:
                kept_plain += (env_id, reward)
            else:
                lost[env_id] = failure
        for result in results:
            env_id, reward, _, _, info, obs, _, reset_obs = result
            if isinstance(info, StepInfo) and info.extra:
                info = _without_unpicklable_extra(env_id, info)
                result = (*result[:4], info, *result[5:])
            failure = _pickling_failure(env_id, "step", (("reward", reward), ("info", info), ("observation", obs),
                                                         ("reset observation", reset_obs)))
            if failure is None:
                kept_results.append(result)
            else:
                lost[env_id] = failure
        failures = tuple(f for f in failures if f.env_id not in lost) + tuple(lost.values())
        return (STEP, tuple(kept_plain), tuple(kept_results), failures)
    if type(reply) is ResetReply:
        kept = []
        failures = list(reply.failures)
        for env_id, obs in reply.observations:
            failure = _pickling_failure(env_id, "reset", (("observation", obs),))
            if failure is None:
                kept.append((env_id, obs))
            else:
                failures.append(failure)
        return ResetReply(tuple(kept), tuple(failures))
    raise error  # not an env's doing


_DROPPED_EXTRA: set[str] = set()
"""Step-info keys already said to be dropped (said once per worker, not at every step)."""


def _without_unpicklable_extra(env_id: int, info: StepInfo) -> StepInfo:
    """`info` without the entries of its `extra` (the env's own info dict) that cannot be pickled: a lock or a
    handle there failed the env at every step under this manager while the in-process one ran it (a review);
    nothing of ours reads `extra`, and the entries that can go still do."""
    kept = {}
    for key, value in info.extra.items():
        try:
            pickle.dumps(value, pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            if str(key) not in _DROPPED_EXTRA:
                _DROPPED_EXTRA.add(str(key))
                logger.warning("env worker: env %d's step info %r cannot be pickled to go to the env manager (%s: "
                               "%s); dropped from the info of its steps", env_id, key, type(exc).__name__, exc)
            continue
        kept[key] = value
    return dataclasses.replace(info, extra=kept)


def _pickling_failure(env_id: int, stage: str, parts: tuple[tuple[str, Any], ...]) -> EnvFailure | None:
    """The failure of env `env_id` if one of its `parts` (name, value) cannot be pickled, else None."""
    for name, value in parts:
        try:
            pickle.dumps(value, pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            failure = EnvFailure.capture(env_id, stage, exc, for_pickling=True)
            description = f"its {stage} {name} cannot be pickled to go to the env manager: {failure.description}"
            return dataclasses.replace(failure, description=description)
    return None


def _follow_parent(parent_pid: int | None) -> bool:
    """Ask the kernel (Linux) to SIGKILL this process when its parent dies; False if the parent is already
    gone (it died before the request took effect). SIGKILL, not SIGTERM: a worker stuck in an env would not
    act on anything else, and a lost parent leaves it nothing to finish. `parent_pid` None (a `forkserver`
    worker, whose parent is the fork server, which exits with the manager's process): no check."""
    if not sys.platform.startswith("linux"):
        return True
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            logger.warning("env worker: prctl(PR_SET_PDEATHSIG) failed (errno %d); it may outlive its parent",
                           ctypes.get_errno())
    except (OSError, AttributeError):  # no libc or no prctl in it
        logger.warning("env worker: no prctl; it may outlive its parent")
    return parent_pid is None or os.getppid() == parent_pid


WORKER_IGNORED_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM})
"""What a worker ignores: Ctrl-C and SIGTERM are for its parent, which closes it."""


def worker_main(
    ends: tuple[Connection, Connection],
    env_ids: tuple[int, ...],
    factories_blob: bytes,
    layout: ObsLayout | None,
    doorbell: tuple[DoorbellAddress, float] | None = None,
    parent_pid: int | None = None,
) -> None:
    """Process entry point. Ctrl-C is left to the parent, which closes the workers itself. `ends`: where
    commands come from and replies go to. `doorbell`: where this worker's message counters are, and how long
    it busy-waits on them for a command. `parent_pid`: the manager's process (see `_follow_parent`)."""
    if not _follow_parent(parent_pid):
        return  # the parent is gone: nobody to serve
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the parent closes us; a lost parent kills us
    # Started with both blocked (subprocess._start_with_stop_signals_blocked): one sent meanwhile is dropped now.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, WORKER_IGNORED_SIGNALS)
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
