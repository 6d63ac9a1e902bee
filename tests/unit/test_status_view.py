"""`league status` tables stay readable as the league grows: a full win-rate matrix only for a few players,
then one row per active player; the historical players' table lists each parent's newest snapshots."""

from __future__ import annotations

from rich.console import Console

from common.proto.league.v1 import league_pb2
from league_service.status_view import HISTORICAL_ROWS, render_status

ACTIVE = ("main_player_default_0", "main_exploiter_default_0", "league_exploiter_default_0")


def _status(snapshots_per_parent: int) -> league_pb2.LeagueStatus:
    status = league_pb2.LeagueStatus(league_id="L", league_type="one_vs_one")
    for player in ACTIVE:
        status.players.add(player_id=player, player_type=player.rsplit("_", 2)[0], active=True)
    for parent in ACTIVE:
        for k in range(1, snapshots_per_parent + 1):
            status.players.add(player_id=f"{parent}_{k * 1000}", player_type="historical_player",
                               parent_id=parent, agent_steps=k * 1000, active=False)
    historical = [p for p in status.players if not p.active]
    # Decayed counts of 10 from 1,500 games played: the table shows the games played.
    status.payoff.add(home=ACTIVE[0], away=ACTIVE[1], wins=9, losses=1, games=10, win_rate=0.9, games_played=1500)
    status.payoff.add(home=ACTIVE[1], away=ACTIVE[0], wins=1, losses=9, games=10, win_rate=0.1, games_played=1500)
    for i, past in enumerate(historical):
        rate = 0.3 if past.player_id == f"{ACTIVE[1]}_2000" else 0.8  # the one main player beats least
        status.payoff.add(home=ACTIVE[0], away=past.player_id, wins=rate * (10 + i), losses=(1 - rate) * (10 + i),
                          games=10 + i, win_rate=rate, games_played=100 + i)
    return status


def _text(status: league_pb2.LeagueStatus) -> str:
    console = Console(width=200, record=True, file=open("/dev/null", "w"))
    console.print(render_status(status))
    return console.export_text()


def test_a_small_league_gets_the_whole_matrix():
    text = _text(_status(snapshots_per_parent=1))  # 6 players
    assert "home \\ away" in text and "main_exploiter_default_0_1000" in text
    assert "90% (1,500)" in text and "10% (1,500)" in text


def test_a_league_with_many_historical_players_gets_a_row_per_active_player():
    status = _status(snapshots_per_parent=20)  # 63 players: a matrix would squeeze every column to "…"
    text = _text(status)
    assert "home \\ away" not in text and "…" not in text.split("win rate")[1].split("jobs in flight")[0]
    assert "whole matrix of 63 players" in text and "vs 60 historical" in text
    win_rates = text.split("win rate (games played) of the active players")[1]
    (main_row,) = [line for line in win_rates.splitlines() if line.startswith("│ main_player_default_0 ")]
    assert "90% (1,500)" in main_row  # against the main exploiter
    assert "main_exploiter_default_0_2000 30%" in main_row  # the historical player it beats least
    played = sum(e.games_played for e in status.payoff if e.away.endswith("000"))
    assert f"({played:,})" in main_row


def test_a_default_rate_is_starred_and_left_out_of_the_weakest_and_the_historical_rate():
    """Pairs with fewer recent games than min_win_rate_games showed PFSP's default 50% as if measured (a new
    snapshot after 3 games, a reset pair after a few), could be named the historical player beaten least, and
    counted 50% in the rate against all historical players."""
    status = _status(snapshots_per_parent=20)
    new = f"{ACTIVE[1]}_21000"
    status.players.add(player_id=new, player_type="historical_player", parent_id=ACTIVE[1], agent_steps=21000)
    # 3 games, all lost by the main player: PFSP takes 50% until min_win_rate_games; the table says which it is.
    status.payoff.add(home=ACTIVE[0], away=new, losses=3, games=3, win_rate=0.5, games_played=3,
                      win_rate_is_default=True)
    status.payoff[0].win_rate_is_default = True  # (as if the main exploiter had just been reset)
    text = _text(status)
    (main_row,) = [line for line in text.split("of the active players")[1].splitlines()
                   if line.startswith("│ main_player_default_0 ")]
    assert "90%* (1,500)" in main_row
    assert "main_exploiter_default_0_2000 30% (" in main_row  # not the new one at a default 50%
    past = [e for e in status.payoff if e.home == ACTIVE[0] and e.away.endswith("000")]
    scored = sum(e.wins for e in past) / sum(e.games for e in past)  # the 3 losses count as losses
    assert f"{scored:.0%} ({sum(e.games_played for e in past):,})" in main_row
    assert "*: fewer recent games than league.payoff.min_win_rate_games" in " ".join(text.split())
    small = _status(snapshots_per_parent=1)
    assert "*:" not in _text(small)  # no note without a default rate
    small.payoff[0].win_rate_is_default = True
    assert "90%* (1,500)" in _text(small) and "league.payoff.min_win_rate_games" in " ".join(_text(small).split())


def test_historical_players_are_listed_newest_per_parent_up_to_a_limit():
    text = _text(_status(snapshots_per_parent=20))
    assert f"historical players (60; the newest {HISTORICAL_ROWS}, all with --json)" in text
    for parent in ACTIVE:
        assert f"{parent}_20000" in text and f"{parent}_11000 " in text  # the newest 10 of each
        assert f"{parent}_10000 " not in text
    small = _text(_status(snapshots_per_parent=2))
    assert "historical players (6)" in small
    # In the order they were taken, not by string: 2000 before 10000 would not hold in string order.
    assert small.index("main_player_default_0_1000 ") < small.index("main_player_default_0_2000 ")


def test_a_cluster_of_a_thousand_actors_lists_the_learners_the_dead_and_a_count():
    status = _status(snapshots_per_parent=1)
    status.now = 1000.0
    for i in range(3):
        status.workers.add(worker_id=f"learner-{i}", role=league_pb2.WORKER_ROLE_LEARNER, alive=True,
                           last_heartbeat=999.0)
    for i in range(1000):
        status.workers.add(worker_id=f"actor-{i:04d}", role=league_pb2.WORKER_ROLE_ACTOR, alive=i != 777,
                           last_heartbeat=999.0 if i != 777 else 900.0, job_ids=[f"j{i}"])
        status.jobs.add(job_id=f"j{i}", kind=league_pb2.JOB_KIND_COLLECT, launch_player=ACTIVE[0],
                        players=list(ACTIVE[:2]), worker_id=f"actor-{i:04d}", issued_at=float(i),
                        lease_deadline=1030.0)
    text = _text(status)
    flat = " ".join(text.split())  # captions wrap to the table's width
    assert "workers (1003, 1002 alive)" in text
    assert all(f"learner-{i}" in text for i in range(3)) and "actor-0777" in text  # the learners, the dead one
    assert "963 more in `league status --json`" in flat and "actor-0999" not in text
    assert "jobs in flight (1000)" in text and "960 more" in flat
    assert "j0 " in text and "j999" not in text  # the oldest jobs
    assert len(text.splitlines()) < 200


def test_league_runs_final_status_leaves_out_the_workers_it_stopped():
    """They were listed alive (their last heartbeat is less than a lease old) right after 'every process stopped'."""
    status = _status(snapshots_per_parent=1)
    status.now = 1000.0
    status.workers.add(worker_id="actor-0", role=league_pb2.WORKER_ROLE_ACTOR, alive=True, last_heartbeat=999.0)
    console = Console(width=200, record=True, file=open("/dev/null", "w"))
    console.print(render_status(status, workers=False))
    text = console.export_text()
    assert "workers (" not in text and "actor-0" not in text and "active players" in text
    assert "workers (1, 1 alive)" in _text(status)


def test_a_narrow_terminal_leaves_columns_out_instead_of_cutting_numbers_short():
    """At 80 or 100 columns rich cut every column short: steps read "28,8…" and "iter" vanished. Now the least
    needed columns are left out, in order, the caption says which, and every number is whole."""
    status = _status(snapshots_per_parent=2)
    for i, p in enumerate(status.players):
        p.agent_steps = 2_888_000 * (i + 1)
        p.checkpoint_path, p.checkpoint_version = f"{p.player_id}/v0000000217.pt", 217
    for width in (80, 100):
        console = Console(width=width, record=True, file=open("/dev/null", "w"))
        console.print(render_status(status))
        text = console.export_text()
        assert "…" not in "".join(line for line in text.splitlines() if "default_0" in line and "│" in line
                                  and "_0 " in line.split("│")[1]), text
        for p in status.players:
            assert f"{p.agent_steps:,}" in text, (width, p.agent_steps, text)
        assert "left out at this width: checkpoint" in text
        assert "90% (1,500)" in text  # the win rates whole, too
        assert max(map(len, text.splitlines())) <= width
    wide = _text(status)
    assert "left out" not in wide and "/v0000000217" in wide


def test_a_narrow_solo_table_names_only_columns_it_has():
    status = league_pb2.LeagueStatus(league_id="L", league_type="solo")
    status.players.add(player_id="solo_active_player_default_0", player_type="solo_active_player", active=True,
                       agent_steps=123_456_789, checkpoint_path="solo_active_player_default_0/v0000000012.pt",
                       checkpoint_version=12, learner_worker_id="learner-0", episodes=4_321)
    console = Console(width=60, record=True, file=open("/dev/null", "w"))
    console.print(render_status(status))
    text = console.export_text()
    assert "123,456,789" in text and "left out at this width: checkpoint" in text and "trueskill" not in text


def test_a_narrow_terminal_keeps_the_lease_and_age_of_jobs_in_flight():
    """At 80 or 100 columns the jobs table of a solo league ran past the edge and rich cut it off there: "lease
    left" and "age" were gone, the worker read "actor…", and nothing said so. Now players, launch player and
    kind give way, one at a time, and the caption names them."""
    status = league_pb2.LeagueStatus(league_id="L", league_type="solo", now=1000.0)
    for i in range(3):
        job = status.jobs.add(job_id=f"cacac041d764331{i}", kind=league_pb2.JOB_KIND_COLLECT,
                              launch_player="solo_active_player_default_0", worker_id=f"actor-{i}",
                              lease_deadline=1025.0, issued_at=990.0 + i)
        job.players.append("solo_active_player_default_0")
    for width in (80, 100):
        console = Console(width=width, record=True, file=open("/dev/null", "w"))
        console.print(render_status(status, workers=False))
        text = console.export_text()
        assert max(map(len, text.splitlines())) <= width
        assert "lease left" in text and "age" in text and "left out at this width: players" in text, text
        for i in range(3):
            assert f"cacac041d764331{i}" in text and f"actor-{i} " in text and f"{10.0 - i:.1f}s" in text, text
    wide = _text(status)
    assert "left out" not in wide and "solo_active_player_default_0 vs" not in wide
    assert "│ solo_active_player_default_0 │ solo_active_player_default_0 │" in wide


def test_a_checkpoint_is_shown_whole_where_it_fits():
    """The checkpoint column was cut at 36 characters whatever the width: `league run`'s last status, 200 columns
    wide in a pipe, read "solo_active_player_default_0/v00000…", the version cut off."""
    status = league_pb2.LeagueStatus(league_id="L", league_type="solo")
    status.players.add(player_id="solo_active_player_default_0", player_type="solo_active_player", active=True,
                       agent_steps=26_337, train_iteration=98, checkpoint_version=98, learner_worker_id="learner-0",
                       checkpoint_path="solo_active_player_default_0/v0000000098.pt", episodes=408)
    assert "solo_active_player_default_0/v0000000098.pt@98" in _text(status)
    console = Console(width=80, record=True, file=open("/dev/null", "w"))
    console.print(render_status(status))
    assert "left out at this width: checkpoint" in console.export_text()


def test_text_from_workers_and_errors_is_shown_as_it_is_not_read_as_markup():
    """A worker id, an actor's error or a path holding "[/x]" took `league status` down with a MarkupError;
    "[bold]" vanished, and ":ok:" became an emoji."""
    s = league_pb2.LeagueStatus(league_id="[/l]", league_type="one_vs_one")
    s.players.add(player_id="main_player_default_0", player_type="main_player", active=True,
                  checkpoint_path="/r/[/y]/v1.pt", learner_worker_id="learner[/z]",
                  last_job_error="KeyError: '[bold]x'", failed_attempts_in_a_row=1)
    s.players.add(player_id="h", player_type="main_player", active=False, checkpoint_path="/r/[/y]/v1.pt",
                  set_aside="/r/[/y]/v1.pt: damaged [red]")
    s.workers.add(worker_id="actor[/w]:ok:", hostname="[/h]")
    s.jobs.add(job_id="[/j]", worker_id="actor[/w]:ok:", players=["main_player_default_0", "h"])
    s.payoff.add(home="main_player_default_0", away="h", games=3, win_rate=0.5, games_played=3)
    console = Console(width=250, record=True, emoji=False)
    console.print(render_status(s))
    text = console.export_text()
    for literal in ("[/l]", "/r/[/y]/v1.pt", "learner[/z]", "KeyError: '[bold]x'", "damaged [red]", "actor[/w]:ok:",
                    "[/h]", "[/j]"):
        assert literal in text, literal


def test_a_solo_league_shows_no_ratings_for_snapshots_nor_a_return_before_any_episode():
    """A solo snapshot's Elo and TrueSkill were the starting values for good; a player with no episode showed a
    mean return of 0.00 (a review)."""
    status = league_pb2.LeagueStatus(league_id="L", league_type="solo")
    status.players.add(player_id="solo_active_player_default_0", player_type="solo_active_player", active=True)
    status.players.add(player_id="solo_active_player_default_0_100", player_type="historical_player",
                       parent_id="solo_active_player_default_0", agent_steps=100, active=False, elo=1200.0)
    text = _text(status)
    assert "elo" not in text and "trueskill" not in text and "1200" not in text
    row = next(line for line in text.splitlines() if line.lstrip("│ ").startswith("solo_active_player_default_0 "))
    assert "0.00" not in row


def test_status_json_keys_keep_their_order_whatever_the_values():
    """Fields left at zero came after the set ones, so a key's place moved with its value (a review)."""
    import json

    from league_service.status_view import status_to_json

    zero, set_ = league_pb2.LeagueStatus(league_id="L"), league_pb2.LeagueStatus(league_id="L", league_type="solo")
    zero.counters.jobs_issued, set_.counters.jobs_issued = 0, 5
    for compact in (False, True):
        keys = [list(json.loads(status_to_json(s, compact=compact))["counters"]) for s in (zero, set_)]
        assert keys[0] == keys[1] == sorted(keys[0])


def test_columns_that_is_not_a_positive_width_is_ignored(monkeypatch):
    """COLUMNS=0 made a console of width 0: `league status` printed nothing and exited 0 (a review)."""
    from league_service.status_view import PIPED_WIDTH, status_console

    for value in ("0", "abc", ""):
        monkeypatch.setenv("COLUMNS", value)
        assert status_console().width == PIPED_WIDTH  # stdout is not a terminal under pytest
    monkeypatch.setenv("COLUMNS", "120")
    assert status_console().width == 120


def _printed(status: league_pb2.LeagueStatus, width: int) -> str:
    console = Console(width=width, record=True, file=open("/dev/null", "w"))
    console.print(render_status(status))
    return console.export_text()


def test_ids_too_long_for_the_terminal_fold_and_the_numbers_stay_whole():
    """Ids run to 256 characters: kept whole on one line, rich cut the table at the terminal's edge, a step count
    of 123,456,789 read "123" and the other columns were gone (a review). Folded onto more lines instead."""
    status = league_pb2.LeagueStatus(league_id="L", league_type="one_vs_one")
    for i in range(3):
        status.players.add(player_id=f"main_player_{'x' * 58}_{i}", player_type="main_player", active=True,
                           agent_steps=123_456_789 + i)
    text = _printed(status, 80)
    assert max(map(len, text.splitlines())) <= 80
    for p in status.players:
        assert f"{p.agent_steps:,}" in text, text
    flat = "".join(line.split("│")[1].strip() for line in text.splitlines() if line.startswith("│"))
    assert all(p.player_id in flat for p in status.players)  # whole, over more lines


def test_many_active_players_pool_their_rates_against_each_other_where_a_column_each_does_not_fit():
    """A column per active opponent left every cell empty with 20 active players at 80 columns, and nothing said
    so (a review): their games against the active players taken together instead, and the caption says so."""
    status = league_pb2.LeagueStatus(league_id="L", league_type="one_vs_one")
    ids = [f"main_player_default_{i}" for i in range(20)]
    for player in ids:
        status.players.add(player_id=player, player_type="main_player", active=True)
    for home in ids:
        for away in ids:
            if home != away:
                status.payoff.add(home=home, away=away, wins=3, losses=1, games=4, win_rate=0.75, games_played=40)
    text = _printed(status, 80)
    assert max(map(len, text.splitlines())) <= 80
    assert "vs 20 active" in text and "the rate against each active player" in text
    rows = [line for line in text.split("of the active players")[1].splitlines() if "main_player_default_" in line]
    assert len(rows) == 20 and all("75% (760)" in row for row in rows), text
