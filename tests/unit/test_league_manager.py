"""The league manager: launch slots, its two threads, finish/release/update, snapshots and mutations."""

from __future__ import annotations

import shutil
import threading
from collections import Counter

import pytest

from league_service.base_league_manager import BaseLeagueManager
from league_service.config import Config, config_from_dict
from league_service.factory import create_league
from league_service.league_errors import (
    InvalidResultError,
    LeagueStateError,
    LeagueThreadError,
    NotActivePlayerError,
    SlotError,
    StaleUpdateError,
    UnknownPlayerError,
)
from league_service.messages import EpisodeOutcome, JobResult, JobSpec, Outcome, PlayerOutcome, PlayerUpdate
from league_service.one_vs_one_league import OneVsOneLeague
from league_service.players import CheckpointRef, HistoricalPlayer
from league_service.solo_league import SoloLeague
from league_service.testing import JobRecorder, battle_result, solo_result

W, D, L = Outcome.WIN, Outcome.DRAW, Outcome.LOSS
MAIN, EXPLOITER, LEAGUE_EXPLOITER = (
    "main_player_default_0",
    "main_exploiter_default_0",
    "league_exploiter_default_0",
)


def _cfg(**league) -> Config:
    return config_from_dict({"league": league})


def _no_copy(src: str, dst: str) -> None:
    raise AssertionError(f"unexpected checkpoint copy {src} -> {dst}")


@pytest.fixture
def make_league():
    """Build leagues that are closed at the end of the test, whatever happens."""
    leagues: list[BaseLeagueManager] = []

    def make(
        cfg: Config | None = None, save=_no_copy, launch=None, on_change=None, seed=0
    ) -> BaseLeagueManager:
        league = create_league(
            cfg or _cfg(), save, launch or JobRecorder(), on_change=on_change, rng_seed=seed
        )
        leagues.append(league)
        return league

    yield make
    for league in leagues:
        try:
            league.close()
        except LeagueThreadError:
            pass  # the test that made a thread fail asserts on it


def _update(league, pid, steps, path="", version=0, iteration=0, reset_applied=0):
    return league.update_active_player(PlayerUpdate(pid, iteration, steps, path, version, reset_applied))


# -- construction --------------------------------------------------------------------------------------------


def test_players_have_readable_ids_and_explicit_identity(make_league):
    cfg = _cfg(
        player_category=["terran", "zerg"],
        use_pretrain_init_historical=True,
        pretrain_checkpoint_path={"terran": "sl/terran.pt", "zerg": "sl/zerg.pt"},
    )
    league = make_league(cfg)
    assert [p.player_id for p in league.active_players] == [
        "main_player_terran_0",
        "main_exploiter_terran_0",
        "league_exploiter_terran_0",
        "main_player_zerg_0",
        "main_exploiter_zerg_0",
        "league_exploiter_zerg_0",
    ]
    pretrained = league.get_player("main_player_zerg_0_pretrain")
    assert isinstance(pretrained, HistoricalPlayer) and not pretrained.is_active
    assert (pretrained.parent_id, pretrained.checkpoint_path, pretrained.category) == (
        "main_player_zerg_0",
        "sl/zerg.pt",
        "zerg",
    )
    assert all(p.is_active for p in league.active_players)
    assert len(league.league_id) == 32 and league.league_id not in {
        p.player_id for p in league.active_players
    }
    with pytest.raises(UnknownPlayerError) as info:
        league.get_player("nobody")
    assert isinstance(info.value, KeyError) and "nobody" in str(info.value)


def test_create_league_picks_the_league_type(make_league):
    assert isinstance(make_league(), OneVsOneLeague)
    solo = config_from_dict({"league": {"league_type": "solo", "active_players": {"solo_active_player": 2}},
                             "env": {"name": "CartPole-v1"}})
    assert isinstance(make_league(solo), SoloLeague)
    with pytest.raises(ValueError, match="league_type"):
        SoloLeague(_cfg(), _no_copy, JobRecorder())


# -- launch slots --------------------------------------------------------------------------------------------


def test_launch_fills_every_free_slot_and_no_more(make_league):
    recorder = JobRecorder()
    league = make_league(_cfg(max_active_player_job=2), launch=recorder)
    specs = league.launch_ready_jobs()
    assert Counter(s.launch_player for s in specs) == {MAIN: 2, EXPLOITER: 2, LEAGUE_EXPLOITER: 2}
    assert all(
        isinstance(s, JobSpec) and s.players[0] == s.launch_player and len(s.players) == 2 for s in specs
    )
    assert recorder.drain() == specs
    assert league.launch_ready_jobs() == []
    league.release_job(EXPLOITER)
    (again,) = league.launch_ready_jobs()
    assert again.launch_player == EXPLOITER
    status = {p.player_id: p for p in league.status().players}
    assert (status[MAIN].slots_used, status[MAIN].slots_limit) == (2, 2)


def test_a_player_types_max_job_overrides_the_league_wide_limit(make_league):
    """The main player gets more of the actors than the exploiters that serve it (its learner more data)."""
    cfg = _cfg(max_active_player_job=2, main_player={"max_job": 4}, league_exploiter={"max_job": 1})
    league = make_league(cfg)
    specs = league.launch_ready_jobs()
    assert Counter(s.launch_player for s in specs) == {MAIN: 4, EXPLOITER: 2, LEAGUE_EXPLOITER: 1}
    limits = {p.player_id: p.slots_limit for p in league.status().players if p.slots_limit}
    assert limits == {MAIN: 4, EXPLOITER: 2, LEAGUE_EXPLOITER: 1}
    assert league.launch_ready_jobs() == []
    league.release_job(MAIN)
    assert [s.launch_player for s in league.launch_ready_jobs()] == [MAIN]


def test_a_saved_state_above_a_lowered_limit_loads_and_launches_nothing_until_below_it(make_league):
    cfg = _cfg(main_player={"max_job": 4})
    league = make_league(cfg)
    league.launch_ready_jobs()
    state = league.state_dict()
    assert state["slots_used"][MAIN] == 4
    make_league(cfg).load_state_dict(state)  # 4 of 4: fits
    lowered = make_league(_cfg())  # the default limit of 2: the 4 jobs in flight stay valid
    lowered.load_state_dict(state)
    assert not [job for job in lowered.launch_ready_jobs() if job.launch_player == MAIN]
    for _ in range(3):
        lowered.release_job(MAIN)
    assert [job.launch_player for job in lowered.launch_ready_jobs()].count(MAIN) == 1  # 1 left + 1 = the limit
    with pytest.raises(LeagueStateError, match="expected a count >= 0"):
        make_league(cfg).load_state_dict({**state, "slots_used": {**state["slots_used"], MAIN: -1}})


def test_release_without_a_held_slot_raises(make_league):
    league = make_league(
        _cfg(use_pretrain_init_historical=True, pretrain_checkpoint_path={"default": "sl.pt"})
    )
    with pytest.raises(SlotError, match="no launch slot"):
        league.release_job(MAIN)
    with pytest.raises(UnknownPlayerError):
        league.release_job("ghost")
    with pytest.raises(NotActivePlayerError, match="historical"):
        league.release_job(f"{MAIN}_pretrain")
    league.launch_ready_jobs()
    league.release_job(MAIN)
    league.release_job(MAIN)
    with pytest.raises(SlotError):
        league.release_job(MAIN)


def test_slots_never_exceed_the_limit_under_concurrent_finishes(make_league):
    limit, workers, target = 3, 6, 1200
    recorder = JobRecorder()
    lock = threading.Lock()
    in_flight: Counter = Counter()
    peak: Counter = Counter()
    done = {"jobs": 0}
    errors: list[BaseException] = []

    def launch(spec: JobSpec) -> None:
        with lock:
            in_flight[spec.launch_player] += 1
            peak[spec.launch_player] = max(peak[spec.launch_player], in_flight[spec.launch_player])
        recorder(spec)

    league = make_league(_cfg(max_active_player_job=limit), launch=launch)

    def work() -> None:
        try:
            while True:
                spec = recorder.jobs.get(timeout=30)
                if spec is None:
                    return
                with lock:
                    in_flight[spec.launch_player] -= 1
                    done["jobs"] += 1
                    n = done["jobs"]
                if n % 7 == 0:
                    league.release_job(spec.launch_player)
                else:
                    league.finish_job(battle_result(spec.players, [W, L, D]))
                if n % 50 == 0:
                    assert all(p.slots_used <= limit for p in league.status().players)
                if n == target:
                    for _ in range(workers):
                        recorder.jobs.put(None)
        except BaseException as exc:
            errors.append(exc)
            for _ in range(workers):
                recorder.jobs.put(None)

    threads = [threading.Thread(target=work) for _ in range(workers)]
    league.run()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    league.close()
    assert not errors, errors
    assert set(peak) == {MAIN, EXPLOITER, LEAGUE_EXPLOITER}
    assert max(peak.values()) <= limit
    status = league.status()
    counters = status.counters
    assert counters.jobs_finished + counters.jobs_released >= target
    assert counters.jobs_launched - counters.jobs_finished - counters.jobs_released == sum(
        p.slots_used for p in status.players
    )
    assert all(p.slots_used <= limit for p in status.players)


# -- threads -------------------------------------------------------------------------------------------------


def test_run_launches_and_close_returns_promptly(make_league):
    recorder = JobRecorder()
    league = make_league(launch=recorder)
    league.run()
    assert len(recorder.take(6)) == 6  # every slot filled; now both threads wait
    with pytest.raises(RuntimeError, match="already running"):
        league.run()
    league.close()
    assert not any(t.is_alive() for t in threading.enumerate() if t.name.startswith("league-"))
    league.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        league.run()


def test_close_without_run(make_league):
    league = make_league()
    league.close()
    league.close()


def test_a_finished_job_wakes_the_launch_thread(make_league):
    recorder = JobRecorder()
    league = make_league(launch=recorder)
    league.run()
    specs = recorder.take(6)
    exploiter_job = next(s for s in specs if s.launch_player == EXPLOITER)
    assert league.finish_job(battle_result(exploiter_job.players, [W, W])) == 2
    (refill,) = recorder.take(1)
    assert refill.launch_player == EXPLOITER


def test_a_thread_failure_stops_the_league_and_close_raises_it(make_league):
    calls = []

    def launch(spec: JobSpec) -> None:
        calls.append(spec)
        if len(calls) == 2:
            raise OSError("queue is gone")

    league = make_league(launch=launch)
    league.run()
    with pytest.raises(LeagueThreadError) as info:
        league.close()
    assert isinstance(info.value.__cause__, OSError)
    assert isinstance(league.failure, OSError)
    # The job that could not be launched, and those after it, gave their slots back.
    assert sum(p.slots_used for p in league.status().players) == 1
    league.close()  # reported once


def test_without_its_launch_thread_the_caller_takes_the_jobs_of_freed_slots(make_league):
    """launch_thread=False: nobody launches by itself; take_ready_jobs hands out a job per free slot."""
    launched = JobRecorder()
    league = create_league(_cfg(), _no_copy, launched, rng_seed=0, launch_thread=False)
    try:
        league.run()
        specs = league.take_ready_jobs()
        assert len(specs) == 3 * 2 and league.take_ready_jobs() == []  # 3 active players, 2 slots each
        assert launched.drain() == []  # launch_job_fn is not called
        league.finish_job(battle_result(specs[0].players, [Outcome.WIN]))
        (again,) = league.take_ready_jobs()
        assert again.launch_player == specs[0].launch_player
        assert [t.name for t in threading.enumerate() if t.name == "league-launch"] == []
    finally:
        league.close()


def test_a_player_that_wins_every_game_after_a_few_draws_still_gets_pfsp_jobs(make_league):
    """3 draws then 3,231 wins against a bot (decay 0.99) made the decayed win rate 1.0000000000000002: PFSP
    refused it, and the league stopped launching jobs for good (again after every restart on that state)."""
    league = create_league(_cfg(reference_bots=["random"]), _no_copy, JobRecorder(), rng_seed=0,
                           launch_thread=False)
    try:
        league.take_ready_jobs()
        league.finish_job(battle_result((MAIN, "bot_random"), [D] * 3 + [W] * 3231))
        assert league.payoff.win_rate(MAIN, "bot_random") <= 1.0
        opponents = set()
        for _ in range(40):  # the main player's pfsp branch (half of its jobs) weighs the bot by that rate
            for spec in league.take_ready_jobs():
                opponents.add(spec.players[1])
                league.finish_job(battle_result((spec.launch_player, spec.launch_player), [D]))
        assert league.failure is None
        assert "bot_random" in opponents or len(opponents) > 1
    finally:
        league.close()


# -- finishing jobs ------------------------------------------------------------------------------------------


def test_finish_job_updates_payoff_ratings_and_counters(make_league):
    league = make_league()
    specs = {s.launch_player: s for s in league.launch_ready_jobs()}
    players = specs[EXPLOITER].players
    assert players == (EXPLOITER, MAIN)
    league.finish_job(battle_result(players, [W, W, W, D]))
    status = league.status()
    by_id = {p.player_id: p for p in status.players}
    assert by_id[EXPLOITER].elo > 1200.0 > by_id[MAIN].elo
    assert by_id[EXPLOITER].trueskill_mu > 25.0 > by_id[MAIN].trueskill_mu
    assert by_id[EXPLOITER].episodes == by_id[MAIN].episodes == 4
    rows = {(r.home, r.away): r for r in status.payoff}
    # W, W, W, D with decay 0.99 before each game: the wins decayed once, twice and three times.
    wins = 0.99 + 0.99**2 + 0.99**3
    row = rows[EXPLOITER, MAIN]
    assert (row.wins, row.draws, row.losses, row.games) == (
        pytest.approx(wins),
        1.0,
        0.0,
        pytest.approx(wins + 1),
    )
    assert rows[MAIN, EXPLOITER].losses == pytest.approx(wins)
    assert (status.counters.matches, status.counters.jobs_finished, status.counters.jobs_launched) == (
        4,
        1,
        6,
    )


def _bad_results():
    exploiter_vs_main = (EXPLOITER, MAIN)
    return [
        (battle_result(("ghost", MAIN), [W]), UnknownPlayerError),
        (battle_result((EXPLOITER, "ghost"), [W]), UnknownPlayerError),
        (
            JobResult(
                EXPLOITER,
                exploiter_vs_main,
                (
                    *battle_result(exploiter_vs_main, [W]).episodes,
                    EpisodeOutcome((PlayerOutcome(EXPLOITER, W), PlayerOutcome(MAIN, W))),
                ),
            ),
            InvalidResultError,
        ),
        (JobResult(EXPLOITER, (EXPLOITER,), ()), InvalidResultError),
        (battle_result(exploiter_vs_main, [W]), None),  # valid, then finished twice: no slot left
    ]


def test_bad_results_raise_and_change_nothing(make_league):
    league = make_league(_cfg(max_active_player_job=1))
    league.launch_ready_jobs()
    for result, error in _bad_results()[:-1]:
        before = league.state_dict()
        with pytest.raises(error):
            league.finish_job(result)
        assert league.state_dict() == before
    result, _ = _bad_results()[-1]
    league.finish_job(result)
    before = league.state_dict()
    with pytest.raises(SlotError, match="finished twice"):
        league.finish_job(result)
    assert league.state_dict() == before
    with pytest.raises(TypeError):
        league.finish_job({"launch_player": EXPLOITER})  # type: ignore[arg-type]


# -- updates, snapshots, mutations ---------------------------------------------------------------------------


def test_update_errors(make_league):
    league = make_league(
        _cfg(use_pretrain_init_historical=True, pretrain_checkpoint_path={"default": "sl.pt"})
    )
    _update(league, MAIN, 100)
    with pytest.raises(StaleUpdateError, match="agent_steps"):
        _update(league, MAIN, 50)
    with pytest.raises(UnknownPlayerError):
        _update(league, "ghost", 100)
    with pytest.raises(NotActivePlayerError):
        _update(league, f"{MAIN}_pretrain", 100)
    assert league.get_player(MAIN).total_agent_step == 100


def test_snapshot_thread_copies_the_checkpoint_and_adds_a_historical_player(make_league, tmp_path):
    changed = threading.Event()
    copies = []

    def save(src: str, dst: str) -> None:
        copies.append((src, dst))
        shutil.copyfile(tmp_path / src, tmp_path / dst)

    def on_change() -> None:
        league.status()  # called outside the league's lock: this would deadlock otherwise
        changed.set()

    cfg = _cfg(main_player={"one_phase_step": 1000, "strong_win_rate": None})
    league = make_league(cfg, save=save, on_change=on_change)
    (tmp_path / "main").mkdir()
    (tmp_path / "main" / "ckpt_v3.pt").write_bytes(b"weights-v3")
    league.run()
    assert not _update(league, MAIN, 999, "main/ckpt_v3.pt", 3).mutated
    _update(league, MAIN, 1200, "main/ckpt_v3.pt", 3, iteration=7)
    assert changed.wait(timeout=30)
    league.close()
    snap = league.get_player(f"{MAIN}_1200")
    assert isinstance(snap, HistoricalPlayer)
    assert (snap.checkpoint_path, snap.checkpoint_version, snap.parent_id) == (
        "main/ckpt_v3_1200.pt",
        3,
        MAIN,
    )
    assert copies == [("main/ckpt_v3.pt", "main/ckpt_v3_1200.pt")]
    assert (tmp_path / "main" / "ckpt_v3_1200.pt").read_bytes() == b"weights-v3"
    status = {p.player_id: p for p in league.status().players}
    assert status[MAIN].snapshots == 1 and status[MAIN].mutations == 0  # main players never mutate
    assert status[f"{MAIN}_1200"].active is False and status[f"{MAIN}_1200"].parent_id == MAIN
    assert league.status().counters.snapshots == 1


def test_snapshot_without_a_checkpoint_copies_nothing(make_league):
    league = make_league(_cfg(main_player={"one_phase_step": 10, "strong_win_rate": None}))
    _update(league, MAIN, 10)
    (snap,) = league.snapshot_ready_players()
    assert (snap.player_id, snap.checkpoint_path) == (f"{MAIN}_10", "")
    assert league.snapshot_ready_players() == []


@pytest.mark.parametrize(
    "error, level, traceback",
    [
        # A full disk: one line, every update of the player while it lasts (no traceback: it says nothing more).
        (OSError(28, "No space left on device"), "ERROR", False),
        (RuntimeError("a bug of the copier"), "ERROR", True),
        # The learner retired the version meanwhile (fast publishers): expected, a warning without traceback.
        (FileNotFoundError("main/v1.pt: no published checkpoint"), "WARNING", False),
    ],
)
def test_a_failed_snapshot_copy_is_skipped_and_retried_without_stopping_the_league(
    make_league, caplog, error, level, traceback
):
    attempts = []

    def flaky_save(src: str, dst: str) -> None:
        attempts.append((src, dst))
        if len(attempts) == 1:
            raise error

    league = make_league(_cfg(main_player={"one_phase_step": 10, "strong_win_rate": None}), save=flaky_save)
    before = league.historical_players  # the reference bots
    _update(league, MAIN, 10, path=f"{MAIN}/v1.pt", version=1)
    with caplog.at_level("WARNING", logger="league_service.base_league_manager"):
        assert league.snapshot_ready_players() == []
    (record,) = [r for r in caplog.records if "snapshot of" in r.getMessage()]
    assert record.levelname == level and (record.exc_info is not None) == traceback
    assert league.failure is None and league.historical_players == before
    assert league.get_player(MAIN).is_trained_enough()  # it will be tried again
    (snap,) = league.snapshot_ready_players()
    assert snap.checkpoint_path == attempts[-1][1] and len(attempts) == 2


def test_mutation_resets_to_the_pretrained_checkpoint_and_tells_the_learner(make_league):
    cfg = _cfg(
        use_pretrain_init_historical=True,
        pretrain_checkpoint_path={"default": "sl/pretrained.pt"},
        league_exploiter={"one_phase_step": 100, "strong_win_rate": None, "mutate_prob": 1.0},
    )
    copies = []
    league = make_league(cfg, save=lambda s, d: copies.append((s, d)))
    _update(league, LEAGUE_EXPLOITER, 150, "le/v5.pt", 5)
    (snap,) = league.snapshot_ready_players()
    assert copies == [("le/v5.pt", "le/v5_150.pt")]
    assert (snap.checkpoint_path, snap.checkpoint_version) == ("le/v5_150.pt", 5)  # the trained weights
    player = league.get_player(LEAGUE_EXPLOITER)
    assert (player.checkpoint_path, player.checkpoint_version) == ("sl/pretrained.pt", 6)
    outcome = _update(league, LEAGUE_EXPLOITER, 160, "le/v6.pt", 6)
    assert (outcome.mutated, outcome.reset_checkpoint_path, outcome.reset_checkpoint_version) == (
        True,
        "sl/pretrained.pt",
        6,
    )
    assert player.checkpoint_path == "sl/pretrained.pt"  # the stale checkpoint was not taken
    assert league.checkpoint_of(LEAGUE_EXPLOITER) == CheckpointRef("sl/pretrained.pt", 6)
    assert not _update(league, LEAGUE_EXPLOITER, 170, "le/v7.pt", 7, reset_applied=6).mutated  # acknowledged
    assert (player.checkpoint_path, player.checkpoint_version) == ("le/v7.pt", 7)
    status = league.status()
    assert status.counters.mutations == 1
    assert next(p for p in status.players if p.player_id == LEAGUE_EXPLOITER).mutations == 1


def test_a_reset_player_starts_its_win_rates_afresh(make_league):
    """A main exploiter below min_valid_win_rate against the main player plays only that player's past versions,
    so its record against the main player never changed again, and the stuck rule reset it at every snapshot (a
    review). A reset player's records start afresh (the default rate); its games played stay counted."""
    cfg = _cfg(main_exploiter={"one_phase_step": 100, "strong_win_rate": None, "reset_after_steps": 100})
    league = make_league(cfg, save=lambda s, d: None)
    league.payoff.record_validated([(EXPLOITER, MAIN, Outcome.LOSS)] * 10)  # (its jobs' results)
    assert league.payoff.win_rate(EXPLOITER, MAIN) == 0.0
    _update(league, EXPLOITER, 100, "ex/v1.pt", 1)
    league.snapshot_ready_players()
    assert league.get_player(EXPLOITER).mutations == 1
    default = cfg.league.payoff.default_win_rate
    assert league.payoff.win_rate(EXPLOITER, MAIN) == default and league.payoff.win_rate(MAIN, EXPLOITER) == default
    assert league.payoff.record(EXPLOITER, MAIN)["played"] == 10
    changed = league.payoff.take_changed_records()  # what the state store writes
    assert any({r["home"], r["away"]} == {EXPLOITER, MAIN} and r["games"] == 0.0 for r in changed)


def test_a_reset_player_is_rated_afresh(make_league):
    """It kept the replaced weights' Elo and a TrueSkill sigma shrunk by their games (a review): the initial
    rating now, as the pretrained weights it is reset to are rated; its rated games stay counted."""
    cfg = _cfg(main_exploiter={"one_phase_step": 100, "strong_win_rate": None, "reset_after_steps": 100})
    league = make_league(cfg, save=lambda s, d: None)
    spec = next(s for s in league.launch_ready_jobs() if s.launch_player == EXPLOITER)
    loss = battle_result((EXPLOITER, MAIN), [Outcome.LOSS] * 20)
    league.finish_job(JobResult(loss.launch_player, loss.players, loss.episodes, league.generations(spec.players)))
    rated = league.status().players
    before = next(p for p in rated if p.player_id == EXPLOITER)
    assert before.elo < cfg.league.elo.initial and before.trueskill_sigma < cfg.league.trueskill.sigma
    _update(league, EXPLOITER, 100, "ex/v1.pt", 1)
    league.snapshot_ready_players()
    after = next(p for p in league.status().players if p.player_id == EXPLOITER)
    assert (after.elo, after.trueskill_mu, after.trueskill_sigma) == (
        cfg.league.elo.initial, cfg.league.trueskill.mu, cfg.league.trueskill.sigma)
    assert after.episodes == 20


def test_results_of_a_job_made_before_a_reset_are_not_the_reset_players_record(make_league):
    """A job in flight at a reset was played by the weights it replaced: its 32 losses became the reset main
    exploiter's fresh record at once (past min_win_rate_games), and the stuck rule reset it again at the next
    snapshot (a review). Such results are not counted; a job made after the reset counts as usual."""
    cfg = _cfg(main_exploiter={"one_phase_step": 100, "strong_win_rate": None, "reset_after_steps": 100})
    league = make_league(cfg, save=lambda s, d: None)
    before = next(s for s in league.launch_ready_jobs() if s.launch_player == EXPLOITER)
    leased_before = league.generations(before.players)  # as the coordinator's lease takes them
    assert leased_before == (0, 0)
    _update(league, EXPLOITER, 100, "ex/v1.pt", 1)
    league.snapshot_ready_players()
    assert league.get_player(EXPLOITER).mutations == 1
    stale = battle_result((EXPLOITER, MAIN), [Outcome.LOSS] * 32)
    assert league.finish_job(JobResult(stale.launch_player, stale.players, stale.episodes, leased_before)) == 0
    default = cfg.league.payoff.default_win_rate
    assert league.payoff.win_rate(EXPLOITER, MAIN) == default
    assert league.status().counters.matches == 0
    after = next(s for s in league.launch_ready_jobs() if s.launch_player == EXPLOITER)
    leased_after = league.generations(after.players)
    assert leased_after == (1, 0)
    fresh = battle_result((EXPLOITER, MAIN), [Outcome.LOSS] * 10)
    assert league.finish_job(JobResult(fresh.launch_player, fresh.players, fresh.episodes, leased_after)) == 10
    assert league.payoff.win_rate(EXPLOITER, MAIN) == 0.0
    with pytest.raises(ValueError, match="generations: must be"):
        JobResult(MAIN, (MAIN, EXPLOITER), (), (0,))


def test_main_exploiter_resets_after_its_step_limit(make_league):
    cfg = _cfg(main_exploiter={"one_phase_step": 100, "strong_win_rate": None, "reset_after_steps": 100})
    league = make_league(cfg, save=lambda s, d: None)
    _update(league, EXPLOITER, 100, "ex/v1.pt", 1)
    league.snapshot_ready_players()
    player = league.get_player(EXPLOITER)
    assert (player.checkpoint_path, player.checkpoint_version, player.mutations) == ("", 2, 1)



def test_resetting_after_one_phase_resets_at_every_snapshot_even_with_updates_during_the_copy(make_league):
    """AlphaStar resets a main exploiter at every snapshot; the config's recipe is reset_after_steps =
    one_phase_step. The reset was counted from the steps a learner reported while the snapshot was being
    copied (105 here), so at the next snapshot (200) fewer than 100 steps had passed and it did not reset."""
    cfg = _cfg(main_exploiter={"one_phase_step": 100, "strong_win_rate": None, "reset_after_steps": 100})
    reported_during_copy = []

    def save(src: str, dst: str) -> None:
        if not reported_during_copy:
            reported_during_copy.append(_update(league, EXPLOITER, 105, "ex/v2.pt", 2))

    league = make_league(cfg, save=save)
    _update(league, EXPLOITER, 100, "ex/v1.pt", 1)
    league.snapshot_ready_players()
    assert reported_during_copy and league.get_player(EXPLOITER).mutations == 1
    _update(league, EXPLOITER, 200, "ex/v4.pt", 4, reset_applied=3)
    league.snapshot_ready_players()
    assert league.get_player(EXPLOITER).mutations == 2


# -- solo ----------------------------------------------------------------------------------------------------


def test_solo_league_jobs_and_returns(make_league):
    cfg = config_from_dict(
        {
            "env": {"name": "CartPole-v1"},
            "league": {"league_type": "solo", "active_players": {"solo_active_player": 2}},
        }
    )
    league = make_league(cfg)
    specs = league.launch_ready_jobs()
    assert {s.players for s in specs} == {
        ("solo_active_player_default_0",),
        ("solo_active_player_default_1",),
    }
    league.finish_job(solo_result("solo_active_player_default_0", [10.0, 20.0]))
    status = {p.player_id: p for p in league.status().players}
    assert status["solo_active_player_default_0"].mean_return == 15.0
    assert status["solo_active_player_default_0"].episodes == 2
    assert status["solo_active_player_default_1"].mean_return == 0.0
    with pytest.raises(InvalidResultError):
        league.finish_job(battle_result(("solo_active_player_default_0",) * 2, [W]))
    assert league.status().payoff == ()
