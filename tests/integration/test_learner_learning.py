"""The shipped solo CartPole config learns: a real coordinator and learner, an actor loop pushing real rollouts.

Slow (tens of seconds): run with `-m slow`. The actor acts with the newest published weights and waits for
each update, the SB3 rhythm (8 envs x 32 steps, then an update), so the number of env steps compares with
FIELD_NOTES' reference (mean return >= 475 after 10k-40k steps).
"""

from __future__ import annotations

import numpy as np
import pytest

from common.checkpoint_store import CheckpointStore
from league_service.config import load_config
from league_service.coordinator_testing import running_coordinator
from learner_service.learner_testing import Rollout, running_learner
from tests.integration.test_learner_service import PLAYER, REPO, acting_task, push

BUDGET_STEPS = 100_000
TARGET_RETURN = 475.0


@pytest.mark.slow
def test_solo_cartpole_reaches_the_target_return(tmp_path):
    cfg = load_config(REPO / "configs" / "solo_cartpole.yaml")
    unroll = cfg.league.solo_active_player.adder_kwargs["unroll_len"]
    rollout = Rollout(player_id=PLAYER, env_num=cfg.env.env_num, unroll_len=unroll, seed=1)
    store = CheckpointStore(tmp_path)
    try:
        with running_coordinator(cfg, tmp_path) as coordinator, running_learner(coordinator.address, tmp_path) as lr:
            version = lr.learner.wait_published(PLAYER, 0, 60).version
            steps = 0
            while steps < BUDGET_STEPS:
                task = acting_task(cfg, tmp_path)
                version = task.version
                push(lr.address, rollout.chunks(task, 1, policy_version=version))
                steps += cfg.env.env_num * unroll
                lr.learner.wait_published(PLAYER, version + 1, 60)
                recent = rollout.episode_returns[-20:]
                if len(recent) == 20 and np.mean(recent) >= TARGET_RETURN:
                    break
            print(f"solo CartPole: mean return {np.mean(rollout.episode_returns[-20:]):.1f} over the last 20 "
                  f"episodes after {steps} env steps, version {store.latest(PLAYER).version}")
            assert np.mean(rollout.episode_returns[-20:]) >= TARGET_RETURN
    finally:
        rollout.close()
