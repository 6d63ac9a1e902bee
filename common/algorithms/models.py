"""Standard networks built from specs: an MLP or conv torso, an actor-critic head pair, a Q head.

Observations come as ``observation`` (a vector, or an image laid out channels-first (C, H, W)) plus an
optional ``action_mask`` (bool per action). Masked actions get logit/Q value ``finfo.min``: zero probability
and never the argmax, without the NaNs that ``-inf`` produces in softmax and entropy.
Inputs may carry any leading dims ((B,) for acting, (B, T) for learning).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import nn

from common.algorithms.distributions import (
    ActionDistribution,
    DiagGaussian,
    MultiCategorical,
    action_distribution,
)
from common.computation.model import Model
from common.computation.specs import (
    ACTION_MASK,
    ActionSpec,
    DiscreteActionSpec,
    TensorSpec,
    action_tensor_spec,
    as_action_spec,
)
from common.policy_config import ModelConfig
from common.trajectory import OBSERVATION

NATURE_CONV: tuple[tuple[int, int, int], ...] = ((32, 8, 4), (64, 4, 2), (64, 3, 1))


def layer_init(layer: nn.Module, std: float = math.sqrt(2), bias: float = 0.0) -> nn.Module:
    """Orthogonal weights and constant bias (the PPO implementation details everyone copies)."""
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


def apply_action_mask(values: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    if mask is None:
        return values
    return values.masked_fill(~mask, torch.finfo(values.dtype).min)


class RunningNorm(nn.Module):
    """Standardises observations by a running mean and variance of every entry (`ModelConfig.obs_norm`).

    The statistics are buffers (float64, so that millions of updates do not drift), so they travel with the
    model's weights in checkpoints; only the learner calls `update`. Before the first update it is the identity
    (mean 0, variance 1)."""

    def __init__(self, shape: tuple[int, ...], clip: float) -> None:
        super().__init__()
        self.clip = clip
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        """Merge the statistics of the rows of `x` (..., *shape) into the running ones (Chan et al.'s parallel
        variance, as SB3's RunningMeanStd)."""
        rows = x.reshape(-1, *self.mean.shape).to(torch.float64)
        n = rows.shape[0]
        if n == 0:
            return
        batch_mean, batch_var = rows.mean(0), rows.var(0, unbiased=False)
        total = self.count + n
        delta = batch_mean - self.mean
        self.mean += delta * (n / total)
        self.var.copy_((self.var * self.count + batch_var * n + delta * delta * (self.count * n / total)) / total)
        self.count.copy_(total)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean, std = self.mean.to(x.dtype), torch.sqrt(self.var + 1e-8).to(x.dtype)
        return ((x - mean) / std).clamp(-self.clip, self.clip)


class Torso(nn.Module):
    """Observation -> features: conv stack for (C, H, W), else flatten; then the hidden MLP."""

    def __init__(self, obs_spec: TensorSpec, config: ModelConfig, activation: str) -> None:
        super().__init__()
        act = nn.Tanh if activation == "tanh" else nn.ReLU
        self.obs_shape = obs_spec.shape
        self.obs_scale = config.obs_scale
        self.obs_norm = RunningNorm(obs_spec.shape, config.obs_norm_clip) if config.obs_norm else None
        layers: list[nn.Module] = []
        if len(obs_spec.shape) == 3:
            channels = obs_spec.shape[0]
            same = config.conv_padding == "same"
            for out_channels, kernel, stride in config.conv or NATURE_CONV:
                padding = kernel // 2 if same else 0
                layers += [layer_init(nn.Conv2d(channels, out_channels, kernel, stride, padding)), act()]
                channels = out_channels
        layers.append(nn.Flatten())
        with torch.no_grad():
            try:
                width = nn.Sequential(*layers)(torch.zeros(1, *obs_spec.shape)).shape[1]
            except RuntimeError as err:  # e.g. the Nature stack's 8x8 kernels on a 6x7 board
                stack = [list(layer) for layer in config.conv or NATURE_CONV]
                if min(obs_spec.shape[1:]) >= 5:  # two unpadded 3x3 kernels take 5 rows and 5 columns
                    hint = ("set policy.model.conv to one that does (small boards: 3x3 kernels of stride 1, as "
                            "[[64, 3, 1], [64, 3, 1]], or the default league's [[32, 3, 1], [32, 3, 1]] with "
                            "conv_padding: same)")
                else:  # a board such as tic-tac-toe's (3x3): even that stack shrinks it to nothing unpadded
                    hint = ("set policy.model.conv_padding: same, which keeps each layer at the board's size, with "
                            "a policy.model.conv of odd kernels and stride 1 (as [[64, 3, 1], [64, 3, 1]])")
                raise ValueError(f"model.conv: the conv stack {stack}{'' if config.conv else ' (the default)'} "
                                 f"does not fit observations of shape {tuple(obs_spec.shape)}: {err}; "
                                 f"{hint}") from None
        for hidden in config.hidden:
            layers += [layer_init(nn.Linear(width, hidden)), act()]
            width = hidden
        self.net = nn.Sequential(*layers)
        self.out_features = width

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        lead = observation.shape[: observation.ndim - len(self.obs_shape)]
        x = self._scaled(observation)
        if self.obs_norm is not None:
            x = self.obs_norm(x)
        return self.net(x).reshape(*lead, self.out_features)

    def update_obs_stats(self, observation: torch.Tensor) -> None:
        """Fold observations (..., *obs_shape) into the running statistics (`obs_norm`; nothing without)."""
        if self.obs_norm is not None:
            self.obs_norm.update(self._scaled(observation))

    def _scaled(self, observation: torch.Tensor) -> torch.Tensor:
        x = observation.reshape(-1, *self.obs_shape).float()
        return x * self.obs_scale if self.obs_scale != 1.0 else x


def update_obs_stats(model: nn.Module, observation: torch.Tensor) -> None:
    """Fold a learn batch's observations into every torso's running statistics (`ModelConfig.obs_norm`): the
    learner calls it once per batch, before its forward passes, so the targets and the update see them."""
    for module in model.modules():
        if isinstance(module, Torso):
            module.update_obs_stats(observation)


def split_input_specs(
    obs_specs: Mapping[str, TensorSpec], actions: ActionSpec | int
) -> tuple[TensorSpec, TensorSpec | None]:
    """The observation spec and the action mask's (None for a Box action: there is nothing to mask)."""
    unknown = sorted(set(obs_specs) - {OBSERVATION, ACTION_MASK})
    if unknown:
        raise ValueError(f"obs_spec: standard models read only {OBSERVATION!r} and {ACTION_MASK!r}, got {unknown}")
    if OBSERVATION not in obs_specs:
        raise ValueError(f"obs_spec: missing {OBSERVATION!r}")
    actions = as_action_spec(actions)
    mask = obs_specs.get(ACTION_MASK)
    if not isinstance(actions, DiscreteActionSpec):
        if mask is not None:
            raise ValueError(f"obs_spec[{ACTION_MASK!r}]: a mask of legal actions needs one discrete choice; this "
                             f"policy's action is {type(actions).__name__}{actions.shape}")
        return obs_specs[OBSERVATION], None
    num_actions = actions.num_actions
    if mask is not None and (mask.shape != (num_actions,) or mask.dtype != "bool"):
        raise ValueError(f"obs_spec[{ACTION_MASK!r}]: expected bool ({num_actions},), got {mask.dtype}{mask.shape}")
    # Required when the env declares it; optional (absent = all legal) otherwise.
    mask_spec = TensorSpec(ACTION_MASK, (num_actions,), "bool", optional=mask is None)
    return obs_specs[OBSERVATION], mask_spec


def gaussian_log_std(distribution: ActionDistribution, config: ModelConfig) -> nn.Parameter | None:
    """A Gaussian policy's learned log std (one per action entry, shared by every state); None otherwise."""
    if not isinstance(distribution, DiagGaussian):
        return None
    return nn.Parameter(torch.full((distribution.size,), float(config.log_std_init)))


def policy_params(
    distribution: ActionDistribution, head_out: torch.Tensor, log_std: torch.Tensor | None,
    mask: torch.Tensor | None,
) -> torch.Tensor:
    """The policy head's output as the distribution's parameters: masked logits, every choice's logits, or mean
    and log std."""
    if isinstance(distribution, DiagGaussian):
        assert log_std is not None
        return distribution.params(head_out, log_std)
    if isinstance(distribution, MultiCategorical):
        return head_out
    return apply_action_mask(head_out, mask)


def bound_values(values: torch.Tensor, bound: float | None) -> torch.Tensor:
    """`values` squashed into (-bound, bound) by ``bound * tanh(v / bound)`` (ModelConfig.value_bound), or
    as they are when `bound` is None."""
    return values if bound is None else bound * torch.tanh(values / bound)


class ActorCriticModel(Model):
    """Policy parameters (categorical logits, or a Gaussian's mean and log std) and a state value."""

    def __init__(self, obs_specs: Mapping[str, TensorSpec], actions: ActionSpec | int, config: ModelConfig) -> None:
        super().__init__()
        self.action_spec = as_action_spec(actions)
        self.obs_spec, self.mask_spec = split_input_specs(obs_specs, self.action_spec)
        activation = config.activation or "tanh"
        self.actor_torso = Torso(self.obs_spec, config, activation)
        self.critic_torso = None if config.shared_torso else Torso(self.obs_spec, config, activation)
        width = self.actor_torso.out_features
        self.distribution: ActionDistribution = action_distribution(self.action_spec)
        # Attributes named as before Box actions existed: discrete checkpoints keep their keys.
        self.policy_head = layer_init(nn.Linear(width, self.distribution.head_size), std=0.01)
        self.log_std = gaussian_log_std(self.distribution, config)
        self.value_head = layer_init(nn.Linear(width, 1), std=1.0)
        self.value_bound = config.value_bound

    def get_input_specs(self) -> list[TensorSpec]:
        return [self.obs_spec] if self.mask_spec is None else [self.obs_spec, self.mask_spec]

    def get_action_specs(self) -> list[TensorSpec]:
        return [action_tensor_spec(self.action_spec)]

    def forward(self, inputs: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Policy parameters (..., P) and values (...)."""
        features = self.actor_torso(inputs[OBSERVATION])
        params = policy_params(self.distribution, self.policy_head(features), self.log_std, inputs.get(ACTION_MASK))
        critic = features if self.critic_torso is None else self.critic_torso(inputs[OBSERVATION])
        return params, bound_values(self.value_head(critic).squeeze(-1), self.value_bound)

    def value(self, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        torso = self.actor_torso if self.critic_torso is None else self.critic_torso
        return bound_values(self.value_head(torso(inputs[OBSERVATION])).squeeze(-1), self.value_bound)


class QNetworkModel(Model):
    """Action values Q(s, ·), masked."""

    def __init__(self, obs_specs: Mapping[str, TensorSpec], num_actions: int, config: ModelConfig) -> None:
        super().__init__()
        self.obs_spec, self.mask_spec = split_input_specs(obs_specs, num_actions)
        self.num_actions = num_actions
        self.torso = Torso(self.obs_spec, config, config.activation or "relu")
        self.q_head = layer_init(nn.Linear(self.torso.out_features, num_actions), std=1.0)

    def get_input_specs(self) -> list[TensorSpec]:
        return [self.obs_spec, self.mask_spec]

    def get_action_specs(self) -> list[TensorSpec]:
        return [TensorSpec("action", (), "int64")]

    def forward(self, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return apply_action_mask(self.q_head(self.torso(inputs[OBSERVATION])), inputs.get(ACTION_MASK))
