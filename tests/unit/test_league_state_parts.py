"""The league state in parts: what `take_state_changes` hands out after every step, written as it comes, adds up
to `state_dict()`; a finished job writes a few rows, not the league; a schema-1 store (one whole document) is
read as it is and replaced by parts at the first complete write."""

from __future__ import annotations

import json
import random
import sqlite3

import pytest

from league_service.base_league_manager import BaseLeagueManager
from league_service.config import Config, config_from_dict
from league_service.factory import create_league
from league_service.messages import Outcome, PlayerUpdate
from league_service.store import LeagueStore
from league_service.testing import JobRecorder, battle_result, solo_result

OUTCOMES = (Outcome.WIN, Outcome.DRAW, Outcome.LOSS)


def _battle_cfg() -> Config:
    return config_from_dict({
        "league": {
            "use_pretrain_init_historical": True,
            "pretrain_checkpoint_path": {"default": "sl/pretrained.pt"},
            "max_active_player_job": 2,
            "main_player": {"one_phase_step": 3000},
            "main_exploiter": {"one_phase_step": 2000, "reset_after_steps": 6000},
            "league_exploiter": {"one_phase_step": 2500, "mutate_prob": 0.5},
            "payoff": {"min_win_rate_games": 2, "decay": 0.99},
        }
    })


def _solo_cfg() -> Config:
    return config_from_dict({
        "league": {"league_type": "solo", "active_players": {"solo_active_player": 2}, "max_active_player_job": 2,
                   "solo_active_player": {"one_phase_step": 2000}},
        "env": {"name": "CartPole-v1"},
    })


def _json(value):
    return json.loads(json.dumps(value))


def _write(store: LeagueStore, league: BaseLeagueManager) -> None:
    with store.transaction() as tx:
        tx.put_league_changes(league.take_state_changes())
    assert store.load().league_state == _json(league.state_dict())


@pytest.mark.parametrize("kind", ["battle", "solo"])
def test_changes_written_after_every_step_add_up_to_the_whole_state(tmp_path, kind):
    league = create_league(_battle_cfg() if kind == "battle" else _solo_cfg(), lambda s, d: None, JobRecorder(),
                           rng_seed=3)
    store = LeagueStore(tmp_path / "state.sqlite")
    try:
        store.initialise("digest")
        first = league.take_state_changes()
        assert first.complete and len(first.players) == len(league.state_dict()["players"])
        with store.transaction() as tx:
            tx.put_league_changes(first)
        rng = random.Random(5)
        steps: dict[str, int] = {}
        for _ in range(10):
            for spec in league.launch_ready_jobs():
                _write(store, league)  # slots and the opponent choice's rng: the header
                if kind == "battle":
                    result = battle_result(spec.players, [rng.choice(OUTCOMES) for _ in range(3)])
                else:
                    result = solo_result(spec.launch_player, [rng.random() for _ in range(3)])
                league.finish_job(result)
                _write(store, league)
            for player in league.active_players:
                pid = player.player_id
                steps[pid] = steps.get(pid, 0) + rng.randrange(500, 1500)
                version = steps[pid] // 100
                outcome = league.update_active_player(PlayerUpdate(
                    pid, version, steps[pid], f"{pid}/v{version}.pt", version,
                    reset_applied_version=version if rng.random() < 0.5 else 0,
                ))
                assert outcome is not None
                _write(store, league)
            league.snapshot_ready_players()
            _write(store, league)
        status = league.status()
        assert status.counters.snapshots >= 3 and len(league.historical_players) >= 3  # the script exercised them
        if kind == "battle":
            assert status.counters.mutations >= 1
    finally:
        store.close()


def test_a_finished_job_changes_one_payoff_record_and_two_ratings(tmp_path):
    league = create_league(_battle_cfg(), lambda s, d: None, JobRecorder(), rng_seed=3)
    league.take_state_changes()
    (spec, *_) = league.launch_ready_jobs()
    league.take_state_changes()
    if spec.players[0] == spec.players[1]:  # self-play is not rated
        spec = next(s for s in league.launch_ready_jobs() if s.players[0] != s.players[1])
        league.take_state_changes()
    league.finish_job(battle_result(spec.players, [Outcome.WIN, Outcome.LOSS]))
    changes = league.take_state_changes()
    assert not changes.complete and changes.players == ()
    assert [(r["home"], r["away"]) for r in changes.payoff_records] == [tuple(sorted(spec.players))]
    assert sorted(pid for pid, _ in changes.ratings) == sorted(spec.players)
    assert changes.header["counters"]["matches"] == 2


def test_a_schema_1_store_is_read_as_is_and_replaced_by_parts(tmp_path):
    path = tmp_path / "state.sqlite"
    league = create_league(_battle_cfg(), lambda s, d: None, JobRecorder(), rng_seed=3)
    whole = _json(league.state_dict())
    conn = sqlite3.connect(path)  # what a schema-1 coordinator left: the league state as one document
    conn.executescript("""
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        INSERT INTO meta VALUES ('schema_version', '1'), ('created_at', '5.0'), ('config_digest', 'd');
    """)
    conn.execute("INSERT INTO meta VALUES ('league_state', ?)", (json.dumps(whole),))
    conn.commit()
    conn.close()
    store = LeagueStore(path)
    try:
        assert store.load().league_state == whole
        restored = create_league(_battle_cfg(), lambda s, d: None, JobRecorder(), rng_seed=4)
        restored.load_state_dict(store.load().league_state)
        with store.transaction() as tx:
            tx.put_league_changes(restored.take_state_changes())  # complete after a load: replaces the document
        assert store.load().league_state == whole
    finally:
        store.close()
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == ("4",)
        assert conn.execute("SELECT COUNT(*) FROM meta WHERE key = 'league_state'").fetchone() == (0,)
    finally:
        conn.close()


def test_a_state_is_split_into_parts_only_when_nothing_would_be_left_out():
    """The store keeps the header and the three collections item by item: a payoff entry besides its records, or
    a header entry named like a collection, would be dropped without a word, so they are refused."""
    from league_service.league_state import LeagueStateChanges, changes_from_state

    state = {"league_type": "solo", "players": [{"player_id": "p"}], "payoff": {"records": []}, "ratings": {}}
    changes = changes_from_state(state)
    assert changes.complete and changes.header == {"league_type": "solo"} and changes.players == ((0, state["players"][0]),)
    with pytest.raises(ValueError, match="state.payoff: expected only 'records'"):
        changes_from_state({**state, "payoff": {"records": [], "totals": {}}})
    with pytest.raises(ValueError, match="'ratings'"):
        changes_from_state({key: value for key, value in state.items() if key != "ratings"})
    with pytest.raises(ValueError, match=r"header: \['players'\] are collections"):
        LeagueStateChanges(header={"players": []})
