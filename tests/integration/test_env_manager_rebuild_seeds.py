"""A rebuilt env (after its failure, or with its worker process) is seeded from its last seed and its rebuilds
since: reproducible, and no replay of the episodes it played from that seed. Seeded again with the last seed, it
replayed its job's opening episodes, and in the subprocess manager so did the healthy envs of a dead worker: the
same data again for the rest of the job (an env-manager review). Real worker processes."""

from __future__ import annotations

import os
import signal
from functools import partial

import pytest

from actor_service.envs import (
    BaseEnvManager,
    EnvManagerConfig,
    SubprocessEnvManager,
    SubprocessEnvManagerConfig,
)
from tests.env_doubles import FlakyEnv
from tests.env_manager_launcher import alive

COUNTING = "python:tests.env_doubles:CountingEnv"  # observation [t, episode, noise from its seeded generator]


def episode_starts(manager, steps: int, kill_after: int | None = None) -> dict[int, list[tuple[int, float]]]:
    """(episode, noise) of every episode start each env showed while `steps` steps were played (a worker
    SIGKILLed after `kill_after` of them)."""
    starts: dict[int, list[tuple[int, float]]] = {i: [] for i in range(manager.env_num)}

    def note() -> None:
        for env_id, obs in manager.next_obs.items():
            start = (int(obs[1]), round(float(obs[2]), 6))
            if obs[0] == 0 and (not starts[env_id] or starts[env_id][-1] != start):  # (shown until stepped)
                starts[env_id].append(start)

    note()
    for step in range(steps):
        if kill_after is not None and step == kill_after:
            os.kill(manager.worker_pids[0], signal.SIGKILL)
        manager.step(dict.fromkeys(manager.ready_env, 0))
        note()
    return starts


@pytest.fixture(autouse=True)
def fresh_flaky_counts():
    FlakyEnv._process_steps = 0
    yield
    FlakyEnv._process_steps = 0


@pytest.mark.parametrize("kind", ["base", "subprocess"])
def test_a_rebuilt_env_does_not_replay_the_episodes_of_its_seed(kind):
    env = partial(FlakyEnv, inner=COUNTING, crash_every=7)  # episodes of 3 steps: a crash every 2-3 episodes
    manager = (BaseEnvManager([env], EnvManagerConfig(max_retry=100)) if kind == "base" else
               SubprocessEnvManager([env], SubprocessEnvManagerConfig(num_workers=1, max_retry=100)))
    try:
        manager.seed(42)
        manager.launch()
        starts = episode_starts(manager, 40)[0]
        firsts = [noise for episode, noise in starts if episode == 0]  # the first episode of each build
        assert len(firsts) >= 3, starts
        assert len(set(firsts)) == len(firsts), starts  # each build's own, none the seed's replayed
    finally:
        manager.close()
    # Reproducible: the same seed and failures give the same episodes.
    FlakyEnv._process_steps = 0
    again = (BaseEnvManager([env], EnvManagerConfig(max_retry=100)) if kind == "base" else
             SubprocessEnvManager([env], SubprocessEnvManagerConfig(num_workers=1, max_retry=100)))
    try:
        again.seed(42)
        again.launch()
        assert episode_starts(again, 40)[0] == starts
    finally:
        again.close()


def test_the_healthy_envs_of_a_dead_worker_do_not_replay_their_episodes():
    manager = SubprocessEnvManager([partial(FlakyEnv, inner=COUNTING)] * 2,
                                   SubprocessEnvManagerConfig(num_workers=1, max_retry=5))
    try:
        manager.seed(42)
        manager.launch()
        pids = manager.worker_pids
        starts = episode_starts(manager, 20, kill_after=8)
        assert alive(pids) == []
        for env_id, env_starts in starts.items():
            firsts = [noise for episode, noise in env_starts if episode == 0]
            assert len(firsts) == 2 and firsts[0] != firsts[1], (env_id, env_starts)
    finally:
        manager.close()
