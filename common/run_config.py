"""The `run:` section of a league config: what `league run` starts on this machine.

Here rather than in league_cli so that every loader of a league config checks it (`league coordinator --config`,
`league eval --config`): the README promises that every key is checked, and a typo in `run:` passed the
coordinator silently, to fail only when the same file was given to `league run`.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.config import MAX_DURATION_S, ConfigError, is_device
from common.job_limits import MAX_ENV_NUM

MAX_RUN_ACTORS = 256
"""`league run` starts its processes on this one machine: 100,000 actors (accepted before) spawned one by one
for many minutes and drove the load average to hundreds. Beyond this, spread the league with the
deployment files (deploy/)."""
MIN_STATUS_INTERVAL_S = 0.1
"""The shortest wait between `league run`'s status polls: each builds the whole league's view."""

MAX_ENV_MAX_RETRY = 1_000_000
"""A bound for `env_max_retry` that still fails a job whose env fails at every step (of a job of many steps)."""


@dataclass(frozen=True)
class RunConfig:
    """The `run:` section of a league config: how `league run` lays the league out on this machine."""

    # Actor processes (each runs `env.env_num` environments unless env_num_per_actor is set).
    actors: int = 2
    env_num_per_actor: int = 0
    manager: str = "subprocess"
    # Failures each env may have per collect job (it is rebuilt each time) before the job fails: the actors'
    # --env-max-retry. A flaky env (a step that raises now and then) stopped the run with no way to allow it more.
    env_max_retry: int = 2
    # Seconds an env step (and a build or reset) may take before the env counts as hung and is rebuilt: the
    # actors' --env-step-timeout and --env-reset-timeout (null: no limit). An env whose steps rightly take
    # longer than a minute was killed at every step under `league run`, with no way to allow it more.
    env_step_timeout_s: float | None = 60.0
    env_reset_timeout_s: float | None = 300.0
    # Budget: stop after this many seconds, or after this many env steps (0: no limit), both counted in this
    # run (a run resumed in the same --run-dir starts its budget afresh).
    seconds: float = 300.0
    env_steps: int = 0
    # How often progress is polled and recorded.
    status_interval_s: float = 2.0
    # Seconds each process gets to stop after SIGTERM before it is killed.
    stop_grace_s: float = 15.0
    # Where the learners train: the learners' --device (auto: the GPU when there is one).
    learner_device: str = "auto"

    def __post_init__(self) -> None:
        # Paths relative to the section: from_dict(RunConfig, ..., "run") puts "run." in front.
        if not 1 <= self.actors <= MAX_RUN_ACTORS:
            raise ConfigError("actors", f"must be within [1, {MAX_RUN_ACTORS}], got {self.actors}")
        if not 0 <= self.env_num_per_actor <= MAX_ENV_NUM:
            raise ConfigError("env_num_per_actor",
                              f"must be within [0, {MAX_ENV_NUM}] (0: env.env_num), got {self.env_num_per_actor}")
        if self.manager not in ("subprocess", "base"):
            raise ConfigError("manager", f"must be 'subprocess' or 'base', got {self.manager!r}")
        if not 0 <= self.env_max_retry <= MAX_ENV_MAX_RETRY:
            raise ConfigError("env_max_retry", f"must be within [0, {MAX_ENV_MAX_RETRY}], got {self.env_max_retry}")
        for name in ("env_step_timeout_s", "env_reset_timeout_s"):
            value = getattr(self, name)
            if value is not None and not 0 < value <= MAX_DURATION_S:
                raise ConfigError(name, f"must be > 0 and at most {MAX_DURATION_S:g} seconds, or null (no limit), "
                                        f"got {value}")
        if not 0 < self.seconds <= MAX_DURATION_S:
            raise ConfigError("seconds", f"must be > 0 and at most {MAX_DURATION_S:g}, got {self.seconds}")
        if self.env_steps < 0:
            raise ConfigError("env_steps", f"must be >= 0, got {self.env_steps}")
        # The poll loop waits status_interval_s between polls (0, or 1e-300: a busy loop of status calls that
        # each build the whole league's view) and stop_grace_s per process.
        if not MIN_STATUS_INTERVAL_S <= self.status_interval_s <= MAX_DURATION_S:
            raise ConfigError("status_interval_s", f"must be within [{MIN_STATUS_INTERVAL_S:g}, {MAX_DURATION_S:g}], "
                                                   f"got {self.status_interval_s}")
        if not is_device(self.learner_device):
            raise ConfigError("learner_device", f"expected auto, cpu, cuda or cuda:N, got {self.learner_device!r}")
        if not 0 <= self.stop_grace_s <= MAX_DURATION_S:
            raise ConfigError("stop_grace_s", f"must be >= 0 and at most {MAX_DURATION_S:g}, got {self.stop_grace_s}")
