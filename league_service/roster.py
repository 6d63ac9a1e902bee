"""The league's members and their records: players, launch slots, payoff and ratings, kept together.

A roster is built whole (from the config, or from a saved state) and swapped into the league whole, so a
state that does not fit is rejected before anything of the running league changes. Not thread-safe by
itself: the league uses it under its lock.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from league_service.config import LeagueConfig, reference_bot_id
from league_service.league_errors import LeagueStateError, NotActivePlayerError, UnknownPlayerError
from league_service.payoff import BattleSharedPayoff, SoloSharedPayoff, create_payoff
from league_service.player_factory import PLAYER_CLASSES, create_player
from league_service.players import BOT_CATEGORY, ActivePlayer, HistoricalPlayer, Player, ReferenceBotPlayer
from league_service.ratings import RatingBook
from league_service.slots import LimitedSpaceContainer

log = logging.getLogger(__name__)

_HISTORICAL_CLASSES: dict[str, type[HistoricalPlayer]] = {
    cls.player_type: cls for cls in (HistoricalPlayer, ReferenceBotPlayer)
}


@dataclass
class Roster:
    payoff: BattleSharedPayoff | SoloSharedPayoff
    ratings: RatingBook
    active: dict[str, ActivePlayer] = field(default_factory=dict)
    historical: dict[str, HistoricalPlayer] = field(default_factory=dict)
    # Launch slots of each active player.
    slots: dict[str, LimitedSpaceContainer] = field(default_factory=dict)

    @classmethod
    def _configured(cls, league: LeagueConfig, league_type: str) -> Roster:
        """The configured active players, not yet in the payoff or the ratings."""
        roster = cls(
            payoff=create_payoff(league_type, league.payoff), ratings=RatingBook(league.elo, league.trueskill)
        )
        for category in league.player_category:
            for player_type, count in league.active_players.items():
                for index in range(count):
                    player = create_player(league, player_type, category, index, roster.payoff)
                    roster.active[player.player_id] = player
                    roster.slots[player.player_id] = LimitedSpaceContainer(0, league.job_limit(player_type))
        return roster

    @classmethod
    def build(cls, league: LeagueConfig, league_type: str) -> Roster:
        """The configured active players and, with use_pretrain_init_historical, one pretrained historical
        player per category (a past version of that category's first main player, when there is one)."""
        roster = cls._configured(league, league_type)
        for player in roster.active.values():
            roster.payoff.add_player(player)
            roster.ratings.add_player(player.player_id)
        roster._add_pretrained(league)
        roster._add_reference_bots(league)
        return roster

    def _add_pretrained(self, league: LeagueConfig) -> None:
        """With use_pretrain_init_historical, each category's pretrained historical player not in the league yet
        (a past version of that category's first main player, when there is one): all of them in a new league,
        and those of a resumed league whose config turned the option on since (they join at restart, as bots do;
        before, the option was taken on resume and written into the run's config, but no such player joined)."""
        if not league.use_pretrain_init_historical:
            return
        for category in league.player_category:
            parent = next(
                (p for p in self.active.values() if p.category == category and p.player_type == "main_player"),
                None,
            )
            player_id = f"{parent.player_id}_pretrain" if parent else f"pretrain_{category}"
            if player_id in self.historical:
                continue
            self.add_historical(
                HistoricalPlayer(
                    player_id=player_id,
                    category=category,
                    payoff=self.payoff,
                    checkpoint_path=league.pretrain_path(category),
                    parent_id=parent.player_id if parent else "",
                    parent_type=parent.player_type if parent else "",
                ),
                # The pretrained weights, not its parent's trained ones: the initial rating (in a new league the
                # parent's is the initial one too).
                rated_as_parent=False,
            )

    def _add_reference_bots(self, league: LeagueConfig) -> None:
        """The configured reference bots not in the league yet (all of them in a new league)."""
        for text in league.reference_bots:
            bot_id = reference_bot_id(text)
            if bot_id not in self.historical:
                self.add_historical(
                    ReferenceBotPlayer(player_id=bot_id, category=BOT_CATEGORY, payoff=self.payoff, bot=text)
                )

    def add_historical(self, player: HistoricalPlayer, rated_as_parent: bool = True) -> None:
        """`rated_as_parent`: its rating starts from its parent's (a snapshot), else from the initial one."""
        if player.player_id in self.active or player.player_id in self.historical:
            raise ValueError(f"player_id: {player.player_id!r} already exists in the league")
        self.historical[player.player_id] = player
        self.payoff.add_player(player)
        self.ratings.add_player(player.player_id, parent_id=(player.parent_id or None) if rated_as_parent else None)

    def get(self, player_id: str, field: str = "player_id") -> Player:
        player = self.active.get(player_id) or self.historical.get(player_id)
        if player is None:
            raise UnknownPlayerError(player_id, field=field)
        return player

    def require_active(self, player_id: str, field: str = "player_id") -> ActivePlayer:
        player = self.get(player_id, field)
        if not isinstance(player, ActivePlayer):
            raise NotActivePlayerError(field, f"{player_id!r} is a historical (frozen) player")
        return player

    @property
    def players(self) -> tuple[Player, ...]:
        """Every player in the order they joined (opponent choice walks them in this order)."""
        return self.payoff.players

    # -- durable state ---------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "players": [p.state_dict() for p in self.players],
            "slots_used": self.slots_used(),
            "payoff": self.payoff.state_dict(),
            "ratings": self.ratings.state_dict(),
        }

    def slots_used(self) -> dict[str, int]:
        return {pid: s.used for pid, s in self.slots.items()}

    def take_changes(
        self, player_ids: set[str]
    ) -> tuple[tuple[tuple[int, dict[str, Any]], ...], tuple[dict[str, Any], ...], tuple[tuple[str, dict[str, Any]], ...]]:
        """The states of `player_ids` (with their positions in `state_dict()["players"]`), and the payoff records
        and ratings changed since the last call (which forgets them)."""
        players = (
            tuple((i, p.state_dict()) for i, p in enumerate(self.players) if p.player_id in player_ids)
            if player_ids else ()
        )
        return players, tuple(self.payoff.take_changed_records()), tuple(self.ratings.take_changed())

    @classmethod
    def from_state_dict(cls, league: LeagueConfig, league_type: str, state: dict[str, Any]) -> Roster:
        """A roster restored from `state_dict`; its active players must be the configured ones."""
        roster = cls._configured(league, league_type)
        saved = state.get("players")
        if not isinstance(saved, list) or not all(isinstance(p, dict) for p in saved):
            raise LeagueStateError("players", "expected a list of player states")
        ids = [p.get("player_id") for p in saved]
        if len(set(ids)) != len(ids):
            raise LeagueStateError("players", f"duplicate player ids in {ids}")
        saved_active = {p.get("player_id") for p in saved if p.get("player_type") in PLAYER_CLASSES}
        if saved_active != set(roster.active):
            raise LeagueStateError(
                "players",
                f"active players {sorted(map(str, saved_active))} "
                f"are not the configured {sorted(roster.active)} (a league's active players are fixed when it "
                "starts: configure them as saved (league.active_players, league.player_category), or start a new "
                "league)",
            )
        # Re-add every player in the saved order.
        for entry in saved:
            if entry.get("player_type") in PLAYER_CLASSES:
                player: Player = roster.active[entry["player_id"]]
                player.load_state_dict(entry)
            elif entry.get("player_type") in _HISTORICAL_CLASSES:
                player = _HISTORICAL_CLASSES[entry["player_type"]].from_state_dict(entry, roster.payoff)
                roster.historical[player.player_id] = player
            else:
                raise LeagueStateError("players", f"unknown player_type {entry.get('player_type')!r}")
            roster.payoff.add_player(player)
        configured_bots = {reference_bot_id(text) for text in league.reference_bots}
        dropped = sorted(pid for pid, p in roster.historical.items()
                         if isinstance(p, ReferenceBotPlayer) and pid not in configured_bots)
        if dropped:
            raise LeagueStateError(
                "players", f"reference bots {dropped} are in the saved league but not in league.reference_bots (a "
                "league member cannot leave: put them back, or start a new league)")
        roster.payoff.load_records(state.get("payoff"))
        roster.ratings.load_state_dict(state.get("ratings"), ids)
        slots_used = state.get("slots_used")
        if not isinstance(slots_used, dict) or set(slots_used) != set(roster.active):
            raise LeagueStateError("slots_used", "expected the slots used of every active player")
        for pid, used in slots_used.items():
            limit = roster.slots[pid].max_val
            if not isinstance(used, int) or isinstance(used, bool) or used < 0:
                raise LeagueStateError(f"slots_used.{pid}", f"expected a count >= 0, got {used!r}")
            if used > limit:
                # The limit was lowered (max_job, max_active_player_job) while jobs were in flight: they stay
                # valid, and the player launches nothing new until fewer than the new limit are left.
                log.warning("%s has %d jobs in flight, above its limit of %d: no new job until they end",
                            pid, used, limit)
            roster.slots[pid].cur = used
        roster._add_pretrained(league)  # use_pretrain_init_historical turned on since the state was saved
        roster._add_reference_bots(league)  # bots added to the config since the state was saved join now
        return roster
