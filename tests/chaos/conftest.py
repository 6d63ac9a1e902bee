"""Fixtures shared by the chaos scenarios.

`start_league` starts a real league as separate processes (tests/chaos/procs_league.py) that a test may
kill -9 piece by piece; whatever it started is stopped at the end of the test, failed or not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.chaos.procs_league import SELF_PLAY_LEAGUE, KillableLeague, LeagueLayout


@pytest.fixture
def start_league(tmp_path: Path) -> Iterator[Callable[..., KillableLeague]]:
    """`start_league(layout=None, name="league")` -> a started KillableLeague (default: SELF_PLAY_LEAGUE)."""
    leagues: list[KillableLeague] = []

    def start(layout: LeagueLayout | None = None, name: str = "league") -> KillableLeague:
        league = KillableLeague(tmp_path / name, layout or LeagueLayout(SELF_PLAY_LEAGUE))
        leagues.append(league)
        return league.start()

    try:
        yield start
    finally:
        for league in leagues:
            league.close()
