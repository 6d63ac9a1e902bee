"""DQN with the usual improvements: double Q-learning, a target network, n-step returns, prioritized replay.

Read top to bottom like CleanRL's dqn.py. Acting is ε-greedy over *legal* actions, with ε taken from the
job's forward kwargs (the league's exploration schedule), not from the algorithm. Learning takes one
sampled batch of n-step transitions per call, weighted by the replay's importance weights, and returns the
new priorities (|TD error|) for `ExpReplayHelper.update_priorities`.

n-step transitions are cut from (B, T) trajectory segments by `transitions_from_trajectory`, following
`common.trajectory`'s bootstrapping rules (a window stops at a terminal, bootstraps at a truncation at the
row's end, and stops short of a truncation inside the row).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from common.algorithms.acting import check_legal, epsilon_explore
from common.algorithms.models import QNetworkModel
from common.computation.agent_helpers import ExpReplayHelper
from common.computation.algorithm import (
    Algorithm,
    ForwardKwargs,
    LearnOutput,
    load_optimizer_state,
    make_adam,
    training_counter,
)
from common.computation.specs import ACTION_MASK, TensorSpec
from common.policy_config import DQNConfig
from common.trajectory import DEFAULT_AGENT, Trajectory


def make_replay(config: DQNConfig, seed: int | None = None) -> ExpReplayHelper:
    return ExpReplayHelper(
        config.replay_capacity, config.prioritized, config.priority_alpha, config.priority_beta,
        config.priority_eps, seed,
    )


def transitions_from_trajectory(
    trajectory: Trajectory, gamma: float, n_step: int, agent: str = DEFAULT_AGENT
) -> dict[str, np.ndarray]:
    """n-step transitions (N rows): inputs, ``next_<input>``, ``action``, ``return`` and ``discount``.

    ``discount`` is γ^k for a window of k rewards that bootstraps, 0 when it ended in a terminal. A window that
    would bootstrap from a position where the player has no legal action is dropped, as a step whose target
    cannot be formed: a turn-based game truncated (a move limit) on the opponent's turn ends the player's row
    there, and max over no action is the masked logits' float minimum (-3.4e38, a finite target that
    prioritized replay then drew for ever).
    """
    if n_step < 1:
        raise ValueError(f"n_step must be >= 1, got {n_step}")
    obs, nxt = trajectory.observations(), trajectory.next_observations()
    batch, steps = trajectory.rewards.shape
    rewards = trajectory.rewards.astype(np.float64)
    term, trunc = trajectory.terminals, trajectory.truncations
    valid = ~trunc
    valid[:, -1] = True  # a truncation at a row's end bootstraps from /next_observations
    extended = {k: np.concatenate([v, nxt[k][:, None]], axis=1) for k, v in obs.items()}
    # Every window at once, one offset k at a time (a loop over start steps and offsets took seconds for a row
    # of 4,096 steps on the learner's receiving thread; a review): the same sums in the same order.
    starts = np.arange(steps)
    ret = np.zeros((batch, steps))
    disc = np.ones((batch, steps))
    boot = np.broadcast_to(starts, (batch, steps)).copy()
    alive = np.ones((batch, steps), dtype=bool)
    for k in range(min(n_step, steps)):
        j = np.minimum(starts + k, steps - 1)
        step_ok = alive & valid[:, j] & (starts + k < steps)  # (a mid-row truncation ends the window before j)
        ret += np.where(step_ok, disc * rewards[:, j], 0.0)
        disc = np.where(step_ok, disc * gamma, disc)
        boot = np.where(step_ok, j + 1, boot)
        disc = np.where(step_ok & term[:, j], 0.0, disc)
        alive = step_ok & ~(term[:, j] | trunc[:, j])
    t, b = np.nonzero(valid.T)  # (by start step, then row: the order transitions always came in)
    boot = boot[b, t]
    result = {k: v[b, t] for k, v in obs.items()}
    result.update({f"next_{k}": v[b, boot] for k, v in extended.items()})
    with np.errstate(over="ignore"):  # a return beyond float32 becomes inf, which the learner's checks refuse
        returns = ret[b, t].astype(np.float32)
    result.update(
        action=trajectory.actions(agent)[b, t],
        **{"return": returns},
        discount=disc[b, t].astype(np.float32),
    )
    next_mask = result.get(f"next_{ACTION_MASK}")
    if next_mask is not None:
        formable = (result["discount"] == 0) | next_mask.reshape(len(next_mask), -1).any(axis=1)
        if not formable.all():
            result = {k: v[formable] for k, v in result.items()}
    return result


class DQN(Algorithm):
    model: QNetworkModel

    def __init__(self, model: QNetworkModel, config: DQNConfig) -> None:
        super().__init__(model)
        self.config = config
        self.target = copy.deepcopy(model).requires_grad_(False)
        self.updates = 0

    def make_optimizer(self) -> torch.optim.Optimizer:
        return make_adam(self.model.parameters(), lr=self.config.learning_rate, eps=self.config.adam_eps)

    def to(self, device: torch.device) -> None:
        self.model.to(device)
        self.target.to(device)

    def on_weights_loaded(self) -> None:
        self.target.load_state_dict(self.model.state_dict())

    def get_training_state(self) -> dict[str, Any]:
        return {**super().get_training_state(), "optimizer": self.optimizer.state_dict(), "updates": self.updates,
                "target": self.target.state_dict()}

    def load_training_state(self, state: Mapping[str, Any]) -> None:
        updates = training_counter(state, "updates")
        super().load_training_state(state)
        target = state.get("target")
        if not isinstance(target, Mapping):
            raise ValueError("training_state: missing 'target' (the target network's state_dict)")
        own = self.target.state_dict()
        if set(target) != set(own) or any(
            not isinstance(target[k], torch.Tensor) or target[k].shape != v.shape for k, v in own.items()
        ):
            raise ValueError("training_state['target']: does not fit the target network")
        load_optimizer_state(self.optimizer, state, lr=self.config.learning_rate, eps=self.config.adam_eps)
        self.target.load_state_dict(dict(target))
        self.updates = updates

    def get_learn_specs(self) -> list[TensorSpec]:
        inputs = self.model.get_input_specs()
        return [
            *inputs,
            *(TensorSpec(f"next_{s.name}", s.shape, s.dtype, s.optional) for s in inputs),
            TensorSpec("action", (), "int64"),
            TensorSpec("return", ()),
            TensorSpec("discount", ()),
            TensorSpec("weight", (), optional=True),
        ]

    def predict(
        self, inputs: dict[str, torch.Tensor], states: dict[str, torch.Tensor], kwargs: ForwardKwargs
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        q = self.model(inputs)
        mask = inputs.get(ACTION_MASK)
        check_legal(mask)
        action = epsilon_explore(torch.argmax(q, dim=-1), q, mask, kwargs.eps, self.generator)
        return {"action": action}, states

    def learn(self, batch: dict[str, torch.Tensor]) -> LearnOutput:
        cfg = self.config
        names = [s.name for s in self.model.get_input_specs()]
        inputs = {k: batch[k] for k in names if k in batch}
        next_inputs = {k: batch[f"next_{k}"] for k in names if f"next_{k}" in batch}
        actions, returns, discount = batch["action"], batch["return"], batch["discount"]
        weights = batch.get("weight", torch.ones_like(returns))
        if actions.ndim != 1:
            raise ValueError(f"action: DQN learns from (N,) transitions, got shape {tuple(actions.shape)}")
        for name, value in (("return", returns), ("discount", discount), ("weight", weights)):
            if tuple(value.shape) != tuple(actions.shape):  # (N, 1) would broadcast the target to (N, N)
                raise ValueError(f"{name}: expected shape {tuple(actions.shape)} like action, got {tuple(value.shape)}")

        with torch.no_grad():
            if cfg.double_q:
                next_actions = torch.argmax(self.model(next_inputs), dim=-1, keepdim=True)
            else:
                next_actions = torch.argmax(self.target(next_inputs), dim=-1, keepdim=True)
            next_q = self.target(next_inputs).gather(-1, next_actions).squeeze(-1)
            next_q = torch.where(discount > 0, next_q, torch.zeros_like(next_q))
            target = returns + discount * next_q

        q = self.model(inputs).gather(-1, actions[:, None]).squeeze(-1)
        td = target - q
        if cfg.loss == "huber":
            per_sample = F.smooth_l1_loss(q, target, reduction="none")
        else:
            per_sample = 0.5 * td**2
        loss = (weights * per_sample).mean()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
        self.optimizer.step()

        self.updates += 1
        if self.updates % cfg.target_update_period == 0:
            self._update_target()
        return LearnOutput(
            {"loss": loss.item(), "q_mean": q.mean().item(), "td_abs_mean": td.abs().mean().item(),
             "grad_norm": float(grad_norm)},
            priorities=td.detach().abs(),
        )

    def _update_target(self) -> None:
        tau = self.config.target_update_tau
        with torch.no_grad():
            for target, online in zip(self.target.parameters(), self.model.parameters(), strict=True):
                if tau >= 1.0:
                    target.copy_(online)
                else:
                    target.lerp_(online, tau)
            for target, online in zip(self.target.buffers(), self.model.buffers(), strict=True):
                target.copy_(online)
