"""The coordinator's counters survive a restart exactly, though a commit of granted jobs alone does not write
them: every issued job is ended or in flight, and a restart counts it so."""

from __future__ import annotations

import sqlite3
import threading

import pytest

from league_service.base_league_manager import _PlayerValues
from league_service.coordinator import Coordinator, CoordinatorSettings
from league_service.coordinator_messages import FinishReport, JobGrant
from league_service.coordinator_testing import small_league_config
from league_service.leases import JobEndStatus, WorkerRole
from league_service.messages import EpisodeOutcome, Outcome, PlayerOutcome
from league_service.store import read_counters
from tests.manual_clock import ManualClock


def _open(tmp_path, clock, state) -> Coordinator:
    coordinator = Coordinator(
        small_league_config(),
        CoordinatorSettings(shared_root=tmp_path, state_path=state, lease_timeout_s=60.0, needs_learner=False,
                            rng_seed=0),
        clock=clock,
        expiry_thread=False,
    )
    coordinator.start()
    return coordinator


def test_jobs_granted_after_the_last_counters_written_are_counted_after_a_restart(tmp_path):
    clock = ManualClock()
    state, crashed = tmp_path / "state.sqlite", tmp_path / "crashed.sqlite"
    first = _open(tmp_path, clock, state)
    try:
        first.register_worker("a", WorkerRole.ACTOR, "host", "")
        grants = [first.get_job("a", WorkerRole.ACTOR, "", wait_s=0.0) for _ in range(3)]
        assert all(isinstance(g, JobGrant) for g in grants)
        done = grants[0]
        home, away = (p.player_id for p in done.players)
        episode = EpisodeOutcome((PlayerOutcome(home, Outcome.WIN), PlayerOutcome(away, Outcome.LOSS)), 5)
        first.finish_job(FinishReport("a", done.job_id, JobEndStatus.COMPLETED, (episode,), 5, 0, ""))
        more = [first.get_job("a", WorkerRole.ACTOR, "", wait_s=0.0) for _ in range(2)]  # granted alone: no counters
        assert all(isinstance(g, JobGrant) for g in more)
        assert first.status().counters.jobs_issued == 5
        # What a kill -9 now would leave (a clean stop writes the counters): a consistent copy of the file.
        source, copy = sqlite3.connect(state), sqlite3.connect(crashed)
        try:
            source.backup(copy)
            stored = read_counters(copy)
        finally:
            source.close()
            copy.close()
        assert stored is not None and (stored.jobs_issued, stored.jobs_finished) == (3, 1)  # as of the finish
    finally:
        first.close()

    second = _open(tmp_path, clock, crashed)
    try:
        status = second.status()
        assert (status.counters.jobs_issued, status.counters.jobs_finished, len(status.jobs)) == (5, 1, 4)
    finally:
        second.close()


def test_the_scraped_figures_are_the_statuss_without_building_it(tmp_path):
    """Metrics once read them off a whole status() (every player's and worker's view, the payoff rows) under the
    lock every RPC takes: 160 ms per scrape at 6,000 players. Counted directly, they must still agree."""
    clock = ManualClock()
    coordinator = _open(tmp_path, clock, tmp_path / "state.sqlite")
    try:
        for worker in ("a", "b", "c"):
            coordinator.register_worker(worker, WorkerRole.ACTOR, "host", "")
        grants = [coordinator.get_job("a", WorkerRole.ACTOR, "", wait_s=0.0) for _ in range(3)]
        done = grants[0]
        home, away = (p.player_id for p in done.players)
        episode = EpisodeOutcome((PlayerOutcome(home, Outcome.WIN), PlayerOutcome(away, Outcome.LOSS)), 5)
        coordinator.finish_job(FinishReport("a", done.job_id, JobEndStatus.COMPLETED, (episode,), 5, 0, ""))
        clock.now += 45.0  # past the lease timeout (60 s) for nobody's jobs, but "b" and "c" now silent ...
        coordinator.heartbeat("a", ())
        clock.now += 20.0  # ... and past it: their workers are no longer alive
        figures, status = coordinator.figures(), coordinator.status()
        active = sum(1 for p in status.league.players if p.active)
        assert (figures.active_players, figures.historical_players) == (active, len(status.league.players) - active)
        assert figures.jobs_in_flight == len(status.jobs)
        assert figures.workers_alive == sum(1 for w in status.workers if w.alive) == 1
        assert (figures.matches, figures.jobs_finished, figures.jobs_issued) == (
            status.league.counters.matches, status.counters.jobs_finished, status.counters.jobs_issued)
    finally:
        coordinator.close()


def _free(lock) -> bool:
    """Whether another thread could take `lock` now (so no caller up the stack holds it)."""
    result = []
    thread = threading.Thread(target=lambda: result.append(lock.acquire(timeout=0) and (lock.release() or True)))
    thread.start()
    thread.join()
    return result[0]


def _episodes(grant, outcomes):
    home, away = (p.player_id for p in grant.players)
    return tuple(EpisodeOutcome((PlayerOutcome(home, o), PlayerOutcome(away, o.reverse())), 5) for o in outcomes)


def test_status_builds_the_payoff_rows_and_player_views_outside_the_locks_every_rpc_takes(tmp_path, monkeypatch):
    """With 6,000 players GetStatus held the coordinator's lock 0.1-0.4 s (payoff rows, player views): every
    GetJob, FinishJob and heartbeat waited. Only values are copied under the locks now, and the views are built
    after. The status is still of one moment: a FinishJob that lands while the views are built is not in it."""
    clock = ManualClock()
    coordinator = _open(tmp_path, clock, tmp_path / "state.sqlite")
    league = coordinator._league
    free_at, landed = [], []
    rows_of, view = type(league.payoff).rows_of, _PlayerValues.status

    def build_view(values):
        free_at.append(("view", _free(coordinator._lock), _free(league._lock)))
        if not landed:  # an RPC served between the copy and the build
            landed.append(coordinator.finish_job(FinishReport(
                "a", later.job_id, JobEndStatus.COMPLETED, _episodes(later, [Outcome.LOSS]), 5, 0, "")))
        return view(values)

    monkeypatch.setattr(type(league.payoff), "rows_of", lambda self, counts: free_at.append(
        ("rows", _free(coordinator._lock), _free(league._lock))) or rows_of(self, counts))
    monkeypatch.setattr(_PlayerValues, "status", build_view)
    try:
        coordinator.register_worker("a", WorkerRole.ACTOR, "host", "")
        grant, later = (coordinator.get_job("a", WorkerRole.ACTOR, "", wait_s=0.0) for _ in range(2))
        assert isinstance(grant, JobGrant) and isinstance(later, JobGrant)
        home, away = (p.player_id for p in grant.players)
        coordinator.finish_job(FinishReport("a", grant.job_id, JobEndStatus.COMPLETED,
                                            _episodes(grant, [Outcome.WIN, Outcome.WIN, Outcome.DRAW]), 15, 0, ""))
        status = coordinator.status()
        assert landed and all(took for _, *took in free_at for took in took), free_at
        assert {kind for kind, *_ in free_at} == {"rows", "view"}
        if home != away:
            row = next(r for r in status.league.payoff if (r.home, r.away) == (home, away))
            assert (row.wins, row.draws, row.losses) == pytest.approx((1.99, 1.0, 0.0), abs=0.02)
            assert row.win_rate == pytest.approx(0.83, abs=0.01)
        # Of the moment the values were copied: `later` in flight, its slot held, its episode not counted.
        assert later.job_id in {j.job_id for j in status.jobs}
        assert status.league.counters.matches == status.counters.episodes == 3
        players = {p.player_id: p for p in status.league.players}
        assert len(players) == len(league.payoff.players)
        for pid, player in players.items():
            in_flight = sum(1 for j in status.jobs if j.launch_player == pid)
            assert in_flight <= player.slots_used <= player.slots_limit
        now = coordinator.status()
        assert later.job_id not in {j.job_id for j in now.jobs} and now.league.counters.matches == 4
    finally:
        coordinator.close()


def test_a_workers_multi_line_error_is_logged_as_continuation_lines():
    """A worker's error text (a traceback) went into the log line by line: a line of it could pass for one of the
    coordinator's own (a review)."""
    from league_service.coordinator import _continued

    forged = "Traceback (most recent call last):\n2026-11-29 12:00:00 ERROR league: all jobs lost\nValueError: x"
    assert _continued(forged).splitlines()[1:] == ["    | 2026-11-29 12:00:00 ERROR league: all jobs lost",
                                                   "    | ValueError: x"]


def test_a_learner_asking_a_coordinator_without_learners_is_told_so(tmp_path):
    """It was told "every active player that trains with a learner has one", wrong under --without-learners,
    and asked again every second for ever with nothing useful to see (a review)."""
    from league_service.coordinator_messages import NoJob

    coordinator = _open(tmp_path, ManualClock(), tmp_path / "state.sqlite")
    try:
        coordinator.register_worker("l", WorkerRole.LEARNER, "host", "127.0.0.1:1")
        answer = coordinator.get_job("l", WorkerRole.LEARNER, "127.0.0.1:1", wait_s=0.0)
        assert isinstance(answer, NoJob) and "--without-learners" in answer.reason, answer
    finally:
        coordinator.close()
