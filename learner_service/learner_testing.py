"""A real learner for tests and benchmarks, and real trajectory chunks to push to it.

Not fakes: `running_learner` runs the product's `Learner` in process (its server on 127.0.0.1 port 0, its
session loop on a thread); `rollout_chunks` plays real envs with a real ComputationTask and cuts the data
with `TrajectoryBuilder` + `encode_chunk`, exactly as an actor does. Used by this package's tests and by
actor tests that need a learner to stream to.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from common.computation.computation_task import ComputationTask
from common.computation.specs import TensorSpec
from common.envs import make_env
from common.envs.policy_view import env_action, player_view, policy_specs
from common.proto.league.v1 import league_pb2
from common.tensor_codec import ChunkHeader, DecodedChunk, decode_chunk, encode_chunk
from common.trajectory import DEFAULT_AGENT, AgentStep, Trajectory, TrajectoryBuilder
from learner_service.chunks import EPISODE_RETURN_INFO
from learner_service.config import LearnerSettings
from learner_service.learner import Learner


@dataclass
class RunningLearner:
    learner: Learner
    address: str
    thread: threading.Thread
    failure: list[BaseException] = field(default_factory=list)

    def stop(self, timeout_s: float = 60.0) -> None:
        """The SIGTERM path: stop, final checkpoint, UpdatePlayer, FinishJob(RELEASED), server down."""
        self.learner.request_stop()
        self.thread.join(timeout_s)
        self.learner.close(grace_s=1.0)
        if self.thread.is_alive():
            raise TimeoutError(f"the learner did not stop within {timeout_s}s")
        if self.failure:
            raise RuntimeError("the learner failed") from self.failure[0]


@contextlib.contextmanager
def running_learner(
    coordinator: str, shared_root: Path, *, worker_id: str = "learner-test", **settings: Any
) -> Iterator[RunningLearner]:
    """A started learner for the block; stopped (gracefully) at the end even when the block fails."""
    learner = Learner(LearnerSettings(
        coordinator=coordinator, shared_root=shared_root, worker_id=worker_id,
        **{"device": "cpu", "get_job_wait_s": 1.0, "max_backoff_s": 1.0, **settings},
    ))
    address = learner.start()
    handle = RunningLearner(learner, address, threading.Thread(target=lambda: None))

    def run() -> None:
        try:
            learner.run()
        except BaseException as err:
            handle.failure.append(err)

    handle.thread = threading.Thread(target=run, name="learner-test", daemon=True)
    handle.thread.start()
    try:
        yield handle
    finally:
        handle.stop()


def learner_command(*argv: str) -> list[str]:
    return [sys.executable, "-m", "learner_service.cli", "learner", *argv]


class Rollout:
    """``env_num`` single-player envs stepped together, acting with a given task, cut into chunks as an actor
    does; episodes carry on across calls (a real actor's envs never restart between chunks)."""

    def __init__(
        self, *, player_id: str, env_name: str = "CartPole-v1", env_kwargs: Mapping[str, Any] | None = None,
        env_num: int = 4, unroll_len: int = 16, worker_id: str = "actor-test", job_id: str = "job-test",
        seed: int = 0, with_episode_returns: bool = False,
    ) -> None:
        self.player_id = player_id
        self.worker_id = worker_id
        self.job_id = job_id
        self.with_episode_returns = with_episode_returns
        self.envs = [make_env(env_name, **dict(env_kwargs or {})) for _ in range(env_num)]
        self.info = self.envs[0].info()
        self.action_spec = policy_specs(self.info)[1]
        for i, env in enumerate(self.envs):
            env.seed(seed + i)
        self._obs = [player_view(env.reset(), 0, self.info) for env in self.envs]
        self._returns = np.zeros(env_num)
        self._builder = TrajectoryBuilder(env_num, unroll_len)
        self.seq = 0
        self.episode_returns: list[float] = []
        """Every finished episode's return, in order."""

    def close(self) -> None:
        for env in self.envs:
            env.close()

    def chunks(self, task: ComputationTask, count: int, policy_version: int) -> list[league_pb2.TrajectoryChunk]:
        out = []
        while len(out) < count:
            chunk = self._step(task, policy_version)
            if chunk is not None:
                out.append(chunk)
        return out

    def _step(self, task: ComputationTask, policy_version: int) -> league_pb2.TrajectoryChunk | None:
        env_num = len(self.envs)
        inputs = {k: np.stack([o[k] for o in self._obs]) for k in self._obs[0]}
        prediction = task.predict(inputs)
        actions = prediction.actions["action"]
        rewards = np.zeros(env_num, np.float32)
        terminals = np.zeros(env_num, bool)
        truncations = np.zeros(env_num, bool)
        episode_returns = np.zeros(env_num, np.float32)
        final = list(self._obs)
        for i, env in enumerate(self.envs):
            step = env.step(env_action(self.action_spec, actions[i], self.info))
            rewards[i], terminals[i], truncations[i] = step.reward, step.terminated, step.truncated
            self._returns[i] += step.reward
            episode_returns[i] = self._returns[i]
            final[i] = player_view(step.obs, 0, self.info)
            if step.done:
                self.episode_returns.append(float(self._returns[i]))
                self._returns[i] = 0.0
                self._obs[i] = player_view(env.reset(), 0, self.info)
            else:
                self._obs[i] = final[i]
        infos = {EPISODE_RETURN_INFO: episode_returns} if self.with_episode_returns else None
        self._builder.add(_stack_view(inputs), {DEFAULT_AGENT: AgentStep(actions, prediction.artifacts)}, rewards,
                          terminals, truncations, infos)
        if not self._builder.full:
            return None
        # A row whose last step was truncated bootstraps from that episode's final observation.
        nxt = [final[i] if truncations[i] else self._obs[i] for i in range(env_num)]
        trajectory = self._builder.build(_stack_view({k: np.stack([o[k] for o in nxt]) for k in nxt[0]}))
        header = ChunkHeader(self.job_id, self.player_id, self.worker_id, self.seq, policy_version)
        self.seq += 1
        return encode_chunk(trajectory, header)


def rollout_chunks(
    task: ComputationTask, *, player_id: str, count: int = 4, policy_version: int = 0, **rollout: Any
) -> list[league_pb2.TrajectoryChunk]:
    """``count`` chunks from a fresh `Rollout` (seq from 0)."""
    source = Rollout(player_id=player_id, **rollout)
    try:
        return source.chunks(task, count, policy_version)
    finally:
        source.close()


def edited_chunk(chunk: league_pb2.TrajectoryChunk, key: str, value: np.ndarray) -> DecodedChunk:
    """`chunk` decoded with trajectory key `key` replaced by `value` (what a buggy or hostile actor sends)."""
    decoded = decode_chunk(chunk)
    tensors = {**decoded.trajectory.tensors, key: value}
    return decode_chunk(encode_chunk(Trajectory(tensors), decoded.header))


def synthetic_chunk(
    obs_specs: Mapping[str, TensorSpec], num_actions: int, *, player_id: str, batch: int = 2, steps: int = 8,
    seq: int = 0, policy_version: int = 0, worker_id: str = "actor-test", job_id: str = "job-test", seed: int = 0,
) -> league_pb2.TrajectoryChunk:
    """A well-formed chunk of random data for any policy view (e.g. connect four's observation + action_mask):
    legal actions drawn uniformly, behaviour logp to match, an episode end now and then."""
    rng = np.random.default_rng(seed)

    def sample(spec: TensorSpec, lead: tuple[int, ...]) -> np.ndarray:
        shape = (*lead, *spec.shape)
        if spec.dtype == "bool":
            mask = rng.random(shape) < 0.7
            mask[..., 0] = True  # at least one legal action
            return mask
        return rng.standard_normal(shape).astype(spec.dtype)

    names = [name for name, spec in obs_specs.items() if not spec.optional]
    obs = {name: sample(obs_specs[name], (batch, steps)) for name in names}
    nxt = {name: sample(obs_specs[name], (batch,)) for name in names}
    mask = obs.get("action_mask", np.ones((batch, steps, num_actions), bool))
    scores = np.where(mask, rng.random(mask.shape), -1.0)
    actions = scores.argmax(-1).astype(np.int64)
    logp = -np.log(mask.sum(-1)).astype(np.float32)
    terminals = rng.random((batch, steps)) < 0.1
    tensors = {"/rewards": np.where(terminals, rng.choice([-1.0, 1.0], (batch, steps)), 0.0).astype(np.float32),
               "/terminals": terminals, "/truncations": np.zeros((batch, steps), bool),
               f"/agents/{DEFAULT_AGENT}/actions": actions, f"/agents/{DEFAULT_AGENT}/artifacts/logp": logp}
    if set(names) == {"observation"}:
        tensors.update({"/observations": obs["observation"], "/next_observations": nxt["observation"]})
    else:
        tensors.update({f"/observations/{k}": v for k, v in obs.items()})
        tensors.update({f"/next_observations/{k}": v for k, v in nxt.items()})
    return encode_chunk(Trajectory(tensors), ChunkHeader(job_id, player_id, worker_id, seq, policy_version))


def _stack_view(inputs: Mapping[str, np.ndarray]) -> np.ndarray | dict[str, np.ndarray]:
    """A plain observation stays a plain array (``/observations``); a dict view stays a dict."""
    if set(inputs) == {"observation"}:
        return inputs["observation"]
    return dict(inputs)
