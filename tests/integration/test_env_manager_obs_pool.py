"""SubprocessEnvManager's observation pool: large observations are handed out as arrays in shared memory,
without a copy, and a slot is written again only once nobody holds its array. Real worker processes."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from actor_service.envs import SubprocessEnvManager, SubprocessEnvManagerConfig
from actor_service.envs.env_manager import shared_memory
from common.envs import NO_INFO, ArraySpec, DiscreteSpec, Env, EnvInfo, TimeStep

SHAPE = (84, 84, 4)


class FrameEnv(Env):
    """84x84x4 uint8 frames that say which env and step they come from: frame[..., 0] = env id, frame[..., 1]
    = step within the episode (mod 256), frame[..., 2] = episode. Episodes of `length` steps; `as_dict` puts
    the frame under "frame" beside a small "t" array."""

    def __init__(self, env_id: int, length: int = 1000, as_dict: bool = False) -> None:
        self._env_id = env_id
        self._length = length
        self._as_dict = as_dict
        self._t = 0
        self._episode = -1

    def info(self) -> EnvInfo:
        frame = ArraySpec(SHAPE, np.uint8)
        return EnvInfo("frames", {"frame": frame, "t": ArraySpec((1,), np.int64)} if self._as_dict else frame,
                       DiscreteSpec(2))

    def seed(self, seed: int) -> None:
        pass

    def reset(self):
        self._t = 0
        self._episode += 1
        return self._obs()

    def step(self, action: int) -> TimeStep:
        self._t += 1
        return TimeStep(self._obs(), 1.0, self._t >= self._length, False, NO_INFO)

    def _obs(self):
        frame = np.empty(SHAPE, np.uint8)
        frame[..., 0] = self._env_id
        frame[..., 1] = self._t % 256
        frame[..., 2] = self._episode % 256
        frame[..., 3] = 0
        return {"frame": frame, "t": np.array([self._t])} if self._as_dict else frame


def frame_of(obs) -> np.ndarray:
    return obs["frame"] if isinstance(obs, dict) else obs


def says(obs, env_id: int, t: int, episode: int = 0) -> bool:
    frame = frame_of(obs)
    return bool((frame[..., 0] == env_id).all() and (frame[..., 1] == t % 256).all()
                and (frame[..., 2] == episode).all())


@pytest.fixture
def launched():
    built: list[SubprocessEnvManager] = []

    def launch(env_num: int = 4, **env_kwargs) -> SubprocessEnvManager:
        factories = [lambda i=i: FrameEnv(i, **env_kwargs) for i in range(env_num)]
        manager = SubprocessEnvManager(factories, SubprocessEnvManagerConfig(num_workers=2, wait_num=env_num))
        built.append(manager)
        manager.launch()
        return manager

    try:
        yield launch
    finally:
        for manager in built:
            manager.close()


@pytest.mark.parametrize("as_dict", [False, True])
def test_observations_the_caller_keeps_stay_intact(launched, as_dict):
    manager = launched(as_dict=as_dict)
    kept = []  # (env_id, t, observation or a view of it)
    for t in range(1, 31):
        timesteps = manager.step(dict.fromkeys(manager.ready_env, 0))
        for env_id, ts in timesteps.items():
            assert says(ts.obs, env_id, t), (env_id, t)
            if t % 4 == env_id:
                kept.append((env_id, t, ts.obs))
            elif t % 7 == env_id:
                kept.append((env_id, t, frame_of(ts.obs)[1:, :, :2]))  # only a view of it
    for env_id, t, obs in kept:
        if isinstance(obs, np.ndarray) and obs.shape != SHAPE:
            assert (obs[..., 0] == env_id).all() and (obs[..., 1] == t).all(), (env_id, t)
        else:
            assert says(obs, env_id, t), (env_id, t)


def test_observations_the_caller_drops_come_without_a_copy(launched):
    manager = launched()
    for _ in range(3):
        manager.step(dict.fromkeys(manager.ready_env, 0))
    timesteps = manager.step(dict.fromkeys(manager.ready_env, 0))
    assert all(not ts.obs.flags.owndata for ts in timesteps.values())  # arrays in shared memory
    # Holding every observation of an env uses up its slots; the manager then copies, and stays correct.
    held = []
    for t in range(5, 15):
        timesteps = manager.step(dict.fromkeys(manager.ready_env, 0))
        held.append(timesteps[0].obs)
        assert says(timesteps[0].obs, 0, t)
    assert any(obs.flags.owndata for obs in held)  # copies once the pool ran out
    assert all(says(obs, 0, t) for t, obs in enumerate(held, start=5))


def test_closing_while_the_caller_holds_observations_keeps_them_readable(launched):
    manager = launched()
    held = {env_id: ts.obs for env_id, ts in manager.step(dict.fromkeys(manager.ready_env, 0)).items()}
    later = manager.step(dict.fromkeys(manager.ready_env, 0))
    manager.close()
    assert all(says(obs, env_id, 1) for env_id, obs in held.items())
    assert later and all(says(ts.obs, env_id, 2) for env_id, ts in later.items())
    assert shared_memory._held_blocks  # not unmapped: arrays still point into it
    del held, later
    gc.collect()
    shared_memory._release_held_blocks()
    assert shared_memory._held_blocks == []


def test_pool_size_follows_the_observation_size():
    frame = ArraySpec(SHAPE, np.uint8)
    assert shared_memory.pool_size_for(frame, env_num=8) == shared_memory.POOL_SIZE
    assert shared_memory.pool_size_for(ArraySpec((4,), np.float32), env_num=8) == 0  # a copy is cheaper
    huge = ArraySpec((1024, 1024, 4), np.float32)  # 16 MB: two slots for 2 envs fit in 64 MB, not for 4
    assert shared_memory.pool_size_for(huge, env_num=2) == 2
    assert shared_memory.pool_size_for(huge, env_num=4) == 0
