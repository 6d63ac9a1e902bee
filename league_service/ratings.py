"""Elo and TrueSkill ratings of every player, updated from every rated two-player episode (draws count).

Elo is the familiar single number; TrueSkill (the `trueskill` package) adds an uncertainty sigma that shrinks
as a player plays. A snapshot starts from its parent's rating: it is the same policy at that moment.
Not thread-safe by itself: the league calls it under its lock.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import trueskill

from league_service.config import EloConfig, TrueSkillConfig
from league_service.league_errors import LeagueStateError, UnknownPlayerError
from league_service.messages import Outcome

_SCORE = {Outcome.WIN: 1.0, Outcome.DRAW: 0.5, Outcome.LOSS: 0.0}


def elo_expected(rating: float, opponent: float) -> float:
    """The expected score of `rating` against `opponent`."""
    return 1.0 / (1.0 + 10.0 ** ((opponent - rating) / 400.0))


@dataclass(frozen=True)
class Rating:
    elo: float
    mu: float
    sigma: float
    # Rated episodes played.
    games: int = 0


class RatingBook:
    def __init__(self, elo: EloConfig, trueskill_cfg: TrueSkillConfig) -> None:
        self._elo = elo
        self._env = trueskill.TrueSkill(
            mu=trueskill_cfg.mu,
            sigma=trueskill_cfg.sigma,
            beta=trueskill_cfg.beta,
            tau=trueskill_cfg.tau,
            draw_probability=trueskill_cfg.draw_probability,
        )
        self._ratings: dict[str, Rating] = {}

    def add_player(self, player_id: str, parent_id: str | None = None) -> None:
        """Rate a new player, starting from its parent's rating when it has one."""
        if player_id in self._ratings:
            raise ValueError(f"player_id: {player_id!r} is already rated")
        if parent_id is not None and parent_id in self._ratings:
            parent = self._ratings[parent_id]
            self._ratings[player_id] = Rating(parent.elo, parent.mu, parent.sigma, 0)
        else:
            self._ratings[player_id] = Rating(self._elo.initial, self._env.mu, self._env.sigma, 0)

    def get(self, player_id: str) -> Rating:
        try:
            return self._ratings[player_id]
        except KeyError:
            raise UnknownPlayerError(player_id) from None

    def compute(self, matches: Iterable[tuple[str, str, Outcome]]) -> dict[str, Rating]:
        """The ratings after these (home, away, home's outcome) episodes, in order; nothing is changed yet.

        Self-play episodes carry no information about relative skill and are skipped.
        """
        updated: dict[str, Rating] = {}
        for home, away, outcome in matches:
            if home == away:
                continue
            a = updated.get(home) or self.get(home)
            b = updated.get(away) or self.get(away)
            score = _SCORE[outcome]
            expected = elo_expected(a.elo, b.elo)
            delta = self._elo.k_factor * (score - expected)
            ts_a = self._env.create_rating(a.mu, a.sigma)
            ts_b = self._env.create_rating(b.mu, b.sigma)
            if outcome is Outcome.LOSS:
                ts_b, ts_a = trueskill.rate_1vs1(ts_b, ts_a, env=self._env)
            else:
                ts_a, ts_b = trueskill.rate_1vs1(ts_a, ts_b, drawn=outcome is Outcome.DRAW, env=self._env)
            updated[home] = Rating(a.elo + delta, ts_a.mu, ts_a.sigma, a.games + 1)
            updated[away] = Rating(b.elo - delta, ts_b.mu, ts_b.sigma, b.games + 1)
        return updated

    def commit(self, updated: dict[str, Rating]) -> None:
        for player_id in updated:
            self.get(player_id)
        self._ratings.update(updated)

    def state_dict(self) -> dict[str, Any]:
        return {
            pid: {"elo": r.elo, "mu": r.mu, "sigma": r.sigma, "games": r.games}
            for pid, r in self._ratings.items()
        }

    def load_state_dict(self, state: Any, player_ids: Iterable[str]) -> None:
        """Replace all ratings; `state` must rate exactly `player_ids`."""
        expected = set(player_ids)
        if not isinstance(state, dict) or set(state) != expected:
            got = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise LeagueStateError(
                "ratings", f"must rate exactly the league's players {sorted(expected)}, got {got}"
            )
        ratings = {}
        for pid, row in state.items():
            try:
                ratings[pid] = Rating(
                    float(row["elo"]), float(row["mu"]), float(row["sigma"]), int(row["games"])
                )
            except (KeyError, TypeError, ValueError) as exc:
                raise LeagueStateError(f"ratings.{pid}", f"malformed rating: {exc}") from None
        self._ratings = ratings
