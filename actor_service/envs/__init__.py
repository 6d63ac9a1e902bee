"""Environments for actors: the env managers, plus the `Env` interface and env names from common.envs.

Adapters (gymnasium, pyspiel) are imported by `make_env` when first needed, so a worker process that only
runs test envs does not pay for importing them.
"""

from actor_service.envs.env_manager import (
    BaseEnvManager,
    EnvError,
    EnvManagerClosedError,
    EnvManagerConfig,
    EnvState,
    SubprocessEnvManager,
    SubprocessEnvManagerConfig,
)
from common.envs.base import (
    NO_INFO,
    ArraySpec,
    DiscreteSpec,
    Env,
    EnvInfo,
    EpisodeStats,
    Outcome,
    StepInfo,
    TimeStep,
)
from common.envs.registry import EnvSpec, env_factories, make_env

__all__ = [
    "NO_INFO",
    "ArraySpec",
    "BaseEnvManager",
    "DiscreteSpec",
    "Env",
    "EnvError",
    "EnvInfo",
    "EnvManagerClosedError",
    "EnvManagerConfig",
    "EnvSpec",
    "EnvState",
    "EpisodeStats",
    "Outcome",
    "StepInfo",
    "SubprocessEnvManager",
    "SubprocessEnvManagerConfig",
    "TimeStep",
    "env_factories",
    "make_env",
]
