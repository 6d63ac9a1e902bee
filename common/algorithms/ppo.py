"""PPO (clipped objective, GAE, value loss, entropy bonus) with an IMPALA-style correction for stale data.

Read top to bottom like CleanRL's ppo.py; the differences are what a distributed league needs:

- Trajectories arrive as (B, T) segments (`common.trajectory`); bootstrapping follows that module's rules:
  a terminal never bootstraps, a truncation bootstraps V(final observation) at a row's end, and a step
  truncated inside a row (whose final observation is not stored) is dropped, the steps before it
  bootstrapping from the last observation of their episode that is known.
- Legal-action masks: masked actions have zero probability when acting and in the loss.
- Discrete actions (categorical), several at once (a categorical per entry) or a Box's real vector (diagonal
  Gaussian): the model's `distribution` (`common.algorithms.distributions`) turns its policy output into
  log-probabilities, entropies and actions.
- Actors act with a policy some versions old (the behaviour policy µ, whose log-probabilities come with
  the data). With ``off_policy_correction="vtrace"`` the update follows IMPALA and "decoupled" PPO: at the
  start of an update the learner's current policy π_prox is evaluated; value targets are V-trace targets
  with truncated importance weights ρ = min(ρ̄, π_prox/µ), c = λ·min(c̄, π_prox/µ); the policy advantage is
  ρ_t (r_t + γ v_{t+1} − V(x_t)); the clipped PPO ratio is taken against π_prox, not µ, so stale data is
  reweighted instead of being clipped away. With ``"none"`` it is plain PPO with GAE against µ.

Recurrent models (``policy.model.recurrent``) train with `common.algorithms.recurrent_ppo.RecurrentPPO`, which
shares this objective (`PPO._minibatch_step`) but minibatches whole sequences.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from common.algorithms.distributions import LOG_STD_MAX, LOG_STD_MIN, Categorical
from common.algorithms.models import ActorCriticModel, update_obs_stats
from common.computation.algorithm import (
    Algorithm,
    ForwardKwargs,
    LearnOutput,
    load_optimizer_state,
    make_adam,
    training_counter,
)
from common.computation.model import Model
from common.computation.specs import ACTION_MASK, TensorSpec
from common.policy_config import PPOConfig
from common.trajectory import DEFAULT_AGENT, OBSERVATION, Trajectory, hidden_state_key


@dataclass
class Targets:
    advantages: torch.Tensor
    """(B, T) policy advantages."""
    returns: torch.Tensor
    """(B, T) value targets."""
    valid: torch.Tensor
    """(B, T) bool: steps whose target could be formed."""
    rho: torch.Tensor
    """(B, T) truncated importance weights (ones without correction)."""


def valid_steps(truncated: torch.Tensor) -> torch.Tensor:
    """(B, T) bool: the steps a target can be formed for. A step truncated inside a row (its final observation
    is not stored; also a row's front padding) has none; a row's last step bootstraps from the next observation."""
    last = torch.zeros_like(truncated)
    last[:, -1] = True
    return ~(truncated & ~last)


def compute_targets(
    values: torch.Tensor,
    bootstrap_values: torch.Tensor,
    rewards: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    gamma: float,
    lam: float,
    log_ratio: torch.Tensor | None = None,
    rho_clip: float = 1.0,
    c_clip: float = 1.0,
) -> Targets:
    """GAE (``log_ratio`` None) or V-trace targets for (B, T) segments; ``bootstrap_values`` is V(next obs) (B,).

    ``log_ratio`` = log π(a_t|x_t) − log µ(a_t|x_t) for V-trace.
    """
    batch, steps = rewards.shape
    valid = valid_steps(truncated)
    next_values = torch.cat([values[:, 1:], bootstrap_values[:, None]], dim=1)
    not_terminal = (~terminated).to(values.dtype)
    continues = (~(terminated | truncated)).to(values.dtype)
    delta = rewards + gamma * not_terminal * next_values - values
    if log_ratio is None:
        rho = torch.ones_like(values)
        c = torch.full_like(values, lam)
    else:
        ratio = torch.exp(log_ratio)
        rho = torch.clamp(ratio, max=rho_clip)
        c = lam * torch.clamp(ratio, max=c_clip)
    valid_f = valid.to(values.dtype)
    diffs = torch.empty_like(values)
    acc = torch.zeros(batch, dtype=values.dtype, device=values.device)
    for t in reversed(range(steps)):
        acc = (rho[:, t] * delta[:, t] + gamma * c[:, t] * continues[:, t] * acc) * valid_f[:, t]
        diffs[:, t] = acc
    returns = values + diffs
    if log_ratio is None:
        advantages = diffs
    else:
        next_returns = torch.cat([returns[:, 1:], bootstrap_values[:, None]], dim=1)
        advantages = rho * (rewards + gamma * not_terminal * next_returns - values) * valid_f
    return Targets(advantages, returns, valid, rho)


MAX_LOG_RATIO = 20.0
"""The PPO ratio π/µ is taken as exp(min(log ratio, this)): 5e8, far beyond the clip range (the sample gives no
gradient there), and finite in float32 with any advantage and gradient it multiplies."""

STATE_PREFIX = "state_"
"""Learn-batch key prefix of a recurrent model's recorded states: ``state_<name>`` (B, T, ...)."""


def batch_from_trajectory(
    trajectory: Trajectory, agent: str = DEFAULT_AGENT, state_names: Sequence[str] = ()
) -> dict[str, np.ndarray]:
    """The PPO learn batch of one agent's (B, T) trajectory (needs the ``logp`` artifact from acting, and for a
    recurrent model the ``hidden_state/<name>`` entries of each of its ``state_names``)."""
    artifacts = trajectory.artifacts(agent)
    if "logp" not in artifacts:
        raise ValueError(f"/agents/{agent}/artifacts/logp: PPO needs the behaviour log-probabilities")
    batch = dict(trajectory.observations())
    batch.update({f"next_{k}": v for k, v in trajectory.next_observations().items()})
    batch.update(
        action=trajectory.actions(agent),
        reward=trajectory.rewards,
        terminated=trajectory.terminals,
        truncated=trajectory.truncations,
        behaviour_logp=artifacts["logp"],
    )
    if state_names:
        recorded = trajectory.hidden_state(agent)
        for name in state_names:
            if name not in recorded:
                raise ValueError(f"{hidden_state_key(agent, name)}: a recurrent policy learns from the states it "
                                 f"acted with")
            batch[STATE_PREFIX + name] = recorded[name]
    return batch


def split_inputs(
    model: Model, batch: Mapping[str, torch.Tensor]
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The model inputs of a learn batch and their ``next_`` counterparts."""
    names = [s.name for s in model.get_input_specs()]
    return {k: batch[k] for k in names if k in batch}, {k: batch[f"next_{k}"] for k in names if f"next_{k}" in batch}


class PPO(Algorithm):
    model: ActorCriticModel

    def __init__(self, model: ActorCriticModel, config: PPOConfig) -> None:
        super().__init__(model)
        self.config = config
        self.updates = 0

    def make_optimizer(self) -> torch.optim.Optimizer:
        return make_adam(self.model.parameters(), lr=self.config.learning_rate, eps=self.config.adam_eps)

    def get_artifact_specs(self) -> list[TensorSpec]:
        return [TensorSpec("logp", ()), TensorSpec("value", ())]

    def get_training_state(self) -> dict[str, Any]:
        return {**super().get_training_state(), "optimizer": self.optimizer.state_dict(), "updates": self.updates}

    def load_training_state(self, state: Mapping[str, Any]) -> None:
        updates = training_counter(state, "updates")
        super().load_training_state(state)
        load_optimizer_state(self.optimizer, state, eps=self.config.adam_eps)  # lr: set by every learn call
        self.updates = updates

    def get_learn_specs(self) -> list[TensorSpec]:
        inputs = self.model.get_input_specs()
        return [
            *inputs,
            *(TensorSpec(f"next_{s.name}", s.shape, s.dtype, s.optional) for s in inputs),
            *self.model.get_action_specs(),
            TensorSpec("reward", ()),
            TensorSpec("terminated", (), "bool"),
            TensorSpec("truncated", (), "bool"),
            TensorSpec("behaviour_logp", ()),
        ]

    # ---- acting -----------------------------------------------------------------------------------------
    def predict(
        self, inputs: dict[str, torch.Tensor], states: dict[str, torch.Tensor], kwargs: ForwardKwargs
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        params, value = self.model(inputs)
        return self.model.distribution.choose(params, value, inputs.get(ACTION_MASK), kwargs, self.generator), states

    def policy_and_value(self, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        if not isinstance(self.model.distribution, Categorical):
            raise NotImplementedError(f"a policy over {type(self.model.distribution).__name__} actions has no "
                                      "probability per action to search with (one discrete choice only)")
        logits, value = self.model(inputs)  # masked logits: an illegal action's probability is 0
        # In the env's own units (the head learns returns of rewards scaled by reward_scale): a search compares it
        # with the game's final scores.
        return torch.softmax(logits, dim=-1), value / self.config.reward_scale

    # ---- learning ---------------------------------------------------------------------------------------
    def learn(self, batch: dict[str, torch.Tensor]) -> LearnOutput:
        cfg = self.config
        inputs, next_inputs = split_inputs(self.model, batch)
        actions = batch["action"]
        check_segments(batch, inputs, next_inputs)
        update_obs_stats(self.model, inputs[OBSERVATION][valid_steps(batch["truncated"])])

        with torch.no_grad():
            logits, values = self.model(inputs)
            bootstrap = self.model.value(next_inputs)
            targets, old_logp, behaviour_log_ratio = self._targets(batch, logits, values, bootstrap)

        # Flatten (B, T) to samples and keep the steps that have a target.
        keep = targets.valid.flatten().nonzero().squeeze(-1)
        flat = {k: v.flatten(0, 1)[keep] for k, v in inputs.items()}
        b_actions = actions.flatten(0, 1)[keep]
        b_old_logp = old_logp.flatten()[keep]
        b_adv = targets.advantages.flatten()[keep]
        b_returns = targets.returns.flatten()[keep]
        b_values = values.flatten()[keep]
        samples = len(keep)

        stats = self._start_update()
        for _epoch in range(cfg.update_epochs):
            order = torch.randperm(samples, generator=self.generator).to(b_actions.device)
            for mb in minibatches(order, cfg.num_minibatches):
                logits, new_values = self.model({k: v[mb] for k, v in flat.items()})
                self._minibatch_step(logits, new_values, b_actions[mb], b_old_logp[mb], b_adv[mb], b_values[mb],
                                     b_returns[mb], stats)
            if cfg.target_kl is not None and stats["approx_kl"][-1].item() > cfg.target_kl:
                break
        return self._finish_update(stats, b_returns, b_values, targets, behaviour_log_ratio)

    def _targets(
        self, batch: Mapping[str, torch.Tensor], logits: torch.Tensor, values: torch.Tensor, bootstrap: torch.Tensor
    ) -> tuple[Targets, torch.Tensor, torch.Tensor]:
        """Targets of the (B, T) batch from the start-of-update logits and values; the log-probabilities the
        clipped ratio is taken against; log π/µ of the behaviour data."""
        cfg = self.config
        logp_now = self.model.distribution.log_prob(logits, batch["action"])
        behaviour_log_ratio = logp_now - batch["behaviour_logp"]
        vtrace = cfg.off_policy_correction == "vtrace"
        rewards = batch["reward"] if cfg.reward_scale == 1.0 else batch["reward"] * cfg.reward_scale
        targets = compute_targets(
            values, bootstrap, rewards, batch["terminated"], batch["truncated"], cfg.gamma, cfg.gae_lambda,
            log_ratio=behaviour_log_ratio if vtrace else None,
            rho_clip=cfg.vtrace_rho_clip, c_clip=cfg.vtrace_c_clip,
        )
        return targets, (logp_now if vtrace else batch["behaviour_logp"]), behaviour_log_ratio

    def _start_update(self) -> dict[str, list[torch.Tensor]]:
        lr = self._learning_rate()
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return {k: [] for k in ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction")}

    def _minibatch_step(
        self, logits: torch.Tensor, new_values: torch.Tensor, actions: torch.Tensor, old_logp: torch.Tensor,
        adv: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, stats: dict[str, list[torch.Tensor]],
        normalize: bool = True,
    ) -> None:
        """One gradient step on a minibatch of samples (flat: (N, P) policy parameters, (N, ...) actions, (N,)
        everything else). ``normalize``: standardise the advantages over the minibatch (where the config asks;
        False when the caller standardised them over the whole batch)."""
        cfg = self.config
        distribution = self.model.distribution
        new_logp = distribution.log_prob(logits, actions)
        entropy = distribution.entropy(logits).mean()
        log_ratio = new_logp - old_logp
        # Capped where exp() stays finite: a Gaussian's improbable draw (log-density -5e5) moves by hundreds
        # per step, and exp(300) = inf made the unclipped branch, and so the whole update, NaN.
        ratio = log_ratio.clamp(max=MAX_LOG_RATIO).exp()
        if normalize and cfg.normalize_advantages and len(adv) > 1:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        policy_loss = torch.max(-adv * ratio, -adv * torch.clamp(ratio, 1 - cfg.clip_coef, 1 + cfg.clip_coef)).mean()
        value_loss = _value_loss(new_values, old_values, returns, cfg)
        loss = policy_loss - cfg.entropy_coef * entropy + cfg.value_coef * value_loss
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
        self.optimizer.step()
        log_std = getattr(self.model, "log_std", None)
        if log_std is not None:
            # Kept within the bounds the Gaussian clamps it to: beyond them the clamp passes no gradient, and a
            # log std one step past 2 (the entropy bonus's push) stayed at a std of 7.4 for ever, whatever the
            # rewards asked for later.
            with torch.no_grad():
                log_std.clamp_(LOG_STD_MIN, LOG_STD_MAX)
        with torch.no_grad():  # kept as tensors: one device sync at the end, not five per step
            stats["policy_loss"].append(policy_loss.detach())
            stats["value_loss"].append(value_loss.detach())
            stats["entropy"].append(entropy.detach())
            stats["approx_kl"].append(((ratio - 1) - log_ratio).mean())
            stats["clip_fraction"].append(((ratio - 1).abs() > cfg.clip_coef).float().mean())

    def _finish_update(
        self, stats: dict[str, list[torch.Tensor]], b_returns: torch.Tensor, b_values: torch.Tensor,
        targets: Targets, behaviour_log_ratio: torch.Tensor,
    ) -> LearnOutput:
        """Count the update and report its statistics (``b_*``: the valid samples' returns and values)."""
        self.updates += 1
        samples = len(b_returns)
        out = {k: torch.stack(v).mean().item() if v else 0.0 for k, v in stats.items()}
        var_returns = b_returns.var() if samples > 1 else torch.tensor(0.0)
        out.update(
            explained_variance=float(1 - (b_returns - b_values).var() / var_returns) if var_returns > 0 else 0.0,
            learning_rate=self.optimizer.param_groups[0]["lr"],
            samples=float(samples),
            valid_fraction=samples / targets.valid.numel(),
            # Over the steps trained on: front padding and dropped truncated steps are no data.
            # (capped as the PPO ratio is: a stale wide Gaussian against a collapsed one made it inf)
            behaviour_ratio=(float(behaviour_log_ratio[targets.valid].clamp(max=MAX_LOG_RATIO).exp().mean())
                             if samples else 1.0),
            rho_mean=float(targets.rho[targets.valid].mean()) if samples else 1.0,
        )
        log_std = getattr(self.model, "log_std", None)
        if log_std is not None:  # a Gaussian policy: how widely it still explores (TensorBoard train/action_std)
            out["action_std"] = float(log_std.detach().clamp(LOG_STD_MIN, LOG_STD_MAX).exp().mean())
        return LearnOutput(out)

    def _learning_rate(self) -> float:
        cfg = self.config
        if cfg.anneal_lr_updates <= 0:
            return cfg.learning_rate
        return cfg.learning_rate * max(0.0, 1.0 - self.updates / cfg.anneal_lr_updates)


def _value_loss(new: torch.Tensor, old: torch.Tensor, returns: torch.Tensor, cfg: PPOConfig) -> torch.Tensor:
    unclipped = (new - returns) ** 2
    if not cfg.clip_value_loss:
        return 0.5 * unclipped.mean()
    clipped = old + torch.clamp(new - old, -cfg.clip_coef, cfg.clip_coef)
    return 0.5 * torch.max(unclipped, (clipped - returns) ** 2).mean()


def check_segments(
    batch: Mapping[str, torch.Tensor], inputs: Mapping[str, torch.Tensor], next_inputs: Mapping[str, torch.Tensor]
) -> None:
    lead = tuple(batch["reward"].shape)
    if len(lead) != 2:
        raise ValueError(f"reward: PPO learns from (batch, steps) segments, got shape {lead}")
    if tuple(batch["action"].shape[:2]) != lead:
        raise ValueError(f"action: leading shape {tuple(batch['action'].shape[:2])} != reward shape {lead}")
    for key in ("terminated", "truncated", "behaviour_logp"):
        if tuple(batch[key].shape) != lead:
            raise ValueError(f"{key}: shape {tuple(batch[key].shape)} != reward shape {lead}")
    for key, value in inputs.items():
        if tuple(value.shape[:2]) != lead:
            raise ValueError(f"{key}: leading shape {tuple(value.shape[:2])} != {lead}")
    if set(next_inputs) != set(inputs):
        raise ValueError(f"next_*: need next_ entries for {sorted(inputs)}, got {sorted(next_inputs)}")
    for key, value in next_inputs.items():
        if value.shape[0] != lead[0] or value.shape[1:] != inputs[key].shape[2:]:
            raise ValueError(f"next_{key}: shape {tuple(value.shape)} does not continue {key}")


def minibatches(order: torch.Tensor, count: int) -> tuple[torch.Tensor, ...]:
    """`order` split into `count` minibatches of near-equal size (sizes differ by one at most; none empty).
    Slices of ceil(n / count) left a last minibatch of a sample or two (13 samples in 4: 4, 4, 4, 1), whose
    raw advantage then took a full step unnormalised, and whose KL alone decided the early stop."""
    if len(order) == 0:
        return ()
    return torch.tensor_split(order, min(count, len(order)))
