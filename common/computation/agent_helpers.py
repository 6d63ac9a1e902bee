"""Experience buffers that decide what a task trains on (FLARE's AgentHelpers).

- `OnlineHelper` keeps the most recent experience and hands all of it over at once (on-policy PPO).
- `ExpReplayHelper` keeps a large ring buffer and samples from it, uniformly or prioritized by TD error
  with importance weights (Schaul et al., 2016), for off-policy learning such as DQN.

Both store ``{key: array}`` batches whose arrays share the leading (row) dimension, and are thread-safe:
actors' data arrives on RPC threads while the training loop takes or samples.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from common.computation.data_processor import pack
from common.computation.priority_tree import PriorityTree


def _rows(batch: Mapping[str, np.ndarray], what: str) -> int:
    if not batch:
        raise ValueError(f"{what}: empty batch")
    rows = {k: np.shape(v)[0] if np.ndim(v) else None for k, v in batch.items()}
    if None in rows.values() or len(set(rows.values())) != 1:
        raise ValueError(f"{what}: arrays disagree on the leading (rows) dim {rows}")
    return next(iter(rows.values()))


class OnlineHelper:
    """Most recent experience, taken whole; when over ``capacity_rows`` the oldest batches are dropped."""

    def __init__(self, capacity_rows: int) -> None:
        if capacity_rows < 1:
            raise ValueError(f"capacity_rows must be >= 1, got {capacity_rows}")
        self.capacity_rows = capacity_rows
        self._batches: list[dict[str, np.ndarray]] = []
        self._rows = 0
        self.dropped_rows = 0
        self._closed = False
        self._cond = threading.Condition()

    @property
    def rows(self) -> int:
        with self._cond:
            return self._rows

    def add(self, batch: Mapping[str, np.ndarray]) -> None:
        rows = _rows(batch, "OnlineHelper.add")
        with self._cond:
            if self._batches and set(batch) != set(self._batches[0]):
                raise ValueError(f"OnlineHelper.add: keys {sorted(batch)} differ from {sorted(self._batches[0])}")
            self._batches.append(dict(batch))
            self._rows += rows
            while self._rows > self.capacity_rows and len(self._batches) > 1:
                dropped = self._batches.pop(0)
                self._rows -= _rows(dropped, "")
                self.dropped_rows += _rows(dropped, "")
            self._cond.notify_all()

    def take(self, min_rows: int = 1, timeout: float | None = None) -> dict[str, np.ndarray] | None:
        """Wait until at least ``min_rows`` are held, then return all of them packed and start empty.

        Returns None when the wait times out or the helper is closed first.
        """
        with self._cond:
            if not self._cond.wait_for(lambda: self._rows >= min_rows or self._closed, timeout):
                return None
            if self._rows < min_rows:
                return None
            batches, self._batches, self._rows = self._batches, [], 0
        return pack(batches).arrays

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


@dataclass(frozen=True)
class ReplaySample:
    batch: dict[str, np.ndarray]
    indices: np.ndarray
    """Slots sampled; hand them back with new priorities to `ExpReplayHelper.update_priorities`."""
    weights: np.ndarray
    """Importance weights (N·P(i))^-β normalised by the largest possible weight; all ones when uniform."""
    generations: np.ndarray
    """Which write of each slot was sampled, so priorities for since-overwritten slots are ignored."""


class ExpReplayHelper:
    """A ring buffer of rows with uniform or prioritized sampling."""

    def __init__(
        self,
        capacity: int,
        prioritized: bool = True,
        alpha: float = 0.6,
        beta: float = 0.4,
        priority_eps: float = 1e-6,
        seed: int | None = None,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        if alpha < 0 or not 0 <= beta <= 1 or priority_eps <= 0:
            raise ValueError(f"need alpha >= 0, 0 <= beta <= 1, priority_eps > 0 (got {alpha}, {beta}, {priority_eps})")
        self.capacity = capacity
        self.prioritized = prioritized
        self.alpha = alpha
        self.beta = beta
        self.priority_eps = priority_eps
        self._rng = np.random.default_rng(seed)
        self._storage: dict[str, np.ndarray] = {}
        self._generation = np.zeros(capacity, dtype=np.int64)
        self._tree = PriorityTree(capacity) if prioritized else None
        self._max_priority = 1.0
        self._next = 0
        self._size = 0
        self._writes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return self._size

    @property
    def total_added(self) -> int:
        return self._writes

    def add(self, batch: Mapping[str, np.ndarray], priorities: np.ndarray | None = None) -> np.ndarray:
        """Store rows (overwriting the oldest when full); new rows get ``priorities`` or the max seen so far."""
        rows = _rows(batch, "ExpReplayHelper.add")
        if rows > self.capacity:
            raise ValueError(f"ExpReplayHelper.add: {rows} rows exceed the capacity {self.capacity}")
        with self._lock:
            if not self._storage:
                self._storage = {
                    k: np.empty((self.capacity, *np.shape(v)[1:]), dtype=np.asarray(v).dtype) for k, v in batch.items()
                }
            if set(batch) != set(self._storage):
                raise ValueError(f"ExpReplayHelper.add: keys {sorted(batch)} differ from {sorted(self._storage)}")
            for key, value in batch.items():
                value = np.asarray(value)
                store = self._storage[key]
                if value.shape[1:] != store.shape[1:] or not np.can_cast(value.dtype, store.dtype, "same_kind"):
                    raise ValueError(
                        f"ExpReplayHelper.add: {key} is {value.dtype}{value.shape[1:]}, buffer holds "
                        f"{store.dtype}{store.shape[1:]}"
                    )
            slots = (self._next + np.arange(rows)) % self.capacity
            for key, value in batch.items():
                self._storage[key][slots] = value
            self._generation[slots] += 1
            self._next = (self._next + rows) % self.capacity
            self._size = min(self.capacity, self._size + rows)
            self._writes += rows
            if self._tree is not None:
                if priorities is None:
                    raw = np.full(rows, self._max_priority)
                else:
                    raw = self._check_priorities(priorities, rows)
                    if rows:  # (given ones count as seen: later rows without any start at least this high)
                        self._max_priority = max(self._max_priority, float(raw.max()))
                self._tree.update(slots, raw**self.alpha)
            return slots

    def sample(self, batch_size: int, beta: float | None = None) -> ReplaySample:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        beta = self.beta if beta is None else beta
        with self._lock:
            if self._size == 0:
                raise ValueError("ExpReplayHelper.sample: the buffer is empty")
            if self._tree is None:
                slots = self._rng.integers(0, self._size, size=batch_size)
                weights = np.ones(batch_size, dtype=np.float32)
            else:
                total = self._tree.total
                # Stratified: one draw from each of batch_size equal slices of the priority mass.
                mass = (np.arange(batch_size) + self._rng.random(batch_size)) * (total / batch_size)
                slots = np.minimum(self._tree.find(np.minimum(mass, total * (1 - 1e-12))), self._size - 1)
                probs = self._tree.get(slots) / total
                max_weight = (self._size * self._tree.min / total) ** -beta
                weights = ((self._size * probs) ** -beta / max_weight).astype(np.float32)
            batch = {k: v[slots] for k, v in self._storage.items()}
            return ReplaySample(batch, slots, weights, self._generation[slots].copy())

    def update_priorities(self, sample: ReplaySample, priorities: np.ndarray) -> None:
        """New raw priorities (e.g. |TD error|) for a sample's rows; rows overwritten since are skipped."""
        if self._tree is None:
            return
        raw = self._check_priorities(priorities, len(sample.indices))
        with self._lock:
            current = self._generation[sample.indices] == sample.generations
            if not np.any(current):
                return
            self._max_priority = max(self._max_priority, float(raw[current].max()))
            self._tree.update(sample.indices[current], raw[current] ** self.alpha)

    def probabilities(self) -> np.ndarray:
        """Sampling probability of each stored row (for tests and diagnostics)."""
        with self._lock:
            if self._tree is None:
                return np.full(self._size, 1.0 / self._size)
            return self._tree.get(np.arange(self._size)) / self._tree.total

    def _check_priorities(self, priorities: np.ndarray, rows: int) -> np.ndarray:
        raw = np.asarray(priorities, dtype=np.float64).ravel()
        if raw.shape != (rows,):
            raise ValueError(f"priorities: expected {rows} values, got shape {np.shape(priorities)}")
        if not np.all(np.isfinite(raw)) or np.any(raw < 0):
            raise ValueError("priorities must be finite and >= 0")
        return raw + self.priority_eps
