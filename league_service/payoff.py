"""Payoff: the league's memory of past games, shared by all players and used to choose future work.

Battle leagues keep, per pair of players, decayed counts of wins, draws and losses and derive win rates;
solo leagues keep each player's recent episode returns. Both are thread-safe (one lock per payoff) and
validate a whole job result before changing anything, so bad input never leaves half an update behind.
"""

from __future__ import annotations

import math
import threading
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from league_service.config import PayoffConfig
from league_service.league_errors import InvalidResultError, LeagueStateError, UnknownPlayerError
from league_service.messages import JobResult, Outcome
from league_service.status import PayoffRow

if TYPE_CHECKING:
    from league_service.players import Player


class BattleRecordDict(dict):
    """Games between two players from the first one's side: wins, draws, losses, games (floats, they decay),
    and the games actually played (an int, never decayed: what a status shows as the pair's game count).

    Multiplying by a factor scales every decayed count, which is how records decay.
    """

    data_keys = ("wins", "draws", "losses", "games")

    def __init__(
        self, wins: float = 0.0, draws: float = 0.0, losses: float = 0.0, games: float = 0.0, played: int = 0
    ) -> None:
        super().__init__(wins=float(wins), draws=float(draws), losses=float(losses), games=float(games),
                         played=int(played))

    def __mul__(self, factor: float) -> BattleRecordDict:
        return BattleRecordDict(*(self[k] * factor for k in self.data_keys), played=self["played"])

    __rmul__ = __mul__

    def __imul__(self, factor: float) -> BattleRecordDict:
        for key in self.data_keys:
            self[key] *= factor
        return self

    def reversed(self) -> BattleRecordDict:
        """The same games seen from the other player's side."""
        return BattleRecordDict(self["losses"], self["draws"], self["wins"], self["games"], self["played"])


class PayoffDict(defaultdict):
    """A record per key, made on first use: BattleRecordDict for battles, a bounded deque for solo players."""

    def __init__(self, factory: Callable[[], Any]) -> None:
        super().__init__(factory)


# (home, away, wins, draws, losses, games, played) of each pair that has played, from home's side (`counts()`).
PayoffCounts = list[tuple[str, str, float, float, float, float, int]]

_OUTCOME_KEY = {Outcome.WIN: "wins", Outcome.DRAW: "draws", Outcome.LOSS: "losses"}
_CONSISTENT = {(Outcome.WIN, Outcome.LOSS), (Outcome.LOSS, Outcome.WIN), (Outcome.DRAW, Outcome.DRAW)}


def battle_outcomes(result: JobResult) -> list[tuple[str, str, Outcome]]:
    """Per episode: (players[0], players[1], players[0]'s outcome). Call on a validated result."""
    home, away = result.players
    matches = []
    for episode in result.episodes:
        first, second = episode.player_outcomes
        outcome = first.outcome if first.player_id == home else second.outcome
        if home == away:  # self-play: the first listed seat stands for the launch player
            outcome = first.outcome
        matches.append((home, away, outcome))
    return matches


class _SharedPayoff:
    """What both payoffs share: the registered players (in the order they joined), a lock, and the keys of the
    records changed since `take_changed_records` last ran (the store writes only those)."""

    def __init__(self, cfg: PayoffConfig) -> None:
        self._cfg = cfg
        self._lock = threading.RLock()
        self._players: dict[str, Player] = {}
        self._changed: set[Any] = set()

    @property
    def players(self) -> tuple[Player, ...]:
        with self._lock:
            return tuple(self._players.values())

    def add_player(self, player: Player) -> None:
        with self._lock:
            if player.player_id in self._players:
                raise ValueError(f"player_id: {player.player_id!r} is already in the payoff")
            self._players[player.player_id] = player

    def forget_results_of(self, player_id: str) -> None:
        """Start `player_id`'s records afresh (a reset player); solo records are its episodes' returns: kept."""

    def has_player(self, player_id: str) -> bool:
        with self._lock:
            return player_id in self._players

    def _check_players_known(self, result: JobResult) -> None:
        for i, pid in enumerate(result.players):
            if pid not in self._players:
                raise UnknownPlayerError(pid, field=f"players[{i}]")


class BattleSharedPayoff(_SharedPayoff):
    """Records of two-player games, win rates with a minimum of games and a default, and decay."""

    def __init__(self, cfg: PayoffConfig) -> None:
        super().__init__(cfg)
        # Key: (a, b) with a < b; the record is from a's side.
        self._data: PayoffDict = PayoffDict(BattleRecordDict)

    @staticmethod
    def _key(home: str, away: str) -> tuple[tuple[str, str], bool]:
        return ((home, away), False) if home <= away else ((away, home), True)

    def validate(self, result: JobResult) -> None:
        """Raise InvalidResultError / UnknownPlayerError unless `result` is a well-formed battle result."""
        with self._lock:
            if len(result.players) != 2:
                raise InvalidResultError("players", f"a battle has two players, got {len(result.players)}")
            self._check_players_known(result)
            for i, episode in enumerate(result.episodes):
                outcomes = episode.player_outcomes
                ids = sorted(po.player_id for po in outcomes)
                if ids != sorted(result.players):
                    raise InvalidResultError(
                        f"episodes[{i}].players",
                        f"must name the match's players {list(result.players)}, got {ids}",
                    )
                pair = (outcomes[0].outcome, outcomes[1].outcome)
                if pair not in _CONSISTENT:
                    raise InvalidResultError(
                        f"episodes[{i}].players",
                        f"inconsistent outcomes {pair[0].value}/{pair[1].value} "
                        "(expected win/loss or draw/draw)",
                    )

    def update(self, result: JobResult) -> int:
        """Count every episode of a (validated here) result; returns the episodes counted.

        Each new game first decays the pair's record. Self-play games are not recorded: a player's win rate
        against itself is 0.5 by definition.
        """
        with self._lock:
            self.validate(result)
            return self.record_validated(battle_outcomes(result))

    def record_validated(self, matches: list[tuple[str, str, Outcome]]) -> int:
        """`update` for the `battle_outcomes` of a result `validate` accepted already (a league validates,
        rates, then counts); returns the episodes counted."""
        with self._lock:
            for home, away, outcome in matches:
                if home == away:
                    continue
                key, reverse = self._key(home, away)
                self._changed.add(key)
                record = self._data[key]
                record *= self._cfg.decay
                record["games"] += 1.0
                record["played"] += 1
                record[_OUTCOME_KEY[outcome.reverse() if reverse else outcome]] += 1.0
            return len(matches)

    def forget_results_of(self, player_id: str) -> None:
        """A player reset to other weights (a mutation) starts its records afresh: its win rates are the
        default again until it has played. The old ones were the discarded weights': a main exploiter below
        min_valid_win_rate against the main player played only that player's past versions, so its record
        against the main player never changed again, and the stuck rule reset it at every snapshot however it
        did (a review). The games played (`played`) stay counted."""
        with self._lock:
            for key, record in self._data.items():
                if player_id in key:
                    for name in BattleRecordDict.data_keys:
                        record[name] = 0.0
                    self._changed.add(key)

    def record(self, home: str, away: str) -> BattleRecordDict:
        """A copy of the record of `home` against `away`, from home's side."""
        with self._lock:
            key, reverse = self._key(home, away)
            record = self._data.get(key) or BattleRecordDict()
            return record.reversed() if reverse else BattleRecordDict(*record.values())

    def win_rate(self, home: str, away: str) -> float:
        """Home's win rate against away, draws counting half; the default below min_win_rate_games."""
        return float(self.win_rates(home, (away,))[0])

    def _too_few(self, games: float) -> bool:
        return games < self._cfg.min_win_rate_games or games <= 0.0

    def _rate(self, wins: float, draws: float, games: float) -> float:
        if self._too_few(games):
            return self._cfg.default_win_rate
        # wins, draws and games decay separately, so their roundings differ: after a draw and a long run of wins
        # (the default decay, ~3,200 wins) wins + draws / 2 came out an ulp above games, and PFSP refused the rate
        # 1.0000000000000002 (the league stopped launching jobs for good).
        return min(max((wins + 0.5 * draws) / games, 0.0), 1.0)

    def win_rates(self, home: str, aways: Sequence[str]) -> np.ndarray:
        """Home's win rate against each of `aways` (draws counting half; the default below min_win_rate_games),
        under one lock and copying no record: PFSP asks this of every historical player at each job, and a copy
        per opponent made a league exploiter's job cost ~29 ms with 5,000 historical players (a review), all of
        it under the league's lock."""
        rates = np.empty(len(aways), dtype=np.float64)
        with self._lock:
            data = self._data
            for i, away in enumerate(aways):
                if home == away:
                    rates[i] = 0.5
                    continue
                key, reverse = self._key(home, away)
                record = data.get(key)
                wins = "losses" if reverse else "wins"  # (the record is kept from the other side)
                rates[i] = (self._cfg.default_win_rate if record is None
                            else self._rate(record[wins], record["draws"], record["games"]))
        return rates

    def __getitem__(self, players: tuple[Player, Player | Sequence[Player]]) -> np.ndarray:
        """payoff[home, away_or_list] -> win rates of home against each away (a numpy array)."""
        home, away = players
        aways = [away] if not isinstance(away, Sequence) else away
        return self.win_rates(home.player_id, [a.player_id for a in aways])

    def rows(self) -> list[PayoffRow]:
        """Both sides of every pair that has played, sorted by (home, away)."""
        return self.rows_of(self.counts())

    def counts(self) -> PayoffCounts:
        """A copy of every pair's counts (a tuple each: cheap under the lock; `rows_of` builds the rows after).
        The coordinator's status copies them under the locks every RPC takes: 12,000 rows built there, with a
        `win_rate` call each that locked and copied the record again, held up every RPC 0.1-0.35 s."""
        with self._lock:
            return [(a, b, rec["wins"], rec["draws"], rec["losses"], rec["games"], rec["played"])
                    for (a, b), rec in self._data.items()]

    def rows_of(self, counts: PayoffCounts) -> list[PayoffRow]:
        """The rows of `counts()`: both sides of every pair, sorted by (home, away)."""
        rows = []
        for a, b, wins, draws, losses, games, played in counts:
            default = self._too_few(games)
            rows.append(PayoffRow(a, b, wins, draws, losses, games, self._rate(wins, draws, games), played, default))
            rows.append(PayoffRow(b, a, losses, draws, wins, games, self._rate(losses, draws, games), played,
                                  default))
        rows.sort(key=lambda r: (r.home, r.away))
        return rows

    def state_dict(self) -> dict[str, Any]:
        with self._lock:
            return {"records": [self._record_state(key) for key in sorted(self._data)]}

    def take_changed_records(self) -> list[dict[str, Any]]:
        """The records (as in `state_dict`) changed since the last call; forgets them."""
        with self._lock:
            changed, self._changed = self._changed, set()
            return [self._record_state(key) for key in sorted(changed)]

    def _record_state(self, key: tuple[str, str]) -> dict[str, Any]:
        a, b = key
        return {"home": a, "away": b, **self._data[key]}

    def load_records(self, state: dict[str, Any]) -> None:
        """Replace the records (players must already be added); validated before anything changes."""
        data = PayoffDict(BattleRecordDict)
        for i, row in enumerate(_list_of_dicts(state, "records")):
            try:
                home, away = str(row["home"]), str(row["away"])
                values = [float(row[k]) for k in BattleRecordDict.data_keys]
                if not all(math.isfinite(v) and v >= 0 for v in values):  # (a damaged or hand-edited state: a
                    # NaN count made a NaN win rate, PFSP raised, and the league stopped launching jobs for good)
                    raise ValueError(f"wins, draws, losses and games must be finite and >= 0, got {values}")
                played = row.get("played", 0)  # absent from records saved before it was counted
                if isinstance(played, bool) or not isinstance(played, int) or played < 0:
                    raise ValueError(f"played must be an integer >= 0, got {played!r}")
            except (KeyError, TypeError, ValueError) as exc:
                raise LeagueStateError(f"payoff.records[{i}]", f"malformed record: {exc}") from None
            for pid in (home, away):
                if not self.has_player(pid):
                    raise LeagueStateError(f"payoff.records[{i}]", f"unknown player {pid!r}")
            if home == away:  # never written (self-play is not recorded); its rows would contradict each other
                raise LeagueStateError(f"payoff.records[{i}]", f"a record of {home!r} against itself")
            key, reverse = self._key(home, away)
            record = BattleRecordDict(*values, played=played)
            data[key] = record.reversed() if reverse else record
        with self._lock:
            self._data, self._changed = data, set()


class SoloSharedPayoff(_SharedPayoff):
    """Each solo player's recent episode returns (a bounded deque) and its total episode count."""

    def __init__(self, cfg: PayoffConfig) -> None:
        super().__init__(cfg)
        self._data: PayoffDict = PayoffDict(lambda: deque(maxlen=cfg.solo_buffer_size))
        self._episodes: dict[str, int] = {}

    def validate(self, result: JobResult) -> None:
        with self._lock:
            if len(result.players) != 1:
                raise InvalidResultError("players", f"a solo job has one player, got {len(result.players)}")
            self._check_players_known(result)
            for i, episode in enumerate(result.episodes):
                ids = [po.player_id for po in episode.player_outcomes]
                if ids != list(result.players):
                    raise InvalidResultError(
                        f"episodes[{i}].players", f"must be exactly {list(result.players)}, got {ids}"
                    )

    def update(self, result: JobResult) -> int:
        with self._lock:
            self.validate(result)
            (pid,) = result.players
            for episode in result.episodes:
                self._data[pid].append(float(episode.player_outcomes[0].episode_return))
            self._episodes[pid] = self._episodes.get(pid, 0) + len(result.episodes)
            self._changed.add(pid)
            return len(result.episodes)

    def recent_returns(self, player_id: str) -> list[float]:
        with self._lock:
            return list(self._data.get(player_id, ()))

    def mean_return(self, player_id: str) -> float:
        """Of the recent returns. `math.fsum`, not `np.mean`: a status reads it for every player under the
        league's lock, and numpy's call overhead made that 5x slower (6,000 players: ~0.3 s). Each return is
        divided before the sum: returns near float64's limit are finite, and their sum overflowed (every status
        failed, and so did the coordinator's restart on that state)."""
        returns = self.recent_returns(player_id)
        n = len(returns)
        return math.fsum(r / n for r in returns) if returns else 0.0

    def episodes(self, player_id: str) -> int:
        with self._lock:
            return self._episodes.get(player_id, 0)

    def rows(self) -> list[PayoffRow]:
        return []

    def counts(self) -> PayoffCounts:
        return []

    def rows_of(self, counts: PayoffCounts) -> list[PayoffRow]:
        return []

    def state_dict(self) -> dict[str, Any]:
        with self._lock:
            return {"records": [self._record_state(pid) for pid in sorted(self._episodes)]}

    def take_changed_records(self) -> list[dict[str, Any]]:
        """The records (as in `state_dict`) changed since the last call; forgets them."""
        with self._lock:
            changed, self._changed = self._changed, set()
            return [self._record_state(pid) for pid in sorted(changed)]

    def _record_state(self, pid: str) -> dict[str, Any]:
        return {"player_id": pid, "returns": list(self._data.get(pid, ())), "episodes": self._episodes[pid]}

    def load_records(self, state: dict[str, Any]) -> None:
        data = PayoffDict(lambda: deque(maxlen=self._cfg.solo_buffer_size))
        episodes: dict[str, int] = {}
        for i, row in enumerate(_list_of_dicts(state, "records")):
            try:
                pid = str(row["player_id"])
                returns = [float(r) for r in row["returns"]]
                count = int(row["episodes"])
                if not all(math.isfinite(r) for r in returns):  # (as the battle records': a damaged state)
                    raise ValueError("returns must be finite")
                if count < 0:
                    raise ValueError(f"episodes must be >= 0, got {count}")
            except (KeyError, TypeError, ValueError) as exc:
                raise LeagueStateError(f"payoff.records[{i}]", f"malformed record: {exc}") from None
            if not self.has_player(pid):
                raise LeagueStateError(f"payoff.records[{i}]", f"unknown player {pid!r}")
            data[pid].extend(returns)
            episodes[pid] = count
        with self._lock:
            self._data, self._episodes, self._changed = data, episodes, set()


def _list_of_dicts(state: Any, key: str) -> Iterable[dict[str, Any]]:
    if not isinstance(state, dict) or not isinstance(state.get(key), list):
        raise LeagueStateError(f"payoff.{key}", "expected a list of records")
    for i, row in enumerate(state[key]):
        if not isinstance(row, dict):
            raise LeagueStateError(f"payoff.{key}[{i}]", "expected a mapping")
    return state[key]


def create_payoff(league_type: str, cfg: PayoffConfig) -> BattleSharedPayoff | SoloSharedPayoff:
    if league_type == "one_vs_one":
        return BattleSharedPayoff(cfg)
    if league_type == "solo":
        return SoloSharedPayoff(cfg)
    raise ValueError(f"league_type: unknown {league_type!r} (expected 'one_vs_one' or 'solo')")
