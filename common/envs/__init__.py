"""Environments: the `Env` interface, the gymnasium and OpenSpiel adapters, and env names (`make_env`).

They live in `common` because more than the actors need them: a learner builds its model from the env's
observation and action specs, and `league eval` plays checkpoints in them. The env *managers* (running many
envs in subprocesses) stay in actor_service.
"""

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
from common.envs.registry import EnvSpec, env_factories, env_info, make_env

__all__ = [
    "NO_INFO",
    "ArraySpec",
    "DiscreteSpec",
    "Env",
    "EnvInfo",
    "EpisodeStats",
    "Outcome",
    "StepInfo",
    "TimeStep",
    "EnvSpec",
    "env_factories",
    "env_info",
    "make_env",
]
