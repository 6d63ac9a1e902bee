"""A league of single-agent environments (solo): jobs have no opponent; results are kept as each player's
recent episode returns. Ratings stay at their initial values (there are no matches to rate)."""

from __future__ import annotations

from typing import ClassVar

from league_service.base_league_manager import BaseLeagueManager
from league_service.messages import JobResult, JobSpec
from league_service.payoff import SoloSharedPayoff
from league_service.players import ActivePlayer, Player


class SoloLeague(BaseLeagueManager):
    league_type: ClassVar[str] = "solo"

    @property
    def payoff(self) -> SoloSharedPayoff:
        return self._roster.payoff  # type: ignore[return-value]

    def _get_job_info(self, player: ActivePlayer) -> JobSpec:
        return self._job_spec(player, player.get_job(self._rng))

    def _record_result(self, result: JobResult) -> int:
        return self.payoff.update(result)

    def _player_record(self, player: Player) -> tuple[int, float]:
        return self.payoff.episodes(player.player_id), self.payoff.mean_return(player.player_id)
