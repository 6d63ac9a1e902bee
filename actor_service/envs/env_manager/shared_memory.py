"""Observation buffers in shared memory, so large numpy observations never go through a pipe.

One block holds, for every env, two slots per observation array: slot STEP_SLOT for the observation a step
returned, slot RESET_SLOT for the first observation of the episode an automatic reset started. A worker
writes an env's slots only while it handles a command for that env, and the parent copies them out before
it sends that env its next command, so no lock is needed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import Any

import numpy as np

from common.envs.base import ArraySpec, DiscreteSpec, ObsSpec

STEP_SLOT = 0
RESET_SLOT = 1
_SLOTS = 2
_ALIGN = 64


@dataclass(frozen=True)
class _Leaf:
    key: str | None  # None: the observation is this one array
    shape: tuple[int, ...]
    dtype: str
    offset: int


@dataclass(frozen=True)
class ObsLayout:
    """Where each env's observation slots live in the named shared-memory block (sent to workers)."""

    shm_name: str
    env_num: int
    leaves: tuple[_Leaf, ...]
    size: int


def supports(obs_spec: ObsSpec) -> bool:
    """Whether observations of this spec can live in shared memory (an array or a flat dict of arrays)."""
    if isinstance(obs_spec, (ArraySpec, DiscreteSpec)):
        return True
    return isinstance(obs_spec, Mapping) and bool(obs_spec) and all(
        isinstance(leaf, (ArraySpec, DiscreteSpec)) for leaf in obs_spec.values()
    )


class ObsBuffer:
    """Numpy views over the shared block; `create` in the parent (which owns and unlinks it), `attach` in
    workers."""

    def __init__(self, shm: shared_memory.SharedMemory, layout: ObsLayout, owner: bool) -> None:
        self._shm = shm
        self._owner = owner
        self.layout = layout
        arrays = {
            leaf.key: np.ndarray((layout.env_num, _SLOTS, *leaf.shape), np.dtype(leaf.dtype), shm.buf, leaf.offset)
            for leaf in layout.leaves
        }
        # One view per (env, slot), made once: indexing on every call costs more than the copy itself.
        self._slots: list[list[dict[str | None, np.ndarray]]] = [
            [{key: array[env_id, slot, ...] for key, array in arrays.items()} for slot in range(_SLOTS)]
            for env_id in range(layout.env_num)
        ]
        self._single = None in arrays

    @classmethod
    def create(cls, obs_spec: ObsSpec, env_num: int) -> ObsBuffer:
        if not supports(obs_spec):
            raise ValueError(f"observations of spec {obs_spec!r} cannot go through shared memory")
        specs = obs_spec.items() if isinstance(obs_spec, Mapping) else [(None, obs_spec)]
        leaves = []
        offset = 0
        for key, spec in specs:
            leaves.append(_Leaf(key, tuple(spec.shape), np.dtype(spec.dtype).str, offset))
            nbytes = env_num * _SLOTS * int(np.prod(spec.shape, dtype=np.int64)) * np.dtype(spec.dtype).itemsize
            offset += -(-max(nbytes, 1) // _ALIGN) * _ALIGN
        shm = shared_memory.SharedMemory(create=True, size=offset)
        return cls(shm, ObsLayout(shm.name, env_num, tuple(leaves), offset), owner=True)

    @classmethod
    def attach(cls, layout: ObsLayout) -> ObsBuffer:
        return cls(shared_memory.SharedMemory(name=layout.shm_name), layout, owner=False)

    def write(self, env_id: int, slot: int, obs: Any) -> None:
        views = self._slots[env_id][slot]
        if self._single:
            _copy_into(views[None], obs, "observation")
            return
        if not isinstance(obs, Mapping) or obs.keys() != views.keys():
            got = sorted(obs) if isinstance(obs, Mapping) else type(obs).__name__
            raise ValueError(f"observation keys {got} do not match the env's spec {sorted(views)}")
        for key, view in views.items():
            _copy_into(view, obs[key], f"observation[{key!r}]")

    def read(self, env_id: int, slot: int) -> Any:
        """A copy of the observation (the slot is overwritten by the env's next command)."""
        views = self._slots[env_id][slot]
        if self._single:
            return views[None].copy()
        return {key: view.copy() for key, view in views.items()}

    def close(self) -> None:
        """Drop the views and the mapping; the owner also removes the block."""
        if self._shm is None:
            return
        self._slots = []
        shm, self._shm = self._shm, None
        shm.close()
        if self._owner:
            shm.unlink()


def _copy_into(dst: np.ndarray, value: Any, name: str) -> None:
    if (value.shape if type(value) is np.ndarray else np.shape(value)) != dst.shape:
        raise ValueError(f"{name} has shape {np.shape(value)}, but the env's spec says {dst.shape}")
    dst[...] = value
