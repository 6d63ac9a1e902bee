"""What a kill -9 leaves must restart into a league that goes on: a lease is never committed without the
players it names, and a launch-slot limit lowered while jobs were in flight does not stop the coordinator."""

from __future__ import annotations

import logging
import sqlite3
import threading
import time

import pytest

from league_service.coordinator import Coordinator, CoordinatorSettings
from league_service.coordinator_messages import FinishReport, JobGrant, NoJob, PlayerUpdateRequest
from league_service.coordinator_testing import small_league_config
from league_service.league_errors import LeagueStateError
from league_service.leases import JobEndStatus, WorkerRole
from league_service.messages import EpisodeOutcome, Outcome, PlayerOutcome, PlayerUpdate
from tests.manual_clock import ManualClock

MAIN = "main_player_default_0"


def _play_one_game(coordinator: Coordinator) -> None:
    """One completed collect job (the league has then played: bound to its env and network), then close."""
    try:
        coordinator.register_worker("a", WorkerRole.ACTOR, "host", "")
        grant = coordinator.get_job("a", WorkerRole.ACTOR, "", wait_s=0.0)
        home, away = (p.player_id for p in grant.players)
        episode = EpisodeOutcome((PlayerOutcome(home, Outcome.WIN), PlayerOutcome(away, Outcome.LOSS)), 5)
        coordinator.finish_job(FinishReport("a", grant.job_id, JobEndStatus.COMPLETED, (episode,), 5, 0, ""))
    finally:
        coordinator.close()


def _open(tmp_path, state, overrides=None, clock=None) -> Coordinator:
    coordinator = Coordinator(
        small_league_config(overrides),
        CoordinatorSettings(shared_root=tmp_path, state_path=state, lease_timeout_s=60.0, needs_learner=False,
                            rng_seed=0),
        clock=ManualClock() if clock is None else clock,
        expiry_thread=False,
    )
    coordinator.start()
    return coordinator


def _crash_copy(state, crashed) -> None:
    """What a kill -9 now would leave: a consistent copy of what was committed."""
    source, copy = sqlite3.connect(state), sqlite3.connect(crashed)
    try:
        source.backup(copy)
    finally:
        source.close()
        copy.close()


def test_a_restart_with_fewer_launch_slots_than_jobs_in_flight_keeps_them_and_launches_no_more(tmp_path):
    state = tmp_path / "state.sqlite"
    first = _open(tmp_path, state)
    try:
        first.register_worker("a", WorkerRole.ACTOR, "host", "")
        grants = [first.get_job("a", WorkerRole.ACTOR, "", wait_s=0.0) for _ in range(4)]  # 2 slots per player
        assert all(isinstance(g, JobGrant) for g in grants)
    finally:
        first.close()

    second = _open(tmp_path, state, {"league": {"max_active_player_job": 1}})
    try:
        players = {p.player_id: p for p in second.status().league.players if p.active}
        assert {(p.slots_used, p.slots_limit) for p in players.values()} == {(2, 1)}
        assert isinstance(second.get_job("a", WorkerRole.ACTOR, "", wait_s=0.0), NoJob)
        # Both of a player's jobs must end before it launches again, now one at a time.
        mine = [g for g in grants if g.launch_player == MAIN]
        for grant in mine:
            home, away = (p.player_id for p in grant.players)
            episode = EpisodeOutcome((PlayerOutcome(home, Outcome.WIN), PlayerOutcome(away, Outcome.LOSS)), 5)
            second.finish_job(FinishReport("a", grant.job_id, JobEndStatus.COMPLETED, (episode,), 5, 0, ""))
        again = second.get_job("a", WorkerRole.ACTOR, "", wait_s=0.0)
        assert isinstance(again, JobGrant) and again.launch_player == MAIN
        assert isinstance(second.get_job("a", WorkerRole.ACTOR, "", wait_s=0.0), NoJob)  # the exploiter's 2 remain
    finally:
        second.close()


def test_a_job_leased_before_a_restart_is_held_to_the_episodes_it_was_granted_with(tmp_path):
    """The lease's episode_num was not stored: after a restart a finish of a job granted with 4 episodes counted
    1,000 (the wire bound alone held), each in the payoff and ratings. A config changed meanwhile does not move
    the bound of the jobs already granted."""
    from league_service.errors import InvalidArgumentError

    state = tmp_path / "state.sqlite"
    first = _open(tmp_path, state)
    try:
        first.register_worker("a", WorkerRole.ACTOR, "host", "")
        grant = first.get_job("a", WorkerRole.ACTOR, "", wait_s=0.0)
        assert isinstance(grant, JobGrant) and grant.episode_num == 4
    finally:
        first.close()
    second = _open(tmp_path, state, {"env": {"episode_num": 8}})
    try:
        home, away = (p.player_id for p in grant.players)
        episode = EpisodeOutcome((PlayerOutcome(home, Outcome.WIN), PlayerOutcome(away, Outcome.LOSS)), 5)
        episodes = second.status().counters.episodes
        with pytest.raises(InvalidArgumentError, match=f"^episodes: job '{grant.job_id}' asked for 4 episodes, got 5"):
            second.finish_job(FinishReport("a", grant.job_id, JobEndStatus.COMPLETED, (episode,) * 5, 25, 0, ""))
        assert second.status().counters.episodes == episodes
        ack = second.finish_job(FinishReport("a", grant.job_id, JobEndStatus.COMPLETED, (episode,) * 4, 20, 0, ""))
        assert ack.episodes_counted == 4 and not ack.duplicate
        again = second.get_job("a", WorkerRole.ACTOR, "", wait_s=0.0)
        assert isinstance(again, JobGrant) and again.episode_num == 8  # granted now: the config's
    finally:
        second.close()


def test_a_job_naming_a_snapshot_not_yet_recorded_is_committed_with_it(tmp_path):
    """The snapshot thread adds a historical player under the league's lock and records the change under the
    coordinator's lock afterwards. A job granted in between (here: held open) must not reach the disk alone."""
    overrides = {"coordinator": {"max_job_attempts": 1, "job_retry_backoff_s": 0.0, "max_job_retry_backoff_s": 0.0}}
    state, crashed = tmp_path / "state.sqlite", tmp_path / "crashed.sqlite"
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "main.pt").write_bytes(b"weights")
    gate = threading.Event()
    first = _open(tmp_path, state, overrides)
    try:
        league = first._league
        record = league._on_change
        league._on_change = lambda: (gate.wait(30), record())  # the snapshot thread waits inside the window
        first.register_worker("a", WorkerRole.ACTOR, "host", "")
        first.register_worker("l", WorkerRole.LEARNER, "host", "127.0.0.1:1")
        grants = [first.get_job("a", WorkerRole.ACTOR, "", wait_s=0.0) for _ in range(4)]
        first.update_player(PlayerUpdateRequest("l", PlayerUpdate(MAIN, 1, 20_000, "ckpt/main.pt", 1, 0)))
        deadline = time.monotonic() + 10
        while not league.historical_players and time.monotonic() < deadline:
            time.sleep(0.02)
        snapshot = league.historical_players[0].player_id
        naming = None
        for _ in range(100):  # fail the main player's jobs (given up at once) until a new one plays the snapshot
            failed = next(g for g in grants if g.launch_player == MAIN)
            grants.remove(failed)
            first.finish_job(FinishReport("a", failed.job_id, JobEndStatus.FAILED, (), 0, 0, "boom"))
            grant = first.get_job("a", WorkerRole.ACTOR, "", wait_s=0.0)
            grants.append(grant)
            if snapshot in [p.player_id for p in grant.players]:
                naming = grant
                break
        assert naming is not None
        _crash_copy(state, crashed)
    finally:
        gate.set()
        first.close()

    second = _open(tmp_path, crashed, overrides)
    try:
        assert snapshot in [p.player_id for p in second.status().league.players]
        home, away = (p.player_id for p in naming.players)
        episode = EpisodeOutcome((PlayerOutcome(home, Outcome.WIN), PlayerOutcome(away, Outcome.LOSS)), 5)
        ack = second.finish_job(FinishReport("a", naming.job_id, JobEndStatus.COMPLETED, (episode,), 5, 0, ""))
        assert not ack.duplicate and ack.episodes_counted == 1
    finally:
        second.close()


def test_a_state_is_not_resumed_with_a_config_of_another_env_or_network(tmp_path):
    """A coordinator restarted on a connect-four state with a tic-tac-toe config served it with one warning: the
    connect-four payoff matched tic-tac-toe jobs, and its checkpoints fit no learner's network."""
    import pytest

    from league_service.league_errors import LeagueStateError

    state = tmp_path / "state.sqlite"
    # A league that played no game and has no checkpoint (its env did not build) is bound to nothing yet: a first
    # run with a typo in env.name could not be fixed in its run directory.
    _open(tmp_path, state, {"env": {"name": "python:tic_tac_tow:Env"}}).close()
    _play_one_game(_open(tmp_path, state))  # the typo fixed
    # game_params make another game of the name (5x5 connect four: other shapes, another game's payoff): it
    # started with a warning that "the configuration changed".
    for overrides, key in (({"env": {"name": "openspiel:tic_tac_toe"}}, "env.name"),
                           ({"policy": {"model": {"hidden": [32]}}}, "policy.model.hidden"),
                           ({"env": {"kwargs": {"game_params": {"rows": 5, "columns": 5}}}},
                            "env.kwargs.game_params")):
        with pytest.raises(LeagueStateError, match=f"^{key}: the league in this state was made with "):
            Coordinator(small_league_config(overrides), CoordinatorSettings(shared_root=tmp_path, state_path=state),
                        expiry_thread=False)
    # What shapes no weights may change.
    _open(tmp_path, state, {"policy": {"ppo": {"learning_rate": 0.0003}}, "env": {"name": "openspiel:connect_four"}
                            }).close()
    # The game's defaults written out are the same game (they were refused as another).
    _open(tmp_path, state, {"env": {"kwargs": {"game_params": {"rows": 6, "columns": 7}}}}).close()


def test_a_config_change_is_said_once_naming_its_sections_and_run_changes_not_at_all(tmp_path, caplog,
                                                                                    monkeypatch):
    """Compared with the config the state was created with, every start after an allowed change (a learning rate)
    warned "the configuration changed", naming nothing, for good; a change of `run.seconds`, which the
    coordinator never reads, too (a review). Said once per change, at INFO, naming the sections; a start refused
    after it records nothing (the next start says it)."""
    import league_service.coordinator as coordinator_module

    state = tmp_path / "state.sqlite"
    _play_one_game(_open(tmp_path, state))

    def refused(players, root):
        raise LeagueStateError("shared_root", "none of the checkpoints is under the shared root")

    monkeypatch.setattr(coordinator_module, "_check_checkpoints_present", refused)
    with pytest.raises(LeagueStateError):
        _open(tmp_path, state, {"policy": {"ppo": {"learning_rate": 0.0003}}})
    monkeypatch.undo()

    def start_says(overrides) -> list[str]:
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="league_service.coordinator"):
            _open(tmp_path, state, overrides).close()
        return [r.getMessage() for r in caplog.records if "config" in r.getMessage() and "changed" in r.getMessage()]

    changed = {"policy": {"ppo": {"learning_rate": 0.0003}}, "run": {"seconds": 60}}
    (line,) = start_says(changed)
    assert "the config's policy changed since this league's last start" in line
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert start_says(changed) == []  # the same config again
    assert start_says({**changed, "run": {"seconds": 30}}) == []  # `league run`'s own section


def test_a_store_from_before_the_identity_record_learns_it_only_from_its_own_config(tmp_path):
    """A store written before stores kept what their league is bound to: recorded from whatever config came
    first, a wrong env given once (even in a start refused for other reasons) locked the league out of its own."""
    import pytest

    from league_service.league_errors import LeagueStateError

    state = tmp_path / "state.sqlite"
    _open(tmp_path, state).close()

    def identity():
        conn = sqlite3.connect(state)
        with conn:
            row = conn.execute("SELECT value FROM meta WHERE key = 'league_identity'").fetchone()
        conn.close()
        return row

    conn = sqlite3.connect(state)
    with conn:
        conn.execute("DELETE FROM meta WHERE key = 'league_identity'")
    conn.close()
    with pytest.raises(LeagueStateError, match="active players"):  # refused: the store stays as it was
        _open(tmp_path, state, {"env": {"name": "openspiel:tic_tac_toe"}, "league": {"active_players": {"main_player": 1}}})
    assert identity() is None
    _open(tmp_path, state, {"env": {"name": "openspiel:tic_tac_toe"}}).close()  # taken as before, but not recorded
    assert identity() is None
    _open(tmp_path, state).close()  # the config it was made with
    assert '"env":"connect_four"' in identity()[0].replace(" ", "")


def test_an_identity_saved_before_game_params_were_part_of_it_learns_them_from_its_own_config(tmp_path):
    """Not compared while unknown (the league may have been made with any), recorded from the config it was made
    with, and compared from then on."""
    import json

    import pytest

    from league_service.league_errors import LeagueStateError

    state = tmp_path / "state.sqlite"
    _open(tmp_path, state).close()

    def identity(value=None):
        conn = sqlite3.connect(state)
        with conn:
            if value is not None:
                conn.execute("UPDATE meta SET value = ? WHERE key = 'league_identity'", (value,))
            row = conn.execute("SELECT value FROM meta WHERE key = 'league_identity'").fetchone()
        conn.close()
        return json.loads(row[0])

    assert identity()["game_params"] == {"main_player": {}, "main_exploiter": {}}  # the game's defaults
    old = identity()
    del old["game_params"]
    identity(json.dumps(old))
    _play_one_game(_open(tmp_path, state))
    assert identity()["game_params"] == {"main_player": {}, "main_exploiter": {}}  # learned from its own config
    with pytest.raises(LeagueStateError, match="^env.kwargs.game_params: the league"):
        _open(tmp_path, state, {"env": {"kwargs": {"game_params": {"rows": 5, "columns": 5}}}})


def test_an_sqlite_database_of_something_else_is_not_taken_over(tmp_path):
    import pytest

    state = tmp_path / "notes.sqlite"
    conn = sqlite3.connect(state)
    with conn:
        conn.execute("CREATE TABLE notes (body TEXT)")
    conn.close()
    with pytest.raises(ValueError, match=r"an SQLite database of something else \(tables: notes\)"):
        _open(tmp_path, state)
    conn = sqlite3.connect(state)
    assert [name for (name,) in conn.execute("SELECT name FROM sqlite_master")] == ["notes"]  # left as it was
    conn.close()


def _open_at(root, state) -> Coordinator:
    return Coordinator(
        small_league_config(),
        CoordinatorSettings(shared_root=root, state_path=state, lease_timeout_s=60.0, needs_learner=False, rng_seed=0),
        clock=ManualClock(),
        expiry_thread=False,
    )


def test_a_state_restored_where_none_of_its_checkpoints_are_is_refused_and_one_missing_is_named(tmp_path, caplog):
    """A state moved to another shared root (or a mistyped `--shared-root`) started without a word: its
    historical players were set aside one failed job at a time and learners began again from fresh weights."""
    root, elsewhere, state = tmp_path / "root", tmp_path / "elsewhere", tmp_path / "state.sqlite"
    root.mkdir()
    elsewhere.mkdir()
    (root / "ckpt").mkdir()
    first = _open_at(root, state)
    try:
        first.register_worker("l", WorkerRole.LEARNER, "host", "127.0.0.1:1")
        ids = [p.player_id for p in first.status().league.players if p.active]
        for i, player in enumerate(ids):
            (root / "ckpt" / f"{i}.pt").write_bytes(b"weights")
            first.update_player(PlayerUpdateRequest("l", PlayerUpdate(player, 1, 100, f"ckpt/{i}.pt", 1, 0)))
    finally:
        first.close()

    with pytest.raises(LeagueStateError, match=r"shared_root: none of the 2 checkpoint\(s\).*elsewhere"):
        _open_at(elsewhere, state)

    (root / "ckpt" / "1.pt").unlink()
    with caplog.at_level(logging.WARNING, logger="league_service.coordinator"):
        second = _open_at(root, state)
    second.close()
    assert f"1 of the 2 checkpoint(s) this league's state names are not under the shared root {root}: " \
           f"{ids[1]} (ckpt/1.pt)" in caplog.text


def test_a_state_whose_versions_retention_retired_meanwhile_is_restored_with_a_warning(tmp_path, caplog):
    """A learner publishes on while the coordinator is away (until its lease lapses), and its retention retires
    the versions the state names: the root is the right one (the players' directories hold newer versions), so
    the league is restored, not refused as if --shared-root were wrong."""
    import numpy as np

    from common.checkpoint_store import CheckpointStore

    root, state = tmp_path / "root", tmp_path / "state.sqlite"
    root.mkdir()
    store = CheckpointStore(root, keep_last=2)
    weights = {"w": np.zeros(3, np.float32)}
    first = _open_at(root, state)
    try:
        first.register_worker("l", WorkerRole.LEARNER, "host", "127.0.0.1:1")
        ids = [p.player_id for p in first.status().league.players if p.active]
        for player in ids:
            ref = store.publish(player, weights, 1)
            first.update_player(PlayerUpdateRequest("l", PlayerUpdate(player, 1, 100, ref.path, 1, 0)))
    finally:
        first.close()
    for player in ids:
        for version in (2, 3, 4):
            store.publish(player, weights, version)
    store.close()

    with caplog.at_level(logging.WARNING, logger="league_service.coordinator"):
        second = _open_at(root, state)
    second.close()
    assert f"2 of the 2 checkpoint(s) this league's state names are not under the shared root {root}" in caplog.text


def test_a_restart_after_the_wall_clock_stepped_back_keeps_no_time_stored_ahead_of_it(tmp_path):
    """Stopped, then the wall clock set back an hour, then restarted: the worker silent since is taken as heard
    from at the restart at the latest (not alive a lease later, not for the hour too), and the failing player's
    jobs are held for their backoff, not for the hour too."""
    state, clock = tmp_path / "state.sqlite", ManualClock()
    clock.now = 100_000.0
    backoff = {"coordinator": {"max_job_attempts": 1, "job_retry_backoff_s": 5.0, "max_job_retry_backoff_s": 60.0}}
    first = _open(tmp_path, state, backoff, clock)
    try:
        first.register_worker("a", WorkerRole.ACTOR, "host", "")
        grant = first.get_job("a", WorkerRole.ACTOR, "", wait_s=0.0)
        assert isinstance(grant, JobGrant)
        first.finish_job(FinishReport("a", grant.job_id, JobEndStatus.FAILED, (), 0, 0, "boom"))
        [books] = first.status().job_failures
        assert books.held_until == clock.now + 5.0
    finally:
        first.close()

    clock.now -= 3600.0
    second = _open(tmp_path, state, backoff, clock)
    try:
        status = second.status()
        [books] = status.job_failures
        assert status.now < books.held_until <= status.now + 5.0
        clock.now += 61.0  # a lease timeout
        status = second.status()
        [worker] = status.workers
        assert worker.last_heartbeat <= status.now and not worker.alive
    finally:
        second.close()


def test_a_new_league_on_a_shared_root_holding_its_players_checkpoints_says_so(tmp_path, caplog):
    """A second league on the same shared root (or this one's state lost): its learners take the checkpoints
    there up as their own and publish among them. Right after a lost state (tests/integration/test_learner_service
    rebinds so), not for another league's players: the start says which players, once, so the two can be told
    apart. A root whose player directories hold nothing published (or other players' checkpoints) says nothing."""
    root = tmp_path / "root"
    (root / "someone_else").mkdir(parents=True)
    (root / "someone_else" / "v0000000003.pt").write_bytes(b"weights")
    (root / MAIN).mkdir()  # a directory alone: nothing published
    with caplog.at_level(logging.WARNING, logger="league_service.coordinator"):
        _open_at(root, tmp_path / "a.sqlite").close()
    assert "already holds checkpoints" not in caplog.text
    (root / MAIN / "v0000000051.pt").write_bytes(b"weights")
    with caplog.at_level(logging.WARNING, logger="league_service.coordinator"):
        _open_at(root, tmp_path / "b.sqlite").close()
    assert f"already holds checkpoints of {MAIN}, players of the new league" in caplog.text
    assert "another --shared-root" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="league_service.coordinator"):
        _open_at(root, tmp_path / "a.sqlite").close()  # a league resumed on its state: nothing to say
    assert "already holds checkpoints" not in caplog.text


EXPLOITER = "main_exploiter_default_0"
RESET_AT_SNAPSHOT = {"league": {"main_exploiter": {"one_phase_step": 100, "strong_win_rate": None,
                                                   "reset_after_steps": 100}}}
"""The main exploiter snapshots at 100 steps and is reset there (its reset_after_steps passed, below 20%)."""


def _reset_exploiter(coordinator: Coordinator, tmp_path) -> None:
    (tmp_path / "ckpt").mkdir(exist_ok=True)
    (tmp_path / "ckpt" / "ex.pt").write_bytes(b"weights")
    coordinator.update_player(PlayerUpdateRequest("l", PlayerUpdate(EXPLOITER, 1, 100, "ckpt/ex.pt", 1, 0)))
    deadline = time.monotonic() + 10
    while coordinator._league.get_player(EXPLOITER).mutations == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert coordinator._league.get_player(EXPLOITER).mutations == 1


def _finish_with_losses(coordinator: Coordinator, grant: JobGrant):
    home, away = (p.player_id for p in grant.players)
    episode = EpisodeOutcome((PlayerOutcome(home, Outcome.LOSS), PlayerOutcome(away, Outcome.WIN)), 5)
    return coordinator.finish_job(FinishReport("a", grant.job_id, JobEndStatus.COMPLETED, (episode,) * 4, 20, 0, ""))


def test_a_job_leased_before_a_reset_is_not_counted_after_a_restart_either(tmp_path):
    """The jobs table kept no reset generations: after a restart a job leased before its player's reset counted
    as if no reset had happened, the replaced weights' losses becoming the reset player's record (a review)."""
    state = tmp_path / "state.sqlite"
    first = _open(tmp_path, state, RESET_AT_SNAPSHOT)
    try:
        first.register_worker("a", WorkerRole.ACTOR, "host", "")
        first.register_worker("l", WorkerRole.LEARNER, "host", "127.0.0.1:1")
        grants = [first.get_job("a", WorkerRole.ACTOR, "", wait_s=0.0) for _ in range(4)]
        stale = next(g for g in grants if g.launch_player == EXPLOITER)
        _reset_exploiter(first, tmp_path)
    finally:
        first.close()
    second = _open(tmp_path, state, RESET_AT_SNAPSHOT)
    try:
        assert _finish_with_losses(second, stale).episodes_counted == 0
    finally:
        second.close()


def test_a_job_offered_before_a_reset_and_leased_after_it_is_counted(tmp_path):
    """Generations were stamped when a job was offered, the checkpoints read when it was leased: a job waiting
    for an actor at its player's reset was played wholly by the reset's weights, and its results thrown away
    (a review). A job counts with the generations of the weights it is leased to play."""
    first = _open(tmp_path, tmp_path / "state.sqlite", RESET_AT_SNAPSHOT)
    try:
        first.register_worker("a", WorkerRole.ACTOR, "host", "")
        first.register_worker("l", WorkerRole.LEARNER, "host", "127.0.0.1:1")
        _reset_exploiter(first, tmp_path)  # its jobs were offered (launched) before, none leased yet
        grants = [first.get_job("a", WorkerRole.ACTOR, "", wait_s=0.0) for _ in range(4)]
        played = next(g for g in grants if g.launch_player == EXPLOITER)
        assert played.players[0].checkpoint_version >= 1  # the reset's weights
        assert _finish_with_losses(first, played).episodes_counted == 4
    finally:
        first.close()


def test_a_job_redirected_to_a_moved_learner_waits_out_its_players_backoff(tmp_path):
    """A player whose jobs keep failing is held back (LEASES.md); a collect job revoked because its learner moved
    to another port was offered again at once, and leased while the player was held (a review)."""
    overrides = {"league": {"active_players": {"main_player": 1}},
                 "coordinator": {"max_job_attempts": 1, "job_retry_backoff_s": 5.0}}
    clock = ManualClock()
    coordinator = Coordinator(
        small_league_config(overrides),
        CoordinatorSettings(shared_root=tmp_path, state_path=tmp_path / "state.sqlite", lease_timeout_s=60.0,
                            needs_learner=True, rng_seed=0),
        clock=clock, expiry_thread=False,
    )
    coordinator.start()
    try:
        coordinator.register_worker("l", WorkerRole.LEARNER, "host", "127.0.0.1:1")
        assert isinstance(coordinator.get_job("l", WorkerRole.LEARNER, "127.0.0.1:1", wait_s=0.0), JobGrant)
        coordinator.register_worker("a", WorkerRole.ACTOR, "host", "")
        failing, playing = (coordinator.get_job("a", WorkerRole.ACTOR, "", wait_s=0.0) for _ in range(2))
        coordinator.finish_job(FinishReport("a", failing.job_id, JobEndStatus.FAILED, (), 0, 0, "boom"))
        assert isinstance(coordinator.get_job("a", WorkerRole.ACTOR, "", wait_s=0.0), NoJob)  # held back 5 s
        coordinator.register_worker("l", WorkerRole.LEARNER, "host", "127.0.0.1:2")  # restarted on another port
        assert isinstance(coordinator.get_job("l", WorkerRole.LEARNER, "127.0.0.1:2", wait_s=0.0), JobGrant)
        assert isinstance(coordinator.get_job("a", WorkerRole.ACTOR, "", wait_s=0.0), NoJob)  # still held
        clock.now += 5.0
        again = coordinator.get_job("a", WorkerRole.ACTOR, "", wait_s=0.0)
        assert isinstance(again, JobGrant) and again.learner_endpoint == "127.0.0.1:2"
        assert playing.job_id != again.job_id
    finally:
        coordinator.close()


def test_a_learn_job_carries_its_players_own_env_kwargs(tmp_path):
    """A learn lease has no job spec: its grant carried env.kwargs alone, so a view set in each player type's
    `env_kwargs` (5x5 connect four) reached the actors but not the learner, whose model then did not fit the
    actors' observations."""
    from league_service.coordinator_messages import JobGrant

    types = ("main_player", "main_exploiter")
    coordinator = Coordinator(
        small_league_config({"league": {t: {"env_kwargs": {"game_params": {"rows": 5, "columns": 5}}}
                                        for t in types}}),
        CoordinatorSettings(shared_root=tmp_path, state_path=tmp_path / "state.sqlite", lease_timeout_s=60.0,
                            rng_seed=0),
        clock=ManualClock(), expiry_thread=False,
    )
    coordinator.start()
    try:
        coordinator.register_worker("l", WorkerRole.LEARNER, "host", "127.0.0.1:7000")
        grant = coordinator.get_job("l", WorkerRole.LEARNER, "127.0.0.1:7000", wait_s=0.0)
        assert isinstance(grant, JobGrant)
        assert grant.env_kwargs["game_params"] == {"rows": 5, "columns": 5}
    finally:
        coordinator.close()


def test_a_worker_restarted_under_its_id_on_the_same_host_has_its_old_collect_jobs_released(tmp_path):
    """A restarted container keeps its hostname and pid, so its worker id: the old process's collect jobs,
    which it can never finish now (it is refused from then on), were left to expire a lease later, counted as
    a failed attempt of a worker said to have gone silent while the player's launch slot idled (a review)."""
    coordinator = _open(tmp_path, tmp_path / "state.sqlite")
    try:
        old, new = "host/pid 7/aaaa", "host/pid 7/bbbb"
        coordinator.register_worker("a", WorkerRole.ACTOR, "host", "", process=old)
        grants = [coordinator.get_job("a", WorkerRole.ACTOR, "", wait_s=0.0, process=old) for _ in range(4)]
        assert all(isinstance(g, JobGrant) for g in grants)  # every launch slot (2 players x 2)
        assert isinstance(coordinator.get_job("a", WorkerRole.ACTOR, "", wait_s=0.0, process=old), NoJob)
        coordinator.register_worker("a", WorkerRole.ACTOR, "host", "", process=new)
        status = coordinator.status()
        assert status.jobs == ()
        counters = status.counters  # ended, none of them an expiry or a failed attempt
        assert (counters.jobs_finished, counters.jobs_expired, counters.jobs_failed) == (4, 0, 0), counters
        assert not status.job_failures
        assert isinstance(coordinator.get_job("a", WorkerRole.ACTOR, "", wait_s=0.0, process=new), JobGrant)
        with pytest.raises(Exception, match="refused|used by"):  # the old process can finish nothing
            coordinator.finish_job(FinishReport("a", grants[0].job_id, JobEndStatus.COMPLETED, (), 0, 0, ""), old)
    finally:
        coordinator.close()


def _job_rows(path) -> list[tuple[str]]:
    connection = sqlite3.connect(path)
    try:
        return connection.execute("SELECT job_id FROM jobs").fetchall()
    finally:
        connection.close()


def test_a_finish_refused_for_an_expiry_it_recorded_waits_until_the_expiry_is_committed(tmp_path):
    """"The lease expired" made the worker drop its results. Sent before the expiry was committed, a crash took
    the expiry back, and the restarted coordinator counted the same finish (a review)."""
    clock = ManualClock()
    coordinator = _open(tmp_path, tmp_path / "state.sqlite", clock=clock)
    try:
        coordinator.register_worker("a", WorkerRole.ACTOR, "host", "")
        grant = coordinator.get_job("a", WorkerRole.ACTOR, "", wait_s=0.0)
        assert isinstance(grant, JobGrant)
        home, away = (p.player_id for p in grant.players)
        episode = EpisodeOutcome((PlayerOutcome(home, Outcome.WIN), PlayerOutcome(away, Outcome.LOSS)), 5)
        clock.now += 61.0  # past the 60 s lease
        refused: list[BaseException] = []

        def finish() -> None:
            try:
                coordinator.finish_job(FinishReport("a", grant.job_id, JobEndStatus.COMPLETED, (episode,), 5, 0, ""))
            except Exception as err:  # noqa: BLE001 - the refusal is what the test looks at
                refused.append(err)

        with coordinator._store._lock:  # a stalled disk: no commit can finish
            caller = threading.Thread(target=finish)
            caller.start()
            caller.join(0.5)
            assert caller.is_alive(), f"refused before the expiry it rests on was committed: {refused}"
            _crash_copy(tmp_path / "state.sqlite", tmp_path / "crashed.sqlite")
            assert _job_rows(tmp_path / "crashed.sqlite") == [(grant.job_id,)]  # what a crash now would keep
        caller.join(10.0)
        assert not caller.is_alive()
        assert len(refused) == 1 and "expired" in str(refused[0]), refused
        _crash_copy(tmp_path / "state.sqlite", tmp_path / "crashed.sqlite")
        assert _job_rows(tmp_path / "crashed.sqlite") == []
    finally:
        coordinator.close()
