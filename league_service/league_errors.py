"""Errors of the league core.

They derive from the coordinator's error classes (league_service.errors), so the servicer maps them to gRPC
status codes without knowing the core, and from the builtin classes callers expect (KeyError, ValueError).
"""

from __future__ import annotations

from league_service.errors import FailedPreconditionError, InvalidArgumentError, NotFoundError


class UnknownPlayerError(NotFoundError, KeyError):
    """A player id the league does not know."""

    def __init__(self, player_id: str, field: str = "player_id") -> None:
        super().__init__(field, f"unknown player {player_id!r}")
        self.player_id = player_id

    def __str__(self) -> str:  # KeyError would quote the message
        return Exception.__str__(self)


class InvalidResultError(InvalidArgumentError):
    """A job result that does not fit the league: wrong players, inconsistent outcomes, a missing seat."""


class NotActivePlayerError(InvalidArgumentError):
    """An operation for trainable players (an update, a launch slot) named a historical player."""


class NotHistoricalCheckpointError(InvalidArgumentError):
    """Only a historical player with a checkpoint can be set aside as unloadable (an active player's learner and
    actors fall back to its older versions; a reference bot has no checkpoint)."""


class StaleUpdateError(FailedPreconditionError, ValueError):
    """A player update that would move steps or the checkpoint version backwards."""


class SlotError(FailedPreconditionError, ValueError):
    """A launch slot released that was never held (a double release or finish)."""


class LeagueStateError(InvalidArgumentError):
    """A state_dict that does not fit this league (other players, another league type, a bad record)."""


class LeagueThreadError(RuntimeError):
    """A league thread (launch or snapshot) died; the original exception is the cause."""
