"""`Algorithm`: how a model acts (`predict`) and how it is trained (`learn`), in torch.

Only `ComputationTask` calls these; it hands over torch tensors converted by the specs and turns the
results back into numpy, so the rest of the code base never sees torch.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from common.computation.model import Model
from common.computation.specs import TensorSpec
from common.forward_kwargs import ForwardKwargs


@dataclass
class LearnOutput:
    """What one `Algorithm.learn` call reports: scalar statistics and, for replay, new priorities."""

    stats: dict[str, float]
    priorities: torch.Tensor | None = None


class Algorithm(ABC):
    """Owns a `Model` (and whatever else training needs: optimizer, target network)."""

    _optimizer: torch.optim.Optimizer | None = None  # a class default: subclasses may assign before super().__init__

    def __init__(self, model: Model) -> None:
        self.model = model
        self.generator = torch.Generator()
        """Randomness of acting and minibatch order; seeded by the task for reproducible runs."""

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """Built on first use. Actors only act, and building any torch optimizer imports ``torch._dynamo``:
        about a second of CPU at every actor start, on the way to its first job."""
        if self._optimizer is None:
            self._optimizer = self.make_optimizer()
        return self._optimizer

    @optimizer.setter
    def optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Algorithms may also build theirs eagerly (``self.optimizer = ...`` in ``__init__``)."""
        self._optimizer = optimizer

    def make_optimizer(self) -> torch.optim.Optimizer:
        """The optimizer `learn` steps (algorithms that train override this)."""
        raise NotImplementedError(f"{type(self).__name__} does not train with an optimizer")

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

    def policy_and_value(self, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's probability of every action (0 for an illegal one) and its state value in the env's units of
        return: the prior and the leaf evaluation of a search at play time (actor_service.search). Only a feed-forward policy over one
        discrete choice has both; the others raise NotImplementedError saying why."""
        raise NotImplementedError(f"{type(self).__name__} has no action probabilities and state value to search with")

    @abstractmethod
    def learn(self, batch: dict[str, torch.Tensor]) -> LearnOutput:
        """One training update on ``batch``."""

    def on_weights_loaded(self) -> None:
        """Called after `ComputationTask.set_weights` (e.g. DQN re-syncs its target network)."""
        return None

    def get_training_state(self) -> dict[str, Any]:
        """Everything besides the model's weights that training needs to go on exactly where it was: torch
        tensors, numbers, strings and containers of them (so ``torch.load(weights_only=True)`` reads it back).
        The base class keeps the acting/minibatch random generator; subclasses add optimizers, target
        networks, counters."""
        return {"generator": self.generator.get_state()}

    def load_training_state(self, state: Mapping[str, Any]) -> None:
        """Adopt a `get_training_state` of an identically built algorithm (after its weights were loaded);
        raises ValueError naming the part that does not fit."""
        generator = _require(state, "generator", torch.Tensor)
        own = self.generator.get_state()
        if generator.dtype != own.dtype or generator.shape != own.shape:
            raise ValueError(f"training_state['generator']: not a state of this generator ({generator.dtype}, "
                             f"{tuple(generator.shape)})")
        self.generator.set_state(generator)

    def to(self, device: torch.device) -> None:
        """Move every module the algorithm owns (parameters keep their identity, so optimizers stay valid)."""
        self.model.to(device)


def _require(state: Mapping[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    if not isinstance(state, Mapping) or key not in state:
        raise ValueError(f"training_state: missing {key!r}")
    value = state[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise ValueError(f"training_state[{key!r}]: expected {kind}, got {type(value).__name__}")
    return value


def training_counter(state: Mapping[str, Any], key: str) -> int:
    """A non-negative int counter from a training state (``updates``)."""
    value = _require(state, key, int)
    if value < 0:
        raise ValueError(f"training_state[{key!r}] must be >= 0, got {value}")
    return int(value)


FUSED_ADAM_DEVICES = frozenset({"cpu", "cuda"})
"""Devices whose fused Adam kernel this project uses (torch has one for each)."""
OPTIMIZER_IMPLEMENTATION = ("foreach", "fused", "capturable", "differentiable")
"""Keys of an optimizer's param groups that say how it computes, not what: a loaded state keeps the optimizer's
own (a state saved by a learner on another device, or before fused Adam, must not switch them)."""


def make_adam(parameters: Iterable[torch.nn.Parameter], lr: float, eps: float) -> torch.optim.Adam:
    """Adam, fused where torch has the kernel: one pass over all parameters instead of ~10 tensor operations a
    parameter. On the solo CartPole MLPs (256 samples a step) fused Adam's step cost 0.13 ms against 0.54 ms,
    a sixth of a whole minibatch step; the same arithmetic (to float rounding). Only for contiguous parameters:
    torch 2.13's fused CPU kernel writes a non-contiguous one's memory as if it were contiguous (a review's
    reproduction; no model here has such parameters)."""
    params = list(parameters)
    fused = bool(params) and all(p.is_floating_point() and p.is_contiguous() and p.device.type in FUSED_ADAM_DEVICES
                                 for p in params)
    return torch.optim.Adam(params, lr=lr, eps=eps, fused=fused or None)


def load_optimizer_state(
    optimizer: torch.optim.Optimizer, state: Mapping[str, Any], key: str = "optimizer", **hyperparameters: float
) -> None:
    """Load ``state[key]`` (an optimizer ``state_dict``) into ``optimizer``, after checking that every
    per-parameter tensor has its parameter's shape (torch itself only checks the parameter counts); the
    given ``hyperparameters`` (the current config's ``lr``, ``eps``...) then override the saved ones."""
    saved = _require(state, key, Mapping)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    per_param = saved.get("state")
    if not isinstance(per_param, Mapping) or not isinstance(saved.get("param_groups"), list):
        raise ValueError(f"training_state[{key!r}]: not an optimizer state_dict")
    for index, entries in per_param.items():
        if not isinstance(index, int) or not 0 <= index < len(params) or not isinstance(entries, Mapping):
            raise ValueError(f"training_state[{key!r}]: state of unknown parameter {index!r}")
        for name, value in entries.items():
            if isinstance(value, torch.Tensor) and value.ndim > 0 and value.shape != params[index].shape:
                raise ValueError(f"training_state[{key!r}]: {name} of parameter {index} has shape "
                                 f"{tuple(value.shape)}, the model's is {tuple(params[index].shape)}")
    groups = saved["param_groups"]
    if len(groups) == len(optimizer.param_groups) and all(isinstance(g, Mapping) for g in groups):
        own = [{k: group[k] for k in OPTIMIZER_IMPLEMENTATION if k in group} for group in optimizer.param_groups]
        saved = {**saved, "param_groups": [{**g, **o} for g, o in zip(groups, own, strict=True)]}
    try:
        optimizer.load_state_dict(dict(saved))
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"training_state[{key!r}]: does not fit the optimizer ({e})") from e
    for group in optimizer.param_groups:
        group.update(hyperparameters)
