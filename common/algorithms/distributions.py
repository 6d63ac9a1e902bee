"""The action distributions of actor-critic policies: categorical over N choices, independent categoricals over
several choices made together (MultiDiscrete), diagonal Gaussian over a Box.

A model's policy output is one tensor of *parameters* per row (masked logits (..., A), the logits of every
choice side by side (..., sum(nvec)), or a Gaussian's mean and log standard deviation side by side (..., 2D)),
so PPO slices, flattens and minibatches it the same way for all; the distribution object turns parameters into
log-probabilities, entropies and actions.

The Gaussian follows CleanRL's ``ppo_continuous_action``: a state-independent log std (a learned parameter of
the model), actions sampled unbounded and clipped to the Box only where the env receives them
(`BoxActionSpec.clip`), so the recorded action is the one whose density the behaviour log-probability is.
"""

from __future__ import annotations

import math

import torch

from common.algorithms.acting import check_legal, epsilon_explore, legal_count, sample_logits, uniform_legal
from common.computation.algorithm import ForwardKwargs
from common.computation.specs import (
    MAX_ABS_BOX_ACTION,
    ActionSpec,
    BoxActionSpec,
    DiscreteActionSpec,
    MultiDiscreteActionSpec,
)

LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0
"""Bounds of a Gaussian policy's log std: beyond them the density under- or overflows float32 (the entropy
bonus alone pushes an unclamped std up for ever on a task whose reward ignores an action entry)."""

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


class Categorical:
    """One of `num_actions` choices; parameters are the masked logits (..., A)."""

    def __init__(self, spec: DiscreteActionSpec) -> None:
        self.spec = spec
        self.head_size = spec.num_actions
        """Width of the linear layer whose output the parameters are made of."""

    def log_prob(self, params: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(params, dim=-1).gather(-1, actions[..., None]).squeeze(-1)

    def entropy(self, params: torch.Tensor) -> torch.Tensor:
        return _categorical_entropy(params)

    def greedy(self, params: torch.Tensor) -> torch.Tensor:
        """The most probable (legal: the logits are masked) action of each row."""
        return torch.argmax(params, dim=-1)

    def choose(
        self, params: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, kwargs: ForwardKwargs,
        generator: torch.Generator,
    ) -> dict[str, torch.Tensor]:
        """The action of each row (sampled, greedy and/or ε-explored) with its behaviour log-probability and
        value."""
        check_legal(mask)
        log_probs = torch.log_softmax(params, dim=-1)
        greedy_action = self.greedy(params)
        action = greedy_action if kwargs.greedy else sample_logits(params, generator)
        action = epsilon_explore(action, params, mask, kwargs.eps, generator)
        chosen = log_probs.gather(-1, action[:, None]).squeeze(-1)
        if kwargs.eps > 0 or kwargs.greedy:
            # The behaviour distribution is the mixture actually sampled from; V-trace corrects for it.
            policy_prob = (action == greedy_action).to(value.dtype) if kwargs.greedy else chosen.exp()
            logp = torch.log((1 - kwargs.eps) * policy_prob + kwargs.eps / legal_count(params, mask))
        else:
            logp = chosen
        return {"action": action, "logp": logp, "value": value}


class MultiCategorical:
    """One choice per entry of a MultiDiscrete action, independent given the state; parameters are the logits of
    every entry's choices side by side (..., sum(nvec))."""

    def __init__(self, spec: MultiDiscreteActionSpec) -> None:
        self.spec = spec
        self.nvec = list(spec.nvec)
        self.head_size = sum(self.nvec)

    def _flat(self, actions: torch.Tensor) -> torch.Tensor:
        """(..., *shape) actions as (..., K)."""
        return actions.reshape(*actions.shape[: actions.ndim - len(self.spec.shape)], len(self.nvec))

    def log_prob(self, params: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        flat = self._flat(actions)
        parts = [torch.log_softmax(logits, dim=-1).gather(-1, flat[..., i, None]).squeeze(-1)
                 for i, logits in enumerate(torch.split(params, self.nvec, dim=-1))]
        return torch.stack(parts, dim=-1).sum(-1)

    def entropy(self, params: torch.Tensor) -> torch.Tensor:
        return torch.stack([_categorical_entropy(logits) for logits in torch.split(params, self.nvec, dim=-1)],
                           dim=-1).sum(-1)

    def greedy(self, params: torch.Tensor) -> torch.Tensor:
        """Each row's most probable choice of every entry, in the action's shape."""
        flat = self._greedy_flat(torch.split(params, self.nvec, dim=-1))
        return flat.reshape(*flat.shape[:-1], *self.spec.shape)

    @staticmethod
    def _greedy_flat(segments: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return torch.stack([torch.argmax(logits, dim=-1) for logits in segments], dim=-1)

    def choose(
        self, params: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, kwargs: ForwardKwargs,
        generator: torch.Generator,
    ) -> dict[str, torch.Tensor]:
        """Each row's choices (sampled or greedy, and with probability ``eps`` a uniform draw of all of them),
        with the log-probability of the distribution actually sampled from."""
        segments = torch.split(params, self.nvec, dim=-1)
        greedy = self._greedy_flat(segments)
        flat = greedy if kwargs.greedy else torch.stack([sample_logits(logits, generator) for logits in segments], -1)
        if kwargs.eps > 0:
            uniform = torch.stack([uniform_legal(logits, None, generator) for logits in segments], dim=-1)
            explore = torch.rand(flat.shape[:-1], generator=generator).to(flat.device) < kwargs.eps
            flat = torch.where(explore[..., None], uniform, flat)
        action = flat.reshape(*flat.shape[:-1], *self.spec.shape)
        logp = self.log_prob(params, action)
        if kwargs.eps > 0 or kwargs.greedy:
            # The mixture's probability, added in log space: a joint action's probabilities are products over
            # the entries (2**-200 for 200 binary ones), which float32 rounds to 0, and the log of the sum was
            # -inf, a behaviour logp the learner refuses every chunk for.
            policy_logp = (torch.zeros_like(logp).masked_fill(~(flat == greedy).all(-1), -math.inf)
                           if kwargs.greedy else logp)
            keep = math.log1p(-kwargs.eps) if kwargs.eps < 1 else -math.inf
            explore = (math.log(kwargs.eps) if kwargs.eps > 0 else -math.inf) - sum(math.log(n) for n in self.nvec)
            logp = torch.logaddexp(policy_logp + keep, torch.full_like(logp, explore))
        return {"action": action, "logp": logp, "value": value}


def _categorical_entropy(logits: torch.Tensor) -> torch.Tensor:
    log_probs = torch.log_softmax(logits, dim=-1)
    probs = log_probs.exp()
    return -torch.where(probs > 0, probs * log_probs, torch.zeros_like(probs)).sum(-1)


class DiagGaussian:
    """A real vector of the Box's shape; parameters are (..., 2D): the mean, then the log std, per entry."""

    def __init__(self, spec: BoxActionSpec) -> None:
        self.spec = spec
        self.size = spec.size
        self.head_size = spec.size
        """Width of the linear layer that gives the mean (the log std is a parameter of its own)."""

    def params(self, mean: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
        """Parameters from a mean (..., D) and a log std (D) shared by every row."""
        log_std = log_std.clamp(LOG_STD_MIN, LOG_STD_MAX).expand_as(mean)
        return torch.cat([mean, log_std], dim=-1)

    def split(self, params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return params[..., : self.size], params[..., self.size:]

    def greedy(self, params: torch.Tensor) -> torch.Tensor:
        """Each row's mean, in the action's shape (unclipped, as `choose` gives it)."""
        mean = self.split(params)[0]
        return mean.reshape(*mean.shape[:-1], *self.spec.shape)

    def _flat(self, actions: torch.Tensor) -> torch.Tensor:
        """(..., *shape) actions as (..., D)."""
        return actions.reshape(*actions.shape[: actions.ndim - len(self.spec.shape)], self.size)

    def log_prob(self, params: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        mean, log_std = self.split(params)
        z = (self._flat(actions).to(mean.dtype) - mean) * torch.exp(-log_std)
        return (-0.5 * z * z - log_std - _LOG_SQRT_2PI).sum(-1)

    def entropy(self, params: torch.Tensor) -> torch.Tensor:
        return (self.split(params)[1] + 0.5 + _LOG_SQRT_2PI).sum(-1)

    def choose(
        self, params: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, kwargs: ForwardKwargs,
        generator: torch.Generator,
    ) -> dict[str, torch.Tensor]:
        """Each row's action (``shape``, unclipped), its behaviour log-density and value.

        ``greedy``: the mean, recorded with the policy's density there (a deterministic choice has no density
        to weigh its data with; train on sampled data). ``eps``: with that probability per row, a uniform draw
        over the Box (bounded Boxes only), and the log-density of the mixture actually sampled from."""
        mean, log_std = self.split(params)
        if kwargs.greedy:
            flat = mean
        else:
            noise = torch.randn(mean.shape, generator=generator, dtype=mean.dtype).to(mean.device)
            flat = mean + torch.exp(log_std) * noise
        if kwargs.eps > 0:
            flat = self._explore(flat, kwargs.eps, generator)
        action = flat.reshape(*flat.shape[:-1], *self.spec.shape)
        logp = self.log_prob(params, action)
        if kwargs.eps > 0:
            low, high = self._bounds(mean)
            inside = ((flat >= low) & (flat <= high)).all(-1)
            log_uniform = torch.where(inside, -torch.log(high - low).sum(), -math.inf)
            from_policy = logp + math.log1p(-kwargs.eps) if kwargs.eps < 1 else torch.full_like(logp, -math.inf)
            logp = torch.logaddexp(from_policy, log_uniform + math.log(kwargs.eps))
        return {"action": action, "logp": logp, "value": value}

    def _explore(self, flat: torch.Tensor, eps: float, generator: torch.Generator) -> torch.Tensor:
        check_uniform_exploration(self.spec, eps)
        low, high = self._bounds(flat)
        uniform = low + (high - low) * torch.rand(flat.shape, generator=generator, dtype=flat.dtype).to(flat.device)
        explore = torch.rand(flat.shape[:-1], generator=generator).to(flat.device) < eps
        return torch.where(explore[..., None], uniform, flat)

    def _bounds(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        low = torch.tensor(self.spec.low, dtype=like.dtype, device=like.device)
        high = torch.tensor(self.spec.high, dtype=like.dtype, device=like.device)
        return low, high


def check_uniform_exploration(spec: BoxActionSpec, eps: float) -> None:
    """ValueError, naming forward_kwargs.eps, when ε-exploration (``eps`` > 0) cannot draw uniformly in `spec`."""
    if eps > 0 and (not spec.bounded or any(h <= lo for lo, h in zip(spec.low, spec.high, strict=True))
                    or max(map(abs, spec.low + spec.high)) > MAX_ABS_BOX_ACTION):
        raise ValueError(
            f"forward_kwargs.eps {eps}: ε-exploration draws uniformly over the action space, and this env's "
            f"Box action has unbounded, empty or too wide entries (low {list(spec.low)}, high {list(spec.high)}; "
            f"at most ±{MAX_ABS_BOX_ACTION:.0e}); a Gaussian policy explores by its own standard deviation: "
            "leave eps at 0")


ActionDistribution = Categorical | MultiCategorical | DiagGaussian


def action_distribution(spec: ActionSpec) -> ActionDistribution:
    if isinstance(spec, DiscreteActionSpec):
        return Categorical(spec)
    if isinstance(spec, MultiDiscreteActionSpec):
        return MultiCategorical(spec)
    return DiagGaussian(spec)
