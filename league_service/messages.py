"""Typed messages between the league and its callers (the coordinator translates them to and from protobuf).

Frozen dataclasses instead of dicts so a swapped or misspelled key is an error, not a silent default. Each
checks its own fields on construction and names the field at fault.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


class Outcome(enum.Enum):
    """One player's result of one episode; NONE for solo episodes, which have no winner."""

    WIN = "win"
    DRAW = "draw"
    LOSS = "loss"
    NONE = "none"

    # Members are singletons compared by identity: the identity hash (a C slot) agrees with that and spares
    # Enum's Python-level __hash__ in the lookups every counted episode makes.
    __hash__ = object.__hash__

    def reverse(self) -> Outcome:
        """The result the other side of a two-player episode saw."""
        return _REVERSED.get(self, self)


_REVERSED = {Outcome.WIN: Outcome.LOSS, Outcome.LOSS: Outcome.WIN}


def _require(condition: bool, field_name: str, message: str) -> None:
    if not condition:
        raise ValueError(f"{field_name}: {message}")


def _require_player_ids(players: Any, field_name: str) -> None:
    if isinstance(players, tuple) and players and all(isinstance(pid, str) and pid for pid in players):
        return  # the common case, without building the messages below
    _require(
        isinstance(players, tuple), field_name, f"must be a tuple of player ids, got {type(players).__name__}"
    )
    _require(len(players) >= 1, field_name, "must name at least one player")
    for i, pid in enumerate(players):
        _require(
            isinstance(pid, str) and pid != "", f"{field_name}[{i}]", f"must be a non-empty str, got {pid!r}"
        )


def _require_mapping(value: Any, field_name: str) -> None:
    if type(value) is dict:  # the common case, without an abstract-class check
        return
    _require(isinstance(value, Mapping), field_name, f"must be a dict, got {type(value).__name__}")


@dataclass(frozen=True)
class JobSpec:
    """A match the league wants played for `launch_player`; players are in seat order, launch player first."""

    launch_player: str
    players: tuple[str, ...]
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    # Policy behaviour while collecting, e.g. {"eps": 0.05} from the player's exploration schedule.
    forward_kwargs: dict[str, Any] = field(default_factory=dict)
    # How trajectories are cut and sent, e.g. {"unroll_len": 64}.
    adder_kwargs: dict[str, Any] = field(default_factory=dict)
    # The rest of the player's job template.
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _require_player_ids(self.players, "players")
        _require(self.players[0] == self.launch_player, "players", "players[0] must be the launch player")
        for name in ("env_kwargs", "forward_kwargs", "adder_kwargs", "extra"):
            _require_mapping(getattr(self, name), name)


def _require_generations(generations: tuple[int, ...], players: tuple[str, ...]) -> None:
    if not (isinstance(generations, tuple) and len(generations) in (0, len(players))
            and all(type(g) is int and g >= 0 for g in generations)):  # (the message formatted only on failure)
        _require(False, "generations", f"must be () or one int >= 0 per player ({len(players)}), got {generations!r}")


@dataclass(frozen=True)
class PlayerOutcome:
    player_id: str
    outcome: Outcome
    episode_return: float = 0.0

    def __post_init__(self) -> None:
        # Several of these are built per finished job: the common case is checked in one go, and the messages
        # are formatted only on failure.
        if (type(self.player_id) is str and self.player_id and type(self.outcome) is Outcome
                and type(self.episode_return) is float and math.isfinite(self.episode_return)):
            return
        _require(
            isinstance(self.player_id, str) and self.player_id != "", "player_id", "must be a non-empty str"
        )
        if not isinstance(self.outcome, Outcome):
            raise ValueError(f"outcome: must be an Outcome, got {self.outcome!r}")
        if not (isinstance(self.episode_return, int | float) and math.isfinite(self.episode_return)):
            raise ValueError(f"episode_return: must be a finite number, got {self.episode_return!r}")


@dataclass(frozen=True)
class EpisodeOutcome:
    """One finished episode: every player's outcome (one per seat) and its length in env steps."""

    player_outcomes: tuple[PlayerOutcome, ...]
    length: int = 0

    def __post_init__(self) -> None:
        _require(isinstance(self.player_outcomes, tuple), "player_outcomes", "must be a tuple")
        for i, po in enumerate(self.player_outcomes):
            if not isinstance(po, PlayerOutcome):
                raise ValueError(f"player_outcomes[{i}]: must be a PlayerOutcome")
        if not (isinstance(self.length, int) and not isinstance(self.length, bool) and self.length >= 0):
            raise ValueError(f"length: must be an int >= 0, got {self.length!r}")


@dataclass(frozen=True)
class JobResult:
    """What a finished job reports: the match's players in seat order and its episodes."""

    launch_player: str
    players: tuple[str, ...]
    episodes: tuple[EpisodeOutcome, ...] = ()
    # Each player's reset generation when the job was leased (`BaseLeagueManager.generations`: an active player's
    # mutations so far, 0 for a historical one; the coordinator's lease keeps them): results of weights a reset has
    # since replaced are not counted. () unknown.
    generations: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        _require_player_ids(self.players, "players")
        _require(self.players[0] == self.launch_player, "players", "players[0] must be the launch player")
        _require_generations(self.generations, self.players)
        _require(isinstance(self.episodes, tuple), "episodes", "must be a tuple")
        for i, ep in enumerate(self.episodes):
            if not isinstance(ep, EpisodeOutcome):
                raise ValueError(f"episodes[{i}]: must be an EpisodeOutcome")


@dataclass(frozen=True)
class PlayerUpdate:
    """A learner's progress report: totals since the player was created and its newest checkpoint.

    An empty checkpoint_path means "no new checkpoint" (steps only). `reset_applied_version`: the
    reset_checkpoint_version of the latest reset (mutation) the learner continues from, 0 for none; it
    acknowledges that reset, which the league repeats in every reply until then.
    """

    player_id: str
    train_iteration: int
    agent_steps: int
    checkpoint_path: str = ""
    checkpoint_version: int = 0
    reset_applied_version: int = 0

    def __post_init__(self) -> None:
        _require(
            isinstance(self.player_id, str) and self.player_id != "", "player_id", "must be a non-empty str"
        )
        for name in ("train_iteration", "agent_steps", "checkpoint_version", "reset_applied_version"):
            value = getattr(self, name)
            _require(
                isinstance(value, int) and not isinstance(value, bool) and value >= 0,
                name,
                f"must be an int >= 0, got {value!r}",
            )
        _require(isinstance(self.checkpoint_path, str), "checkpoint_path", "must be a str")


@dataclass(frozen=True)
class UpdateOutcome:
    """The league's answer to a PlayerUpdate.

    When `mutated`, the learner must continue from the reset checkpoint (path "" means a fresh
    initialisation), number its next checkpoints at or above reset_checkpoint_version, and acknowledge the
    reset (PlayerUpdate.reset_applied_version) in its next updates. Until it does, every reply repeats it.
    """

    mutated: bool = False
    reset_checkpoint_path: str = ""
    reset_checkpoint_version: int = 0
