"""Env managers: many envs behind one `step({env_id: action})`, serially or in worker processes."""

from actor_service.envs.env_manager.base import BaseEnvManager, EnvManagerConfig, EnvState
from actor_service.envs.env_manager.failure import EnvError, EnvManagerClosedError, EnvManagerInterrupted
from actor_service.envs.env_manager.subprocess import SubprocessEnvManager, SubprocessEnvManagerConfig

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
