"""Exponential backoff with full jitter, for reconnecting to a coordinator or learner that is away."""

from __future__ import annotations

import random
from dataclasses import dataclass

import grpc


@dataclass(frozen=True)
class BackoffSettings:
    initial_s: float = 0.1
    max_s: float = 5.0
    multiplier: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.initial_s <= self.max_s:
            raise ValueError(f"backoff: need 0 < initial_s <= max_s, got {self.initial_s}, {self.max_s}")
        if self.multiplier < 1:
            raise ValueError(f"backoff.multiplier must be >= 1, got {self.multiplier}")


class Backoff:
    """`next_delay()` grows the cap after each failure; `reset()` after a success."""

    def __init__(self, settings: BackoffSettings | None = None, rng: random.Random | None = None) -> None:
        self.settings = settings or BackoffSettings()
        self._rng = rng or random.Random()
        self._cap = self.settings.initial_s
        self.failures = 0

    def next_delay(self) -> float:
        delay = self._rng.uniform(self._cap / 2, self._cap)  # never ~0: a tight retry loop helps nobody
        self._cap = min(self.settings.max_s, self._cap * self.settings.multiplier)
        self.failures += 1
        return delay

    def reset(self) -> None:
        self._cap = self.settings.initial_s
        self.failures = 0


def status_code(error: grpc.RpcError) -> grpc.StatusCode | None:
    code = getattr(error, "code", None)
    return code() if callable(code) else None
