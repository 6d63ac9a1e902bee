"""A read-only view of the league for status tools: plain frozen dataclasses, built from values copied under
the locks."""

from __future__ import annotations

from dataclasses import dataclass

from common.job_limits import STATUS_MAX_BYTES  # noqa: F401  (its home before learners needed it too)

REFERENCE_BOT_TYPE = "reference_bot"
"""The `player_type` of a reference bot (players.ReferenceBotPlayer), as status readers see it."""


@dataclass(frozen=True)
class PlayerStatus:
    player_id: str
    player_type: str
    active: bool
    category: str
    parent_id: str
    agent_steps: int
    train_iteration: int
    checkpoint_path: str
    checkpoint_version: int
    elo: float
    trueskill_mu: float
    trueskill_sigma: float
    slots_used: int
    slots_limit: int
    snapshots: int
    mutations: int
    # Rated episodes played (battle) or episodes recorded (solo).
    episodes: int
    # Solo leagues: mean return of the recent episodes (0.0 before any).
    mean_return: float
    # Why matchmaking leaves this historical player out (its checkpoint cannot be loaded); "" while it plays.
    set_aside: str = ""


@dataclass(frozen=True)
class PayoffRow:
    """The record of `home` against `away` (decayed counts), home's win rate (draws count half) and the games
    the two have actually played."""

    home: str
    away: str
    wins: float
    draws: float
    losses: float
    games: float
    win_rate: float
    played: int = 0
    win_rate_is_default: bool = False
    """Fewer decayed games than min_win_rate_games: `win_rate` is the configured default, PFSP's view."""


@dataclass(frozen=True)
class LeagueCounters:
    matches: int = 0
    snapshots: int = 0
    mutations: int = 0
    jobs_launched: int = 0
    jobs_finished: int = 0
    jobs_released: int = 0


@dataclass(frozen=True)
class LeagueStatus:
    league_id: str
    league_type: str
    players: tuple[PlayerStatus, ...]
    payoff: tuple[PayoffRow, ...]
    counters: LeagueCounters
