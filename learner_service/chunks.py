"""Pushed trajectories -> validated learn rows, on the RPC thread that received them.

Everything an actor sends is checked here against the model the learner trains (observation names, shapes
and dtypes, action range, the behaviour log-probabilities PPO needs, finite numbers), so a bad chunk fails
its own stream with INVALID_ARGUMENT naming the trajectory key, and never reaches the training loop.
Converting on the RPC threads also spreads that work over the server's threads instead of the trainer's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from common.adder_config import MAX_UNROLL_LEN
from common.algorithms.dqn import transitions_from_trajectory
from common.algorithms.ppo import batch_from_trajectory
from common.computation.specs import (
    ACTION_MASK,
    MAX_ABS_BOX_ACTION,
    ActionSpec,
    BoxActionSpec,
    MultiDiscreteActionSpec,
    TensorSpec,
    as_action_spec,
)
from common.policy_config import PolicyConfig
from common.tensor_codec import ChunkHeader, DecodedChunk
from common.trajectory import DEFAULT_AGENT, OBSERVATION, Trajectory, hidden_state_key

EPISODE_RETURN_INFO = "episode_return"
MAX_CATEGORICAL_LOGP = 1e-3
"""A discrete action's log-probability is <= 0; this much above it is rounding."""
MIN_CATEGORICAL_LOGP = -104.0
"""log of float32's smallest positive number (1.4e-45): no policy samples a move less likely."""
FLOAT32_MAX = float(np.finfo(np.float32).max)
"""Optional ``/infos/episode_return`` (B, T): the episode's return, read at the steps that end an episode."""


class InvalidChunkError(ValueError):
    """A chunk that does not fit the learner's model; ``key`` names the trajectory key at fault."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}" if key else message)
        self.key = key


@dataclass(frozen=True)
class PreparedChunk:
    """A chunk ready for the trainer: its header, learn rows and what the learner logs about it."""

    header: ChunkHeader
    rows: Mapping[str, np.ndarray]
    """PPO: (B, T, ...) segments; DQN: (N, ...) n-step transitions."""
    steps: int
    """T of the segments (PPO batches only segments of equal length)."""
    agent_steps: int
    """Decisions of the learner's player in the chunk (B × T)."""
    rewards: np.ndarray
    """(B, T) rewards and ..."""
    dones: np.ndarray
    """... (B, T) episode ends, to sum episode returns across chunks when the actor sends none."""
    episode_returns: np.ndarray | None
    """Returns of the episodes that ended in this chunk, when the actor sent ``/infos/episode_return``."""

    @property
    def nbytes(self) -> int:
        return sum(v.nbytes for v in self.rows.values())


def observation_key(name: str, trajectory: Trajectory, prefix: str = "/observations") -> str:
    """The trajectory key a model input comes from: ``/observations`` for a plain array, else ``/observations/<k>``."""
    plain = prefix in trajectory.tensors
    return prefix if plain and name == OBSERVATION else f"{prefix}/{name}"


class ChunkPreparer:
    """Checks chunks against one model and converts them to its algorithm's learn rows (thread-safe)."""

    def __init__(
        self, policy: PolicyConfig, input_specs: tuple[TensorSpec, ...], learn_specs: tuple[TensorSpec, ...],
        actions: ActionSpec | int, state_specs: tuple[TensorSpec, ...] = (),
    ) -> None:
        """``actions``: the policy's action spec (an int: that many discrete actions); ``state_specs``: a
        recurrent model's states, which every chunk must carry per step (as ``/agents/<name>/hidden_state/<k>``)."""
        self.policy = policy
        self.input_specs = {s.name: s for s in input_specs}
        self.learn_specs = learn_specs
        self.actions = as_action_spec(actions)
        self.state_specs = state_specs

    def prepare(self, chunk: DecodedChunk) -> PreparedChunk:
        trajectory = chunk.trajectory
        if trajectory.steps > MAX_UNROLL_LEN:
            raise InvalidChunkError("/rewards", f"rows of {trajectory.steps} steps; at most {MAX_UNROLL_LEN} "
                                                "(adder_kwargs.unroll_len's bound)")
        agent = self._agent(trajectory)
        self._check_observations(trajectory)
        self._check_actions(trajectory, agent)
        _check_finite("/rewards", trajectory.rewards)
        sources = {"reward": "/rewards", "return": "/rewards"}  # the chunk keys learn rows are computed from
        if self.policy.algorithm == "ppo":
            logp_key = f"/agents/{agent}/artifacts/logp"
            logp = trajectory.tensors.get(logp_key)
            if logp is None:
                raise InvalidChunkError(logp_key, "PPO needs the behaviour log-probabilities of the actions")
            if logp.shape != trajectory.rewards.shape or not np.issubdtype(logp.dtype, np.floating):
                raise InvalidChunkError(logp_key, f"expected float (batch, steps), got {logp.dtype}{logp.shape}")
            _check_finite(logp_key, logp)
            self._check_categorical_logp(logp_key, logp)
            sources["behaviour_logp"] = logp_key
            self._check_states(trajectory, agent)
            rows = batch_from_trajectory(trajectory, agent, [s.name for s in self.state_specs])
        else:
            rows = transitions_from_trajectory(trajectory, self.policy.dqn.gamma, self.policy.dqn.n_step, agent)
        rows = self._check_rows(rows, sources)
        dones = trajectory.terminals | trajectory.truncations
        return PreparedChunk(
            header=chunk.header,
            rows=rows,
            steps=trajectory.steps,
            agent_steps=trajectory.num_steps,
            rewards=trajectory.rewards,
            dones=dones,
            episode_returns=self._episode_returns(trajectory, dones),
        )

    # ---- checks ---------------------------------------------------------------------------------------
    def _check_categorical_logp(self, key: str, logp: np.ndarray) -> None:
        """A discrete action's probability is at most 1: a log-probability above 0 (but rounding), or below
        any a float32 policy gives a move it takes, is no behaviour policy's. Accepted, +25 made the samples'
        ratios ~0 (the data silently cancelled), -200 an infinite behaviour ratio in the telemetry. A Gaussian's
        density can exceed 1, so Box actions are not checked."""
        if isinstance(self.actions, BoxActionSpec):
            return
        # (a MultiDiscrete action's is the sum of its entries')
        floor = MIN_CATEGORICAL_LOGP * (len(self.actions.nvec) if isinstance(self.actions, MultiDiscreteActionSpec)
                                        else 1)
        if logp.size and (logp.max() > MAX_CATEGORICAL_LOGP or logp.min() < floor):
            raise InvalidChunkError(key, f"log-probabilities of discrete actions must lie in [{floor:g}, 0], got "
                                         f"{logp.min():g}..{logp.max():g}")

    @staticmethod
    def _agent(trajectory: Trajectory) -> str:
        agents = trajectory.agents()
        if DEFAULT_AGENT in agents:
            return DEFAULT_AGENT
        if len(agents) == 1:
            return agents[0]
        if not agents:
            raise InvalidChunkError(f"/agents/{DEFAULT_AGENT}/actions", "required: the learner's player's actions")
        raise InvalidChunkError("/agents", f"several agents {agents} and none named {DEFAULT_AGENT!r}")

    def _check_observations(self, trajectory: Trajectory) -> None:
        for prefix, observations, leading in (
            ("/observations", trajectory.observations(), 2),
            ("/next_observations", trajectory.next_observations(), 1),
        ):
            for name, array in observations.items():
                key = observation_key(name, trajectory, prefix)
                spec = self.input_specs.get(name)
                if spec is None:
                    raise InvalidChunkError(key, f"not an input of the model (inputs: {sorted(self.input_specs)})")
                if spec.optional:
                    # Optional inputs are the ones this player's env does not have (an action mask for CartPole):
                    # taken from one actor, they would be batched with other chunks' rows that lack them.
                    raise InvalidChunkError(key, "this player's env has no such observation (the model takes it "
                                                 "only from envs that declare it)")
                try:
                    checked = spec.check(array, leading_dims=leading)
                except ValueError as e:
                    raise InvalidChunkError(key, str(e).split(": ", 1)[-1]) from e
                if np.issubdtype(checked.dtype, np.floating):
                    _check_finite(key, checked)
            for name, spec in self.input_specs.items():
                if not spec.optional and name not in observations:
                    raise InvalidChunkError(observation_key(name, trajectory, prefix), "required input missing")

    def _check_actions(self, trajectory: Trajectory, agent: str) -> None:
        key = f"/agents/{agent}/actions"
        actions = trajectory.actions(agent)
        if isinstance(self.actions, BoxActionSpec):
            expected = (*trajectory.rewards.shape, *self.actions.shape)
            if actions.shape != expected or not np.issubdtype(actions.dtype, np.floating):
                raise InvalidChunkError(key, f"expected float {expected} (batch, steps, *the Box's shape), got "
                                             f"{actions.dtype}{actions.shape}")
            _check_finite(key, actions)  # unclipped draws may leave the Box; a NaN or inf poisons the update
            if actions.size and not np.abs(actions).max() <= MAX_ABS_BOX_ACTION:
                raise InvalidChunkError(key, f"an entry of magnitude {float(np.abs(actions).max()):.3g}; a Gaussian "
                                             f"policy's draws are within ±{MAX_ABS_BOX_ACTION:.0e} (its mean plus a "
                                             "few standard deviations)")
            return
        if isinstance(self.actions, MultiDiscreteActionSpec):
            expected = (*trajectory.rewards.shape, *self.actions.shape)
            if actions.shape != expected or not np.issubdtype(actions.dtype, np.integer):
                raise InvalidChunkError(key, f"expected integer {expected} (batch, steps, *the action's shape), got "
                                             f"{actions.dtype}{actions.shape}")
            flat = actions.reshape(-1, len(self.actions.nvec))
            if flat.size and ((flat < 0).any() or (flat >= np.asarray(self.actions.nvec)).any()):
                raise InvalidChunkError(key, f"entry i of an action must be in [0, nvec[i]), nvec "
                                             f"{list(self.actions.nvec)}")
            return
        if actions.shape != trajectory.rewards.shape or not np.issubdtype(actions.dtype, np.integer):
            raise InvalidChunkError(key, f"expected integer (batch, steps), got {actions.dtype}{actions.shape}")
        num_actions = self.actions.num_actions
        if actions.size and (actions.min() < 0 or actions.max() >= num_actions):
            raise InvalidChunkError(key, f"actions must be in [0, {num_actions})")
        mask = trajectory.observations().get(ACTION_MASK)
        if mask is not None and actions.size:  # its shape was checked with the observations
            legal = np.take_along_axis(np.asarray(mask, bool), actions[..., None].astype(np.intp), axis=-1)[..., 0]
            if not legal.all():
                b, t = (int(i) for i in np.argwhere(~legal)[0])
                raise InvalidChunkError(key, f"{(~legal).sum()} action(s) the step's action mask forbids (first: row "
                                             f"{b}, step {t}, action {int(actions[b, t])}): no policy of the "
                                             "league takes them, and they would poison the importance weights")

    def _check_states(self, trajectory: Trajectory, agent: str) -> None:
        recorded = trajectory.hidden_state(agent)
        for spec in self.state_specs:
            key = hidden_state_key(agent, spec.name)
            if spec.name not in recorded:
                raise InvalidChunkError(key, "a recurrent policy's chunks carry the state it acted with at each step")
            try:
                spec.check(recorded[spec.name], leading_dims=2)
            except ValueError as e:
                raise InvalidChunkError(key, str(e).split(": ", 1)[-1]) from e
            _check_finite(key, recorded[spec.name])

    def _check_rows(self, rows: dict[str, np.ndarray], sources: Mapping[str, str]) -> dict[str, np.ndarray]:
        """The learn rows as the model's learn specs hold them (cast), each finite in its dtype; errors about a
        row name the chunk key it came from (`sources`)."""
        specs = {s.name: s for s in self.learn_specs}
        unknown = sorted(set(rows) - set(specs))
        if unknown:
            raise InvalidChunkError("", f"learn rows have unknown entries {unknown}")
        out = {}
        for name, spec in specs.items():
            if name not in rows:
                if spec.optional:
                    continue
                raise InvalidChunkError("", f"learn rows miss {name!r}")
            try:
                with np.errstate(over="ignore", invalid="ignore"):
                    out[name] = spec.check(rows[name])
            except ValueError as e:
                raise InvalidChunkError("", f"learn rows: {e}") from e
            # Finite values of the chunk can be beyond float32 (float64 rewards or logp of 1e300), and what the
            # algorithm computed from them can overflow (DQN's n-step returns of finite float32 rewards); such
            # a row would make every update it is in NaN.
            if np.issubdtype(out[name].dtype, np.floating) and not np.all(np.isfinite(out[name])):
                raise InvalidChunkError(sources.get(name, ""), f"learn rows: {name} is not finite in "
                                                               f"{out[name].dtype}")
        return out

    @staticmethod
    def _episode_returns(trajectory: Trajectory, dones: np.ndarray) -> np.ndarray | None:
        key = f"/infos/{EPISODE_RETURN_INFO}"
        returns = trajectory.tensors.get(key)
        if returns is None:
            return None
        if returns.shape != dones.shape or not np.issubdtype(returns.dtype, np.number):
            raise InvalidChunkError(key, f"expected numeric (batch, steps), got {returns.dtype}{returns.shape}")
        ended = returns[dones].astype(np.float64)
        _check_finite(key, ended)
        if ended.size and np.abs(ended).max() > FLOAT32_MAX:  # finite in float64, inf in TensorBoard's float32
            raise InvalidChunkError(key, "holds returns beyond float32's range")
        return ended


def _check_finite(key: str, array: np.ndarray) -> None:
    if np.issubdtype(array.dtype, np.floating) and not np.all(np.isfinite(array)):
        raise InvalidChunkError(key, "holds NaN or infinite values")
