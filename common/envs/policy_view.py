"""What one player's policy sees of an env: the single place actors and learners agree on it.

An env describes the whole game (for a two-player board game, both players' observations and legal-action
masks side by side, plus whose turn it is). A policy sees one player's view. Actors cut that view out of every
observation and learners build their model from its specs, so both call these functions, never their own
variants.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from common.computation.specs import (
    ACTION_MASK,
    ActionSpec,
    BoxActionSpec,
    DiscreteActionSpec,
    MultiDiscreteActionSpec,
    TensorSpec,
)
from common.envs.base import ArraySpec, DiscreteSpec, EnvInfo
from common.trajectory import OBSERVATION

TO_PLAY = "to_play"
"""Turn-based envs: the seat that acts now (-1 when the game is over). Not part of a policy's input."""


class UnsupportedEnvError(ValueError):
    """An env whose spaces no policy here can play: said when a learner or actor first builds it, naming the
    space, rather than as an AttributeError from deep in model building."""


_WRAP_ADVICE = ("give env.name as 'python:<module>:<callable>' returning it wrapped in "
                "gymnasium.wrappers.FlattenObservation (a one-hot or flat Box)")


def policy_specs(info: EnvInfo, algorithm: str = "ppo") -> tuple[dict[str, TensorSpec], ActionSpec]:
    """The model-input specs of one player's policy, and its action spec; UnsupportedEnvError for an env whose
    actions are neither one discrete choice, nor several (a MultiDiscrete from 0 or MultiBinary), nor a real vector
    (a float Box) — the last two not for `algorithm` dqn —, or whose observations are not arrays of at least one
    dimension."""
    action = _action_spec(info, algorithm)
    obs_spec = info.obs_spec
    if isinstance(obs_spec, ArraySpec):
        _check_leaf(info, "its observation", obs_spec.shape)
        _check_not_channels_last(info, "its observation", obs_spec.shape, obs_spec.dtype)
        return {OBSERVATION: _tensor_spec(OBSERVATION, obs_spec.shape, obs_spec.dtype)}, action
    if isinstance(obs_spec, DiscreteSpec):
        raise UnsupportedEnvError(
            f"env {info.name!r}: its observation is one integer (a gymnasium Discrete space); the models take "
            f"arrays: {_WRAP_ADVICE}")
    if not isinstance(obs_spec, Mapping) or not obs_spec:
        raise UnsupportedEnvError(
            f"env {info.name!r}: its observations are not arrays (a gymnasium Tuple, Text, Graph or nested Dict "
            f"space); {_WRAP_ADVICE}")
    _check_dict_entries(info, obs_spec)
    specs = {}
    for name, spec in obs_spec.items():
        if name == TO_PLAY:
            continue
        shape = spec.shape[1:] if info.num_players > 1 else spec.shape
        _check_leaf(info, f"its observation {name!r}", shape)
        _check_not_channels_last(info, f"its observation {name!r}", shape, spec.dtype)
        specs[name] = _tensor_spec(name, shape, spec.dtype)
    return specs, action


def _action_spec(info: EnvInfo, algorithm: str) -> ActionSpec:
    spec = info.action_spec
    if isinstance(spec, DiscreteSpec):
        return DiscreteActionSpec(int(spec.num_values))
    if isinstance(spec, ArraySpec) and np.dtype(spec.dtype).kind == "f" and spec.nbytes > 0:
        _check_not_dqn(info, spec, algorithm, "whose Gaussian policy acts in a Box")
        return BoxActionSpec(spec.shape, _bound(spec.minimum, -np.inf), _bound(spec.maximum, np.inf))
    if _multi_discrete(spec):
        _check_not_dqn(info, spec, algorithm, "which chooses every entry of a MultiDiscrete")
        # Counted in Python ints: an integer Box up to its dtype's maximum (2**63 - 1) would wrap around in int64.
        high = np.broadcast_to(np.asarray(spec.maximum), spec.shape)
        nvec = [int(h) + 1 for h in high.flat] if np.all(np.isfinite(high)) else None
        total = math.inf if nvec is None else sum(nvec)
        if total > MAX_MULTI_DISCRETE_CHOICES:
            raise UnsupportedEnvError(
                f"env {info.name!r}: its action space is {_describe(spec)} with {total:,} choices over its "
                f"entries; a policy's head holds one output per choice, at most {MAX_MULTI_DISCRETE_CHOICES:,}")
        assert nvec is not None  # total is finite
        return MultiDiscreteActionSpec(spec.shape, tuple(nvec))
    raise UnsupportedEnvError(
        f"env {info.name!r}: its action space is {_describe(spec)}; the policies here choose one of N discrete "
        "actions (a gymnasium Discrete space starting at 0), several (a MultiDiscrete starting at 0, a "
        "MultiBinary) or a real vector (a float Box)")


MAX_MULTI_DISCRETE_CHOICES = 65_536
"""The most choices a MultiDiscrete action may sum to over its entries: the policy head has one output per
choice (an integer Box of [0, 2**31) per entry would ask for billions)."""


def _multi_discrete(spec: Any) -> bool:
    """An integer array with bounds per entry, all from 0 (`gym_env.spec_from_space`'s MultiDiscrete and
    MultiBinary; an integer Box of such bounds is the same action)."""
    if not (isinstance(spec, ArraySpec) and np.dtype(spec.dtype).kind in "iub" and spec.shape and spec.nbytes > 0):
        return False
    if spec.minimum is None or spec.maximum is None:
        return False
    low, high = np.asarray(spec.minimum), np.asarray(spec.maximum)
    try:
        if np.broadcast_shapes(low.shape, high.shape, spec.shape) != spec.shape:
            return False
    except ValueError:
        return False
    return bool(np.all(low == 0) and np.all(high >= 0))


def _check_not_dqn(info: EnvInfo, spec: Any, algorithm: str, instead: str) -> None:
    if algorithm == "dqn":
        raise UnsupportedEnvError(
            f"env {info.name!r}: its action space is {_describe(spec)}; DQN picks the action of highest value "
            f"among N discrete actions: use policy.algorithm: ppo, {instead}")


def _bound(value: Any, unbounded: float) -> Any:
    return unbounded if value is None else value


def _check_dict_entries(info: EnvInfo, obs_spec: Mapping[str, Any]) -> None:
    """A dict observation must be what the models read (common.algorithms.models.split_input_specs): one array
    `observation` and, optionally, a bool `action_mask`. Other entries, or a mask of 0/1 integers (a gymnasium
    MultiBinary), were refused from model building without a word on what to do."""
    entries = sorted(name for name in obs_spec if name != TO_PLAY)
    if OBSERVATION not in obs_spec or set(entries) - {OBSERVATION, ACTION_MASK}:
        raise UnsupportedEnvError(
            f"env {info.name!r}: its observation is a dict of {entries}; the models read one array "
            f"{OBSERVATION!r} (and a bool {ACTION_MASK!r} of legal actions, if any): return those entries, or "
            f"{_WRAP_ADVICE}")
    mask = obs_spec.get(ACTION_MASK)
    if mask is not None and not isinstance(info.action_spec, DiscreteSpec):
        raise UnsupportedEnvError(
            f"env {info.name!r}: its observation has an {ACTION_MASK!r}, which names legal actions among N "
            f"discrete ones, but its action space is {_describe(info.action_spec)}: drop the mask")
    if mask is not None and np.dtype(mask.dtype) != np.bool_:
        raise UnsupportedEnvError(
            f"env {info.name!r}: its {ACTION_MASK!r} is {np.dtype(mask.dtype).name}; the models take a bool mask: "
            f"declare it gymnasium.spaces.Box(0, 1, ({info.action_spec.num_values},), bool) and return bool arrays")


def _check_leaf(info: EnvInfo, what: str, shape: tuple[int, ...]) -> None:
    if len(shape) == 0:
        raise UnsupportedEnvError(
            f"env {info.name!r}: {what} is a scalar (shape ()); the models take arrays of at least one "
            f"dimension: {_WRAP_ADVICE}")


IMAGE_CHANNELS = (1, 3, 4)
"""Channel counts of pictures: grey, RGB, RGBA."""


def _check_not_channels_last(info: EnvInfo, what: str, shape: tuple[int, ...], dtype: Any) -> None:
    """An (H, W, C) picture, as gymnasium's pixel envs and wrappers give (MiniGrid's (7, 7, 3)), is refused:
    the conv torso reads three dimensions as (C, H, W), so it would take its rows for channels and its colours
    for a width of 3. The default conv stack then failed with advice (`conv_padding: same`) that, followed,
    trained on the misread layout without a word. A picture's channels are fewer than its rows and its columns:
    planes of a small board, channels first ((16, 4, 4), (2, 3, 3)), are no picture laid out (H, W, C); nor is
    anything of an env that says its observations are channels first (`EnvInfo.channels_first`)."""
    if (not info.channels_first and len(shape) == 3 and shape[-1] in IMAGE_CHANNELS
            and shape[0] not in IMAGE_CHANNELS and shape[-1] < min(shape[0], shape[1])):
        # (Any dtype: every 3-D observation goes through the conv torso, and a float picture (H, W, 3) passed
        # the uint8-only check, then trained on the misread layout once `conv_padding: same` made it fit.)
        name = np.dtype(dtype).name
        space = (f"gymnasium.spaces.Box(0, 255, {(shape[2], shape[0], shape[1])}, numpy.uint8)" if name == "uint8"
                 else f"gymnasium.spaces.Box(low, high, {(shape[2], shape[0], shape[1])}, numpy.{name}) (its "
                      "bounds transposed alike)")
        scale = " (and set policy.model.obs_scale: 0.00392 to see pixels in [0, 1])" if name == "uint8" else ""
        raise UnsupportedEnvError(
            f"env {info.name!r}: {what} of shape {tuple(shape)} ({name}) is a picture laid out (H, W, C); the conv "
            "torso takes (C, H, W): give env.name as 'python:<module>:<callable>' returning it wrapped in "
            f"gymnasium.wrappers.TransformObservation(env, lambda obs: obs.transpose(2, 0, 1), {space}){scale}")


def _describe(spec: Any) -> str:
    if spec is None:
        return "not one the adapters know (a gymnasium Tuple, Dict or other composite space)"
    if isinstance(spec, ArraySpec) and spec.shape == ():
        integer = np.dtype(spec.dtype).kind in "iu"
        if integer and spec.minimum is not None and np.ndim(spec.minimum) == 0 and spec.minimum != 0:
            return f"a Discrete space not starting at 0 (from {spec.minimum})"  # (gym_env.spec_from_space)
        return f"{'an integer' if integer else 'a continuous'} scalar ({np.dtype(spec.dtype).name})"
    if isinstance(spec, ArraySpec):
        kind = "continuous" if np.dtype(spec.dtype).kind == "f" else "multi-discrete or multi-binary"
        if kind != "continuous" and spec.minimum is not None and np.any(np.asarray(spec.minimum) != 0):
            kind = "multi-discrete not starting at 0"
        return f"{kind} (an array of shape {spec.shape}, {np.dtype(spec.dtype).name})"
    return type(spec).__name__


def player_view(obs: Any, seat: int, info: EnvInfo) -> dict[str, np.ndarray]:
    """The observation of player `seat` as the policy's inputs (arrays without a batch dimension)."""
    if isinstance(info.obs_spec, ArraySpec):
        return {OBSERVATION: np.asarray(obs)}
    if not isinstance(obs, Mapping):
        raise TypeError(f"{info.name}: expected a dict observation, got {type(obs).__name__}")
    view = {}
    for name in info.obs_spec:
        if name == TO_PLAY:
            continue
        array = np.asarray(obs[name])
        view[name] = array[seat] if info.num_players > 1 else array
    return view


def env_action(action: ActionSpec, chosen: Any, info: EnvInfo) -> Any:
    """What the env receives for a policy's action: the index as an int, or the Box's array clipped to its
    bounds in the env's dtype (the trajectory keeps the unclipped draw: its log-probability is the policy's)."""
    if isinstance(action, DiscreteActionSpec):
        return int(chosen)
    if isinstance(action, MultiDiscreteActionSpec):
        return np.asarray(chosen).astype(info.action_spec.dtype, copy=False).reshape(action.shape)
    return action.clip(chosen, info.action_spec.dtype)


def to_play(obs: Any, info: EnvInfo) -> int:
    """Whose turn it is: the `to_play` entry of a turn-based env, else 0 (single-player envs)."""
    if isinstance(obs, Mapping) and TO_PLAY in obs:
        return int(np.asarray(obs[TO_PLAY]))
    return 0


def _tensor_spec(name: str, shape: tuple[int, ...], dtype: np.dtype) -> TensorSpec:
    dtype_name = np.dtype(dtype).name
    return TensorSpec(name, tuple(int(d) for d in shape), dtype_name)


__all__ = ["ACTION_MASK", "TO_PLAY", "UnsupportedEnvError", "env_action", "player_view", "policy_specs", "to_play"]
