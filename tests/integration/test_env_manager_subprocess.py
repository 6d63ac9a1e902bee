"""SubprocessEnvManager with real worker processes: same trajectories as the serial manager, async steps,
shared memory, reset while steps are in flight, and a clean process table after close."""

from __future__ import annotations

import os
from functools import partial

import numpy as np
import pytest

from actor_service.envs import (
    BaseEnvManager,
    EnvError,
    EnvManagerClosedError,
    EnvManagerConfig,
    EnvState,
    SubprocessEnvManager,
    SubprocessEnvManagerConfig,
)
from common.envs import NO_INFO, ArraySpec, DiscreteSpec, EnvInfo, EnvSpec, TimeStep
from tests.env_doubles import CountingEnv


def SlowEnv() -> CountingEnv:  # noqa: N802 - a factory standing for an env class
    return CountingEnv(length=100, step_delay=0.6)


@pytest.fixture
def managers():
    """Builds managers, closes them at the end, and checks that their worker processes are gone."""
    built: list[BaseEnvManager] = []
    pids: set[int] = set()

    def make(cls, env_fns, **config):
        manager = cls(
            env_fns,
            (SubprocessEnvManagerConfig if cls is SubprocessEnvManager else EnvManagerConfig)(**config),
        )
        built.append(manager)
        return manager

    def record(manager: SubprocessEnvManager) -> None:
        pids.update(manager.worker_pids)

    make.record = record
    try:
        yield make
    finally:
        for manager in built:
            if isinstance(manager, SubprocessEnvManager) and not manager.closed:
                record(manager)
            manager.close()
    assert [pid for pid in pids if os.path.exists(f"/proc/{pid}")] == [], "worker processes left behind"


def _policy(env_id: int, obs) -> int:
    """A deterministic policy of the observation, so trajectories depend only on the envs."""
    if isinstance(obs, dict):
        legal = np.flatnonzero(obs["action_mask"][int(obs["to_play"])])
        return int(legal[(env_id + int(obs["observation"].sum())) % len(legal)])
    return int(abs(float(np.asarray(obs).sum())) * 10 + env_id) % 2


def _trajectories(manager: BaseEnvManager) -> dict[int, list]:
    """Plays until done; per env, every (obs, reward, terminated, truncated, next obs) in order."""
    out: dict[int, list] = {i: [] for i in range(manager.env_num)}

    def flat(obs) -> list:
        return (
            [np.asarray(obs[k]).tolist() for k in sorted(obs)]
            if isinstance(obs, dict)
            else np.asarray(obs).tolist()
        )

    while not manager.done:
        obs = manager.next_obs
        for env_id, ts in manager.step({i: _policy(i, o) for i, o in obs.items()}).items():
            out[env_id].append((flat(ts.obs), np.asarray(ts.reward).tolist(), ts.terminated, ts.truncated))
    return out


@pytest.mark.parametrize(
    ("env_fns", "subprocess_config"),
    [
        # 5 counting envs in 2 workers (3 + 2), answering as they come (wait_num=1), busy-waiting.
        ([CountingEnv] * 5, {"num_workers": 2, "wait_num": 1, "spin_s": 200e-6}),
        # Connect four against a random bot: dict observations through shared memory, then pickled.
        ([EnvSpec("connect_four", {"bots": {1: "random"}})] * 3, {"num_workers": 2}),
        ([EnvSpec("connect_four")] * 2, {"num_workers": 1, "shared_memory": False, "spin_s": 0.0}),
        ([EnvSpec("CartPole-v1")] * 3, {"num_workers": 2, "num_splits": 1, "wait_num": 1}),
        ([EnvSpec("CartPole-v1")] * 5, {}),  # the defaults
    ],
    ids=[
        "counting-async-spin", "connect-four-shm", "connect-four-pickled", "cartpole-one-split", "cartpole-default"
    ],
)
def test_same_seeds_give_the_serial_managers_trajectories(managers, env_fns, subprocess_config):
    runs = []
    for cls, config in ((BaseEnvManager, {}), (SubprocessEnvManager, subprocess_config)):
        manager = managers(cls, env_fns, episode_num=3, **config)
        manager.seed(11)
        manager.launch(reset_params={0: {"length": 2}} if env_fns[0] is CountingEnv else None)
        runs.append(_trajectories(manager))
        assert manager.episode_counts == dict.fromkeys(range(len(env_fns)), 3)
        assert all(state is EnvState.DONE for state in manager.env_states.values())
    assert runs[0] == runs[1]
    assert all(len(steps) > 0 for steps in runs[0].values())


def test_async_step_returns_ready_envs_and_keeps_the_rest_in_flight(managers):
    manager = managers(SubprocessEnvManager, [CountingEnv, SlowEnv], num_workers=2, wait_num=1)
    manager.launch()
    managers.record(manager)
    first = manager.step({0: 0, 1: 0})
    assert list(first) == [0]  # the slow env is still stepping
    assert manager.ready_env == [0] and list(manager.next_obs) == [0]
    with pytest.raises(ValueError, match="in flight"):
        manager.step({1: 0})
    later = {}
    while 1 not in later:
        later = manager.step({})
    assert later[1].obs[0] == 1.0
    assert manager.ready_env == [0, 1]

    # With a timeout, step gives up waiting for wait_num envs and returns what has arrived.
    manager.close()
    manager = managers(SubprocessEnvManager, [CountingEnv, SlowEnv], num_workers=2, timeout=0.05)
    manager.launch()
    managers.record(manager)
    assert list(manager.step({0: 0, 1: 0})) == [0]

    # reset() lets the step in flight land first, then starts every env afresh.
    manager.reset()
    assert manager.ready_env == [0, 1]
    assert manager.episode_counts == {0: 0, 1: 0}
    assert {int(obs[0]) for obs in manager.next_obs.values()} == {0}


def test_a_step_that_lands_during_a_partial_reset_is_returned_not_overwritten(managers):
    """A reset of env 0 lets env 1's step in flight land first. Its timestep is the caller's until `step`
    returns it: env 1 is not ready before then (stepping it again overwrote that timestep, and an episode's
    end or reward with it)."""
    manager = managers(SubprocessEnvManager, [CountingEnv, SlowEnv], num_workers=2, wait_num=1)
    manager.launch()
    managers.record(manager)
    assert list(manager.step({0: 0, 1: 2})) == [0]  # env 1 is slow: still in flight
    manager.reset({0: {}})
    assert manager.ready_env == [0] and list(manager.next_obs) == [0]
    with pytest.raises(ValueError, match=r"not returned yet: step\(\{\}\) returns it"):
        manager.step({1: 0})
    landed = manager.step({})
    assert list(landed) == [1] and landed[1].obs[0] == 1.0 and landed[1].reward >= 2.0
    assert manager.ready_env == [0, 1]


def OneStepEnv() -> CountingEnv:  # noqa: N802
    return CountingEnv(length=1)


def SlowOneStepEnv() -> CountingEnv:  # noqa: N802
    return CountingEnv(length=1, step_delay=0.4)


def test_the_manager_is_not_done_while_a_final_timestep_is_not_returned(managers):
    """Env 1's last step landed during a reset of env 0 (both envs then DONE): `done` said True, and a
    `while not done` loop dropped env 1's final timestep."""
    manager = managers(SubprocessEnvManager, [OneStepEnv, SlowOneStepEnv], num_workers=2, wait_num=1,
                       episode_num=1)
    manager.launch()
    managers.record(manager)
    assert list(manager.step({0: 0, 1: 0})) == [0]  # env 0 ended its one episode; env 1 still in flight
    manager.reset({})  # resets nothing, but waits out the steps in flight
    assert not manager.done
    last = manager.step({})
    assert list(last) == [1] and last[1].terminated
    assert manager.done


def test_numpy_scalar_actions_reach_the_env_as_in_the_serial_manager(managers):
    """Integers travel as Python ints (cheaper to pickle, the same value); floats keep their numpy type, whose
    arithmetic differs from a Python float's (float32 + a Python float is float64, not float32)."""
    got = {}
    for cls in (BaseEnvManager, SubprocessEnvManager):
        manager = managers(cls, [ActionEchoEnv], **({"num_workers": 1} if cls is SubprocessEnvManager else {}))
        manager.launch()
        obs = [manager.step({0: action})[0].obs.tolist() for action in (np.float32(0.1), np.int64(2), 3)]
        got[cls] = obs
        manager.close()
    assert got[BaseEnvManager] == got[SubprocessEnvManager]
    assert got[SubprocessEnvManager][0] == [np.float32(0.1) + np.float32(1.0), 1.0]  # float32 kept as float32


class ActionEchoEnv(CountingEnv):
    """Observation [action + 1 (in the action's own arithmetic), whether the action was a float32]."""

    def info(self):
        return EnvInfo("echo", ArraySpec((2,), np.float64), DiscreteSpec(4))

    def reset(self, length=None):
        return np.zeros(2)

    def step(self, action):
        return TimeStep(np.array([action + np.float32(1.0), isinstance(action, np.float32)]), 0.0, False, False,
                        NO_INFO)


class OffSpecEnv(CountingEnv):
    """A float32 (3,) spec; observations come as float64 (a cast both managers make), and step `bad_at` of
    each episode returns one of shape (4,) (an env failure in both)."""

    def __init__(self, bad_at: int = 0) -> None:
        super().__init__(length=5)
        self._bad_at = bad_at

    def _obs(self) -> np.ndarray:
        if self._bad_at and self._t == self._bad_at:
            return np.zeros(4)
        return super()._obs().astype(np.float64)


@pytest.mark.parametrize(("cls", "config"), [(BaseEnvManager, {}), (SubprocessEnvManager, {}),
                                             (SubprocessEnvManager, {"shared_memory": False})],
                         ids=["serial", "subprocess", "subprocess-without-shared-memory"])
def test_observations_off_the_spec_are_cast_or_refused_alike_by_both_managers(managers, cls, config):
    """The subprocess manager's shared memory takes only observations that fit the spec; the serial manager
    now applies the same rule (obs_check.py): the same arrays from both, and the same failure. Without shared
    memory the subprocess manager's workers apply it too: they handed on float64 arrays, and took an
    observation of the wrong shape without a word."""
    manager = managers(cls, [OffSpecEnv], episode_num=1, **config)
    manager.seed(3)
    manager.launch()
    first = manager.next_obs[0]
    assert first.dtype == np.float32 and first.shape == (3,)
    ts = manager.step({0: 1})[0]
    assert ts.obs.dtype == np.float32 and manager.next_obs[0].dtype == np.float32

    manager = managers(cls, [partial(OffSpecEnv, bad_at=2)], episode_num=1, max_retry=0, **config)
    manager.launch()
    manager.step({0: 1})
    with pytest.raises(EnvError, match=r"env 0: observation has shape \(4,\), but the env's spec says \(3,\)"):
        manager.step({0: 1})


def test_envs_and_workers_are_described(managers):
    manager = managers(SubprocessEnvManager, [EnvSpec("connect_four")] * 4, num_workers=2)
    assert manager.num_workers == 2 and manager.env_num == 4
    manager.launch()
    managers.record(manager)
    assert len(set(manager.worker_pids)) == 2
    assert manager.env_info.num_players == 2
    obs = manager.next_obs
    assert sorted(obs) == [0, 1, 2, 3]
    assert obs[0]["observation"].shape == (2, 5, 6, 7) and obs[0]["action_mask"].dtype == np.bool_
    assert int(obs[0]["to_play"]) == 0
    # Observations handed out are copies: the next step does not change them.
    before = obs[0]["observation"].copy()
    manager.step({0: 3})
    np.testing.assert_array_equal(obs[0]["observation"], before)


def _step_all(manager: BaseEnvManager, times: int) -> None:
    for _ in range(times):
        manager.step(dict.fromkeys(manager.ready_env, 0))


@pytest.mark.parametrize("cls", [BaseEnvManager, SubprocessEnvManager])
def test_a_reset_that_names_envs_resets_only_those_and_seeds_may_name_envs_too(managers, cls):
    """DI-engine's forms: `seed({env_id: seed})` seeds the envs it names (the keys were taken for seeds), and
    `reset({env_id: params})` starts a new episode in the envs it names only (every env was reset)."""
    config = {"num_workers": 2, "wait_num": 3} if cls is SubprocessEnvManager else {}
    manager = managers(cls, [CountingEnv] * 3, **config)
    manager.seed({0: 5, 2: 7})
    manager.launch()
    first = manager.next_obs
    assert first[0][2] == np.float32(np.random.default_rng(5).random())
    assert first[2][2] == np.float32(np.random.default_rng(7).random())
    _step_all(manager, 4)  # episodes of 3 steps: each env finished one and is 1 step into the next
    assert manager.episode_counts == {0: 1, 1: 1, 2: 1}
    manager.reset({1: {"length": 5}})
    obs = manager.next_obs
    assert obs[1][:2].tolist() == [0, 2]  # env 1: a new episode (its third), from its first step
    assert obs[0][:2].tolist() == [1, 1] and obs[2][:2].tolist() == [1, 1]  # the others play on
    assert manager.episode_counts == {0: 1, 1: 0, 2: 1}
    manager.reset([{}, {}, {"length": 2}])  # a sequence: one mapping per env, every env reset
    assert [o[:2].tolist() for o in manager.next_obs.values()] == [[0, 2], [0, 3], [0, 2]]
    assert manager.episode_counts == {0: 0, 1: 0, 2: 0}
    for bad in ("x", {3: {}}, [{}]):
        with pytest.raises((TypeError, ValueError), match="reset_params"):
            manager.reset(bad)
    for bad in (1.5, "7", {0: 1.5}, {9: 1}):
        with pytest.raises((TypeError, ValueError), match="seed"):
            manager.seed(bad)
    manager.close()
    with pytest.raises(EnvManagerClosedError):
        _ = manager.done  # a `while not manager.done` loop must not spin on a closed manager
