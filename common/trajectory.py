"""The trajectory format actors send and learners train on: flat Digideep-style keys, (batch, steps, ...) arrays.

Keys (``<k>`` and ``<name>`` are one component of letters, digits and ``_.-``)::

    /observations                  (B, T, ...)  observation o_t the agents acted on; a plain array env
    /observations/<k>              (B, T, ...)  ... or one entry of a dict observation (e.g. action_mask)
    /rewards                       (B, T)       float reward r_t received after acting at t
    /terminals                     (B, T)       bool: the episode *terminated* after step t (no bootstrap)
    /truncations                   (B, T)       bool: the episode was *truncated* after step t (bootstrap)
    /masks                         (B, T)       optional float: 1 - done of step t (derivable, see `masks`)
    /infos/<k>                     (B, T, ...)  optional env information
    /agents/<name>/actions         (B, T, ...)  the action agent <name> took at t
    /agents/<name>/hidden_state[/<k>] (B, T, ...) recurrent state the agent acted with (memory models)
    /agents/<name>/artifacts/<k>   (B, T, ...)  what the learner needs from acting, e.g. logp, value
    /next_observations[/<k>]       (B, ...)     the observation after each row's last step (no T axis)

Bootstrapping. Row b runs o_0 .. o_{T-1} and continues at ``/next_observations``: when the last step did not
end the episode that is o_T; when it was truncated it is the episode's final observation, so the learner
bootstraps V(o_T) in both cases. A step t < T-1 that was truncated is followed in the row by the *reset*
observation of the next episode; the final observation is not stored, so learners cannot form that one
step's target: they drop step t and bootstrap earlier steps from V(o_t) (one sample per truncated episode
is lost; no value is ever bootstrapped from the wrong episode). A terminal never bootstraps, and a step is
never both terminated and truncated (gymnasium may report both: terminated is what holds, no bootstrap).

Coming from Digideep: the keys are Digideep's, the layout is not. Digideep keeps rows of T + 1 entries, the
last one holding the bootstrap observation, mask, value and hidden state, and keeps each mask with the
*next* observation (its ``masks[:, t + 1]`` says whether step t ended the episode). Here a row has T steps,
``/next_observations`` carries the bootstrap observation, ``/masks[:, t]`` is about step t itself (the same
value one index earlier), ``/rewards`` and ``/masks`` have no trailing axis of 1, the learner computes values
itself, and ``hidden_state`` is the state the agent acted *with* at t (Digideep stores the state after it).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

OBSERVATION = "observation"
"""The name a plain (non-dict) observation has as a model input."""

DEFAULT_AGENT = "agent"

_NAME = r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,63}"
# Matched with fullmatch: `$` would also match before a trailing newline ("/rewards\n").
_STEP_KEY = re.compile(
    rf"(/observations(/{_NAME})?|/rewards|/terminals|/truncations|/masks|/infos/{_NAME}"
    rf"|/agents/{_NAME}/(actions|hidden_state(/{_NAME})?|artifacts/{_NAME}))"
)
_ROW_KEY = re.compile(rf"/next_observations(/{_NAME})?")
_AGENT_KEY = re.compile(rf"/agents/(?P<agent>{_NAME})/(?P<rest>.+)")

ALLOWED_DTYPES: frozenset[str] = frozenset(
    ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
     "float16", "float32", "float64"]
)


class TrajectoryError(ValueError):
    """A trajectory that breaks the format; the message names the offending key."""


def is_step_key(key: str) -> bool:
    return bool(_STEP_KEY.fullmatch(key))


def is_row_key(key: str) -> bool:
    return bool(_ROW_KEY.fullmatch(key))


def check_key(key: str) -> str:
    if not isinstance(key, str) or not (is_step_key(key) or is_row_key(key)):
        raise TrajectoryError(f"{key!r}: not a trajectory key (see common/trajectory.py for the grammar)")
    return key


@dataclass(frozen=True, eq=False)
class Trajectory:
    """A validated, read-only batch of trajectory segments (B rows of T steps each)."""

    tensors: Mapping[str, np.ndarray]
    batch_size: int = field(init=False)
    steps: int = field(init=False)

    def __post_init__(self) -> None:
        tensors = dict(self.tensors)
        for key, value in tensors.items():
            check_key(key)
            if not isinstance(value, np.ndarray):
                raise TrajectoryError(f"{key}: expected a numpy array, got {type(value).__name__}")
            if value.dtype.name not in ALLOWED_DTYPES:
                raise TrajectoryError(f"{key}: dtype {value.dtype} is not allowed ({sorted(ALLOWED_DTYPES)})")
        for required in ("/rewards", "/terminals", "/truncations"):
            if required not in tensors:
                raise TrajectoryError(f"{required}: required key missing")
        rewards = tensors["/rewards"]
        if rewards.ndim != 2:
            raise TrajectoryError(f"/rewards: expected shape (batch, steps), got {rewards.shape}")
        batch, steps = rewards.shape
        if batch < 1 or steps < 1:
            raise TrajectoryError(f"/rewards: empty trajectory {rewards.shape}")
        for key, value in tensors.items():
            lead = (batch,) if is_row_key(key) else (batch, steps)
            if value.shape[: len(lead)] != lead:
                raise TrajectoryError(f"{key}: leading shape {value.shape[:len(lead)]} != expected {lead}")
        if not np.issubdtype(rewards.dtype, np.floating):
            raise TrajectoryError(f"/rewards: expected a float dtype, got {rewards.dtype}")
        for key in ("/terminals", "/truncations"):
            if tensors[key].dtype != np.bool_ or tensors[key].ndim != 2:
                raise TrajectoryError(f"{key}: expected bool (batch, steps), got {tensors[key].dtype}")
        both = tensors["/terminals"] & tensors["/truncations"]
        if both.any():
            b, t = (int(i) for i in np.argwhere(both)[0])
            raise TrajectoryError(f"/truncations: step [{b}, {t}] is also terminated; a terminated step is not "
                                  "truncated (clear /truncations where /terminals is set)")
        if "/masks" in tensors:
            masks = tensors["/masks"]
            if masks.ndim != 2 or not np.issubdtype(masks.dtype, np.floating):
                raise TrajectoryError(f"/masks: expected float (batch, steps), got {masks.dtype} {masks.shape}")
            if not np.array_equal(masks, (~(tensors["/terminals"] | tensors["/truncations"])).astype(masks.dtype)):
                raise TrajectoryError("/masks: must be 1 - (terminals | truncations), step by step")
        obs_names = _observation_names(tensors, "/observations")
        if not obs_names:
            raise TrajectoryError("/observations: required key missing")
        next_names = _observation_names(tensors, "/next_observations")
        if next_names != obs_names:
            raise TrajectoryError(
                f"/next_observations: entries {sorted(next_names)} must match /observations {sorted(obs_names)}"
            )
        if ("/observations" in tensors) != ("/next_observations" in tensors):
            raise TrajectoryError("/next_observations: must use the same plain/dict form as /observations")
        observations = _named_observations(tensors, "/observations")
        for name, nxt in _named_observations(tensors, "/next_observations").items():
            obs = observations[name]
            next_key = "/next_observations" if name == OBSERVATION and "/next_observations" in tensors else (
                f"/next_observations/{name}")
            if obs.shape[2:] != nxt.shape[1:]:
                raise TrajectoryError(f"{next_key}: shape {nxt.shape} does not continue observations {obs.shape}")
            if obs.dtype != nxt.dtype:
                raise TrajectoryError(f"{next_key}: dtype {nxt.dtype} != observation dtype {obs.dtype}")
        for agent in _agents(tensors):
            if f"/agents/{agent}/actions" not in tensors:
                raise TrajectoryError(f"/agents/{agent}/actions: required for every agent named in the keys")
        object.__setattr__(self, "tensors", MappingProxyType(tensors))
        object.__setattr__(self, "batch_size", batch)
        object.__setattr__(self, "steps", steps)

    # ---- views -------------------------------------------------------------------------------------------
    @property
    def num_steps(self) -> int:
        """Agent steps in the trajectory (batch × steps)."""
        return self.batch_size * self.steps

    @property
    def rewards(self) -> np.ndarray:
        return self.tensors["/rewards"]

    @property
    def terminals(self) -> np.ndarray:
        return self.tensors["/terminals"]

    @property
    def truncations(self) -> np.ndarray:
        return self.tensors["/truncations"]

    @property
    def masks(self) -> np.ndarray:
        """1.0 where the episode goes on after the step, 0.0 where it ended (either way) after it; Digideep's
        masks one index earlier (the module doc)."""
        if "/masks" in self.tensors:
            return self.tensors["/masks"]
        return (~(self.terminals | self.truncations)).astype(np.float32)

    def observations(self) -> dict[str, np.ndarray]:
        """Model-input-named observations: ``{"observation": ...}`` for a plain array, else the dict's keys."""
        return _named_observations(self.tensors, "/observations")

    def next_observations(self) -> dict[str, np.ndarray]:
        return _named_observations(self.tensors, "/next_observations")

    def infos(self) -> dict[str, np.ndarray]:
        return {k[len("/infos/"):]: v for k, v in self.tensors.items() if k.startswith("/infos/")}

    def agents(self) -> list[str]:
        return sorted(_agents(self.tensors))

    def actions(self, agent: str = DEFAULT_AGENT) -> np.ndarray:
        key = f"/agents/{agent}/actions"
        if key not in self.tensors:
            raise KeyError(f"{key}: no such agent in the trajectory (agents: {self.agents()})")
        return self.tensors[key]

    def artifacts(self, agent: str = DEFAULT_AGENT) -> dict[str, np.ndarray]:
        prefix = f"/agents/{agent}/artifacts/"
        return {k[len(prefix):]: v for k, v in self.tensors.items() if k.startswith(prefix)}

    def hidden_state(self, agent: str = DEFAULT_AGENT) -> dict[str, np.ndarray]:
        """The agent's recurrent state: ``{"": array}`` for a single array, else by sub-key."""
        prefix = f"/agents/{agent}/hidden_state"
        return {k[len(prefix) + 1:]: v for k, v in self.tensors.items() if k == prefix or k.startswith(prefix + "/")}

    @property
    def nbytes(self) -> int:
        return sum(v.nbytes for v in self.tensors.values())

    # ---- combining -----------------------------------------------------------------------------------------
    @staticmethod
    def concatenate(parts: Sequence[Trajectory]) -> Trajectory:
        """Stack trajectories with the same keys and steps along the batch axis."""
        if not parts:
            raise TrajectoryError("concatenate: no trajectories given")
        keys = set(parts[0].tensors)
        for i, part in enumerate(parts[1:], start=1):
            if set(part.tensors) != keys:
                raise TrajectoryError(f"concatenate: part {i} keys differ: {sorted(keys ^ set(part.tensors))}")
            if part.steps != parts[0].steps:
                raise TrajectoryError(f"concatenate: part {i} has {part.steps} steps, part 0 has {parts[0].steps}")
        if len(parts) == 1:
            return parts[0]
        return Trajectory({k: np.concatenate([p.tensors[k] for p in parts], axis=0) for k in sorted(keys)})


def _observation_names(tensors: Mapping[str, np.ndarray], prefix: str) -> set[str]:
    names = set()
    plain = prefix in tensors
    for key in tensors:
        if key.startswith(prefix + "/"):
            names.add(key[len(prefix) + 1:])
    if plain and names:
        raise TrajectoryError(f"{prefix}: use either {prefix} or {prefix}/<k> entries, not both")
    return {OBSERVATION} if plain else names


def _named_observations(tensors: Mapping[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    if prefix in tensors:
        return {OBSERVATION: tensors[prefix]}
    return {k[len(prefix) + 1:]: v for k, v in tensors.items() if k.startswith(prefix + "/")}


def _agents(tensors: Mapping[str, np.ndarray]) -> set[str]:
    return {m.group("agent") for k in tensors if (m := _AGENT_KEY.fullmatch(k))}


def hidden_state_key(agent: str, name: str) -> str:
    """The key of entry ``name`` of an agent's recurrent state (models name their states, e.g. ``hidden``)."""
    return f"/agents/{agent}/hidden_state/{name}"


def observation_tensors(observation: np.ndarray | Mapping[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    """Flat keys for one observation value: a plain array goes to ``prefix``, a dict to ``prefix/<k>``."""
    if isinstance(observation, Mapping):
        if not observation:
            raise TrajectoryError(f"{prefix}: empty observation dict")
        return {f"{prefix}/{k}": np.asarray(v) for k, v in observation.items()}
    return {prefix: np.asarray(observation)}


@dataclass(frozen=True)
class AgentStep:
    """What one agent did at one (batched) step: actions (B, ...), artifacts and optional recurrent state."""

    actions: np.ndarray
    artifacts: Mapping[str, np.ndarray] = field(default_factory=dict)
    hidden_state: np.ndarray | Mapping[str, np.ndarray] | None = None


class TrajectoryBuilder:
    """Collects batched steps on the actor side and cuts them into `Trajectory` segments of `unroll_len`.

    Usage per vector step: ``add(obs, agents, rewards, terminals, truncations)``; when `full`, call
    ``build(next_observations)`` with the observation the envs continue from (the final observation for a
    row whose last step was truncated). ``batch_size`` is the number of envs stepped together; for envs that
    step independently use one builder each (batch_size=1) and `Trajectory.concatenate` the results.
    """

    def __init__(self, batch_size: int, unroll_len: int) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if unroll_len < 1:
            raise ValueError(f"unroll_len must be >= 1, got {unroll_len}")
        self.batch_size = batch_size
        self.unroll_len = unroll_len
        self._steps: list[dict[str, np.ndarray]] = []

    def __len__(self) -> int:
        return len(self._steps)

    @property
    def full(self) -> bool:
        return len(self._steps) >= self.unroll_len

    def add(
        self,
        observations: np.ndarray | Mapping[str, np.ndarray],
        agents: Mapping[str, AgentStep],
        rewards: np.ndarray,
        terminals: np.ndarray,
        truncations: np.ndarray,
        infos: Mapping[str, np.ndarray] | None = None,
    ) -> None:
        if self.full:
            raise TrajectoryError("builder is full: call build(next_observations) first")
        step = observation_tensors(observations, "/observations")
        step["/rewards"] = np.asarray(rewards, dtype=np.float32)
        step["/terminals"] = np.asarray(terminals, dtype=np.bool_)
        # Gymnasium may report a step as both: it terminated, so nothing is bootstrapped.
        step["/truncations"] = np.asarray(truncations, dtype=np.bool_) & ~step["/terminals"]
        for k, v in (infos or {}).items():
            step[f"/infos/{k}"] = np.asarray(v)
        if not agents:
            raise TrajectoryError("/agents: at least one agent step is required")
        for name, agent in agents.items():
            step[f"/agents/{name}/actions"] = np.asarray(agent.actions)
            for k, v in agent.artifacts.items():
                step[f"/agents/{name}/artifacts/{k}"] = np.asarray(v)
            if isinstance(agent.hidden_state, Mapping):
                for k, v in agent.hidden_state.items():
                    step[f"/agents/{name}/hidden_state/{k}"] = np.asarray(v)
            elif agent.hidden_state is not None:
                step[f"/agents/{name}/hidden_state"] = np.asarray(agent.hidden_state)
        for key, value in step.items():
            check_key(key)
            if value.shape[:1] != (self.batch_size,):
                raise TrajectoryError(f"{key}: leading dim {value.shape[:1]} != batch_size {self.batch_size}")
        if self._steps and set(step) != set(self._steps[0]):
            raise TrajectoryError(f"step keys changed within a segment: {sorted(set(step) ^ set(self._steps[0]))}")
        self._steps.append(step)

    def build(self, next_observations: np.ndarray | Mapping[str, np.ndarray]) -> Trajectory:
        """The collected steps as a trajectory (steps = len(self)); the builder starts empty again."""
        if not self._steps:
            raise TrajectoryError("build: no steps collected")
        tensors = {k: np.stack([s[k] for s in self._steps], axis=1) for k in self._steps[0]}
        for key, value in observation_tensors(next_observations, "/next_observations").items():
            obs = tensors.get("/observations" + key[len("/next_observations"):])
            if obs is not None and value.dtype != obs.dtype and np.can_cast(value.dtype, obs.dtype, "same_kind"):
                value = value.astype(obs.dtype)  # e.g. a final observation that came back as float64
            tensors[key] = value
        self._steps = []
        return Trajectory(tensors)
