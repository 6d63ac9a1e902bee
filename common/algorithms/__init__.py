"""Standard algorithms (PPO, DQN), their networks, and the registry that builds them from a policy config."""

from common.algorithms.dqn import DQN, make_replay, transitions_from_trajectory
from common.algorithms.models import ActorCriticModel, QNetworkModel
from common.algorithms.ppo import PPO, batch_from_trajectory, compute_targets
from common.algorithms.recurrent_models import RecurrentActorCriticModel
from common.algorithms.recurrent_ppo import RecurrentPPO
from common.algorithms.registry import ALGORITHMS, make_computation_task
from common.policy_config import DQNConfig, ModelConfig, PolicyConfig, PPOConfig

__all__ = [
    "ALGORITHMS",
    "DQN",
    "PPO",
    "ActorCriticModel",
    "DQNConfig",
    "ModelConfig",
    "PPOConfig",
    "PolicyConfig",
    "QNetworkModel",
    "RecurrentActorCriticModel",
    "RecurrentPPO",
    "batch_from_trajectory",
    "compute_targets",
    "make_computation_task",
    "make_replay",
    "transitions_from_trajectory",
]
