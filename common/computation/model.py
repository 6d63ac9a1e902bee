"""`Model`: a network plus the specs of what it reads and writes (FLARE's Model).

A model only computes; an `Algorithm` decides which of its functions to call for acting and for learning,
so one Q-network serves DQN and its variants, and one actor-critic serves PPO with or without correction.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from torch import nn

from common.computation.specs import TensorSpec


class Model(nn.Module, ABC):
    """Subclasses implement the network and declare its input and action specs."""

    @abstractmethod
    def get_input_specs(self) -> list[TensorSpec]:
        """The observation entries the network reads, e.g. ``observation`` and an optional ``action_mask``."""

    def get_state_specs(self) -> list[TensorSpec]:
        """Recurrent state carried between steps; empty for memoryless models."""
        return []

    @abstractmethod
    def get_action_specs(self) -> list[TensorSpec]:
        """What acting produces, e.g. ``action`` (int64, shape ())."""

    def get_reward_specs(self) -> list[TensorSpec]:
        return [TensorSpec("reward", ())]
