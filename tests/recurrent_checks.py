"""What recurrent-policy tests check on recorded data: the learner's unroll over a trajectory, from its recorded
hidden states, reproduces what the actor computed step by step (so states were carried and reset correctly)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from common.algorithms.ppo import STATE_PREFIX, batch_from_trajectory
from common.algorithms.recurrent_ppo import episode_starts
from common.computation import ComputationTask
from common.trajectory import Trajectory


def unrolled_logp(task: ComputationTask, batch: Mapping[str, np.ndarray]) -> np.ndarray:
    """log π(action) at every (B, T) step of a PPO learn batch, by the learner's unroll of the task's model."""
    t = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in batch.items()}
    inputs = {s.name: t[s.name] for s in task.input_specs if s.name in t}
    with torch.no_grad():
        logits, _, _ = task.algorithm.model.unroll(
            inputs, {s.name: t[STATE_PREFIX + s.name] for s in task.state_specs},
            episode_starts(t["terminated"], t["truncated"]),
        )
    return torch.log_softmax(logits, -1).gather(-1, t["action"][..., None]).squeeze(-1).numpy()


def assert_unroll_matches_acting(task: ComputationTask, trajectory: Trajectory, agent: str = "agent") -> None:
    batch = batch_from_trajectory(trajectory, agent, [s.name for s in task.state_specs])
    np.testing.assert_allclose(unrolled_logp(task, batch), batch["behaviour_logp"], rtol=1e-4, atol=1e-5)
