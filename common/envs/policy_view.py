"""What one player's policy sees of an env: the single place actors and learners agree on it.

An env describes the whole game (for a two-player board game, both players' observations and legal-action
masks side by side, plus whose turn it is). A policy sees one player's view. Actors cut that view out of every
observation and learners build their model from its specs, so both call these functions, never their own
variants.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from common.computation.specs import ACTION_MASK, DiscreteActionSpec, TensorSpec
from common.envs.base import ArraySpec, EnvInfo
from common.trajectory import OBSERVATION

TO_PLAY = "to_play"
"""Turn-based envs: the seat that acts now (-1 when the game is over). Not part of a policy's input."""


def policy_specs(info: EnvInfo) -> tuple[dict[str, TensorSpec], DiscreteActionSpec]:
    """The model-input specs of one player's policy, and its action spec."""
    action = DiscreteActionSpec(int(info.action_spec.num_values))
    if isinstance(info.obs_spec, ArraySpec):
        return {OBSERVATION: _tensor_spec(OBSERVATION, info.obs_spec.shape, info.obs_spec.dtype)}, action
    specs = {}
    for name, spec in info.obs_spec.items():
        if name == TO_PLAY:
            continue
        shape = spec.shape[1:] if info.num_players > 1 else spec.shape
        specs[name] = _tensor_spec(name, shape, spec.dtype)
    return specs, action


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


def to_play(obs: Any, info: EnvInfo) -> int:
    """Whose turn it is: the `to_play` entry of a turn-based env, else 0 (single-player envs)."""
    if isinstance(obs, Mapping) and TO_PLAY in obs:
        return int(np.asarray(obs[TO_PLAY]))
    return 0


def _tensor_spec(name: str, shape: tuple[int, ...], dtype: np.dtype) -> TensorSpec:
    dtype_name = np.dtype(dtype).name
    return TensorSpec(name, tuple(int(d) for d in shape), dtype_name)


__all__ = ["ACTION_MASK", "TO_PLAY", "policy_specs", "player_view", "to_play"]
