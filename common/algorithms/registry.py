"""Build a model + algorithm + `ComputationTask` from the league config's ``policy`` section.

The coordinator passes that section to every worker unchanged (a protobuf Struct, so numbers arrive as
doubles); actors and learners call `make_computation_task` with it and the env's specs, and get identically
built tasks, so weights published by one load into the other.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from common.algorithms.dqn import DQN
from common.algorithms.models import ActorCriticModel, QNetworkModel
from common.algorithms.ppo import PPO
from common.algorithms.recurrent_models import RecurrentActorCriticModel
from common.algorithms.recurrent_ppo import RecurrentPPO
from common.computation.algorithm import Algorithm
from common.computation.computation_task import ComputationTask
from common.computation.specs import (
    ActionSpec,
    DiscreteActionSpec,
    ObsSpec,
    as_action_spec,
    observation_specs,
)
from common.policy_config import ALGORITHM_NAMES, PolicyConfig


def _build_ppo(obs: Mapping, actions: ActionSpec, config: PolicyConfig) -> Algorithm:
    if config.model.recurrent is not None:
        return RecurrentPPO(RecurrentActorCriticModel(obs, actions, config.model), config.ppo)
    return PPO(ActorCriticModel(obs, actions, config.model), config.ppo)


class UnsupportedActionError(ValueError):
    """An algorithm that cannot act in the env's action space (DQN and a Box action)."""


def _build_dqn(obs: Mapping, actions: ActionSpec, config: PolicyConfig) -> Algorithm:
    if not isinstance(actions, DiscreteActionSpec):
        raise UnsupportedActionError(
            f"policy.algorithm dqn: DQN picks the action of highest value among N discrete actions; this env's "
            f"action is {type(actions).__name__}{actions.shape}: use policy.algorithm: ppo")
    return DQN(QNetworkModel(obs, actions.num_actions, config.model), config.dqn)


ALGORITHMS: dict[str, Callable[[Mapping, ActionSpec, PolicyConfig], Algorithm]] = {
    "ppo": _build_ppo,
    "dqn": _build_dqn,
}
"""Algorithm name -> builder(obs specs, action spec, policy config)."""
if set(ALGORITHMS) != set(ALGORITHM_NAMES):
    raise ImportError(f"common.policy_config.ALGORITHM_NAMES {ALGORITHM_NAMES} != the builders {sorted(ALGORITHMS)}")


def make_computation_task(
    policy_config: Mapping[str, Any] | PolicyConfig | None,
    obs_spec: ObsSpec,
    action_spec: ActionSpec | int,
    device: str = "auto",
    seed: int | None = None,
) -> ComputationTask:
    """A ready task; ``seed`` fixes the initial weights and the acting/minibatch randomness."""
    config = PolicyConfig.from_mapping(policy_config)
    action_spec = as_action_spec(action_spec)
    specs = observation_specs(obs_spec)
    if seed is None:
        algorithm = ALGORITHMS[config.algorithm](specs, action_spec, config)
    else:
        # Seeded initialisation without disturbing the process-wide torch RNG.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            algorithm = ALGORITHMS[config.algorithm](specs, action_spec, config)
    return ComputationTask(algorithm, device=device, seed=seed)
