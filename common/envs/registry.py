"""Env names -> envs, so a job's `env_name` + `env_kwargs` is all a subprocess needs to build its env."""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from common.envs.base import Env, EnvInfo

OPENSPIEL_PREFIX = "openspiel:"
# "python:package.module:Name" builds `Name(**kwargs)` from an importable module: envs of your own (and the test
# doubles) named in a league config like any other env, built by the same name in every env worker process.
PYTHON_PREFIX = "python:"
# Short names for OpenSpiel games; anything else goes through "openspiel:<game>" or to gymnasium.
OPENSPIEL_ALIASES = ("connect_four",)


def make_env(name: str, **kwargs: Any) -> Env:
    """`connect_four` and `openspiel:<game>` build an `OpenSpielEnv`; `python:<module>:<name>` calls that
    callable with `kwargs` (it must return an `Env`, or a gymnasium env, which goes behind `GymEnv`); any
    other name is a gymnasium id."""
    if not name:
        raise ValueError("make_env: env name is empty")
    if name.startswith(PYTHON_PREFIX):
        return _python_env(name, kwargs)
    if name in OPENSPIEL_ALIASES or name.startswith(OPENSPIEL_PREFIX):
        return _openspiel_env(name, kwargs)
    import gymnasium

    from common.envs.gym_env import GymEnv

    try:
        return GymEnv(name, **kwargs)
    except gymnasium.error.UnregisteredEnv as err:
        raise ValueError(f"env name {name!r}: {err}{_openspiel_hint(name)}") from err


def _openspiel_env(name: str, kwargs: Mapping[str, Any]) -> Env:
    """An `OpenSpielEnv`, with pyspiel's errors as one-line ValueErrors naming the env.

    Why: pyspiel's error for an unknown game lists every registered game (over a hundred lines), printed to
    stderr by its C++ side as well, in every worker's log; so the name is checked before pyspiel sees it."""
    import pyspiel

    from common.envs.openspiel_env import OpenSpielEnv

    game = name.removeprefix(OPENSPIEL_PREFIX)
    games = pyspiel.registered_names()
    if game not in games:
        close = difflib.get_close_matches(game, games, n=3)
        hint = (f"; did you mean {' or '.join(repr(g) for g in close)}?" if close
                else " (pyspiel.registered_names() lists its games)")
        raise ValueError(f"env name {name!r}: OpenSpiel has no game {game!r}{hint}")
    try:
        return OpenSpielEnv(game, **kwargs)
    except pyspiel.SpielError as err:  # bad game parameters: keep the first line, not a list that may follow
        lines = str(err).strip().splitlines() or [type(err).__name__]
        raise ValueError(f"env name {name!r}: {lines[0]}") from None


def env_info(name: str, **kwargs: Any) -> EnvInfo:
    """The `info()` of the env `make_env(name, **kwargs)` builds, which is closed again: its spaces, for building
    a policy without playing it."""
    env = make_env(name, **kwargs)
    try:
        return env.info()
    finally:
        env.close()


def _openspiel_hint(name: str) -> str:
    """A gymnasium id that is not registered but names an OpenSpiel game: say how to ask for the game."""
    import pyspiel

    if name in pyspiel.registered_names():
        return f" OpenSpiel has a game of that name: use '{OPENSPIEL_PREFIX}{name}'."
    return ""


def _python_env(name: str, kwargs: Mapping[str, Any]) -> Env:
    module_name, sep, attr = name.removeprefix(PYTHON_PREFIX).partition(":")
    if not (module_name and sep and attr):
        raise ValueError(f"env name {name!r}: expected {PYTHON_PREFIX}<module>:<callable>")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        hint = ""
        if isinstance(err, ModuleNotFoundError) and err.name and (module_name + ".").startswith(err.name + "."):
            # `league run` starts its workers with `python -m`, which searches the directory it was started from;
            # `league eval` and workers started on their own do not: a run trained, its checkpoint did not load.
            hint = ("; a module of your own must be importable wherever the env is built: add its directory to "
                    "PYTHONPATH (only `league run` also searches the directory it was started from)")
        raise ValueError(f"env name {name!r}: cannot import {attr!r} from {module_name!r}: {err}{hint}") from err
    except Exception as err:  # the module's own code failed (a SyntaxError, an error at import): said with its name
        raise ValueError(f"env name {name!r}: importing {module_name!r} raised {type(err).__name__}: {err}") from err
    env = factory(**kwargs)
    if not isinstance(env, Env):
        import gymnasium

        if isinstance(env, gymnasium.Env):
            # A gymnasium env, such as one wrapped in FlattenObservation as UnsupportedEnvError's advice says:
            # behind `Env` like a gymnasium id.
            from common.envs.gym_env import GymEnv

            return GymEnv(lambda: env, env_name=name)
        raise TypeError(f"env name {name!r}: {module_name}.{attr} returned a {type(env).__name__}, not an Env")
    return env


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
