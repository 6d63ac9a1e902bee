"""The actor's env manager, kept from job to job while the jobs run the same envs.

Starting worker processes costs far more than resetting envs, and a league's jobs almost always name the same
env, so the manager of the last job is reset (with the new job's seed) instead of rebuilt. Worker processes
start with `spawn`: the actor process holds gRPC channels, which do not survive `fork`.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from actor_service.envs.env_manager import (
    BaseEnvManager,
    EnvManagerConfig,
    EnvManagerInterrupted,
    SubprocessEnvManager,
    SubprocessEnvManagerConfig,
)
from common.envs.registry import env_factories

log = logging.getLogger(__name__)

ManagerKind = Literal["subprocess", "base"]
MANAGER_KINDS: tuple[str, ...] = ("subprocess", "base")


class EnvManagers:
    """`max_retry`: failures each env may have per job (it is rebuilt each time) before the job fails.
    `step_timeout_s` / `reset_timeout_s`: how long an env may take before it is deemed hung and rebuilt (the
    subprocess manager kills its worker process; the serial manager interrupts it in process, which cannot
    break a hang inside C code: see `stalled_s`). `cpus`: the CPUs the subprocess manager sizes itself for
    (SubprocessEnvManagerConfig.cpus; None: all this process may run on)."""

    def __init__(
        self,
        kind: ManagerKind,
        max_retry: int = 2,
        step_timeout_s: float | None = 60.0,
        reset_timeout_s: float | None = 300.0,
        cpus: int | None = None,
    ) -> None:
        if kind not in MANAGER_KINDS:
            raise ValueError(f"manager must be one of {MANAGER_KINDS}, got {kind!r}")
        self.kind = kind
        self._max_retry = max_retry
        self._step_timeout_s = step_timeout_s
        self._reset_timeout_s = reset_timeout_s
        self._cpus = cpus
        self._manager: BaseEnvManager | None = None
        self._launching: BaseEnvManager | None = None
        self._key: tuple[str, str, int] | None = None
        self._bots_seated = False  # the envs of the current manager hold reference bots from the last job
        self._interrupted = False

    @property
    def current(self) -> BaseEnvManager | None:
        return self._manager

    def stalled_s(self) -> float:
        """How long the manager's env operation under way (launch included) has run past its timeout
        without the manager ending it (BaseEnvManager.stalled_s); 0 if none. Safe from any thread."""
        manager = self._launching or self._manager
        return manager.stalled_s() if manager is not None else 0.0

    def interrupt(self) -> None:
        """The actor is stopping: cut short the env manager's call under way (a launch of envs that take long
        to build, a reset, a step that hangs) and every later one, with EnvManagerInterrupted; later
        `acquire` calls raise it too. Safe from a signal handler (BaseEnvManager.interrupt)."""
        self._interrupted = True
        manager = self._launching or self._manager
        if manager is not None:
            manager.interrupt()

    def acquire(
        self, env_name: str, env_kwargs: Mapping[str, Any], env_num: int, seed: int,
        seat_bots: Sequence[Mapping[int, str]] | None = None,
    ) -> BaseEnvManager:
        """A launched manager of `env_num` envs `env_name(**env_kwargs)`, every env at a fresh episode.

        `seat_bots[i]` (seat -> bot spec): the reference bots env i plays itself in this job, given as a reset
        param (`reset(bots=...)`, which the env keeps for its later episodes), so a job with bots reuses the
        manager of a job without; the next job without bots resets them away."""
        key = _manager_key(env_name, env_kwargs, env_num)
        if seat_bots is not None and len(seat_bots) != env_num:
            raise ValueError(f"seat_bots: {len(seat_bots)} entries for {env_num} envs")
        bot_params = ({i: {"bots": {str(seat): bot for seat, bot in bots.items()}} for i, bots in enumerate(seat_bots)}
                      if seat_bots else None)
        self._check_interrupted()
        manager = self._manager
        if manager is not None and key == self._key and not manager.closed:
            reset_params = bot_params
            if reset_params is None and self._bots_seated:
                reset_params = {i: {"bots": {}} for i in range(env_num)}
            manager.seed(seed)
            try:
                manager.reset(reset_params)
            except BaseException as err:
                # Its envs would keep the reset params that failed, or were left mid-reset: start afresh next time.
                if reset_params or isinstance(err, EnvManagerInterrupted):
                    self.discard()
                raise
            self._bots_seated = bool(seat_bots)
            return manager
        self.discard()
        factories = env_factories(env_name, env_num, **env_kwargs)
        if self.kind == "subprocess":
            manager = SubprocessEnvManager(
                factories,
                SubprocessEnvManagerConfig(
                    episode_num=math.inf, max_retry=self._max_retry, start_method="spawn",
                    step_timeout=self._step_timeout_s, reset_timeout=self._reset_timeout_s, cpus=self._cpus,
                ),
            )
        else:
            manager = BaseEnvManager(factories, EnvManagerConfig(
                episode_num=math.inf, max_retry=self._max_retry, step_timeout=self._step_timeout_s,
                reset_timeout=self._reset_timeout_s,
            ))
        manager.seed(seed)
        self._launching = manager
        try:
            self._check_interrupted()  # an interrupt that came before `_launching` was set
            manager.launch(bot_params)  # closes itself if launching fails
        finally:
            self._launching = None
        self._bots_seated = bool(seat_bots)
        log.info("launched %s env manager: %d x %s", self.kind, env_num, env_name)
        self._manager, self._key = manager, key
        return manager

    def resume(self, env_name: str, env_kwargs: Mapping[str, Any], env_num: int) -> BaseEnvManager | None:
        """The manager the last job left, envs mid-episode, when it runs these envs (and no reference bots):
        the next job plays on from there (`Rollout(carry=...)`). None when there is none to play on."""
        self._check_interrupted()
        manager = self._manager
        if manager is None or _manager_key(env_name, env_kwargs, env_num) != self._key or manager.closed or self._bots_seated or not manager.play_on():
            return None
        return manager

    def _check_interrupted(self) -> None:
        if self._interrupted:
            raise EnvManagerInterrupted("the actor is stopping: no env manager is launched or reset any more")

    def discard(self) -> None:
        """Close the current manager (after a failure its state is unknown; or at shutdown)."""
        manager, self._manager, self._key = self._manager, None, None
        if manager is not None:
            manager.close()

    def close(self) -> None:
        self.discard()


def _manager_key(env_name: str, env_kwargs: Mapping[str, Any], env_num: int) -> tuple[str, str, int]:
    """What makes a manager reusable for a job: the same envs, built alike, as many."""
    return env_name, json.dumps(env_kwargs, sort_keys=True, default=str), env_num
