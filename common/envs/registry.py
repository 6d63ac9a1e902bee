"""Env names -> envs, so a job's `env_name` + `env_kwargs` is all a subprocess needs to build its env."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from common.envs.base import Env

OPENSPIEL_PREFIX = "openspiel:"
# Short names for OpenSpiel games; anything else goes through "openspiel:<game>" or to gymnasium.
OPENSPIEL_ALIASES = ("connect_four",)


def make_env(name: str, **kwargs: Any) -> Env:
    """`connect_four` and `openspiel:<game>` build an `OpenSpielEnv`; any other name is a gymnasium id."""
    if not name:
        raise ValueError("make_env: env name is empty")
    if name in OPENSPIEL_ALIASES or name.startswith(OPENSPIEL_PREFIX):
        from common.envs.openspiel_env import OpenSpielEnv

        return OpenSpielEnv(name.removeprefix(OPENSPIEL_PREFIX), **kwargs)
    from common.envs.gym_env import GymEnv

    return GymEnv(name, **kwargs)


@dataclass(frozen=True)
class EnvSpec:
    """A picklable env factory: `EnvSpec("CartPole-v1")()` builds the env (in whichever process calls it)."""

    name: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("EnvSpec.name is empty")

    def __call__(self) -> Env:
        return make_env(self.name, **self.kwargs)


def env_factories(name: str, env_num: int, **kwargs: Any) -> list[EnvSpec]:
    """`env_num` identical factories, the usual argument of an env manager."""
    if env_num < 1:
        raise ValueError(f"env_num must be >= 1, got {env_num}")
    return [EnvSpec(name, dict(kwargs)) for _ in range(env_num)]
