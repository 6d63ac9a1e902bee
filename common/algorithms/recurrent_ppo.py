"""PPO for recurrent models: the same objective as `PPO`, learned over whole sequences.

What changes against feed-forward PPO:

- Acting steps the core from the caller's states and returns the next ones (`ComputationTask.predict`).
- The learn batch carries ``state_<name>`` (B, T, ...): the state the actor acted with at every step.
- Targets: the core is re-run over each (B, T) row from its recorded state at step 0, restarting from the
  recorded (initial) state after every episode end in the row; the bootstrap value of ``next_<input>`` is
  taken with the state the row ends in.
- Minibatches are sets of whole rows (the rows are shuffled, not the steps), so each minibatch re-runs the core
  over its sequences with gradients through time; losses are taken over the valid steps only.
- Advantages are standardised over the whole batch's valid steps, not per minibatch: a minibatch of whole rows
  may hold a single valid step (rows of 1, 1, 1 and 16 real steps in 4 minibatches), which then took a full
  gradient step on its raw advantage (a review).
"""

from __future__ import annotations

import torch

from common.algorithms.models import update_obs_stats
from common.algorithms.ppo import PPO, STATE_PREFIX, check_segments, minibatches, split_inputs, valid_steps
from common.algorithms.recurrent_models import RecurrentActorCriticModel
from common.computation.algorithm import ForwardKwargs, LearnOutput
from common.computation.specs import ACTION_MASK, TensorSpec
from common.policy_config import PPOConfig
from common.trajectory import OBSERVATION


def episode_starts(terminated: torch.Tensor, truncated: torch.Tensor) -> torch.Tensor:
    """(B, T) bool: the steps where the core restarts from the recorded state (step 0, and after an end)."""
    starts = torch.ones_like(terminated)
    starts[:, 1:] = terminated[:, :-1] | truncated[:, :-1]
    return starts


class RecurrentPPO(PPO):
    model: RecurrentActorCriticModel  # type: ignore[assignment]

    def __init__(self, model: RecurrentActorCriticModel, config: PPOConfig) -> None:
        super().__init__(model, config)  # type: ignore[arg-type]

    def get_learn_specs(self) -> list[TensorSpec]:
        states = [TensorSpec(STATE_PREFIX + s.name, s.shape, s.dtype) for s in self.model.get_state_specs()]
        return [*super().get_learn_specs(), *states]

    def predict(
        self, inputs: dict[str, torch.Tensor], states: dict[str, torch.Tensor], kwargs: ForwardKwargs
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        params, value, next_states = self.model.step(inputs, states)
        return self.model.distribution.choose(params, value, inputs.get(ACTION_MASK), kwargs, self.generator), \
            next_states

    def policy_and_value(self, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError("a recurrent policy acts on the memory of the moves that led to a position, "
                                  "which a search's imagined positions do not have")

    def learn(self, batch: dict[str, torch.Tensor]) -> LearnOutput:
        cfg = self.config
        inputs, next_inputs = split_inputs(self.model, batch)
        check_segments(batch, inputs, next_inputs)
        update_obs_stats(self.model, inputs[OBSERVATION][valid_steps(batch["truncated"])])
        recorded = self._recorded_states(batch)
        actions = batch["action"]
        starts = episode_starts(batch["terminated"], batch["truncated"])

        with torch.no_grad():
            logits, values, final = self.model.unroll(inputs, recorded, starts)
            bootstrap = self.model.value(next_inputs, final)
            targets, old_logp, behaviour_log_ratio = self._targets(batch, logits, values, bootstrap)

        advantages = targets.advantages
        if cfg.normalize_advantages and int(targets.valid.sum()) > 1:
            valid_adv = advantages[targets.valid]
            advantages = (advantages - valid_adv.mean()) / (valid_adv.std() + 1e-8)
        rows = actions.shape[0]
        stats = self._start_update()
        for _epoch in range(cfg.update_epochs):
            order = torch.randperm(rows, generator=self.generator).to(actions.device)
            for mb in minibatches(order, cfg.num_minibatches):
                keep = targets.valid[mb]
                logits, new_values, _ = self.model.unroll(
                    {k: v[mb] for k, v in inputs.items()}, {k: v[mb] for k, v in recorded.items()}, starts[mb]
                )
                self._minibatch_step(
                    logits[keep], new_values[keep], actions[mb][keep], old_logp[mb][keep],
                    advantages[mb][keep], values[mb][keep], targets.returns[mb][keep], stats, normalize=False,
                )
            if cfg.target_kl is not None and stats["approx_kl"][-1].item() > cfg.target_kl:
                break
        valid = targets.valid
        return self._finish_update(stats, targets.returns[valid], values[valid], targets, behaviour_log_ratio)

    def _recorded_states(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        lead = tuple(batch["reward"].shape)
        states = {}
        for spec in self.model.get_state_specs():
            value = batch[STATE_PREFIX + spec.name]
            if tuple(value.shape[:2]) != lead:
                raise ValueError(f"{STATE_PREFIX}{spec.name}: leading shape {tuple(value.shape[:2])} != {lead}")
            states[spec.name] = value
        return states
