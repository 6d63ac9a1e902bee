"""`league eval --run-dir`: which checkpoints of a run stand for its main player (pure functions, no torch)."""

from __future__ import annotations

import pytest

from league_cli.progression import LineagePoint, PointResult, lineage, with_latest_published

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
    main = "main_player_default_0"
    newer = with_latest_published(line, main, 12, "main_player_default_0/v0000000012.pt", 1200, points=4)
    assert newer[:-1] == line[:-1]
    assert newer[-1] == LineagePoint(main, 1200, "main_player_default_0/v0000000012.pt", 12, True)
    assert with_latest_published(line, main, 9, "main_player_default_0/v0000000009.pt", None, points=4) == line
    assert with_latest_published(line, main, 12, "p/v12.pt", None, points=4)[-1].agent_steps == 900  # kept


def test_a_version_published_after_a_snapshot_of_the_status_version_is_added_after_it():
    """A snapshot that froze the active player's version stands for it in the line; a version the learner
    published after the last status record was then left out (a reviewer's run ended at the snapshot's v17
    while v18 was published). It is added, in the snapshot's place when the line is full."""
    players = [dict(p) for p in STATUS["players"]]
    players.append({"player_id": "main_player_default_0_9", "active": False, "parent_id": "main_player_default_0",
                    "agent_steps": 900, "checkpoint_path": "main_player_default_0/v0000000009_900.pt",
                    "checkpoint_version": 9})
    line = lineage({"players": players}, "main_player_default_0", points=4)
    assert [(p.checkpoint_version, p.active) for p in line] == [(3, False), (6, False), (9, False)]
    main = "main_player_default_0"
    newer = with_latest_published(line, main, 10, "main_player_default_0/v0000000010.pt", 1000, points=4)
    assert [(p.checkpoint_version, p.active) for p in newer] == [(3, False), (6, False), (9, False), (10, True)]
    assert newer[-1] == LineagePoint(main, 1000, "main_player_default_0/v0000000010.pt", 10, True)
    full = with_latest_published(line, main, 10, "main_player_default_0/v0000000010.pt", 1000, points=3)
    assert [(p.checkpoint_version, p.active) for p in full] == [(3, False), (6, False), (10, True)]
    assert with_latest_published(line, main, 9, "x", 900, points=4) == line  # nothing newer: left alone
    assert with_latest_published([], main, 2, "p/v2.pt", None, points=4) == [LineagePoint(main, 0, "p/v2.pt", 2, True)]


def test_the_strongest_opponent_beaten_goes_by_bot_strength_not_by_the_order_given():
    """`--opponent mcts:5,random` said random for a player that beat both: the last one beaten in list order."""
    result = PointResult(LineagePoint("p", 1, "p/v1.pt", 1, True))
    result.results = {"mcts:25": {"win_rate": 0.4}, "mcts:5": {"win_rate": 0.9}, "random": {"win_rate": 0.95}}
    assert result.strongest_beaten() == "mcts:5"
    result.results["mcts:25"]["win_rate"] = 0.6
    assert result.strongest_beaten() == "mcts:25"
    result.results = {"random": {"win_rate": 0.5}}
    assert result.strongest_beaten() == "-"


def test_snapshots_the_league_set_aside_are_left_out():
    players = [dict(p) for p in STATUS["players"]]
    players[1]["set_aside"] = "digest does not match the manifest (corrupt or tampered)"
    line = lineage({"players": players}, "main_player_default_0", points=4)
    assert [p.checkpoint_version for p in line] == [6, 9]


def test_a_count_that_is_no_count_is_a_malformed_record_naming_the_player_and_key():
    """A version of Infinity (JSON as Python reads it) raised OverflowError out of `league eval --run-dir`, a
    traceback (a review); a ValueError is the command's refusal."""
    players = [dict(p) for p in STATUS["players"]]
    players[1]["checkpoint_version"] = float("inf")
    with pytest.raises(ValueError, match="a malformed status record: player 'main_player_default_0_3' has "
                                         "checkpoint_version inf, not a count"):
        lineage({"players": players}, "main_player_default_0", points=4)


def test_the_score_that_names_an_opponent_beaten_is_shown_beside_the_win_rate(capsys):
    """A tic-tac-toe point read "30%" against mcts:10 and named mcts:10 beaten (a score of 60%: draws half), and
    the JSON held no score to tell why (a review)."""
    import json

    from league_cli.eval import _print_progression
    from league_cli.progression import progression_to_dict

    result = PointResult(LineagePoint("p", 100, "p/v1.pt", 1, True))
    result.results = {"random": {"win_rate": 1.0, "score": 1.0}, "mcts:10": {"win_rate": 0.3, "score": 0.6}}
    report = {**progression_to_dict("p", [result], 10), "search": 0}
    (point,) = json.loads(json.dumps(report))["points"]
    assert point["strongest_beaten"] == "mcts:10" and point["score"] == {"random": 1.0, "mcts:10": 0.6}
    _print_progression(report, ("random", "mcts:10"))
    out = capsys.readouterr().out
    assert "30% / 60%" in out and "the score (wins plus half the draws)" in out


def test_a_history_whose_newest_line_is_no_status_record_is_refused_naming_the_file(tmp_path):
    """`league status --json >> status_history.jsonl` or another program's file: `.get` of a list was a traceback
    out of `league eval --run-dir` (a review)."""
    import json

    from league_cli.progression import last_status

    history = tmp_path / "status_history.jsonl"
    history.write_text(json.dumps({"players": [], "payoff": []}) + "\n[1, 2]\n")
    with pytest.raises(ValueError, match="its newest line is not a status record"):
        last_status(history)
    history.write_text(json.dumps({"players": [{"active": True}]}) + "\n")  # a player without an id
    with pytest.raises(ValueError, match="its newest line is not a status record"):
        last_status(history)
