"""League members. Active players are trained and get jobs; historical players are frozen snapshots.

A player's kind is its class (and `player_type` / `is_active`), never parsed out of its id. Players are not
thread-safe: the league changes them only under its lock. The AlphaStar players live in alphastar_players.py.
"""

from __future__ import annotations

import bisect
import copy
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from common.config import deep_merge
from league_service.config import (
    JOB_TEMPLATE_SECTIONS,
    ActivePlayerConfig,
    ExplorationConfig,
    NaiveSpPlayerConfig,
)
from league_service.league_errors import LeagueStateError, StaleUpdateError
from league_service.messages import PlayerUpdate, UpdateOutcome
from league_service.pfsp import pfsp
from league_service.status import REFERENCE_BOT_TYPE

if TYPE_CHECKING:
    from league_service.payoff import BattleSharedPayoff, SoloSharedPayoff

    Payoff = BattleSharedPayoff | SoloSharedPayoff


def epsilon_greedy(cfg: ExplorationConfig) -> Callable[[int], float]:
    """The exploration epsilon as a function of the player's agent steps."""
    span = cfg.start - cfg.end
    if cfg.kind == "linear":  # either way: a schedule may rise too (start < end), and stops at `end`
        return lambda step: cfg.end if step >= cfg.decay_len else cfg.start - span * step / cfg.decay_len
    return lambda step: cfg.end + span * math.exp(-step / cfg.decay_len)


STRONG_CHECK_NEWEST = 32
"""The strong-win-rate rule looks at this many of the newest reference players first (`is_trained_enough`)."""


def snapshot_checkpoint_path(checkpoint_path: str, step: int) -> str:
    """`<ckpt>_<step>`, keeping a file extension last (`a/ckpt.pt` -> `a/ckpt_20000.pt`); "" stays ""."""
    if not checkpoint_path:
        return ""
    path = PurePosixPath(checkpoint_path)
    if path.suffix and not checkpoint_path.endswith("/"):
        return str(path.with_name(f"{path.stem}_{step}{path.suffix}"))
    return f"{checkpoint_path.rstrip('/')}_{step}"


def draw_index(rng: np.random.Generator, cumulative_weights: Sequence[float]) -> int:
    """An index drawn with probability proportional to its weight, given the running sums of the weights (as
    `rng.choice(n, p=weights / total)` draws: one uniform number against the cumulative distribution, so a
    zero weight is never drawn), without numpy's per-call cost for a handful of weights."""
    total = cumulative_weights[-1]
    if not total > 0:
        raise ValueError(f"weights: must have a positive total, got {total}")
    return min(bisect.bisect_right(cumulative_weights, rng.random() * total), len(cumulative_weights) - 1)


def _fresh_copy(section: dict[str, Any]) -> dict[str, Any]:
    """A deep copy of a config section (one per job: a job may be changed by whoever gets it)."""
    return copy.deepcopy(section) if section else {}


def _over_template(template: dict[str, Any], section: str, computed: dict[str, Any]) -> dict[str, Any]:
    """`computed` (a fresh dict) merged over the job template's `section`, sharing nothing with the template."""
    base = template.get(section)
    return deep_merge(base, computed) if base else computed


@dataclass(frozen=True)
class CheckpointRef:
    path: str
    version: int


@dataclass(frozen=True)
class PlayerJob:
    """What an active player asks for: opponents (empty for solo) and the job's keyword arguments."""

    opponents: tuple[Player, ...]
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    forward_kwargs: dict[str, Any] = field(default_factory=dict)
    adder_kwargs: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


class Player:
    """What active and historical players share: identity, category, payoff and checkpoint."""

    player_type: ClassVar[str] = "player"
    is_active: ClassVar[bool] = False

    def __init__(
        self,
        *,
        player_id: str,
        category: str,
        payoff: Payoff,
        checkpoint_path: str = "",
        checkpoint_version: int = 0,
        total_agent_step: int = 0,
    ) -> None:
        if not isinstance(player_id, str) or not player_id:
            raise ValueError(f"player_id: must be a non-empty str, got {player_id!r}")
        self._player_id = player_id
        self._category = category
        self._payoff = payoff
        self._checkpoint_path = checkpoint_path
        self._checkpoint_version = checkpoint_version
        self._total_agent_step = total_agent_step

    @property
    def player_id(self) -> str:
        return self._player_id

    @property
    def category(self) -> str:
        return self._category

    @property
    def payoff(self) -> Payoff:
        return self._payoff

    @property
    def checkpoint_path(self) -> str:
        return self._checkpoint_path

    @property
    def checkpoint_version(self) -> int:
        return self._checkpoint_version

    @property
    def total_agent_step(self) -> int:
        return self._total_agent_step

    @property
    def bot(self) -> str:
        """The reference bot the env plays this player with ("mcts:25"); "" for a player with a policy."""
        return ""

    @property
    def set_aside(self) -> str:
        """Why matchmaking leaves this player out ("": it plays); see `HistoricalPlayer.set_aside_for`."""
        return ""

    def state_dict(self) -> dict[str, Any]:
        return {
            "player_id": self._player_id,
            "player_type": self.player_type,
            "category": self._category,
            "checkpoint_path": self._checkpoint_path,
            "checkpoint_version": self._checkpoint_version,
            "total_agent_step": self._total_agent_step,
        }

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._player_id!r})"

    @classmethod
    def _saved_fields(cls, state: dict[str, Any]) -> dict[str, Any]:
        """The constructor's arguments (but the payoff) from a `state_dict`: what every player saves."""
        return {
            "player_id": str(state["player_id"]),
            "category": str(state["category"]),
            "checkpoint_path": str(state["checkpoint_path"]),
            "checkpoint_version": int(state["checkpoint_version"]),
            "total_agent_step": int(state["total_agent_step"]),
        }


class HistoricalPlayer(Player):
    """A frozen player: a snapshot of an active player, or a pretrained checkpoint added at start."""

    player_type: ClassVar[str] = "historical_player"
    is_active: ClassVar[bool] = False

    def __init__(self, *, parent_id: str, parent_type: str, set_aside: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._parent_id = parent_id
        # The player_type of the parent ("" without a parent), so selection needs no lookup.
        self._parent_type = parent_type
        self._set_aside = set_aside

    @property
    def set_aside(self) -> str:
        return self._set_aside

    def set_aside_for(self, reason: str) -> None:
        """Leave this player out of matchmaking for good: its checkpoint cannot be loaded (corrupt or lost), and
        a frozen player has no other version, so every job that played it would fail. Its games so far stay in
        the payoff and its rating stays as it was."""
        if not reason:
            raise ValueError("reason: say why the player is set aside")
        self._set_aside = reason

    @property
    def parent_id(self) -> str:
        return self._parent_id

    @property
    def parent_type(self) -> str:
        return self._parent_type

    def state_dict(self) -> dict[str, Any]:
        state = {**super().state_dict(), "parent_id": self._parent_id, "parent_type": self._parent_type}
        if self._set_aside:  # absent in states saved before players could be set aside
            state["set_aside"] = self._set_aside
        return state

    @classmethod
    def from_state_dict(cls, state: dict[str, Any], payoff: Payoff) -> HistoricalPlayer:
        try:
            return cls(payoff=payoff, **cls._saved_fields(state))
        except (KeyError, TypeError, ValueError) as exc:
            kind = cls.player_type.replace("_", " ")
            raise LeagueStateError("players", f"malformed {kind} {state!r}: {exc}") from None

    @classmethod
    def _saved_fields(cls, state: dict[str, Any]) -> dict[str, Any]:
        return {**Player._saved_fields(state), "parent_id": str(state["parent_id"]),
                "parent_type": str(state["parent_type"]), "set_aside": str(state.get("set_aside", ""))}


BOT_CATEGORY = "bot"
"""The category of reference bots: they belong to no configured category, and opponent choice ignores it."""


class ReferenceBotPlayer(HistoricalPlayer):
    """A reference bot as a league member: `bot` ("mcts:25") names the bot the env plays this player's seat
    with, so it has no checkpoint, never trains and never changes. It is historical (frozen) so that opponent
    choice, the payoff and the ratings take it as they take any past player."""

    player_type: ClassVar[str] = REFERENCE_BOT_TYPE

    def __init__(self, *, bot: str, **kwargs: Any) -> None:
        if not bot:
            raise ValueError("bot: a reference bot needs a bot spec, e.g. 'mcts:25'")
        super().__init__(parent_id="", parent_type="", **kwargs)
        self._bot = bot

    @property
    def bot(self) -> str:
        return self._bot

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "bot": self._bot}

    @classmethod
    def _saved_fields(cls, state: dict[str, Any]) -> dict[str, Any]:
        return {**Player._saved_fields(state), "bot": str(state["bot"])}  # no parent: it sets its own


class ActivePlayer(Player):
    """A trainable player: gets jobs, is snapshot once trained enough, and may mutate (reset) afterwards."""

    player_type: ClassVar[str] = "active_player"
    is_active: ClassVar[bool] = True

    def __init__(self, *, cfg: ActivePlayerConfig, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._cfg = cfg
        self._one_phase_step = cfg.one_phase_step
        self._strong_win_rate = cfg.strong_win_rate
        self._exploration = epsilon_greedy(cfg.exploration) if cfg.exploration is not None else None
        self._train_iteration = 0
        self._last_enough_step = 0
        self._last_reset_step = 0
        self._exploration_from = 0
        """The agent step the exploration schedule counts from: 0, or a reset to a fresh network's step."""
        self._snapshots = 0
        self._mutations = 0
        # Set by a mutation; handed to the learner with every update until it acknowledges it.
        self._pending_reset: CheckpointRef | None = None

    @property
    def cfg(self) -> ActivePlayerConfig:
        return self._cfg

    @property
    def train_iteration(self) -> int:
        return self._train_iteration

    @property
    def last_enough_step(self) -> int:
        return self._last_enough_step

    @property
    def last_reset_step(self) -> int:
        return self._last_reset_step

    @property
    def snapshots(self) -> int:
        return self._snapshots

    @property
    def mutations(self) -> int:
        return self._mutations

    @property
    def pending_reset(self) -> CheckpointRef | None:
        return self._pending_reset

    # -- training progress ---------------------------------------------------------------------------------

    def apply_update(self, update: PlayerUpdate) -> UpdateOutcome:
        """Record a learner's progress. Steps never go backwards; nor does the checkpoint version.

        After a mutation the update's checkpoint (trained from the weights before the reset) is ignored and
        the reset checkpoint is returned instead, in every reply until an update acknowledges it
        (`reset_applied_version` at or above the reset's version): a reply lost on its way, or a learner that
        crashed before it reloaded, still gets the reset. The acknowledging update's checkpoint counts.
        """
        if update.agent_steps < self._total_agent_step:
            raise StaleUpdateError(
                "agent_steps",
                f"{update.agent_steps} is below the player's {self._total_agent_step} (steps never go back)",
            )
        pending = self._pending_reset
        if pending is not None and update.reset_applied_version >= pending.version:
            pending = None  # acknowledged; cleared below, once nothing can refuse the update any more
        if (
            pending is None
            and update.checkpoint_path
            and update.checkpoint_version < self._checkpoint_version
        ):
            raise StaleUpdateError(
                "checkpoint_version",
                f"{update.checkpoint_version} is below the player's {self._checkpoint_version} "
                "(versions never go back)",
            )
        self._pending_reset = pending
        self._total_agent_step = update.agent_steps
        self._train_iteration = max(self._train_iteration, update.train_iteration)  # a count: never shown going back
        if pending is not None:
            return UpdateOutcome(
                mutated=True, reset_checkpoint_path=pending.path, reset_checkpoint_version=pending.version
            )
        if update.checkpoint_path:
            self._checkpoint_path = update.checkpoint_path
            self._checkpoint_version = update.checkpoint_version
        return UpdateOutcome()

    def is_trained_enough(self) -> bool:
        """Due for a snapshot? After one phase of steps if the strong-win-rate rule holds (or is off), after
        two phases in any case. Pure: `record_snapshot` starts the next phase."""
        step_passed = self._total_agent_step - self._last_enough_step
        if step_passed < self._one_phase_step:
            return False
        if self._strong_win_rate is None or step_passed >= 2 * self._one_phase_step:
            return True
        reference = self._get_players(self._is_strong_win_rate_reference)
        if not reference:
            return False
        # The newest first (they joined last, and are the ones a player not yet strong loses to): checked after
        # every report of the player once a phase passed, under the league's lock, the rule read the win rates
        # against every historical player, ~13 ms each time at 5,000 of them (a review). The same answer.
        if self._payoff[self, reference[-STRONG_CHECK_NEWEST:]].min() <= self._strong_win_rate:
            return False
        return bool(self._payoff[self, reference].min() > self._strong_win_rate)

    def _is_strong_win_rate_reference(self, player: Player) -> bool:
        """The opponents the strong-win-rate rule looks at: historical players unless a type overrides."""
        return isinstance(player, HistoricalPlayer)

    def snapshot(self) -> HistoricalPlayer:
        """A frozen copy of this player as it is now: id `<id>_<step>`, checkpoint `<ckpt>_<step>`."""
        step = self._total_agent_step
        return HistoricalPlayer(
            player_id=f"{self._player_id}_{step}",
            category=self._category,
            payoff=self._payoff,
            checkpoint_path=snapshot_checkpoint_path(self._checkpoint_path, step),
            checkpoint_version=self._checkpoint_version,
            total_agent_step=step,
            parent_id=self._player_id,
            parent_type=self.player_type,
        )

    def record_snapshot(self, historical: HistoricalPlayer) -> None:
        """Start the next phase after `historical` was taken of this player."""
        self._last_enough_step = historical.total_agent_step
        self._snapshots += 1

    def mutate(self, reset_checkpoint_path: str, rng: np.random.Generator) -> str | None:
        """Called after each snapshot: the checkpoint to reset to, or None to keep training as is."""
        return None

    def reset_checkpoint(self, checkpoint_path: str) -> CheckpointRef:
        """Make `checkpoint_path` this player's checkpoint under a new (higher) version, so actors reload it,
        and remember to tell the learner."""
        ref = CheckpointRef(checkpoint_path, self._checkpoint_version + 1)
        self._checkpoint_path, self._checkpoint_version = ref.path, ref.version
        # Counted from the snapshot this reset follows, not from the steps reported while it was being
        # copied: "reset after one_phase_step" then resets at every snapshot, as AlphaStar does.
        self._last_reset_step = self._last_enough_step
        if not checkpoint_path:
            # A fresh network explores as a new player does: its learner starts a new Q-network and replay, and
            # a DQN exploiter reset went on at the schedule's end (eps ~0.1 where a new player has 0.95; a
            # review). A pretrained checkpoint keeps the schedule where it is.
            self._exploration_from = self._last_reset_step
        self._mutations += 1
        self._pending_reset = ref
        return ref

    # -- jobs ------------------------------------------------------------------------------------------------

    def get_job(self, rng: np.random.Generator) -> PlayerJob:
        """The next job: computed values (`_get_job_*`) merged over the config's job template."""
        template = self._cfg.job
        return PlayerJob(
            opponents=self._get_job_opponents(rng),
            forward_kwargs=_over_template(template, "forward_kwargs", self._get_job_forward()),
            adder_kwargs=_over_template(template, "adder_kwargs", self._get_job_adder()),
            env_kwargs=self.job_env_kwargs(),
            extra={k: copy.deepcopy(v) for k, v in template.items() if k not in JOB_TEMPLATE_SECTIONS}
            if template else {},
        )

    def job_env_kwargs(self) -> dict[str, Any]:
        """The env kwargs of this player's own jobs (its type's, over its job template's), which its learner
        builds the player's env with too."""
        return _over_template(self._cfg.job, "env_kwargs", self._get_job_env())

    def _get_job_opponents(self, rng: np.random.Generator) -> tuple[Player, ...]:
        raise NotImplementedError

    def _get_job_forward(self) -> dict[str, Any]:
        ret = _fresh_copy(self._cfg.forward_kwargs)
        if self._exploration is not None:
            ret["eps"] = self._exploration(max(0, self._total_agent_step - self._exploration_from))
        return ret

    def _get_job_adder(self) -> dict[str, Any]:
        return _fresh_copy(self._cfg.adder_kwargs)

    def _get_job_env(self) -> dict[str, Any]:
        return _fresh_copy(self._cfg.env_kwargs)

    def _get_players(self, select_fn: Callable[[Player], bool]) -> list[Player]:
        """Players of the league (in the order they joined) that `select_fn` accepts, but those set aside."""
        return [p for p in self._payoff.players if not p.set_aside and select_fn(p)]

    # -- durable state ---------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        pending = self._pending_reset
        return {
            **super().state_dict(),
            "train_iteration": self._train_iteration,
            "last_enough_step": self._last_enough_step,
            "last_reset_step": self._last_reset_step,
            "exploration_from": self._exploration_from,
            "snapshots": self._snapshots,
            "mutations": self._mutations,
            "pending_reset": None if pending is None else {"path": pending.path, "version": pending.version},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the progress of this (already configured) player; validated before anything changes."""
        if state.get("player_id") != self._player_id or state.get("player_type") != self.player_type:
            raise LeagueStateError(
                "players",
                f"state of {state.get('player_type')} {state.get('player_id')!r} does not fit "
                f"{self.player_type} {self._player_id!r}",
            )
        try:
            pending = state["pending_reset"]
            values = (
                str(state["checkpoint_path"]),
                int(state["checkpoint_version"]),
                int(state["total_agent_step"]),
                int(state["train_iteration"]),
                int(state["last_enough_step"]),
                int(state["last_reset_step"]),
                int(state.get("exploration_from", 0)),  # (states saved before it was kept: 0)
                int(state["snapshots"]),
                int(state["mutations"]),
                None if pending is None else CheckpointRef(str(pending["path"]), int(pending["version"])),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise LeagueStateError("players", f"malformed state of {self._player_id!r}: {exc}") from None
        (
            self._checkpoint_path,
            self._checkpoint_version,
            self._total_agent_step,
            self._train_iteration,
            self._last_enough_step,
            self._last_reset_step,
            self._exploration_from,
            self._snapshots,
            self._mutations,
            self._pending_reset,
        ) = values


class SoloActivePlayer(ActivePlayer):
    """An active player of a solo environment: its jobs have no opponent."""

    player_type: ClassVar[str] = "solo_active_player"

    def _get_job_opponents(self, rng: np.random.Generator) -> tuple[Player, ...]:
        return ()


class BattleActivePlayer(ActivePlayer):
    """An active player of a two-player game: each job picks an opponent through one of its branches.

    A subclass implements `_<name>_branch(rng) -> Player` for each branch its config allows; the config's
    branch_probs choose among them. When a branch has no candidate yet (no historical player before the first
    snapshot) the player plays itself; a main exploiter's would never have one without a main player, which
    the config therefore requires.
    """

    player_type: ClassVar[str] = "battle_active_player"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # The branches and their cumulative weights, once: a job draws one with a single uniform number.
        names = list(self._cfg.branch_probs)
        self._branches = [getattr(self, f"_{name}_branch") for name in names]
        self._branch_weights = list(itertools.accumulate(self._cfg.branch_probs[name] for name in names))

    def _get_job_opponents(self, rng: np.random.Generator) -> tuple[Player, ...]:
        return (self._get_collect_opponent(rng),)

    def _get_collect_opponent(self, rng: np.random.Generator) -> Player:
        return self._branches[draw_index(rng, self._branch_weights)](rng)

    def _get_opponent(
        self, players: Sequence[Player], rng: np.random.Generator, p: np.ndarray | None = None
    ) -> Player:
        if p is None:
            return players[int(rng.integers(len(players)))]
        return players[draw_index(rng, list(itertools.accumulate(p.tolist())))]

    def _pfsp_over(self, players: Sequence[Player], weighting: str, rng: np.random.Generator) -> Player:
        return self._get_opponent(players, rng, pfsp(self._payoff[self, players], weighting))

    def _fallback_opponent(self) -> Player:
        return self


class NaiveSpPlayer(BattleActivePlayer):
    """Self-play: against itself (sp) or, by PFSP, against the historical players (pfsp)."""

    player_type: ClassVar[str] = "naive_sp_player"
    _cfg: NaiveSpPlayerConfig

    def _pfsp_branch(self, rng: np.random.Generator) -> Player:
        historical = self._get_players(lambda p: isinstance(p, HistoricalPlayer))
        if not historical:
            return self._fallback_opponent()
        return self._pfsp_over(historical, self._cfg.pfsp_weighting, rng)

    def _sp_branch(self, rng: np.random.Generator) -> Player:
        return self
