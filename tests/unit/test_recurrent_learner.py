"""Recurrent policies in the learner: chunks must carry the states the actor acted with (bad ones name their key),
rows of different lengths train together, and the training state round-trips."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from actor_service.envs.env_manager import BaseEnvManager, EnvManagerConfig
from actor_service.policy_pool import Policy
from actor_service.rollout import Rollout, RolloutTarget
from actor_service.stop import StopSignal
from actor_service.trajectory_sender import InMemorySink
from common.computation.algorithm import ForwardKwargs
from common.envs.policy_view import policy_specs
from common.envs.registry import EnvSpec
from common.learner_config import LearnerConfig
from common.policy_config import PolicyConfig
from common.tensor_codec import ChunkHeader, DecodedChunk, decode_chunk, encode_chunk
from common.trajectory import Trajectory
from learner_service.chunks import InvalidChunkError
from learner_service.trainer import ModelSpec, Progress, Trainer, build_trainer

LSTM = {"algorithm": "ppo", "model": {"hidden": [16], "recurrent": "lstm", "recurrent_size": 8},
        "ppo": {"num_minibatches": 2, "update_epochs": 2}}
CUE = EnvSpec("python:common.envs.cue_memory:CueMemoryEnv", {"num_cues": 2, "delay": 3})
HIDDEN_KEY = "/agents/agent/hidden_state/hidden"


def trainer_for(policy: dict, batch_size: int = 64, seed: int = 0) -> Trainer:
    inputs, actions = policy_specs(CUE().info())
    spec = ModelSpec(PolicyConfig.from_mapping(policy), inputs, actions)
    return build_trainer(spec, LearnerConfig(batch_size=batch_size), Progress(), seed=seed, device="cpu",
                         weights=None, version=0)


def collect(trainer: Trainer, env_steps: int, unroll_len: int) -> list[DecodedChunk]:
    """Chunks of a real rollout acting with the trainer's own task, through the wire codec."""
    manager = BaseEnvManager([CUE] * 3, EnvManagerConfig(episode_num=math.inf))
    manager.seed(0)
    manager.launch()
    try:
        sink = InMemorySink()
        target = RolloutTarget(("p",), 0, env_steps, ForwardKwargs(), unroll_len)
        Rollout(manager, manager.env_info, target, [Policy("p", trainer.task, 0, "")], stop=StopSignal(),
                sink=sink).run()
    finally:
        manager.close()
    return [decode_chunk(encode_chunk(traj, ChunkHeader("j", "p", "w", i, v))) for i, (traj, v) in enumerate(sink.items)]


def edited(chunk: DecodedChunk, key: str, value: np.ndarray | None) -> DecodedChunk:
    tensors = dict(chunk.trajectory.tensors)
    if value is None:
        tensors.pop(key)
    else:
        tensors[key] = value
    return DecodedChunk(chunk.header, Trajectory(tensors))


def test_chunks_without_fitting_hidden_states_are_refused_naming_the_key():
    trainer = trainer_for(LSTM)
    chunk = collect(trainer, env_steps=24, unroll_len=4)[0]
    hidden = chunk.trajectory.tensors[HIDDEN_KEY]
    bad = {
        "a recurrent policy's chunks carry the state": edited(chunk, HIDDEN_KEY, None),
        "shape": edited(chunk, HIDDEN_KEY, hidden[..., :5].copy()),
        "NaN": edited(chunk, HIDDEN_KEY, np.where(np.ones_like(hidden, bool), np.nan, hidden).astype(np.float32)),
    }
    for message, broken in bad.items():
        with pytest.raises(InvalidChunkError, match=message) as info:
            trainer.preparer.prepare(broken)
        assert info.value.key == HIDDEN_KEY
    prepared = trainer.preparer.prepare(chunk)
    assert prepared.rows["state_hidden"].shape == (*chunk.trajectory.rewards.shape, 8)
    assert "state_cell" in prepared.rows
    # A feed-forward learner ignores hidden states it does not need.
    feed_forward = trainer_for({"algorithm": "ppo", "model": {"hidden": [16]}})
    assert not any(k.startswith("state_") for k in feed_forward.preparer.prepare(chunk).rows)


def test_rows_of_different_lengths_train_together_and_the_training_state_round_trips():
    trainer = trainer_for(LSTM, batch_size=60)
    chunks = collect(trainer, env_steps=66, unroll_len=5)
    assert len({c.trajectory.steps for c in chunks}) > 1  # the job's end cut rows short
    report = None
    for chunk in chunks:
        trainer.add(trainer.preparer.prepare(chunk))
        report = trainer.train_ready() or report
    assert report is not None and report.version == 1
    assert report.stats["behaviour_ratio"] == pytest.approx(1.0, abs=1e-4)  # padding kept the unroll on track
    twin = trainer_for(LSTM, batch_size=60, seed=1)
    twin.task.set_weights(trainer.task.get_weights(), trainer.version)
    twin.task.set_training_state(trainer.task.get_training_state())
    assert twin.algorithm_updates == trainer.algorithm_updates == 1


def test_advantages_are_standardised_over_the_batch_not_over_minibatches_of_whole_rows(monkeypatch):
    """Minibatches of whole rows can hold a single valid step (rows of 1, 1, 1 and 16 real steps in 4), which
    then took a gradient step on its raw advantage (no spread to standardise by; an algorithms review). The
    advantages are standardised over the batch's valid steps once."""
    from common.algorithms.ppo import PPO

    policy = {**LSTM, "ppo": {"num_minibatches": 4, "update_epochs": 1}}
    trainer = trainer_for(policy, batch_size=10_000)
    for chunk in collect(trainer, env_steps=120, unroll_len=16):
        trainer.add(trainer.preparer.prepare(chunk))
    seen: list[tuple[torch.Tensor, bool]] = []
    real_step = PPO._minibatch_step

    def recording(self, logits, new_values, actions, old_logp, adv, *rest, normalize=True):
        seen.append((adv.detach().clone(), normalize))
        return real_step(self, logits, new_values, actions, old_logp, adv, *rest, normalize=normalize)

    monkeypatch.setattr(PPO, "_minibatch_step", recording)
    assert trainer.train_ready(rest=True) is not None
    assert seen and not any(normalize for _, normalize in seen)
    everything = torch.cat([adv for adv, _ in seen])
    assert abs(float(everything.mean())) < 1e-4 and abs(float(everything.std()) - 1.0) < 1e-3
