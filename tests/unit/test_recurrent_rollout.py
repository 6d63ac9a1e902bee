"""Recurrent policies in the actor: each env (and each seat, and each opponent) carries its own state through
batched predicts, the state starts afresh with every episode (the env managers' auto-reset), the state a
decision was taken with is recorded, and the learner's unroll of the rows reproduces the actor's steps."""

from __future__ import annotations

import math

import numpy as np
import pytest

from actor_service.envs.env_manager import BaseEnvManager, EnvManagerConfig
from actor_service.evaluation import play_against_bot
from actor_service.job import PlayerSlot
from actor_service.policy_pool import Policy, PolicyPool, PolicySettings
from actor_service.rollout import Rollout, RolloutTarget
from actor_service.stop import StopSignal
from actor_service.trajectory_sender import InMemorySink
from common.algorithms.ppo import batch_from_trajectory
from common.algorithms.registry import make_computation_task
from common.checkpoint_store import CheckpointStore
from common.computation.algorithm import ForwardKwargs
from common.envs.cue_memory import CueMemoryEnv
from common.envs.policy_view import policy_specs
from common.envs.registry import EnvSpec, make_env
from learner_service.trainer import front_pad
from tests.recurrent_checks import assert_unroll_matches_acting, unrolled_logp
from tests.unit.test_actor_rollout import TakeAwayGame

GRU = {"algorithm": "ppo", "model": {"hidden": [16], "recurrent": "gru", "recurrent_size": 8}}
CUE = EnvSpec("python:common.envs.cue_memory:CueMemoryEnv", {"num_cues": 3, "delay": 4})


class StateSpy:
    """A task that records every predict's states in and out (and delegates everything else)."""

    def __init__(self, task) -> None:
        self._task = task
        self.calls: list[tuple[dict, dict, dict]] = []

    def predict(self, inputs, states=None, forward_kwargs=None):
        prediction = self._task.predict(inputs, states, forward_kwargs)
        self.calls.append((dict(inputs), dict(states or {}), prediction.states))
        return prediction

    def __getattr__(self, name):
        return getattr(self._task, name)


def recurrent_policy(player_id: str, info, seed: int) -> Policy:
    inputs, actions = policy_specs(info)
    return Policy(player_id, StateSpy(make_computation_task(GRU, inputs, actions, "cpu", seed)), 3, "")


def play(manager, policies, episodes, unroll_len):
    sink = InMemorySink()
    target = RolloutTarget(tuple(p.player_id for p in policies), episodes, 0, ForwardKwargs(), unroll_len)
    result = Rollout(manager, manager.env_info, target, policies, stop=StopSignal(), sink=sink).run()
    return result, [traj for traj, _ in sink.items]


@pytest.fixture
def cue_envs():
    manager = BaseEnvManager([CUE] * 3, EnvManagerConfig(episode_num=math.inf))
    manager.seed(0)
    manager.launch()
    yield manager
    manager.close()


def test_the_state_is_recorded_per_env_and_starts_afresh_with_every_episode(cue_envs):
    policy = recurrent_policy("p", cue_envs.env_info, 0)
    # Episodes of 5 steps in rows of 3: rows begin mid-episode and episodes end mid-row.
    result, trajectories = play(cue_envs, [policy], episodes=7, unroll_len=3)
    assert len(result.episodes) == 7
    steps = 0
    for trajectory in trajectories:
        hidden = trajectory.hidden_state()["hidden"]
        assert hidden.shape == (trajectory.batch_size, trajectory.steps, 8)
        episode_start = trajectory.observations()["observation"][..., :3].any(-1)  # the cue shows at step 0 only
        assert (hidden[episode_start] == 0).all()
        assert (np.abs(hidden[~episode_start]).sum(-1) > 0).all()
        assert_unroll_matches_acting(policy.task, trajectory)
        steps += trajectory.num_steps
    assert steps == result.agent_steps  # every decision was recorded once (the job's end cut open ones)


def test_front_padded_rows_restart_the_core_from_the_first_real_steps_state(cue_envs):
    policy = recurrent_policy("p", cue_envs.env_info, 1)
    _, trajectories = play(cue_envs, [policy], episodes=4, unroll_len=3)
    names = [s.name for s in policy.task.state_specs]
    for trajectory in trajectories:
        batch = batch_from_trajectory(trajectory, state_names=names)
        padded = front_pad(batch, trajectory.steps + 4)
        np.testing.assert_allclose(unrolled_logp(policy.task, padded)[:, 4:], batch["behaviour_logp"],
                                   rtol=1e-4, atol=1e-5)


def test_self_play_seats_keep_their_own_states_in_one_batched_forward():
    manager = BaseEnvManager([TakeAwayGame] * 2, EnvManagerConfig(episode_num=math.inf))
    manager.launch()
    try:
        me = recurrent_policy("me", manager.env_info, 2)
        result, trajectories = play(manager, [me, me], episodes=6, unroll_len=4)
    finally:
        manager.close()
    assert len(result.episodes) == 6
    assert max(len(inputs["observation"]) for inputs, _, _ in me.task.calls) == 2  # seats/envs batched together
    # Each seat's rows carry on from that seat's own previous step, never from the other seat's.
    for trajectory in trajectories:
        assert_unroll_matches_acting(me.task, trajectory)


def test_a_recurrent_opponent_carries_its_own_state_per_env_and_resets_it_per_episode():
    manager = BaseEnvManager([TakeAwayGame], EnvManagerConfig(episode_num=math.inf))
    manager.launch()
    try:
        home = recurrent_policy("home", manager.env_info, 3)
        away = recurrent_policy("away", manager.env_info, 4)
        result, trajectories = play(manager, [home, away], episodes=6, unroll_len=100)
    finally:
        manager.close()
    assert len(result.episodes) == 6 and trajectories
    assert all("/agents/agent/hidden_state/hidden" in t.tensors for t in trajectories)
    previous_out = None
    episode_starts = 0
    for inputs, states_in, states_out in away.task.calls:
        moves_made = inputs["observation"][0, 1]
        if moves_made <= 1:  # the opponent's first move of an episode: a fresh state
            np.testing.assert_array_equal(states_in["hidden"], np.zeros((1, 8), np.float32))
            episode_starts += 1
        else:  # later moves continue from its own previous step (home's steps in between do not touch it)
            np.testing.assert_array_equal(states_in["hidden"], previous_out["hidden"])
        previous_out = states_out
    assert episode_starts >= 6


def test_the_policy_pool_builds_recurrent_launch_and_opponent_policies(tmp_path):
    info = CueMemoryEnv(num_cues=3, delay=4).info()
    pool = PolicyPool(CheckpointStore(tmp_path), GRU, info, PolicySettings(first_checkpoint_wait_s=0.0), StopSignal())
    launch = pool.launch_policy(PlayerSlot("p", "", 0, True))
    opponent = pool.opponent_policy(PlayerSlot("q", "", 0, False), launch)
    for policy in (launch, opponent):
        assert [s.name for s in policy.task.state_specs] == ["hidden"]



def test_league_eval_plays_a_recurrent_policy_with_its_memory_reset_per_game():
    info = make_env("connect_four").info()
    inputs, actions = policy_specs(info)
    board_gru = {**GRU, "model": {**GRU["model"], "conv": [[8, 3, 1]]}}
    spy = StateSpy(make_computation_task(board_gru, inputs, actions, "cpu", 5))
    result = play_against_bot(spy, "connect_four", {}, "random", games=2, seed=1)
    assert result.games == 2
    fresh = [np.abs(states["hidden"]).sum() == 0 for _, states, _ in spy.calls]
    assert sum(fresh) == 2 and fresh[0]  # the first move of each game, and no other
