"""Reference bots as league members (`league.reference_bots`): fixed historical players the env plays itself.

The league core is driven directly: the bots join at start, PFSP picks them, their results count in the payoff
and the ratings, they survive a save and restore, and a league may gain one on restart but not lose one.
"""

from __future__ import annotations

import json
import os
import random

import pytest
from rich.console import Console

from common.config import ConfigError
from common.proto.league.v1 import league_pb2
from league_service.base_league_manager import BaseLeagueManager
from league_service.config import Config, config_from_dict, reference_bot_id
from league_service.factory import create_league
from league_service.league_errors import LeagueStateError
from league_service.messages import Outcome, PlayerUpdate
from league_service.players import ReferenceBotPlayer
from league_service.status_view import HISTORICAL_ROWS, render_status
from league_service.testing import JobRecorder, battle_result

BOTS = ("random", "mcts:25")
BOT_IDS = ("bot_random", "bot_mcts_25")


def _cfg(bots: tuple[str, ...] = BOTS, **league: object) -> Config:
    return config_from_dict({"league": {"reference_bots": list(bots), "payoff": {"min_win_rate_games": 2},
                                        "main_player": {"one_phase_step": 2000}, **league}})


def _league(cfg: Config, seed: int = 0) -> BaseLeagueManager:
    return create_league(cfg, lambda source, dest: None, JobRecorder(), rng_seed=seed)


def _play(league: BaseLeagueManager, rounds: int, seed: int) -> list[tuple[str, ...]]:
    """Launch every free slot and finish each job at once with random outcomes; returns the jobs' players."""
    rng = random.Random(seed)
    played = []
    for _ in range(rounds):
        for spec in league.launch_ready_jobs():
            played.append(spec.players)
            outcomes = [rng.choice((Outcome.WIN, Outcome.LOSS, Outcome.DRAW)) for _ in range(4)]
            league.finish_job(battle_result(spec.players, outcomes))
    return played


def test_bot_ids_are_the_canonical_spec():
    assert [reference_bot_id(b) for b in ("random", "mcts:25", "mcts")] == ["bot_random", "bot_mcts_25",
                                                                          "bot_mcts_100"]
    with pytest.raises(ValueError, match="simulations must be an integer"):
        reference_bot_id("mcts:lots")


def test_the_default_league_has_bots_and_a_config_for_another_game_does_not_inherit_them():
    assert config_from_dict({}).league.reference_bots == ("random", "mcts:10", "mcts:25")
    assert config_from_dict({"env": {"name": "openspiel:tic_tac_toe"}}).league.reference_bots == ()
    # The default's game with OpenSpiel's prefix is the default's game: its bots stay (they went, silently, and a
    # resume of a default league with such a file was refused as "bots gone"; a review).
    assert config_from_dict({"env": {"name": "openspiel:connect_four"}}).league.reference_bots == (
        "random", "mcts:10", "mcts:25")
    solo = {"league_type": "solo", "active_players": {"solo_active_player": 1}}
    assert config_from_dict({"env": {"name": "CartPole-v1"}, "league": solo}).league.reference_bots == ()
    named = {"env": {"name": "openspiel:tic_tac_toe"}, "league": {"reference_bots": ["mcts:5"]}}
    assert config_from_dict(named).league.reference_bots == ("mcts:5",)
    poker = {"env": {"name": "openspiel:kuhn_poker"}, "league": {"reference_bots": ["random"]}}
    assert config_from_dict(poker).league.reference_bots == ("random",)
    assert config_from_dict({"league": {"reference_bots": []}}).league.reference_bots == ()
    # A battle league seating the env's own bots lost its reference bots and credited games against the env's
    # bot to two league players: refused now (the bots play as reference bots).
    seats_own = {"league": {"main_player": {"env_kwargs": {"bots": {1: "random"}}}}}
    with pytest.raises(ConfigError, match="league.main_player.env_kwargs.bots: a battle league seats two"):
        config_from_dict(seats_own)


@pytest.mark.parametrize(
    ("data", "field", "message"),
    [
        ({"league": {"reference_bots": ["minimax"]}}, "league.reference_bots[0]", "unknown bot; one of .random."),
        ({"league": {"reference_bots": ["random", "mcts:0"]}}, "league.reference_bots[1]", "simulations must be within"),
        # Searched for over ten minutes a move, and no Ctrl-C gets into pyspiel's search.
        ({"league": {"reference_bots": ["mcts:100000000"]}}, "league.reference_bots[0]", r"within \[1, 100,000\]"),
        ({"league": {"reference_bots": ["mcts", "mcts:100"]}}, "league.reference_bots[1]", "same bot"),
        # A colon with nothing after it was taken as the default 100 simulations (and "random:" as random).
        ({"league": {"reference_bots": ["mcts:"]}}, "league.reference_bots[0]", "must be an integer"),
        ({"league": {"reference_bots": ["random:"]}}, "league.reference_bots[0]", "only mcts takes"),
        ({"league": {"reference_bots": ["mcts:²"]}}, "league.reference_bots[0]", "must be an integer"),
        ({"league": {"reference_bots": ["random"]}, "env": {"kwargs": {"bots": {1: "random"}}}}, "env.kwargs.bots",
         "cannot be combined"),
        ({"league": {"reference_bots": ["random"], "league_exploiter": {"job": {"env_kwargs": {"bots": {1: "random"}}}}}},
         "league.league_exploiter.job.env_kwargs.bots", "cannot be combined"),
        ({"env": {"name": "CartPole-v1"}, "league": {"reference_bots": ["random"]}}, "league.reference_bots",
         "plays bots itself"),
        # The env refused it only in the actors: every job against the bot failed, for as long as the league ran.
        ({"env": {"name": "openspiel:kuhn_poker"}, "league": {"reference_bots": ["random", "mcts:10"]}},
         "league.reference_bots", r"\['mcts:10'\] cannot play 'kuhn_poker', a game of imperfect information"),
        ({"env": {"name": "CartPole-v1"}, "league": {"league_type": "solo", "active_players": {"solo_active_player": 1},
                                                    "reference_bots": ["random"]}},
         "league.reference_bots", "solo league"),
    ],
)
def test_a_bad_bot_list_is_refused_naming_the_field(data, field, message):
    with pytest.raises(ConfigError, match=message) as info:
        config_from_dict(data)
    assert info.value.path == field


def test_bots_join_as_fixed_historical_players():
    league = _league(_cfg())
    bots = {p.player_id: p for p in league.historical_players}
    assert set(bots) == set(BOT_IDS)
    assert all(isinstance(p, ReferenceBotPlayer) and p.checkpoint_path == "" and not p.is_active
               for p in bots.values())
    assert bots["bot_mcts_25"].bot == "mcts:25"
    assert league.job_checkpoints(["main_player_default_0", "bot_mcts_25"]) == [
        ("", 0, True, ""), ("", 0, False, "mcts:25")]
    status = {p.player_id: p for p in league.status().players}
    assert status["bot_random"].player_type == "reference_bot" and not status["bot_random"].active


def test_pfsp_picks_bots_and_their_games_count():
    league = _league(_cfg(), seed=3)
    played = _play(league, rounds=40, seed=1)
    against_bots = [players for players in played if players[1] in BOT_IDS]
    assert {players[0] for players in against_bots} >= {"main_player_default_0", "league_exploiter_default_0"}
    # The main exploiter plays main players only.
    assert all(players[0] != "main_exploiter_default_0" for players in against_bots)
    status = league.status()
    games = {(row.home, row.away): row.games for row in status.payoff}
    assert games[("main_player_default_0", "bot_mcts_25")] > 0
    ratings = {p.player_id: p.elo for p in status.players}
    assert ratings["bot_mcts_25"] != 1200.0  # bots are rated like everyone


def test_bots_never_train_snapshot_or_take_updates():
    league = _league(_cfg())
    with pytest.raises(Exception, match="historical"):
        league.update_active_player(PlayerUpdate("bot_random", 1, 100, "bot/v1.pt", 1))
    league.update_active_player(PlayerUpdate("main_player_default_0", 1, 50_000, "main/v1.pt", 1))
    _play(league, rounds=20, seed=2)
    new = league.snapshot_ready_players()
    assert new and all(not isinstance(p, ReferenceBotPlayer) and p.parent_id for p in new)
    assert sum(isinstance(p, ReferenceBotPlayer) for p in league.historical_players) == len(BOTS)


def _roundtrip(league: BaseLeagueManager) -> dict:
    return json.loads(json.dumps(league.state_dict()))


def test_state_round_trip_keeps_the_bots():
    original = _league(_cfg(), seed=1)
    _play(original, rounds=10, seed=4)
    restored = _league(_cfg(), seed=9)
    restored.load_state_dict(_roundtrip(original))
    assert restored.status() == original.status()
    assert _play(restored, rounds=5, seed=5) == _play(original, rounds=5, seed=5)


def test_a_bot_added_to_the_config_joins_a_restored_league():
    original = _league(_cfg(bots=("random",)), seed=1)
    _play(original, rounds=5, seed=4)
    restored = _league(_cfg(), seed=1)
    restored.load_state_dict(_roundtrip(original))
    ids = [p.player_id for p in restored.status().players]
    assert ids[-1] == "bot_mcts_25" and "bot_random" in ids
    payoff = {(r.home, r.away): r.games for r in restored.status().payoff}
    assert payoff == {(r.home, r.away): r.games for r in original.status().payoff}
    # The next save has it: a second restore of that state needs no change.
    again = _league(_cfg(), seed=1)
    again.load_state_dict(_roundtrip(restored))
    assert again.status() == restored.status()


def test_a_bot_dropped_from_the_config_is_refused_and_changes_nothing():
    original = _league(_cfg(), seed=1)
    _play(original, rounds=3, seed=4)
    target = _league(_cfg(bots=("random",)), seed=1)
    before = target.state_dict()
    with pytest.raises(LeagueStateError, match=r"\['bot_mcts_25'\].*not in league.reference_bots") as info:
        target.load_state_dict(_roundtrip(original))
    assert info.value.field == "players"
    assert target.state_dict() == before


def test_a_malformed_saved_bot_is_refused():
    original = _league(_cfg(), seed=1)
    state = _roundtrip(original)
    next(p for p in state["players"] if p["player_type"] == "reference_bot").pop("bot")
    with pytest.raises(LeagueStateError, match="malformed reference bot"):
        _league(_cfg(), seed=1).load_state_dict(state)


def test_status_table_marks_the_bots():
    status = league_pb2.LeagueStatus(league_id="L", league_type="one_vs_one")
    status.players.add(player_id="main_player_default_0", player_type="main_player", active=True)
    for k in range(1, HISTORICAL_ROWS + 5):  # more snapshots than the table lists: the bots are still listed
        status.players.add(player_id=f"main_player_default_0_{k}", player_type="historical_player",
                           parent_id="main_player_default_0", agent_steps=k, active=False)
    status.players.add(player_id="bot_mcts_25", player_type="reference_bot", active=False)
    console = Console(width=200, record=True, file=open(os.devnull, "w"))
    console.print(render_status(status))
    text = console.export_text()
    assert "bot_mcts_25" in text and "(reference bot)" in text
