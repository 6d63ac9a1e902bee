"""A league of two-player games (battle): every job is a match of the launch player against an opponent its
type chooses; results update the shared win-rate payoff and the players' Elo and TrueSkill ratings."""

from __future__ import annotations

from typing import ClassVar

from league_service.base_league_manager import BaseLeagueManager
from league_service.messages import JobResult, JobSpec
from league_service.payoff import BattleSharedPayoff, battle_outcomes
from league_service.players import ActivePlayer, Player


class OneVsOneLeague(BaseLeagueManager):
    league_type: ClassVar[str] = "one_vs_one"

    @property
    def payoff(self) -> BattleSharedPayoff:
        return self._roster.payoff  # type: ignore[return-value]

    def _get_job_info(self, player: ActivePlayer) -> JobSpec:
        return self._job_spec(player, player.get_job(self._rng))

    def _record_result(self, result: JobResult) -> int:
        payoff = self.payoff
        payoff.validate(result)
        if self._played_by_replaced_weights(result):
            return 0
        matches = battle_outcomes(result)
        ratings = self._roster.ratings.compute(matches)
        counted = payoff.record_validated(matches)
        self._roster.ratings.commit(ratings)
        return counted

    def _player_record(self, player: Player) -> tuple[int, float]:
        return self._roster.ratings.get(player.player_id).games, 0.0
