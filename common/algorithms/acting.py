"""Choosing discrete actions under legal-action masks, shared by PPO and DQN.

Sampling uses the Gumbel-max trick with the algorithm's own generator, so a seeded task acts
reproducibly without touching torch's global RNG; masked entries sit at ``finfo.min`` and are never drawn.
"""

from __future__ import annotations

import torch


def check_legal(mask: torch.Tensor | None) -> None:
    """Raise if a row of the bool (..., A) mask allows no action at all."""
    if mask is None:
        return
    empty = ~mask.any(dim=-1)
    if bool(empty.any()):
        rows = empty.nonzero().flatten().tolist()[:10]
        raise ValueError(f"action_mask: row(s) {rows} have no legal action; there is nothing to choose")


def legal_count(values: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Number of legal actions per row (all of them without a mask)."""
    if mask is None:
        return torch.full(values.shape[:-1], values.shape[-1], dtype=values.dtype, device=values.device)
    return mask.sum(-1).to(values.dtype)


def _uniform(shape: torch.Size, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    return torch.rand(shape, generator=generator).to(device)


def sample_logits(logits: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One categorical draw per row from (masked) logits."""
    u = _uniform(logits.shape, generator, logits.device).clamp_(1e-20, 1.0)
    return torch.argmax(logits - torch.log(-torch.log(u)), dim=-1)


def uniform_legal(like: torch.Tensor, mask: torch.Tensor | None, generator: torch.Generator) -> torch.Tensor:
    """A uniformly random legal action per row of ``like`` (..., A)."""
    scores = _uniform(like.shape, generator, like.device)
    if mask is not None:
        scores = scores.masked_fill_(~mask, -1.0)
    return torch.argmax(scores, dim=-1)


def epsilon_explore(
    actions: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None, eps: float, generator: torch.Generator
) -> torch.Tensor:
    """With probability ``eps`` per row replace the action by a uniformly random legal one."""
    if eps <= 0.0:
        return actions
    explore = _uniform(actions.shape, generator, actions.device) < eps
    return torch.where(explore, uniform_legal(values, mask, generator), actions)
