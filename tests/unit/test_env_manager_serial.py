"""BaseEnvManager: episode counting, auto-reset, reset params, seeds, retries and closing, in process."""

from __future__ import annotations

import pathlib
from functools import partial

import numpy as np
import pytest

from actor_service.envs import BaseEnvManager, EnvError, EnvManagerClosedError, EnvManagerConfig, EnvState
from common.envs import Env, EpisodeStats, TimeStep
from tests.env_doubles import CountingEnv


class FailingEnv(CountingEnv):
    """Raises at step `fail_at` of its first episode, as long as `budget_file` allows more failures."""

    def __init__(self, budget_file: pathlib.Path, failures: int, fail_at: int = 2) -> None:
        super().__init__(length=3)
        self._budget_file = budget_file
        self._failures = failures
        self._fail_at = fail_at

    def step(self, action: int) -> TimeStep:
        if self._t + 1 == self._fail_at and self._episode == 0:
            spent = len(self._budget_file.read_text()) if self._budget_file.exists() else 0
            if spent < self._failures:
                self._budget_file.write_text("x" * (spent + 1))
                explode_in_env()
        return super().step(action)


def explode_in_env() -> None:
    raise ValueError("boom from inside the env")


@pytest.fixture
def managers():
    """Builds managers and closes whatever the test left open."""
    built: list[BaseEnvManager] = []

    def make(env_fns, **config) -> BaseEnvManager:
        manager = BaseEnvManager(env_fns, EnvManagerConfig(**config))
        built.append(manager)
        return manager

    yield make
    for manager in built:
        manager.close()


def _run_to_done(manager: BaseEnvManager, action: int = 1) -> dict[int, list[TimeStep]]:
    seen: dict[int, list[TimeStep]] = {i: [] for i in range(manager.env_num)}
    while not manager.done:
        for env_id, ts in manager.step(dict.fromkeys(manager.ready_env, action)).items():
            seen[env_id].append(ts)
    return seen


def test_episodes_are_counted_and_envs_finish(managers):
    manager = managers([CountingEnv] * 3, episode_num=2)
    manager.launch()
    assert manager.ready_env == [0, 1, 2]
    seen = _run_to_done(manager)
    for timesteps in seen.values():
        assert [ts.done for ts in timesteps] == [False, False, True] * 2
    assert manager.episode_counts == {0: 2, 1: 2, 2: 2}
    assert set(manager.env_states.values()) == {EnvState.DONE}
    assert manager.next_obs == {} and manager.ready_env == []
    with pytest.raises(ValueError, match="not waiting for an action"):
        manager.step({0: 1})


def test_auto_reset_keeps_the_last_observation_in_the_timestep(managers):
    manager = managers([CountingEnv])
    manager.launch()
    for _ in range(2):
        manager.step({0: 0})
    last = manager.step({0: 0})[0]
    assert last.terminated and last.obs[:2].tolist() == [3.0, 0.0]  # t=3 of episode 0
    assert last.info.episode == EpisodeStats(3.0, 3)
    assert manager.next_obs[0][:2].tolist() == [0.0, 1.0]  # t=0 of episode 1
    assert manager.env_states[0] is EnvState.RUN and manager.episode_num == float("inf")


def test_reset_params_are_per_env_and_kept_for_auto_resets(managers):
    manager = managers([CountingEnv] * 2, episode_num=2)
    manager.launch(reset_params={1: {"length": 5}})
    seen = _run_to_done(manager)
    assert [len(seen[0]), len(seen[1])] == [6, 10]
    manager.reset(reset_params={0: {"length": 1}})  # only env 0 starts over (DI-engine's reset); env 1 stays done
    assert manager.episode_counts == {0: 0, 1: 2}
    seen = _run_to_done(manager)
    assert [len(seen[0]), len(seen[1])] == [2, 0]
    manager.reset()  # every env, each with the params it was given last
    assert manager.episode_counts == {0: 0, 1: 0}
    seen = _run_to_done(manager)
    assert [len(seen[0]), len(seen[1])] == [2, 10]
    with pytest.raises(ValueError, match="reset_params"):
        manager.reset(reset_params={7: {}})


def _trajectory(manager: BaseEnvManager) -> list:
    return [
        (env_id, ts.obs.tolist(), ts.reward)
        for env_id, tss in sorted(_run_to_done(manager).items())
        for ts in tss
    ]


def test_seeds_make_runs_repeat(managers):
    runs = []
    for _ in range(2):
        manager = managers([CountingEnv] * 2, episode_num=2)
        manager.seed(7)
        manager.launch()
        runs.append(_trajectory(manager))
    assert runs[0] == runs[1]

    direct = CountingEnv()
    direct.seed(8)  # env 1 of seed(7) gets 7 + 1
    assert manager.env_info.name == "counting"
    manager.seed([3, 8])
    manager.reset()
    expected = direct.reset()
    assert manager.next_obs[1][2] == expected[2]  # same noise: env 1 was seeded with 8
    with pytest.raises(ValueError, match="seed"):
        manager.seed([1, 2, 3])


def test_failed_env_is_rebuilt_and_its_episode_cut(managers, tmp_path):
    budget = tmp_path / "failures"
    manager = managers([CountingEnv, partial(FailingEnv, budget, failures=1)], max_retry=1)
    manager.launch()
    manager.step({0: 0, 1: 0})
    last_obs = manager.next_obs[1]
    out = manager.step({0: 0, 1: 0})  # env 1 raises here
    assert not out[0].done
    cut = out[1]
    assert cut.truncated and not cut.terminated and cut.reward == 0.0
    assert "boom from inside the env" in cut.info.failure
    np.testing.assert_array_equal(cut.obs, last_obs)
    assert manager.failure_counts == {0: 0, 1: 1}
    assert manager.next_obs[1][0] == 0.0  # a fresh episode of the rebuilt env
    assert manager.env_states[1] is EnvState.RUN


def test_retries_spent_raises_with_the_env_traceback_and_closes(managers, tmp_path):
    manager = managers([partial(FailingEnv, tmp_path / "failures", failures=5)], max_retry=0)
    manager.launch()
    manager.step({0: 0})
    with pytest.raises(EnvError) as raised:
        manager.step({0: 0})
    assert raised.value.env_id == 0
    assert isinstance(raised.value.__cause__, ValueError)
    assert "explode_in_env" in str(raised.value) and "max_retry=0" in str(raised.value)
    assert manager.closed
    with pytest.raises(EnvManagerClosedError):
        manager.step({0: 0})


class ExitingEnv(CountingEnv):
    """Calls sys.exit at its second step: a failure of this env, not of the process running it."""

    def step(self, action: int) -> TimeStep:
        if self._t + 1 == 2 and self._episode == 0:
            raise SystemExit(3)
        return super().step(action)


def test_an_env_raising_system_exit_fails_as_an_env_not_the_process(managers):
    """SystemExit passed the manager's `except Exception`, ended the actor's job thread and the actor (exit 1, the
    job released uncounted: no retry, no backoff); the subprocess manager fails the same env (a review)."""
    manager = managers([CountingEnv, ExitingEnv], max_retry=1)
    manager.launch()
    manager.step({0: 0, 1: 0})
    cut = manager.step({0: 0, 1: 0})[1]
    assert cut.truncated and "SystemExit(3)" in cut.info.failure
    assert manager.failure_counts == {0: 0, 1: 1} and manager.env_states[1] is EnvState.RUN


def test_lifecycle_errors_are_clear(managers):
    manager = managers([CountingEnv])
    with pytest.raises(RuntimeError, match="launch"):
        manager.step({0: 0})
    manager.launch()
    with pytest.raises(RuntimeError, match="already"):
        manager.launch()
    with pytest.raises(ValueError, match="range"):
        manager.step({5: 0})
    manager.close()
    manager.close()
    for call in (manager.launch, manager.reset, lambda: manager.seed(1), lambda: manager.next_obs):
        with pytest.raises(EnvManagerClosedError, match="closed"):
            call()
    with pytest.raises(ValueError, match="env_fns"):
        BaseEnvManager([])


def test_a_factory_that_cannot_build_fails_launch(managers):
    def broken() -> Env:
        raise OSError("no such game")

    manager = managers([CountingEnv, broken])
    with pytest.raises(EnvError, match="no such game"):
        manager.launch()
    assert manager.closed


def test_a_bool_env_id_is_refused_and_counts_are_ints_not_bools():
    """True == 1 as a dict key: step({True: 0}) stepped env 1 and returned its timestep keyed True."""
    manager = BaseEnvManager([CountingEnv, CountingEnv], EnvManagerConfig())
    manager.launch()
    try:
        with pytest.raises(ValueError, match=r"env id True is not in range\(0, 2\)"):
            manager.step({True: 0})
        assert manager.ready_env == [0, 1]
    finally:
        manager.close()
    for bad in ({"episode_num": True}, {"max_retry": True}, {"max_retry": -1}, {"episode_num": 2.5}):
        with pytest.raises(ValueError):
            EnvManagerConfig(**bad)
    config = EnvManagerConfig(episode_num=np.int64(3), max_retry=np.int64(2))
    assert (config.episode_num, config.max_retry) == (3, 2) and type(config.max_retry) is int


def test_the_counters_stay_readable_after_close():
    manager = BaseEnvManager([CountingEnv], EnvManagerConfig(episode_num=1))
    manager.launch()
    manager.step({0: 0})
    manager.close()
    assert manager.failure_counts == {0: 0} and manager.episode_counts[0] >= 0
    with pytest.raises(EnvManagerClosedError):
        _ = manager.env_states


def test_numpy_bool_ids_and_bool_worker_counts_are_refused_too():
    from actor_service.envs import SubprocessEnvManagerConfig

    manager = BaseEnvManager([CountingEnv, CountingEnv], EnvManagerConfig())
    manager.launch()
    try:
        with pytest.raises(ValueError, match="is not in range"):
            manager.step({np.True_: 0})
    finally:
        manager.close()
    for name in ("num_workers", "cpus", "wait_num"):
        with pytest.raises(ValueError):
            SubprocessEnvManagerConfig(**{name: True})
    assert SubprocessEnvManagerConfig(num_workers=np.int64(2)).num_workers == 2
