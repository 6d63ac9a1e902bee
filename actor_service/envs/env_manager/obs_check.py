"""Observations checked against their env's spec: one rule for both env managers.

The subprocess manager writes observations into shared memory laid out from the spec, so an observation of
another shape, or of a dtype that cannot be cast to the spec's without changing values, fails that env's step
there (the env is rebuilt, the failure says why). The serial manager used to pass observations on as they
came: a wrong one reached the policy and failed the job later with an error about tensors, and a float64
observation of a float32 env reached the policy as float64 from one manager and float32 from the other. The
serial manager now applies the same rule and hands on the same arrays (`ObsConform`).

The rule: the shape must be the spec's; the dtype must cast safely to the spec's (int64 300 must not become
uint8 44 without a word), except float to float (gymnasium envs often return float64 for a float32 space;
that loses only precision). Python numbers and lists are taken at the dtype numpy gives them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from common.envs.base import ArraySpec, DiscreteSpec, ObsSpec


def checked_array(value: Any, shape: tuple[int, ...], dtype: np.dtype, name: str) -> np.ndarray:
    """`value` as a numpy array (not yet cast) once it fits `shape` and `dtype` (module doc); else ValueError."""
    if type(value) is not np.ndarray:
        value = np.asarray(value)
    if value.shape != shape:
        raise ValueError(f"{name} has shape {value.shape}, but the env's spec says {shape}")
    if value.dtype is not dtype and not _fits(value.dtype, dtype):
        raise ValueError(
            f"{name} has dtype {value.dtype}, but the env's spec says {dtype}, and the cast is not safe "
            "(it could change values); return observations of the spec's dtype"
        )
    return value


def _fits(src: np.dtype, dst: np.dtype) -> bool:
    return np.can_cast(src, dst, "safe") or (src.kind == "f" and dst.kind == "f")


def supports(obs_spec: ObsSpec) -> bool:
    """Whether observations of this spec are arrays to check (and to put in shared memory): an array or a flat
    dict of arrays."""
    if isinstance(obs_spec, (ArraySpec, DiscreteSpec)):
        return True
    return isinstance(obs_spec, Mapping) and bool(obs_spec) and all(
        isinstance(leaf, (ArraySpec, DiscreteSpec)) for leaf in obs_spec.values()
    )


class ObsConform:
    """One env's observations made to fit its spec: `fits` tests the usual case cheaply (arrays of exactly the
    spec: it runs every step), `__call__` handles the rest."""

    __slots__ = ("_dtype", "_items", "_shape")

    def __init__(self, spec: ArraySpec | DiscreteSpec | Mapping[str, ArraySpec | DiscreteSpec]) -> None:
        self._items: tuple[tuple[str, tuple[int, ...], np.dtype], ...] | None = None  # a dict spec's leaves
        self._shape: tuple[int, ...] | None = None
        self._dtype: np.dtype | None = None
        if isinstance(spec, Mapping):
            self._items = tuple((key, tuple(leaf.shape), np.dtype(leaf.dtype)) for key, leaf in spec.items())
        else:
            self._shape = tuple(spec.shape)
            self._dtype = np.dtype(spec.dtype)

    @classmethod
    def for_spec(cls, spec: ObsSpec) -> ObsConform | None:
        """The check for `spec`; None where the spec says nothing to check against (no spec, or one that
        is not arrays: the subprocess manager pickles such observations, unchecked)."""
        return cls(spec) if supports(spec) else None  # type: ignore[arg-type]

    def fits(self, obs: Any) -> bool:
        """Whether `obs` is already exactly the spec's arrays (False sends it to `__call__`)."""
        if self._items is None:
            return type(obs) is np.ndarray and obs.shape == self._shape and obs.dtype is self._dtype
        if type(obs) is not dict or len(obs) != len(self._items):
            return False
        for key, shape, dtype in self._items:
            value = obs.get(key)
            if type(value) is not np.ndarray or value.shape != shape or value.dtype is not dtype:
                return False
        return True

    def __call__(self, obs: Any, env_id: int) -> Any:
        """`obs` as the spec's arrays (the same object where it already is); ValueError naming the env if
        it does not fit."""
        if self._items is None:
            assert self._shape is not None and self._dtype is not None
            array = checked_array(obs, self._shape, self._dtype, f"env {env_id}: observation")
            return array if array.dtype == self._dtype else array.astype(self._dtype)
        keys = sorted(key for key, _, _ in self._items)
        if not isinstance(obs, Mapping) or sorted(obs.keys()) != keys:
            got = sorted(obs) if isinstance(obs, Mapping) else type(obs).__name__
            raise ValueError(f"env {env_id}: observation keys {got} do not match the env's spec {keys}")
        conformed = {}
        for key, shape, dtype in self._items:
            array = checked_array(obs[key], shape, dtype, f"env {env_id}: observation[{key!r}]")
            conformed[key] = array if array.dtype == dtype else array.astype(dtype)
        same = all(conformed[key] is obs[key] for key in conformed)
        return obs if same else conformed


__all__ = ["ObsConform", "checked_array", "supports"]
