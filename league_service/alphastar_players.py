"""AlphaStar's league members (Vinyals et al. 2019, Methods "Multi-agent learning").

- MainPlayer: PFSP over all past players (0.5), self-play against the main players, falling back to an
  opponent's past versions when it is too strong (0.35), and verification of exploiters and forgetting (0.15).
- MainExploiter: plays the main players (their past versions, PFSP-variance, when they are still too strong)
  and restarts from the pretrained checkpoint when it is stuck or after a step limit.
- LeagueExploiter: PFSP over all past players; restarts from the pretrained checkpoint with probability 0.25.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from league_service.config import LeagueExploiterConfig, MainExploiterConfig, MainPlayerConfig
from league_service.players import BattleActivePlayer, HistoricalPlayer, Player


def remove_monotonic_suffix(
    win_rates: np.ndarray, players: Sequence[Player]
) -> tuple[np.ndarray, list[Player]]:
    """Drop the trailing run of past versions our win rate only falls against.

    Newer versions are expected to be harder; only an older one we now do worse against than a newer one
    shows forgetting.
    """
    for i in range(len(win_rates) - 1, 0, -1):
        if win_rates[i - 1] < win_rates[i]:
            return win_rates[: i + 1], list(players[: i + 1])
    return np.array([]), []


class MainPlayer(BattleActivePlayer):
    player_type: ClassVar[str] = "main_player"
    _cfg: MainPlayerConfig

    def _historical(self) -> list[Player]:
        return self._get_players(lambda p: isinstance(p, HistoricalPlayer))

    def _past_versions_of(self, player: Player) -> list[Player]:
        """Oldest first (by the step they were taken at, not the order they joined): a pretrained historical
        player added when a resumed league turned use_pretrain_init_historical on joins last, and was taken for
        the newest version, defeating the forgetting check's monotonic-suffix rule (a review)."""
        return sorted(self._get_players(
            lambda p: isinstance(p, HistoricalPlayer) and p.parent_id == player.player_id
        ), key=lambda p: p.total_agent_step)

    def _pfsp_branch(self, rng: np.random.Generator) -> Player:
        historical = self._historical()
        if not historical:
            return self._sp_branch(rng)
        return self._pfsp_over(historical, self._cfg.pfsp_weighting, rng)

    def _sp_branch(self, rng: np.random.Generator, opponent: Player | None = None) -> Player:
        if opponent is None:
            opponent = self._get_opponent(self._get_players(lambda p: isinstance(p, MainPlayer)), rng)
        if self._payoff.win_rate(self.player_id, opponent.player_id) > self._cfg.sp_min_win_rate:
            return opponent
        # The opponent is too strong to learn from: play its past versions, those of our level first.
        past = self._past_versions_of(opponent)
        if not past:
            return opponent
        return self._pfsp_over(past, "variance", rng)

    def _verification_branch(self, rng: np.random.Generator) -> Player:
        opponent = self._get_opponent(self._get_players(lambda p: isinstance(p, MainPlayer)), rng)
        # Exploitation: do past exploiters still beat us?
        exploiters = self._get_players(
            lambda p: isinstance(p, HistoricalPlayer) and p.parent_type == MainExploiter.player_type
        )
        if exploiters:
            win_rates = self._payoff[self, exploiters]
            if win_rates.min() < self._cfg.verification_exploiter_win_rate:
                return self._pfsp_over(exploiters, "squared", rng)
        # Forgetting: do we lose to an old version of the main opponent more than to a newer one?
        past = self._past_versions_of(opponent)
        win_rates, past = remove_monotonic_suffix(self._payoff[self, past], past)
        if len(win_rates) and win_rates.min() < self._cfg.verification_forgetting_win_rate:
            return self._pfsp_over(past, "squared", rng)
        return self._sp_branch(rng, opponent)


class MainExploiter(BattleActivePlayer):
    player_type: ClassVar[str] = "main_exploiter"
    _cfg: MainExploiterConfig

    def _main_players(self) -> list[Player]:
        return self._get_players(lambda p: isinstance(p, MainPlayer))

    def _main_players_branch(self, rng: np.random.Generator) -> Player:
        main_players = self._main_players()
        if not main_players:
            return self._fallback_opponent()
        opponent = self._get_opponent(main_players, rng)
        if self._payoff.win_rate(self.player_id, opponent.player_id) >= self._cfg.min_valid_win_rate:
            return opponent
        # Too strong to give a training signal: a curriculum of its past versions, those of our level first.
        past = self._get_players(
            lambda p: isinstance(p, HistoricalPlayer) and p.parent_id == opponent.player_id
        )
        if not past:
            return opponent
        return self._pfsp_over(past, "variance", rng)

    def _is_strong_win_rate_reference(self, player: Player) -> bool:
        return isinstance(player, MainPlayer)

    def mutate(self, reset_checkpoint_path: str, rng: np.random.Generator) -> str | None:
        # At the snapshot's step (last_enough_step): updates that arrived while it was copied do not count.
        if self.last_enough_step - self.last_reset_step >= self._cfg.reset_after_steps:
            return reset_checkpoint_path
        main_players = self._main_players()
        if main_players and self._payoff[self, main_players].min() < self._cfg.reset_win_rate_below:
            return reset_checkpoint_path
        return None


class LeagueExploiter(BattleActivePlayer):
    player_type: ClassVar[str] = "league_exploiter"
    _cfg: LeagueExploiterConfig

    def _pfsp_branch(self, rng: np.random.Generator) -> Player:
        historical = self._get_players(lambda p: isinstance(p, HistoricalPlayer))
        if not historical:
            return self._fallback_opponent()
        return self._pfsp_over(historical, self._cfg.pfsp_weighting, rng)

    def mutate(self, reset_checkpoint_path: str, rng: np.random.Generator) -> str | None:
        if rng.random() < self._cfg.mutate_prob:
            return reset_checkpoint_path
        return None
