"""A league's durable state as parts that change one at a time: what a commit writes instead of the whole state.

The league core's `state_dict()` is one document: a small header (ids, counters, launch slots, the opponent
choice's rng) and three collections that grow with the league: players, payoff records (one per pair of players
that met, so players squared) and ratings. A FinishJob changes the header, one payoff record and two ratings; an
UpdatePlayer one player. So the league hands out what changed since it was last asked (`LeagueStateChanges`) and
the store writes only those rows; reading them back assembles the same document `state_dict()` gives.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

# The collections stored one row per item, keyed by `part_key`.
PLAYERS = "players"
PAYOFF = "payoff"
RATINGS = "ratings"
COLLECTIONS = (PLAYERS, PAYOFF, RATINGS)


@dataclass(frozen=True)
class LeagueStateChanges:
    """What changed in a league's state: the header whole, and the changed items of each collection.

    `complete`: these are all of the state (the first changes a league hands out, or after `load_state_dict`),
    so whatever a store held before is replaced, not patched.
    """

    # Every top-level entry of state_dict() except the collections (small: always written whole).
    header: dict[str, Any]
    # (position in state_dict()["players"], that player's state) of each changed player.
    players: tuple[tuple[int, dict[str, Any]], ...] = ()
    # Changed entries of state_dict()["payoff"]["records"].
    payoff_records: tuple[dict[str, Any], ...] = ()
    # Changed entries of state_dict()["ratings"].
    ratings: tuple[tuple[str, dict[str, Any]], ...] = ()
    complete: bool = False

    def __post_init__(self) -> None:
        clash = set(COLLECTIONS) & set(self.header)
        if clash:
            raise ValueError(f"header: {sorted(clash)} are collections, stored item by item")


def changes_from_state(state: dict[str, Any]) -> LeagueStateChanges:
    """All of a league's `state_dict()` as changes (complete)."""
    for key in COLLECTIONS:
        if key not in state:
            raise ValueError(f"state: a league state has {key!r}")
    payoff = state[PAYOFF]
    if set(payoff) != {"records"}:
        raise ValueError(f"state.payoff: expected only 'records', got {sorted(payoff)}")
    return LeagueStateChanges(
        header={k: v for k, v in state.items() if k not in COLLECTIONS},
        players=tuple(enumerate(state[PLAYERS])),
        payoff_records=tuple(payoff["records"]),
        ratings=tuple(state[RATINGS].items()),
        complete=True,
    )


def payoff_record_key(record: dict[str, Any]) -> str:
    """What identifies a payoff record: its pair of players (battle) or its player (solo), as JSON."""
    if "home" in record:
        return json.dumps([record["home"], record["away"]])
    return json.dumps([record["player_id"]])


def assemble_state(
    header: dict[str, Any],
    players: Iterable[dict[str, Any]],
    payoff_records: Iterable[tuple[str, dict[str, Any]]],
    ratings: Iterable[tuple[str, dict[str, Any]]],
) -> dict[str, Any]:
    """The `state_dict()` these parts make up: players in position order, payoff records sorted by their key."""
    records = sorted(payoff_records, key=lambda kv: tuple(json.loads(kv[0])))
    return {
        **header,
        PLAYERS: list(players),
        PAYOFF: {"records": [record for _, record in records]},
        RATINGS: dict(ratings),
    }
