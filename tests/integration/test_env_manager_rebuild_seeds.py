"""A rebuilt env (after its failure, or with its worker process) is seeded from its last seed and its rebuilds
since: reproducible, and no replay of the episodes it played from that seed. Seeded again with the last seed, it
replayed its job's opening episodes, and in the subprocess manager so did the healthy envs of a dead worker: the
same data again for the rest of the job (an env-manager review). Real worker processes."""

from __future__ import annotations

import os
import signal
import time
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
    """(episode, noise) of every episode start each env showed while it took `steps` steps (a worker SIGKILLed
    once env 0 had taken `kill_after`). Steps are counted by the timesteps each env returned, a failed step's
    included, not by `manager.step` calls: in the subprocess manager a call can return none for an env whose
    reset or rebuild has not landed yet (a slow reset runs in the worker after the episode's last timestep),
    and how often that happens depends on the machine's load (a CI run played one episode fewer the second
    time)."""
    starts: dict[int, list[tuple[int, float]]] = {i: [] for i in range(manager.env_num)}
    taken = dict.fromkeys(range(manager.env_num), 0)

    def note() -> None:
        for env_id, obs in manager.next_obs.items():
            start = (int(obs[1]), round(float(obs[2]), 6))
            if obs[0] == 0 and (not starts[env_id] or starts[env_id][-1] != start):  # (shown until stepped)
                starts[env_id].append(start)

    note()
    killed = kill_after is None
    deadline = time.monotonic() + 60  # a bound, not a goal: a manager that stops returning timesteps fails here
    while min(taken.values()) < steps:
        if time.monotonic() > deadline:
            raise AssertionError(f"the envs took {taken} of {steps} steps in 60 s")
        if not killed and taken[0] >= kill_after:
            os.kill(manager.worker_pids[0], signal.SIGKILL)
            killed = True
        for env_id in manager.step({env_id: 0 for env_id in manager.ready_env if taken[env_id] < steps}):
            taken[env_id] += 1
        note()
    while len(manager.ready_env) < manager.env_num:  # a reset after the last step, landed or not: wait for it
        assert time.monotonic() < deadline, f"the envs were not all ready again within 60 s: {manager.ready_env}"
        manager.step({})
    note()
    return starts


@pytest.fixture(autouse=True)
def fresh_flaky_counts():
    FlakyEnv._process_steps = 0
    yield
    FlakyEnv._process_steps = 0


def one_env_manager(kind: str, env, max_retry: int):
    """A manager of the one env `env`: the serial one ("base") or the subprocess one (one worker)."""
    if kind == "base":
        return BaseEnvManager([env], EnvManagerConfig(max_retry=max_retry))
    return SubprocessEnvManager([env], SubprocessEnvManagerConfig(num_workers=1, max_retry=max_retry))


@pytest.mark.parametrize("kind", ["base", "subprocess"])
def test_a_rebuilt_env_does_not_replay_the_episodes_of_its_seed(kind):
    env = partial(FlakyEnv, inner=COUNTING, crash_every=7)  # episodes of 3 steps: a crash every 2-3 episodes
    manager = one_env_manager(kind, env, max_retry=100)
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
    again = one_env_manager(kind, env, max_retry=100)
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


def fails_its_first_build(marker: str) -> FlakyEnv:
    """A CountingEnv whose first build (in any process: `marker` remembers it) raises."""
    if not os.path.exists(marker):
        with open(marker, "w"):
            pass
        raise RuntimeError("the first build fails")
    return FlakyEnv(inner=COUNTING)


@pytest.mark.parametrize("kind", ["base", "subprocess"])
def test_an_env_whose_build_failed_at_launch_starts_from_its_seed_in_both_managers(kind, tmp_path):
    """It had played nothing from its seed: the subprocess manager started it from that seed, the serial one from
    a seed derived for rebuilds, so the two managers' trajectories differed after such a failure (a review)."""
    failed, clean = with_and_without_its_failure(kind, tmp_path, fails_its_first_build,
                                                 lambda manager: episode_starts(manager, 1)[0][0])
    assert failed == clean


def with_and_without_its_failure(kind: str, tmp_path, env_of_marker, play) -> list:
    """What `play(manager)` gives on a manager (seeded 42, launched) of `env_of_marker(marker)`, an env that fails
    once unless its `marker` file is there: first where it fails, then where it does not."""
    played = []
    for fails in (True, False):
        marker = tmp_path / f"{kind}-{fails}"
        if not fails:
            marker.touch()
        manager = one_env_manager(kind, partial(env_of_marker, str(marker)), max_retry=2)
        try:
            manager.seed(42)
            manager.launch()
            played.append(play(manager))
        finally:
            manager.close()
    return played


class FailsASeededReset(FlakyEnv):
    """A CountingEnv whose first reset after `seed(100)` raises, once in any process (`marker` remembers it)."""

    def __init__(self, marker: str) -> None:
        super().__init__(inner=COUNTING)
        self._marker, self._seeded = marker, False

    def seed(self, seed: int) -> None:
        super().seed(seed)
        self._seeded = seed == 100

    def reset(self, **kwargs):
        if self._seeded and not os.path.exists(self._marker):
            with open(self._marker, "w"):
                pass
            raise RuntimeError("the seeded reset fails")
        return super().reset(**kwargs)


@pytest.mark.parametrize("kind", ["base", "subprocess"])
def test_an_env_whose_seeded_reset_failed_starts_from_that_seed_in_both_managers(kind, tmp_path):
    """The serial manager rebuilt it from that seed, the subprocess manager from one derived for rebuilds (the
    diff review of the fix above)."""
    def first_obs_after_reset(manager) -> float:
        manager.seed(100)
        manager.reset()
        return round(float(manager.next_obs[0][2]), 6)

    failed, clean = with_and_without_its_failure(kind, tmp_path, FailsASeededReset, first_obs_after_reset)
    assert failed == clean
