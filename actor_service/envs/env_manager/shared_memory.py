"""Observation buffers in shared memory, so large numpy observations never go through a pipe.

One block holds, for every env, `2 + pool` slots per observation array:
- STEP_SLOT: a step's observation, which the parent copies out (used when no pool slot is free);
- RESET_SLOT: the first observation of the episode an automatic reset started (copied out);
- pool slots (POOL_FIRST on): a step's observation handed to the caller *without a copy*. The parent gives
  the caller the slot's own numpy array, and lets a worker write that slot again only once nothing but the
  buffer holds the array (its reference count; every numpy view of it holds it too). An observation the
  caller keeps therefore stays intact, and one it drops costs no copy: copying a 28 KB frame out of memory
  another CPU just wrote was the largest part of the parent's work per step (measured).
A worker writes an env's slots only while it handles a command for that env, and the parent reads them only
after the reply, so no lock is needed.

An observation must fit its slot's shape and dtype (the spec's): `write` refuses one that does not by the rule
of obs_check.py, which the serial manager applies too.
"""

from __future__ import annotations

import logging
import sys
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import Any

import numpy as np

from actor_service.envs.env_manager.obs_check import checked_array, supports
from actor_service.envs.env_manager.shm_blocks import create_block
from common.envs.base import ObsSpec

logger = logging.getLogger(__name__)

STEP_SLOT = 0
RESET_SLOT = 1
POOL_FIRST = 2
_getrefcount = sys.getrefcount
_ALIGN = 64
# Pool slots per env: 2 let a caller that drops each observation before the env's next step go without
# copies (one slot holds the observation waiting for an action, the worker writes the other); a third
# leaves room for a caller that keeps the last one a step longer. Fewer (none) for large observations.
POOL_SIZE = 3
POOL_MAX_BYTES = 64 << 20
# Below this size a copy costs less than finding a free pool slot: no pool.
POOL_MIN_OBS_BYTES = 4096

# Blocks not unmapped at close because a caller still held observations in them (unmapping would pull the
# memory from under those arrays): each with weak references to the held arrays, and unmapped by a later
# `create` or `close` once they are all gone.
_held_blocks: list[tuple[shared_memory.SharedMemory, list[weakref.ref]]] = []


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
    slots: int = POOL_FIRST


def pool_size_for(obs_spec: ObsSpec, env_num: int) -> int:
    """Pool slots per env for this spec: POOL_SIZE, fewer where that would take over POOL_MAX_BYTES (and
    none where fewer than 2 fit: one slot alone never frees up); none for observations under
    POOL_MIN_OBS_BYTES."""
    specs = obs_spec.values() if isinstance(obs_spec, Mapping) else [obs_spec]
    nbytes = sum(int(np.prod(spec.shape, dtype=np.int64)) * np.dtype(spec.dtype).itemsize for spec in specs)
    if nbytes < POOL_MIN_OBS_BYTES:
        return 0
    fit = POOL_MAX_BYTES // max(1, nbytes * env_num)
    size = min(POOL_SIZE, fit)
    return size if size >= 2 else 0


class ObsBuffer:
    """Numpy views over the shared block; `create` in the parent (which owns and unlinks it), `attach` in
    workers."""

    def __init__(self, shm: shared_memory.SharedMemory, layout: ObsLayout, owner: bool) -> None:
        self._shm = shm
        self._owner = owner
        self.layout = layout
        slots = layout.slots
        self.pool_slots = range(POOL_FIRST, slots)
        # One array per (env, slot, leaf), made once: indexing on every call costs more than the copy itself.
        # Each is made directly on the block (its base is not another array), so that every view a caller
        # takes of a pool observation refers to that very array, and its reference count tells if it is held.
        self._slots: list[list[dict[str | None, np.ndarray]]] = [
            [
                {
                    leaf.key: np.ndarray(
                        leaf.shape, np.dtype(leaf.dtype), shm.buf,
                        leaf.offset + (env_id * slots + slot) * _nbytes(leaf),
                    )
                    for leaf in layout.leaves
                }
                for slot in range(slots)
            ]
            for env_id in range(layout.env_num)
        ]
        self._single = layout.leaves[0].key is None
        # single_views[slot][env_id]: the slot's array where the observation is one array (else no list at all):
        # the hot paths use it directly.
        self.single_views: list[list[np.ndarray]] = [
            [self._slots[env_id][slot][None] for env_id in range(layout.env_num)] for slot in range(slots)
        ] if self._single else []
        # (slot, leaves) of each env's pool slots, and the reference count a leaf shows while only this buffer
        # holds it, measured now (nothing else holds them yet) by the same code that checks it later.
        self._pool_leaves = [
            [(slot, tuple(self._slots[env_id][slot].values())) for slot in self.pool_slots]
            for env_id in range(layout.env_num)
        ]
        self._free_refs = 0
        if self.pool_slots:
            for _, leaves in self._pool_leaves[0]:
                for leaf in leaves:
                    self._free_refs = max(self._free_refs, _getrefcount(leaf))

    @classmethod
    def create(cls, obs_spec: ObsSpec, env_num: int, pool_size: int = 0) -> ObsBuffer:
        if not supports(obs_spec):
            raise ValueError(f"observations of spec {obs_spec!r} cannot go through shared memory")
        _release_held_blocks()
        slots = POOL_FIRST + pool_size
        specs = obs_spec.items() if isinstance(obs_spec, Mapping) else [(None, obs_spec)]
        leaves = []
        offset = 0
        for key, spec in specs:
            leaf = _Leaf(key, tuple(spec.shape), np.dtype(spec.dtype).str, offset)
            leaves.append(leaf)
            offset += -(-max(env_num * slots * _nbytes(leaf), 1) // _ALIGN) * _ALIGN
        shm = create_block(offset)
        return cls(shm, ObsLayout(shm.name, env_num, tuple(leaves), offset, slots), owner=True)

    @classmethod
    def attach(cls, layout: ObsLayout) -> ObsBuffer:
        return cls(shared_memory.SharedMemory(name=layout.shm_name), layout, owner=False)

    def write(self, env_id: int, slot: int, obs: Any) -> None:
        """Copy `obs` into the slot; ValueError if its keys, shapes or dtypes do not fit the spec (module doc)."""
        views = self._slots[env_id][slot]
        if self._single:
            _copy_into(views[None], obs, f"env {env_id}: observation")
            return
        if not isinstance(obs, Mapping) or obs.keys() != views.keys():
            got = sorted(obs) if isinstance(obs, Mapping) else type(obs).__name__
            raise ValueError(f"env {env_id}: observation keys {got} do not match the env's spec {sorted(views)}")
        for key, view in views.items():
            _copy_into(view, obs[key], f"env {env_id}: observation[{key!r}]")

    def read(self, env_id: int, slot: int) -> Any:
        """The observation in `slot`: a copy from STEP_SLOT/RESET_SLOT, the slot's own arrays from a pool
        slot (see the module doc)."""
        views = self._slots[env_id][slot]
        if slot >= POOL_FIRST:
            return views[None] if self._single else dict(views)
        if self._single:
            return views[None].copy()
        return {key: view.copy() for key, view in views.items()}

    def free_slot(self, env_id: int) -> int:
        """A pool slot of `env_id` whose observation nobody holds any more (the worker may write it), else
        STEP_SLOT (the parent will copy the observation out)."""
        free_refs = self._free_refs
        for slot, leaves in self._pool_leaves[env_id]:
            for leaf in leaves:
                if _getrefcount(leaf) > free_refs:
                    break
            else:
                return slot
        return STEP_SLOT

    def close(self) -> None:
        """Drop the views and the mapping; the owner also removes the block. Where a caller still holds
        observations from pool slots, the mapping stays until they are gone (the name is removed at once)."""
        if self._shm is None:
            return
        held = []
        free_refs = self._free_refs
        for env_slots in self._pool_leaves:  # (the same reference pattern as in free_slot)
            for _, leaves in env_slots:
                for leaf in leaves:
                    if _getrefcount(leaf) > free_refs:
                        held.append(weakref.ref(leaf))
        self._slots = []
        self.single_views = []
        self._pool_leaves = []
        shm, self._shm = self._shm, None
        if held:
            _held_blocks.append((shm, held))
            logger.debug("%d shared observation(s) still held at close; the block is unmapped once they are gone",
                          len(held))
        else:
            shm.close()
        if self._owner:
            unlink(shm)
        _release_held_blocks()


def _nbytes(leaf: _Leaf) -> int:
    return int(np.prod(leaf.shape, dtype=np.int64)) * np.dtype(leaf.dtype).itemsize


def unlink(shm: shared_memory.SharedMemory) -> None:
    """Remove the block's name; one already gone (something wiped /dev/shm under us, seen once on a shared
    test machine) is logged, not raised: close() must still finish freeing everything else."""
    try:
        shm.unlink()
    except FileNotFoundError:
        logger.warning("shared-memory block %s was already removed by someone else", shm.name)


def _release_held_blocks() -> None:
    for entry in list(_held_blocks):
        shm, held = entry
        if all(ref() is None for ref in held):
            _held_blocks.remove(entry)
            shm.close()


def _copy_into(dst: np.ndarray, value: Any, name: str) -> None:
    dst[...] = checked_array(value, dst.shape, dst.dtype, name)
