"""`ForwardKwargs`: a job's ``forward_kwargs``, how the launch player acts (the league's exploration schedule).

Free of torch, so that the coordinator checks a league config's ``forward_kwargs`` at load with the rules
every actor applies (`common.computation` re-exports it beside the algorithms that read it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from common.typed_config import from_mapping


@dataclass(frozen=True)
class ForwardKwargs:
    """Per-call acting behaviour, from a job's ``forward_kwargs`` (the league's exploration schedule)."""

    eps: float = 0.0
    """Probability of replacing the policy's choice by a uniformly random *legal* action."""
    greedy: bool = False
    """Take the most likely (highest-valued) action instead of sampling (evaluation)."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.eps <= 1.0:
            raise ValueError(f"forward_kwargs.eps must be in [0, 1], got {self.eps}")

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any] | ForwardKwargs | None) -> ForwardKwargs:
        if mapping is None or (isinstance(mapping, Mapping) and not mapping):
            return _DEFAULT_FORWARD_KWARGS  # the common case on the acting hot path
        return from_mapping(cls, mapping, "forward_kwargs")


_DEFAULT_FORWARD_KWARGS = ForwardKwargs()
