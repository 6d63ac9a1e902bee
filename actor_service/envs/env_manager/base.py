"""BaseEnvManager: several envs driven in this process, one after another.

The bookkeeping here (env states, episode counting, auto-reset, seeds, reset params, retries) is shared with
`SubprocessEnvManager`, so both managers give the same trajectories for the same seeds and actions. One
difference: observations that already fit the spec are the env's own arrays here (the subprocess manager's are
copies), so a caller that keeps them past the env's next step must copy them (the rollout keeps the batch it
acted on): an env that reuses its observation buffer rewrites them.

Hung envs: a watchdog thread (watchdog.py) interrupts an env operation that runs past `step_timeout` /
`reset_timeout`; the env then counts as failed and is rebuilt like one that raised. That works for hangs in
Python code and, when the manager is driven from the main thread, in blocking waits (sleep, locks, sockets).
A hang inside C code cannot be interrupted in process: `stalled_s()` then grows (the actor lets its job's
lease expire on it), and the env counts as failed if the call ever returns. Use the SubprocessEnvManager for
envs that can hang in C code.
"""

from __future__ import annotations

import enum
import logging
import math
import numbers
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from actor_service.envs.env_manager.failure import (
    EnvError,
    EnvFailure,
    EnvManagerClosedError,
    EnvManagerInterrupted,
)
from actor_service.envs.env_manager.obs_check import ObsConform
from actor_service.envs.env_manager.watchdog import EnvHangInterrupt, Watchdog
from common.envs.base import Env, EnvInfo, StepInfo, TimeStep

logger = logging.getLogger(__name__)

EnvFactory = Callable[[], Env]


class EnvState(enum.Enum):
    INIT = "init"  # built (or being built); no episode started yet
    RESET = "reset"  # a reset is under way
    RUN = "run"  # has an observation; a step may be in flight
    DONE = "done"  # played its `episode_num` episodes
    ERROR = "error"  # failed; being rebuilt


INTERRUPTED_CLOSE_S = 2.0
"""What the closes of an interrupted manager's envs (its caller is stopping) get together: each close was watched
with the whole `reset_timeout`, one env after another, so a stop with hanging closes took minutes (67 s for two envs
at 30 s; a review), past any supervisor's grace. An env still closing then is left as it is, as a hung one is."""

_BOOLS = (bool, np.bool_)  # True == 1 as a dict key: a bool env id would step env 1


def is_int_count(value: object) -> bool:
    """An integer count, numpy's included, and not a bool (True is an int to Python)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


@dataclass(frozen=True)
class EnvManagerConfig:
    """`episode_num`: episodes per env before it is DONE (`math.inf`: never).
    `max_retry`: how many times each env may fail and be rebuilt before the manager raises `EnvError`.
    `step_timeout`: seconds an env step may take before the env counts as hung (a failure: it is rebuilt).
    `reset_timeout`: the same for building, seeding and resetting an env. None: no limit.
    The automatic reset after an episode ends is timed with `reset_timeout`, and the finished episode's last
    timestep is kept whatever the reset does (a reset that fails or hangs costs the env a failure, as any
    reset does). The subprocess manager does so for an env whose last reset took over 1 ms (it resets it after
    the step's reply); a faster one it resets inside the step command, under `step_timeout` (worker.py).
    The serial manager interrupts a hung env in process, which works for hangs in Python code and, in the
    main thread, in blocking waits, but not for a hang inside C code (watchdog.py); the subprocess manager
    kills the hung env's worker process."""

    episode_num: int | float = math.inf
    max_retry: int = 0
    step_timeout: float | None = 60.0
    reset_timeout: float | None = 300.0

    def __post_init__(self) -> None:
        if not (self.episode_num == math.inf or (is_int_count(self.episode_num) and self.episode_num >= 1)):
            raise ValueError(f"episode_num must be an int >= 1 or math.inf, got {self.episode_num!r}")
        if not is_int_count(self.max_retry) or self.max_retry < 0:
            raise ValueError(f"max_retry must be an int >= 0, got {self.max_retry!r}")
        object.__setattr__(self, "max_retry", int(self.max_retry))  # a numpy integer as the int it stands for
        if self.episode_num != math.inf:
            object.__setattr__(self, "episode_num", int(self.episode_num))
        for name in ("step_timeout", "reset_timeout"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be > 0 seconds or None, got {value!r}")


class _Lifecycle(enum.Enum):
    NEW = "new"
    RUNNING = "running"
    CLOSED = "closed"


class BaseEnvManager:
    """Runs `len(env_fns)` envs serially in this process.

    Usage: `launch()`, then repeatedly `step({env_id: action for env_id in next_obs})` until `done`;
    `close()` at the end. An env whose episode ends is reset at once (its `next_obs` is then the first
    observation of the next episode; the returned timestep carries the last one), until it has played
    `episode_num` episodes. A failing env is rebuilt up to `max_retry` times: the step returns a truncated
    timestep with `info.failure` set for the episode that was cut short, then the env plays on.
    A manager is driven from one thread; it is a context manager that closes on exit.
    """

    def __init__(self, env_fns: Sequence[EnvFactory], config: EnvManagerConfig | None = None) -> None:
        if not env_fns:
            raise ValueError("env_fns is empty: an env manager needs at least one env factory")
        self._env_fns = list(env_fns)
        self._config = config or EnvManagerConfig()
        self._episode_num = self._config.episode_num
        self._lifecycle = _Lifecycle.NEW
        n = len(self._env_fns)
        self._state = [EnvState.INIT] * n
        self._next_obs: dict[int, Any] = {}
        self._in_flight: set[int] = set()  # envs with a step under way (only the subprocess manager has any)
        self._results: dict[int, TimeStep] = {}  # timesteps not yet returned by `step`
        self._episode_count = [0] * n
        self._failures = [0] * n
        self._uncounted: frozenset[int] = frozenset()
        """Envs whose failures are not counted now: found while a reset of theirs settles what the last job
        left (a worker dead between jobs, a step still in flight); the reset starts a fresh budget."""
        self._reset_params: list[dict[str, Any]] = [{} for _ in range(n)]
        self._seeds: list[int | None] = [None] * n
        self._seeds_pending: set[int] = set()  # envs whose seed from `seed()` their next reset has not used
        self._rebuilds = [0] * n  # each env's rebuilds since its last seed (`_rebuild_seed`)
        self._env_info: EnvInfo | None = None
        self._envs: list[Env | None] = [None] * n
        self._obs_conform: list[ObsConform | None] = [None] * n  # the serial manager's check of each env's obs
        self._watchdog: Watchdog | None = None  # the serial manager's, from launch to close
        self._interrupted = False  # by `interrupt()`, from any thread: only `close` is left
        self._close_by: float | None = None  # time.monotonic() by which an interrupted manager's closes end

    # ---- read-only views -------------------------------------------------------------------------------
    @property
    def env_num(self) -> int:
        return len(self._env_fns)

    @property
    def episode_num(self) -> int | float:
        return self._episode_num

    @property
    def closed(self) -> bool:
        return self._lifecycle is _Lifecycle.CLOSED

    @property
    def done(self) -> bool:
        """Every env has played its `episode_num` episodes, and `step` has returned every timestep (a final one
        that landed during a partial `reset` is returned by the next `step`: a `while not done` loop got it)."""
        self._check_not_closed()  # a closed manager is not done: a `while not done` loop must not spin on it
        return not self._results and all(state is EnvState.DONE for state in self._state)

    @property
    def ready_env(self) -> list[int]:
        """Envs waiting for an action. Not an env whose last timestep `step` has not returned yet (one that
        landed during a partial `reset`): stepping it again would overwrite that timestep; `step({})` returns it."""
        if self._lifecycle is not _Lifecycle.RUNNING:
            self._check_running()
        in_flight = self._in_flight
        results = self._results
        if not in_flight and not results:
            return sorted(self._next_obs)
        return [i for i in sorted(self._next_obs) if i not in in_flight and i not in results]

    @property
    def next_obs(self) -> dict[int, Any]:
        """Observations of the envs waiting for an action (`ready_env`), by env id."""
        if self._lifecycle is not _Lifecycle.RUNNING:
            self._check_running()
        next_obs = self._next_obs
        in_flight = self._in_flight
        results = self._results
        return {i: next_obs[i] for i in sorted(next_obs) if i not in in_flight and i not in results}

    @property
    def env_states(self) -> dict[int, EnvState]:
        self._check_not_closed()
        return dict(enumerate(self._state))

    @property
    def episode_counts(self) -> dict[int, int]:
        return dict(enumerate(self._episode_count))

    @property
    def failure_counts(self) -> dict[int, int]:
        return dict(enumerate(self._failures))

    def stalled_s(self) -> float:
        """How long the env operation under way has run past its timeout without the manager ending it (0
        if none). Near 0 while the manager enforces its timeouts; grows while an env hangs where the manager
        cannot interrupt it (see the module doc). Safe to call from any thread, e.g. a heartbeat."""
        watchdog = self._watchdog
        return watchdog.overdue_s() if watchdog is not None else 0.0

    @property
    def env_info(self) -> EnvInfo:
        """Spaces of the envs (known once launched)."""
        if self._env_info is None:
            raise RuntimeError(f"{type(self).__name__}: env_info is known after launch()")
        return self._env_info

    # ---- control ---------------------------------------------------------------------------------------
    def seed(self, seed: int | Sequence[int] | Mapping[int, int]) -> None:
        """Seeds for the envs' next `launch`/`reset`: an int gives env i the seed `seed + i`, a sequence one
        seed per env, a mapping {env_id: seed} (DI-engine's form) seeds the envs it names.

        A seed is used once, by the env's next reset; its later episodes go on from the env's own random
        state (DI-engine's dynamic seed). An env rebuilt after a failure (or with its worker process) is seeded
        from its last seed and the number of its rebuilds since (`_rebuild_seed`): reproducible, and not a
        replay of the episodes it played from that seed.
        """
        self._check_not_closed()
        if isinstance(seed, numbers.Integral) and not isinstance(seed, bool):
            given = {i: int(seed) + i for i in range(self.env_num)}
        elif isinstance(seed, Mapping):
            given = {self._env_id(env_id, "seed"): _integer(value, f"seed[{env_id}]") for env_id, value in seed.items()}
        elif isinstance(seed, Sequence) and not isinstance(seed, (str, bytes)):
            if len(seed) != self.env_num:
                raise ValueError(f"seed: expected {self.env_num} seeds (one per env), got {len(seed)}")
            given = {i: _integer(value, f"seed[{i}]") for i, value in enumerate(seed)}
        else:
            raise TypeError(f"seed: expected an int, a sequence of {self.env_num} ints or a mapping "
                            f"{{env_id: int}}, got {type(seed).__name__}")
        for env_id, value in given.items():
            self._seeds[env_id] = value
            self._seeds_pending.add(env_id)
            self._rebuilds[env_id] = 0

    def launch(self, reset_params: Mapping[int, Mapping[str, Any]] | None = None) -> None:
        """Build the envs and start their first episodes."""
        self._check_not_closed()
        if self._lifecycle is _Lifecycle.RUNNING:
            raise RuntimeError(f"{type(self).__name__}.launch() was already called")
        self._lifecycle = _Lifecycle.RUNNING
        try:
            self._launch(reset_params)
        except BaseException:
            self.close()
            raise

    def reset(self, reset_params: Mapping[int, Mapping[str, Any]] | Sequence[Mapping[str, Any]] | None = None
              ) -> None:
        """Start a new episode in the envs `reset_params` names, or in every env when it is None (as
        DI-engine's managers do), and zero their episode and failure counts (each reset starts a fresh
        `max_retry` budget: an actor resets its manager for every job, and an env that fails now and then
        must not use up the budget of the jobs after). The other envs play on untouched.

        `reset_params` ({env_id: {name: value}}, or a sequence of one mapping per env) replaces the reset
        params of the envs it names; an env's params are used for this reset and every automatic reset after.
        """
        self._check_running()
        params = self._reset_map(reset_params)
        env_ids = sorted(params) if params is not None else list(range(self.env_num))
        self._set_reset_params(params)
        for env_id in env_ids:
            self._failures[env_id] = 0
        self._reset_envs(env_ids)

    def play_on(self) -> bool:
        """Start a fresh `max_retry` budget for every env as `reset` does, without a reset: for a job that plays
        on the episodes under way (without it, failures added up over all such jobs, the manager's whole life in
        a solo league). False, with nothing renewed, when the envs cannot play on as they are (a subprocess
        worker that died between jobs): reset them instead."""
        self._check_running()
        self._failures = [0] * self.env_num
        return True

    def step(self, actions: Mapping[int, Any]) -> dict[int, TimeStep]:
        """Apply one action per env id (envs from `ready_env`); returns their timesteps by env id."""
        self._check_running()
        self._check_ready(actions)
        envs = self._envs
        results = self._results
        next_obs = self._next_obs
        watch = self._watchdog
        assert watch is not None  # from launch to close
        step_timeout = self._config.step_timeout
        if step_timeout is None:
            step_timeout = math.inf  # watched all the same, so that `interrupt` can cut a step short
        thread = threading.get_ident()
        conforms = self._obs_conform
        for env_id, action in actions.items():
            env = envs[env_id]
            try:  # watch.begin / watch.end inlined (Watchdog's doc): this runs for every env step
                op = (env_id, "step", step_timeout, thread, [True])
                watch.current = op
                if step_timeout < watch.polling_for:
                    watch.poll_for(step_timeout)
                try:
                    ts = env.step(action)
                except BaseException as exc:
                    raise watch.raised(op, _as_env_error(exc))  # noqa: B904 - `exc` itself, or the hang it was part of
                try:
                    op[-1].pop()
                except IndexError:
                    raise watch.late(op) from None
                conform = conforms[env_id]
                if conform is not None and not conform.fits(ts.obs):  # obs_check.py
                    conformed = conform(ts.obs, env_id)
                    if conformed is not ts.obs:
                        ts = replace(ts, obs=conformed)
            except EnvHangInterrupt as exc:
                self._recover(env_id, self._hang_failure(env_id, exc))
                continue
            except Exception as exc:
                self._recover(env_id, EnvFailure.capture(env_id, "step", exc))
                continue
            results[env_id] = ts
            if not (ts.terminated or ts.truncated):
                next_obs[env_id] = ts.obs
            elif self._resets_on_done(env_id):
                try:
                    reset_obs = self._watched(env_id, "reset", env.reset, **self._reset_params[env_id])
                    conform = conforms[env_id]
                    if conform is not None and not conform.fits(reset_obs):
                        reset_obs = conform(reset_obs, env_id)
                except (Exception, EnvHangInterrupt) as exc:
                    failure = self._failure(env_id, "reset", exc)
                    self._after_step(env_id, ts, False, None)
                    self._recover(env_id, failure)
                    continue
                self._after_step(env_id, ts, True, reset_obs)
            else:
                self._after_step(env_id, ts, False, None)
        results, self._results = self._results, {}
        return results

    def interrupt(self) -> None:
        """Cut short the call under way (launch, reset, step) and refuse every later one but `close`, each with
        EnvManagerInterrupted: for a caller that is stopping and must not wait for its envs (one that takes a
        minute to build, or hangs). Safe from any thread and from a signal handler: it only sets a flag and
        wakes a watcher.

        The serial manager stops between env calls, and its watchdog interrupts an env call under way as it
        would a hung one: in Python code, and in blocking waits when the manager runs in the main thread; an
        env stuck in C code keeps the call going, and `stalled_s` then counts from this interrupt. The
        subprocess manager stops waiting for its workers within `_INTERRUPT_CHECK_S`; `close` kills them."""
        self._interrupted = True
        watchdog = self._watchdog
        if watchdog is not None:
            watchdog.cut_short()

    def close(self) -> None:
        """Close every env. Idempotent; afterwards every call but `close` raises EnvManagerClosedError, except the
        counters `episode_counts` and `failure_counts`, which stay readable to say how the envs fared (after
        max_retry is exhausted the manager has closed itself)."""
        if self._lifecycle is _Lifecycle.CLOSED:
            return
        self._lifecycle = _Lifecycle.CLOSED
        envs, self._envs = self._envs, [None] * self.env_num
        errors = []
        if self._interrupted:
            self._close_by = time.monotonic() + INTERRUPTED_CLOSE_S
        try:
            for env_id, env in enumerate(envs):
                if env is None:
                    continue
                try:
                    self._watched(env_id, "close", env.close)
                except EnvHangInterrupt as exc:
                    self._settle_hang()
                    logger.warning("env %d hung in close (%s); left as it is", env_id, exc)
                except Exception as exc:  # close the others first, then report
                    errors.append(exc)
        finally:
            watchdog, self._watchdog = self._watchdog, None
            if watchdog is not None:
                watchdog.close()
        if errors:
            raise errors[0]

    def __enter__(self) -> BaseEnvManager:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ---- serial machinery ------------------------------------------------------------------------------
    def _launch(self, reset_params: Mapping[int, Mapping[str, Any]] | None) -> None:
        self._set_reset_params(self._reset_map(reset_params))
        # Also without timeouts: `interrupt` cuts env calls short through it (its thread then sleeps until then).
        self._watchdog = Watchdog(f"env-watchdog-{id(self):x}")
        self._reset_envs(range(self.env_num))

    def _reset_envs(self, env_ids: Sequence[int]) -> None:
        seeds = self._take_seeds(env_ids)
        self._start_reset(env_ids)
        for env_id in env_ids:
            self._check_interrupted()
            try:
                self._start_episode(env_id, seeds[env_id], "reset")
            except (Exception, EnvHangInterrupt) as exc:
                self._recover(env_id, self._failure(env_id, "reset", exc), unplayed_seed=seeds[env_id])
        for env_id in env_ids:
            self._results.pop(env_id, None)

    def _start_episode(self, env_id: int, seed: int | None, stage: str) -> None:
        """Build the env if needed, seed it if `seed` is given, reset it: one watched operation."""
        self._on_reset(env_id, self._watched(env_id, stage, self._build_and_reset, env_id, seed))

    def _build_and_reset(self, env_id: int, seed: int | None) -> Any:
        env = self._envs[env_id]
        if env is None:
            env = self._envs[env_id] = self._env_fns[env_id]()
            info = env.info()
            if self._env_info is None:
                self._env_info = info
            self._obs_conform[env_id] = ObsConform.for_spec(info.obs_spec)
        if seed is not None:
            env.seed(seed)
        obs = env.reset(**self._reset_params[env_id])
        conform = self._obs_conform[env_id]
        return obs if conform is None or conform.fits(obs) else conform(obs, env_id)

    def _recover(self, env_id: int, failure: EnvFailure, unplayed_seed: int | None = None) -> None:
        """Count the failure (raises once retries are spent), then rebuild the env until it starts.
        `unplayed_seed`: the seed from `seed()` the failed reset was to start from; the rebuild starts from it (it
        played nothing from it to replay), as the subprocess manager's does. A seed derived for rebuilds made the
        two managers' trajectories differ after a failed build at launch (a review)."""
        while True:
            self._count_failure(env_id, failure)
            env, self._envs[env_id] = self._envs[env_id], None
            if env is not None:
                try:
                    self._watched(env_id, "close", env.close)
                except EnvHangInterrupt:
                    self._settle_hang()
                    logger.warning("closing failed env %d hung; building a new one anyway", env_id)
                except Exception:
                    logger.warning("closing failed env %d raised; building a new one anyway", env_id, exc_info=True)
            seed = unplayed_seed if unplayed_seed is not None else self._rebuild_seed(env_id)
            try:
                self._start_episode(env_id, seed, "rebuild")
                return
            except (Exception, EnvHangInterrupt) as exc:
                failure = self._failure(env_id, "rebuild", exc)

    def _watched(self, env_id: int, stage: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """`fn(*args, **kwargs)` under the watchdog with the timeout of `stage` (anything but "step" is a
        reset); raises EnvHangInterrupt when it ran past it (then call `_failure` or `_settle_hang`)."""
        watch = self._watchdog
        timeout = self._config.step_timeout if stage == "step" else self._config.reset_timeout
        if stage == "close" and self._close_by is not None:  # an interrupted manager's closes share a budget
            timeout = max(0.01, self._close_by - time.monotonic())
        if watch is None:  # (before launch, or closed)
            try:
                return fn(*args, **kwargs)
            except SystemExit as exc:
                raise _as_env_error(exc) from exc
        op = watch.begin(env_id, stage, math.inf if timeout is None else timeout)
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            raise watch.raised(op, _as_env_error(exc))  # noqa: B904 - `exc` itself, or the hang it was part of
        watch.end(op)
        return result

    def _failure(self, env_id: int, stage: str, exc: BaseException) -> EnvFailure:
        if isinstance(exc, EnvHangInterrupt):
            return self._hang_failure(env_id, exc)
        return EnvFailure.capture(env_id, stage, exc)

    def _hang_failure(self, env_id: int, exc: EnvHangInterrupt) -> EnvFailure:
        """The failure of an env the watchdog interrupted; its traceback shows where the env hung."""
        self._settle_hang()
        stage, timeout = self._watchdog.interrupted() if self._watchdog is not None else ("step", math.nan)
        return EnvFailure(
            env_id, stage, f"hung: no result within its {timeout:g} s {stage} timeout (interrupted in process)",
            "".join(traceback.format_exception(exc)), exc,
        )

    def _settle_hang(self) -> None:
        if self._watchdog is not None:
            self._watchdog.settle()

    # ---- bookkeeping shared with SubprocessEnvManager -----------------------------------------------------
    def _check_not_closed(self) -> None:
        if self._lifecycle is _Lifecycle.CLOSED:
            raise EnvManagerClosedError(f"{type(self).__name__} is closed; build a new manager")

    def _check_running(self) -> None:
        self._check_not_closed()
        if self._lifecycle is _Lifecycle.NEW:
            raise RuntimeError(f"{type(self).__name__}: call launch() first")
        self._check_interrupted()

    def _check_interrupted(self) -> None:
        if self._interrupted:
            raise EnvManagerInterrupted(f"{type(self).__name__} was interrupted (its caller is stopping); only "
                                        "close() is left")

    def _check_ready(self, actions: Mapping[int, Any]) -> None:
        next_obs = self._next_obs
        in_flight = self._in_flight
        results = self._results
        for env_id in actions:
            # (True == 1 as a dict key: a bool id stepped env 1 and came back keyed True.)
            if env_id not in next_obs or env_id in in_flight or env_id in results or isinstance(env_id, _BOOLS):
                raise ValueError(self._not_ready_message(env_id))

    def _not_ready_message(self, env_id: Any) -> str:
        if isinstance(env_id, _BOOLS) or not isinstance(env_id, numbers.Integral) or not 0 <= env_id < self.env_num:
            return f"step: env id {env_id!r} is not in range(0, {self.env_num})"
        if env_id in self._in_flight:
            state = "a step in flight"
        elif env_id in self._results:
            state = "its last timestep is not returned yet: step({}) returns it"
        else:
            state = f"state {self._state[env_id].name}"
        return f"step: env {env_id} is not waiting for an action ({state}); act only on ready_env / next_obs"

    def _reset_map(self, reset_params: Any) -> dict[int, Mapping[str, Any]] | None:
        """`reset_params` as {env_id: params}, checked (a sequence gives env i its i-th mapping)."""
        if reset_params is None:
            return None
        if isinstance(reset_params, Mapping):
            items = list(reset_params.items())
        elif isinstance(reset_params, Sequence) and not isinstance(reset_params, (str, bytes)):
            if len(reset_params) != self.env_num:
                raise ValueError(f"reset_params: expected {self.env_num} mappings (one per env), got "
                                 f"{len(reset_params)}")
            items = list(enumerate(reset_params))
        else:
            raise TypeError(f"reset_params: expected a mapping {{env_id: {{name: value}}}} or a sequence of one "
                            f"mapping per env, got {type(reset_params).__name__}")
        out: dict[int, Mapping[str, Any]] = {}
        for env_id, params in items:
            env_id = self._env_id(env_id, "reset_params")
            if not isinstance(params, Mapping):
                raise TypeError(f"reset_params[{env_id}]: expected a mapping of reset arguments, got "
                                f"{type(params).__name__}")
            self._check_sendable(env_id, params, "reset_params")
            out[env_id] = params
        return out

    def _check_sendable(self, env_id: int, value: Any, what: str) -> None:
        """Hook: whether `value` can reach env `env_id` (the subprocess manager pickles it to a worker)."""

    def _env_id(self, env_id: Any, what: str) -> int:
        if isinstance(env_id, bool) or not isinstance(env_id, numbers.Integral) or not 0 <= env_id < self.env_num:
            raise ValueError(f"{what}: env id {env_id!r} is not in range(0, {self.env_num})")
        return int(env_id)

    def _set_reset_params(self, reset_params: Mapping[int, Mapping[str, Any]] | None) -> None:
        for env_id, params in (reset_params or {}).items():
            self._reset_params[env_id] = dict(params)

    def _rebuild_seed(self, env_id: int) -> int | None:
        """The seed of the env's next rebuild: derived from its last seed and its rebuilds since. Its last seed
        again made a rebuilt env replay the episodes it had played from it (and, with the subprocess manager,
        the healthy envs of a dead worker too): the same data again for the rest of the job (a review)."""
        last = self._seeds[env_id]
        if last is None:
            return None  # never seeded: a new env starts from its own randomness
        self._rebuilds[env_id] += 1
        return int(np.random.SeedSequence([last % 2**63, self._rebuilds[env_id]]).generate_state(1)[0])

    def _rebuild_seeds(self, env_ids: Sequence[int]) -> list[int | None]:
        """`_rebuild_seed` of each of `env_ids`, by env id (None for the others), as `_take_seeds` gives them."""
        seeds: list[int | None] = [None] * self.env_num
        for env_id in env_ids:
            seeds[env_id] = self._rebuild_seed(env_id)
        return seeds

    def _take_seeds(self, env_ids: Sequence[int]) -> list[int | None]:
        """Seeds for resetting `env_ids` (by env id, None for the others): those given by `seed()` since
        each env's last reset."""
        seeds: list[int | None] = [None] * self.env_num
        for env_id in env_ids:
            if env_id in self._seeds_pending:
                self._seeds_pending.discard(env_id)
                seeds[env_id] = self._seeds[env_id]
        return seeds

    def _start_reset(self, env_ids: Sequence[int]) -> None:
        for env_id in env_ids:
            self._next_obs.pop(env_id, None)
            self._results.pop(env_id, None)
            self._episode_count[env_id] = 0
            self._state[env_id] = EnvState.RESET

    def _on_reset(self, env_id: int, obs: Any) -> None:
        self._state[env_id] = EnvState.RUN
        self._next_obs[env_id] = obs

    def _resets_on_done(self, env_id: int) -> bool:
        return self._episode_count[env_id] + 1 < self._episode_num

    def _after_step(self, env_id: int, ts: TimeStep, was_reset: bool, reset_obs: Any) -> None:
        if not (ts.terminated or ts.truncated):
            self._next_obs[env_id] = ts.obs
            return
        self._episode_count[env_id] += 1
        if self._episode_count[env_id] >= self._episode_num:
            self._state[env_id] = EnvState.DONE
            del self._next_obs[env_id]
        elif was_reset:
            self._next_obs[env_id] = reset_obs
        else:  # the automatic reset is under way (subprocess manager) or failed (recovery follows)
            self._state[env_id] = EnvState.RESET
            del self._next_obs[env_id]

    def _count_failure(self, env_id: int, failure: EnvFailure) -> None:
        """Record a failure of `env_id`; an episode it was playing ends here with a truncated timestep.
        Closes the manager and raises EnvError when the env has failed more than `max_retry` times. After
        `interrupt()` raises EnvManagerInterrupted instead: the failure is most likely the interrupt itself."""
        self._check_interrupted()
        counted = env_id not in self._uncounted
        if counted:
            self._failures[env_id] += 1
        else:  # one failure of the wait before a reset is not counted; a second is (a rebuild failing again
            # and again kept that wait, and the reset, going for ever: a review)
            self._uncounted = self._uncounted - {env_id}
        self._in_flight.discard(env_id)
        pending = self._results.get(env_id)
        if pending is not None:
            # A timestep the caller has not received yet (the env stepped; a sibling env killed the worker): kept,
            # not overwritten by a failure's with the next episode's first observation and no reward. One that
            # ended its episode stays as it is; one mid-episode ends it here, as any failure does.
            if not (pending.terminated or pending.truncated):
                self._results[env_id] = replace(
                    pending, truncated=True, info=replace(pending.info, failure=f"{failure.stage}: {failure.description}"))
        elif self._state[env_id] is EnvState.RUN:
            self._results[env_id] = TimeStep(
                obs=self._next_obs.pop(env_id),
                reward=self._zero_reward(),
                terminated=False,
                truncated=True,
                info=StepInfo(failure=f"{failure.stage}: {failure.description}"),
            )
        self._next_obs.pop(env_id, None)
        self._state[env_id] = EnvState.ERROR
        if not counted:
            logger.warning("env %d failed before its reset, during %s: %s; rebuilding it (not counted: the reset "
                           "starts a fresh max_retry budget)", env_id, failure.stage, failure.description)
            return
        if self._failures[env_id] > self._config.max_retry:
            error = failure.to_error(self._failures[env_id], self._config.max_retry)
            try:
                self.close()
            except Exception:
                logger.exception("closing %s after env %d failed raised", type(self).__name__, env_id)
            raise error
        logger.warning(
            "env %d failed (%d of max_retry=%d) during %s: %s; rebuilding it",
            env_id, self._failures[env_id], self._config.max_retry, failure.stage, failure.description,
        )

    def _zero_reward(self) -> float | np.ndarray:
        spec = self._env_info.reward_spec if self._env_info is not None else None
        if spec is None or spec.shape == ():
            return 0.0
        return np.zeros(spec.shape, spec.dtype)


__all__ = ["BaseEnvManager", "EnvError", "EnvManagerClosedError", "EnvManagerConfig", "EnvManagerInterrupted",
           "EnvState"]


def _integer(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{what}: expected an int, got {value!r}")
    return int(value)


class EnvExitError(RuntimeError):
    """An env raised SystemExit (`sys.exit` in its code): a failure of that env, as any exception of its. Let
    through, it ended the actor's job thread (the actor exited 1, its job released uncounted, so no retry or
    backoff applied) where the subprocess manager reports the same env as failed (a review)."""


def _as_env_error(exc: BaseException) -> BaseException:
    """What an env call raised, as the manager handles it: SystemExit as an `EnvExitError` (caused by it)."""
    if not isinstance(exc, SystemExit):
        return exc
    error = EnvExitError(f"the env raised SystemExit({exc.code!r})")
    error.__cause__ = exc
    error.__traceback__ = exc.__traceback__
    return error
