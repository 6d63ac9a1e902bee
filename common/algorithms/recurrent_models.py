"""A recurrent actor-critic: the standard torso, a GRU or LSTM core, and the policy and value heads.

Acting steps the core once per call from the caller's state (`RecurrentActorCriticModel.step`): each batch row
is one env/seat with its own state. Learning re-runs the core over (B, T) segments (`unroll`) from the states
the actor *recorded*: at a row's first step, and again at every step that starts a new episode (``starts``),
where the recorded state is the initial (zero) state the actor reset to. Restarting from the recorded state
rather than from zeros is what lets padded rows (`learner_service.trainer.front_pad` marks padding as
truncated steps) begin their real steps from the state the actor held there.

Both heads read the core's output, so actor and critic share one memory (CleanRL's LSTM PPO does the same).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from common.algorithms.distributions import ActionDistribution, action_distribution
from common.algorithms.models import (
    Torso,
    bound_values,
    gaussian_log_std,
    layer_init,
    policy_params,
    split_input_specs,
)
from common.computation.model import Model
from common.computation.specs import ACTION_MASK, ActionSpec, TensorSpec, action_tensor_spec, as_action_spec
from common.policy_config import ModelConfig
from common.trajectory import OBSERVATION

HIDDEN = "hidden"
"""The state entry of the core's hidden vector (GRU and LSTM)."""
CELL = "cell"
"""The LSTM's cell vector."""

States = dict[str, torch.Tensor]


class RecurrentCore(nn.Module):
    """A one-layer GRU or LSTM over (B, T, features) with named (B, size) states."""

    def __init__(self, kind: str, input_size: int, size: int) -> None:
        super().__init__()
        if kind not in ("gru", "lstm"):
            raise ValueError(f"model.recurrent: expected 'gru' or 'lstm', got {kind!r}")
        self.kind = kind
        self.size = size
        self.rnn: nn.GRU | nn.LSTM = (nn.GRU if kind == "gru" else nn.LSTM)(input_size, size, batch_first=True)
        for name, param in self.rnn.named_parameters():
            if name.startswith("bias"):
                nn.init.constant_(param, 0.0)
            else:
                nn.init.orthogonal_(param, 1.0)
        self.state_names: tuple[str, ...] = (HIDDEN,) if kind == "gru" else (HIDDEN, CELL)

    def forward(self, x: torch.Tensor, state: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, States]:
        """Outputs (B, T, size) and the state after the last step, from ``state`` at the first."""
        if self.kind == "gru":
            out, h = self.rnn(x, state[HIDDEN][None].contiguous())
            return out, {HIDDEN: h[0]}
        out, (h, c) = self.rnn(x, (state[HIDDEN][None].contiguous(), state[CELL][None].contiguous()))
        return out, {HIDDEN: h[0], CELL: c[0]}

    def unroll(
        self, x: torch.Tensor, recorded: Mapping[str, torch.Tensor], starts: torch.Tensor
    ) -> tuple[torch.Tensor, States]:
        """Run over (B, T, features), restarting row b at step t from ``recorded[..][b, t]`` where
        ``starts[b, t]`` (column 0 always starts). Runs of steps without a restart go to the RNN in one call."""
        steps = x.shape[1]
        restart_columns = (torch.nonzero(starts[:, 1:].any(0)).flatten() + 1).tolist()
        bounds = [0, *restart_columns, steps]
        state: States = {k: recorded[k][:, 0] for k in self.state_names}
        outputs = []
        for begin, end in zip(bounds[:-1], bounds[1:], strict=True):
            if begin > 0:
                restart = starts[:, begin, None]
                state = {k: torch.where(restart, recorded[k][:, begin], v) for k, v in state.items()}
            out, state = self(x[:, begin:end], state)
            outputs.append(out)
        return (outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=1)), state


class RecurrentActorCriticModel(Model):
    """Policy parameters (categorical logits, or a Gaussian's mean and log std) and a state value from a torso +
    recurrent core."""

    def __init__(self, obs_specs: Mapping[str, TensorSpec], actions: ActionSpec | int, config: ModelConfig) -> None:
        super().__init__()
        if config.recurrent is None:
            raise ValueError("model.recurrent: a recurrent model needs 'gru' or 'lstm'")
        self.action_spec = as_action_spec(actions)
        self.obs_spec, self.mask_spec = split_input_specs(obs_specs, self.action_spec)
        self.torso = Torso(self.obs_spec, config, config.activation or "tanh")
        self.core = RecurrentCore(config.recurrent, self.torso.out_features, config.recurrent_size)
        self.distribution: ActionDistribution = action_distribution(self.action_spec)
        self.policy_head = layer_init(nn.Linear(config.recurrent_size, self.distribution.head_size), std=0.01)
        self.log_std = gaussian_log_std(self.distribution, config)
        self.value_head = layer_init(nn.Linear(config.recurrent_size, 1), std=1.0)
        self.value_bound = config.value_bound

    def get_input_specs(self) -> list[TensorSpec]:
        return [self.obs_spec] if self.mask_spec is None else [self.obs_spec, self.mask_spec]

    def get_state_specs(self) -> list[TensorSpec]:
        return [TensorSpec(name, (self.core.size,)) for name in self.core.state_names]

    def get_action_specs(self) -> list[TensorSpec]:
        return [action_tensor_spec(self.action_spec)]

    def step(
        self, inputs: Mapping[str, torch.Tensor], states: Mapping[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, States]:
        """One step of B rows: masked logits (B, A), values (B) and each row's next state."""
        out, next_states = self.core(self.torso(inputs[OBSERVATION])[:, None], states)
        logits, values = self._heads(out[:, 0], inputs.get(ACTION_MASK))
        return logits, values, next_states

    def unroll(
        self, inputs: Mapping[str, torch.Tensor], recorded: Mapping[str, torch.Tensor], starts: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, States]:
        """(B, T) segments: logits (B, T, A), values (B, T) and the state after the last step (see the
        module docstring for ``recorded`` and ``starts``)."""
        out, final = self.core.unroll(self.torso(inputs[OBSERVATION]), recorded, starts)
        logits, values = self._heads(out, inputs.get(ACTION_MASK))
        return logits, values, final

    def value(self, inputs: Mapping[str, torch.Tensor], states: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """V of one (B, ...) observation reached with ``states`` (a segment's bootstrap value)."""
        return self.step(inputs, states)[1]

    def _heads(self, features: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        values = bound_values(self.value_head(features).squeeze(-1), self.value_bound)
        return policy_params(self.distribution, self.policy_head(features), self.log_std, mask), values
