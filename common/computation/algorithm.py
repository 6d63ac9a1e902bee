"""`Algorithm`: how a model acts (`predict`) and how it is trained (`learn`), in torch.

Only `ComputationTask` calls these; it hands over torch tensors converted by the specs and turns the
results back into numpy, so the rest of the code base never sees torch.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from common.computation.model import Model
from common.computation.specs import TensorSpec
from common.computation.typed_config import from_mapping


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


@dataclass
class LearnOutput:
    """What one `Algorithm.learn` call reports: scalar statistics and, for replay, new priorities."""

    stats: dict[str, float]
    priorities: torch.Tensor | None = None


class Algorithm(ABC):
    """Owns a `Model` (and whatever else training needs: optimizer, target network)."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self.generator = torch.Generator()
        """Randomness of acting and minibatch order; seeded by the task for reproducible runs."""

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def get_artifact_specs(self) -> list[TensorSpec]:
        """Per-row outputs of `predict` besides the actions (stored under ``/agents/<n>/artifacts/``)."""
        return []

    @abstractmethod
    def get_learn_specs(self) -> list[TensorSpec]:
        """The keys of a `learn` batch with their per-element shapes (leading dims are the algorithm's)."""

    @abstractmethod
    def predict(
        self, inputs: dict[str, torch.Tensor], states: dict[str, torch.Tensor], kwargs: ForwardKwargs
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """Actions and artifacts by spec name, and the next recurrent states."""

    @abstractmethod
    def learn(self, batch: dict[str, torch.Tensor]) -> LearnOutput:
        """One training update on ``batch``."""

    def on_weights_loaded(self) -> None:
        """Called after `ComputationTask.set_weights` (e.g. DQN re-syncs its target network)."""
        return None

    def to(self, device: torch.device) -> None:
        """Move every module the algorithm owns (parameters keep their identity, so optimizers stay valid)."""
        self.model.to(device)
