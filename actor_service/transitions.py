"""One player's transitions in one env, cut into `common.trajectory` rows — turn-based games included.

In a turn-based game a transition runs from one of the player's decisions to its next decision: its reward is
everything the player received in between (the opponent's replies included), and it is terminal when the game
ended before the player's next decision, whoever made the last move. Its next observation is the player's view
at that next decision, or the final position. A single-player env is the special case where every step is a
decision.

Rows (batch 1) hold up to `unroll_len` transitions and end early where the format needs it:
- a *truncated* episode ends the row, so ``/next_observations`` is the final observation and the learner can
  bootstrap from it (inside a row that observation would be lost);
- `cut()` (an env failure, the job's end) drops the decision still waiting for its outcome and ends the row with
  what it has; that row continues at the dropped decision's observation, a valid bootstrap point.
A terminal inside a row is fine: the next step is the first of the env's next episode.

Rows also carry ``/infos/episode_return``: at a step that ends an episode, the player's return over the whole
episode (rewards before its first decision included); 0 at other steps.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from common.trajectory import DEFAULT_AGENT, OBSERVATION, Trajectory, hidden_state_key

EPISODE_RETURN_INFO = "episode_return"

View = Mapping[str, np.ndarray]


NO_STATE: Mapping[str, np.ndarray] = MappingProxyType({})
"""The recurrent state of a feed-forward policy's decision."""


@dataclass(frozen=True)
class Decision:
    """What the player saw and did at one of its turns (arrays without a batch dimension)."""

    observation: View
    action: np.ndarray
    artifacts: Mapping[str, np.ndarray]
    policy_version: int
    hidden_state: Mapping[str, np.ndarray] = field(default_factory=lambda: NO_STATE)
    """A recurrent policy's state when it acted (``/agents/<name>/hidden_state/<k>``, what learners restart
    the core from)."""


@dataclass(frozen=True)
class Row:
    trajectory: Trajectory
    """Batch 1, 1..unroll_len steps."""
    policy_version: int
    """The oldest policy version that acted in the row (staleness is measured from it)."""


class SeatTrajectory:
    """Feed it the player's decisions, its rewards and episode ends in order; it returns finished rows."""

    def __init__(self, unroll_len: int, agent: str = DEFAULT_AGENT) -> None:
        if unroll_len < 1:
            raise ValueError(f"unroll_len must be >= 1, got {unroll_len}")
        self.unroll_len = unroll_len
        self._agent = agent
        # The unfinished row, one entry per transition; stacked and validated (as a Trajectory) once per row,
        # which costs a fraction of TrajectoryBuilder's per-step checks on the acting hot path.
        self._steps: list[Decision] = []
        self._rewards: list[float] = []
        self._terminals: list[bool] = []
        self._truncations: list[bool] = []
        self._episode_returns: list[float] = []
        self._open: Decision | None = None
        self._reward = 0.0
        self._last_next: View | None = None
        self._row_version: int | None = None
        self.transitions = 0

    @property
    def waiting(self) -> bool:
        """A decision is waiting for its outcome."""
        return self._open is not None

    @property
    def pending_steps(self) -> int:
        """Transitions in the unfinished row."""
        return len(self._steps)

    def decide(self, decision: Decision) -> list[Row]:
        """The player acts: the previous transition (if any) ends here, not done."""
        rows = self._close(decision.observation, terminated=False, truncated=False) if self._open else []
        self._open = decision
        self._reward = 0.0
        return rows

    def add_reward(self, reward: float) -> None:
        """A reward the player received on an env step (its own or another player's)."""
        if self._open is not None:
            self._reward += float(reward)

    def end_episode(
        self, final_observation: View, terminated: bool, truncated: bool, episode_return: float = 0.0
    ) -> list[Row]:
        """The episode ended; `final_observation` is the player's view of the last position."""
        if self._open is None:  # the player never acted in this episode
            return []
        rows = self._close(final_observation, terminated=terminated, truncated=truncated and not terminated,
                           episode_return=episode_return)
        if truncated and not terminated:
            rows += self._end_row()
        return rows

    def close_open(self, next_observation: View) -> list[Row]:
        """The job ends with the episode going on and the player about to act at `next_observation`: the
        transition waiting for it ends there, not done (its row bootstraps from that view), and so does the
        row. Cut instead, the step was played and never trained on: one per env and job."""
        rows = self._close(next_observation, terminated=False, truncated=False) if self._open else []
        return rows + self._end_row()

    def cut(self) -> list[Row]:
        """Drop the decision waiting for its outcome and end the row (env failure, end of the job)."""
        self._open = None
        self._reward = 0.0
        return self._end_row()

    def _close(
        self, next_observation: View, terminated: bool, truncated: bool, episode_return: float = 0.0
    ) -> list[Row]:
        decision = self._open
        assert decision is not None
        self._open = None
        self._steps.append(decision)
        self._rewards.append(self._reward)
        self._terminals.append(terminated)
        self._truncations.append(truncated)
        self._episode_returns.append(episode_return)
        self.transitions += 1
        self._reward = 0.0
        self._last_next = next_observation
        version = decision.policy_version
        self._row_version = version if self._row_version is None else min(self._row_version, version)
        return [self._build()] if len(self._steps) >= self.unroll_len else []

    def _end_row(self) -> list[Row]:
        return [self._build()] if self._steps else []

    def _build(self) -> Row:
        """The row as a (1, T) trajectory in common.trajectory's layout (validated by `Trajectory`)."""
        assert self._last_next is not None and self._row_version is not None
        steps = self._steps
        first = steps[0]
        plain = set(first.observation) == {OBSERVATION}
        tensors: dict[str, np.ndarray] = {}
        for name in first.observation:
            key = "/observations" if plain else f"/observations/{name}"
            stacked = np.stack([np.asarray(s.observation[name]) for s in steps])[None]
            tensors[key] = stacked
            final = np.asarray(self._last_next[name])[None]
            if final.dtype != stacked.dtype and np.can_cast(final.dtype, stacked.dtype, "same_kind"):
                final = final.astype(stacked.dtype)
            tensors["/next_observations" + key[len("/observations"):]] = final
        agent = f"/agents/{self._agent}"
        tensors[f"{agent}/actions"] = np.stack([np.asarray(s.action) for s in steps])[None]
        for name in first.artifacts:
            tensors[f"{agent}/artifacts/{name}"] = np.stack([np.asarray(s.artifacts[name]) for s in steps])[None]
        for name in first.hidden_state:
            tensors[hidden_state_key(self._agent, name)] = np.stack([s.hidden_state[name] for s in steps])[None]
        tensors["/rewards"] = np.asarray(self._rewards, np.float32)[None]
        tensors["/terminals"] = np.asarray(self._terminals, np.bool_)[None]
        tensors["/truncations"] = np.asarray(self._truncations, np.bool_)[None]
        tensors[f"/infos/{EPISODE_RETURN_INFO}"] = np.asarray(self._episode_returns, np.float32)[None]
        row = Row(Trajectory(tensors), self._row_version)
        self._steps, self._rewards, self._terminals, self._truncations = [], [], [], []
        self._episode_returns = []
        self._row_version = None
        return row
