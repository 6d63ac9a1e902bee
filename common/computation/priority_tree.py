"""Vectorised sum- and min-trees over a fixed number of slots (prioritized replay's sampling structure).

Leaves hold priorities; every inner node holds the sum (and the min) of its children, so drawing a slot
with probability proportional to its priority is one root-to-leaf walk, done for a whole batch at once
with numpy (depth ~20 steps for a million slots instead of a Python loop per sample).
"""

from __future__ import annotations

import numpy as np


class PriorityTree:
    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._leaves = 1 << max(0, (capacity - 1).bit_length())
        self._sum = np.zeros(2 * self._leaves, dtype=np.float64)
        self._min = np.full(2 * self._leaves, np.inf, dtype=np.float64)

    @property
    def total(self) -> float:
        return float(self._sum[1])

    @property
    def min(self) -> float:
        """Smallest priority among slots set so far (inf when none)."""
        return float(self._min[1])

    def get(self, slots: np.ndarray) -> np.ndarray:
        return self._sum[self._leaves + np.asarray(slots, dtype=np.int64)]

    def update(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        """Set leaf priorities (> 0, finite); the last value wins for repeated slots."""
        slots = np.asarray(slots, dtype=np.int64).ravel()
        priorities = np.asarray(priorities, dtype=np.float64).ravel()
        if slots.shape != priorities.shape:
            raise ValueError(f"slots {slots.shape} and priorities {priorities.shape} differ in length")
        if slots.size == 0:
            return
        if slots.min() < 0 or slots.max() >= self.capacity:
            raise IndexError(f"slot out of range [0, {self.capacity})")
        if not np.all(np.isfinite(priorities)) or np.any(priorities <= 0):
            raise ValueError("priorities must be finite and > 0")
        nodes = slots + self._leaves
        self._sum[nodes] = priorities
        self._min[nodes] = priorities
        nodes = np.unique(nodes // 2)
        while nodes[0] >= 1:
            self._sum[nodes] = self._sum[2 * nodes] + self._sum[2 * nodes + 1]
            self._min[nodes] = np.minimum(self._min[2 * nodes], self._min[2 * nodes + 1])
            if nodes[0] == 1:
                break
            nodes = np.unique(nodes // 2)

    def find(self, mass: np.ndarray) -> np.ndarray:
        """The slot whose cumulative-priority interval contains each ``mass`` in [0, total)."""
        mass = np.array(mass, dtype=np.float64)
        nodes = np.ones(mass.shape, dtype=np.int64)
        if mass.size == 0:
            return nodes
        while nodes[0] < self._leaves:
            left = 2 * nodes
            left_sum = self._sum[left]
            # Never step into an empty subtree, even when rounding pushes mass past a boundary.
            go_right = ((mass >= left_sum) & (self._sum[left + 1] > 0)) | (left_sum <= 0)
            mass = np.where(go_right, mass - left_sum, mass)
            nodes = np.where(go_right, left + 1, left)
        return nodes - self._leaves
