"""Env managers for actors: run many environments serially or in worker processes.

The `Env` interface, the adapters and env names (`make_env`) live in common.envs, shared with learners.
"""

from actor_service.envs.env_manager import (
    BaseEnvManager,
    EnvError,
    EnvManagerClosedError,
    EnvManagerConfig,
    EnvManagerInterrupted,
    EnvState,
    SubprocessEnvManager,
    SubprocessEnvManagerConfig,
)

__all__ = [
    "BaseEnvManager",
    "EnvError",
    "EnvManagerClosedError",
    "EnvManagerConfig",
    "EnvManagerInterrupted",
    "EnvState",
    "SubprocessEnvManager",
    "SubprocessEnvManagerConfig",
]
