"""`league eval --run-dir`: which checkpoints of a run stand for its main player (pure functions, no torch)."""

from __future__ import annotations

from league_cli.progression import LineagePoint, lineage, with_latest_published

STATUS = {
    "players": [
        {"player_id": "main_player_default_0", "player_type": "main_player", "active": True, "agent_steps": 900,
         "checkpoint_path": "main_player_default_0/v0000000009.pt", "checkpoint_version": 9},
        {"player_id": "main_player_default_0_3", "active": False, "parent_id": "main_player_default_0",
         "agent_steps": 300, "checkpoint_path": "main_player_default_0/v0000000003_300.pt", "checkpoint_version": 3},
        {"player_id": "main_player_default_0_6", "active": False, "parent_id": "main_player_default_0",
         "agent_steps": 600, "checkpoint_path": "main_player_default_0/v0000000006_600.pt", "checkpoint_version": 6},
    ]
}


def test_lineage_orders_snapshots_then_the_active_players_latest():
    line = lineage(STATUS, "main_player_default_0", points=4)
    assert [(p.checkpoint_version, p.active) for p in line] == [(3, False), (6, False), (9, True)]


def test_a_version_published_after_the_last_status_replaces_the_active_point():
    """The learner publishes after the run's last status record and keeps only its newest versions: the
    status's version may be deleted by the time the run is judged (seen: v280 gone, v288 the latest)."""
    line = lineage(STATUS, "main_player_default_0", points=4)
    newer = with_latest_published(line, 12, "main_player_default_0/v0000000012.pt", 1200)
    assert newer[:-1] == line[:-1]
    assert newer[-1] == LineagePoint("main_player_default_0", 1200, "main_player_default_0/v0000000012.pt", 12, True)
    assert with_latest_published(line, 9, "main_player_default_0/v0000000009.pt", None) == line
    assert with_latest_published(line, 12, "p/v12.pt", None)[-1].agent_steps == 900  # steps unknown: kept


def test_a_line_of_snapshots_only_is_left_alone():
    snapshots = [pt for pt in lineage(STATUS, "main_player_default_0", points=4) if not pt.active]
    assert with_latest_published(snapshots, 12, "p/v12.pt", 1200) == snapshots


def test_snapshots_the_league_set_aside_are_left_out():
    players = [dict(p) for p in STATUS["players"]]
    players[1]["set_aside"] = "digest does not match the manifest (corrupt or tampered)"
    line = lineage({"players": players}, "main_player_default_0", points=4)
    assert [p.checkpoint_version for p in line] == [6, 9]
