"""The coordinator's counters survive a restart exactly, though a commit of granted jobs alone does not write
them: every issued job is ended or in flight, and a restart counts it so."""

from __future__ import annotations

import sqlite3

from league_service.coordinator import Coordinator, CoordinatorSettings
from league_service.coordinator_messages import FinishReport, JobGrant
from league_service.coordinator_testing import small_league_config
from league_service.leases import JobEndStatus, WorkerRole
from league_service.messages import EpisodeOutcome, Outcome, PlayerOutcome
from league_service.store import read_counters


class _Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


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
    clock = _Clock()
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
    clock = _Clock()
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
