"""Failing collect jobs: retried up to max_job_attempts, then given up; a failing player's jobs back off
exponentially; a completed job ends the backoff; the books survive a restart. The real coordinator (league
core, lease table, SQLite store; no gRPC) with a fake clock."""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path

import pytest

from common.config import ConfigError
from league_service.coordinator import Coordinator, CoordinatorSettings
from league_service.coordinator_messages import FinishReport, JobGrant, NoJob
from league_service.coordinator_testing import FakeClock, small_league_config
from league_service.job_retries import JobRetryPolicy, bounded_error
from league_service.leases import JobEndStatus, WorkerRole
from league_service.messages import EpisodeOutcome, Outcome, PlayerOutcome

PLAYER = "solo_active_player_default_0"
TIMEOUT = 30.0


def solo_config(slots: int = 1, **coordinator):
    overrides = {"max_job_attempts": 3, "job_retry_backoff_s": 10.0, "max_job_retry_backoff_s": 40.0}
    overrides.update(coordinator)
    return small_league_config({
        "league": {"league_type": "solo", "active_players": {"solo_active_player": 1}, "max_active_player_job": slots},
        "env": {"name": "CartPole-v1"},
        "coordinator": overrides,
    })


class League:
    """A coordinator on `root` with one registered actor; `reopen` is a restart on the same state."""

    def __init__(self, root: Path, cfg, clock: FakeClock) -> None:
        self.root, self.cfg, self.clock = root, cfg, clock
        self.coord = self._open()

    def _open(self) -> Coordinator:
        coord = Coordinator(
            self.cfg,
            CoordinatorSettings(shared_root=self.root, lease_timeout_s=TIMEOUT, needs_learner=False, rng_seed=0),
            clock=self.clock,
            expiry_thread=False,
        )
        coord.start()
        coord.register_worker("actor", WorkerRole.ACTOR, "host", "")
        return coord

    def reopen(self) -> None:
        self.coord.close()
        self.coord = self._open()

    def job(self) -> JobGrant:
        grant = self.coord.get_job("actor", WorkerRole.ACTOR, "", wait_s=10.0)
        assert isinstance(grant, JobGrant), grant
        return grant

    def no_job(self, pending: int = 1) -> NoJob:
        """The answer while `pending` jobs wait (the league's launch thread offers them on its own)."""
        deadline = time.monotonic() + 10.0
        while self.coord.figures().jobs_pending < pending:
            assert time.monotonic() < deadline, "the league launched no job"
            threading.Event().wait(0.01)
        answer = self.coord.get_job("actor", WorkerRole.ACTOR, "", wait_s=0.0)
        assert isinstance(answer, NoJob), answer
        return answer

    def fail(self, grant: JobGrant, error: str = "EnvError: env 0 failed") -> None:
        self.coord.finish_job(FinishReport("actor", grant.job_id, JobEndStatus.FAILED, (), 5, 5, error))

    def complete(self, grant: JobGrant) -> None:
        episode = EpisodeOutcome((PlayerOutcome(PLAYER, Outcome.WIN, 1.0),), length=3)
        ack = self.coord.finish_job(FinishReport("actor", grant.job_id, JobEndStatus.COMPLETED, (episode,), 3, 3, ""))
        assert ack.episodes_counted == 1

    def books(self):
        (books,) = self.coord.status().job_failures
        return books

    def close(self) -> None:
        self.coord.close()


@pytest.fixture
def league_factory(tmp_path):
    opened: list[League] = []

    def open_league(cfg=None) -> League:
        league = League(tmp_path, cfg or solo_config(), FakeClock())
        opened.append(league)
        return league

    try:
        yield open_league
    finally:
        for league in opened:
            league.close()


def test_a_failing_job_is_retried_then_given_up_and_the_player_backs_off(league_factory):
    league = league_factory()
    clock = league.clock
    first = league.job()
    league.fail(first, "EnvError: boom\n--- env traceback ---\nTraceback ...\nValueError: boom")
    books = league.books()
    assert books.failures_in_a_row == 1 and books.jobs_given_up == 0 and books.held_until == 0
    assert "ValueError: boom" in books.last_error

    second = league.job()  # offered again at once, as a new job id, same players
    assert second.job_id != first.job_id and second.players == first.players
    league.fail(second)
    third = league.job()
    league.fail(third)  # the third attempt failed: the job is given up
    status = league.coord.status()
    assert status.counters.jobs_failed == 3 and status.counters.jobs_given_up == 1
    assert status.counters.jobs_issued == 3
    assert league.books().held_until == clock.now + 10.0

    # The league launched a new job for the freed slot; it waits out the backoff.
    assert "held back after repeated failures" in league.no_job().reason
    clock.now += 10.0
    delays = []
    for _ in range(4):
        grant = league.job()
        before = clock.now
        league.fail(grant)
        delays.append(league.books().held_until - before)
        league.no_job()
        clock.now = league.books().held_until
    assert delays == [20.0, 40.0, 40.0, 40.0]  # doubling, capped at max_job_retry_backoff_s
    # Attempts 4-6 were one job (given up after its third), attempt 7 the first of the next one.
    assert league.coord.status().counters.jobs_given_up == 2
    assert league.coord.status().counters.jobs_failed == 7


def test_a_completed_job_ends_the_backoff(league_factory):
    league = league_factory()
    for _ in range(3):
        league.fail(league.job())
    league.no_job()
    league.clock.now = league.books().held_until
    league.complete(league.job())
    books = league.books()
    assert books.failures_in_a_row == 0 and books.held_until == 0 and books.jobs_given_up == 1
    league.complete(league.job())  # no wait


def test_a_completed_job_releases_the_players_held_jobs_at_once(league_factory):
    league = league_factory(solo_config(slots=2))
    healthy = league.job()
    for _ in range(3):
        league.fail(league.job())
    league.no_job()  # the given-up job's slot: a new job, held back
    league.complete(healthy)
    assert league.books().held_until == 0
    league.job()  # both slots' jobs go out without the clock moving
    league.job()


def test_an_expired_lease_is_a_failed_attempt(league_factory):
    league = league_factory()
    first = league.job()
    league.clock.now += TIMEOUT + 1
    league.coord.expire_due()
    books = league.books()
    assert books.failures_in_a_row == 1 and "lease expired" in books.last_error
    again = league.job()
    assert again.job_id != first.job_id
    status = league.coord.status()
    assert status.counters.jobs_expired == 1 and status.counters.jobs_issued == 2


def test_the_backoff_survives_a_restart(league_factory):
    league = league_factory()
    for _ in range(3):
        league.fail(league.job(), "EnvError: crashed")
    held_until = league.books().held_until
    league.reopen()
    books = league.books()
    assert books.held_until == held_until and books.failures_in_a_row == 3 and books.jobs_given_up == 1
    assert books.last_error == "EnvError: crashed"
    assert league.coord.status().counters.jobs_given_up == 1
    assert "held back" in league.no_job().reason
    league.clock.now = held_until
    league.job()


def test_a_job_that_keeps_failing_is_not_retried_at_full_rate(league_factory):
    """Without the clock moving, an always-failing job gets exactly max_job_attempts leases, then none."""
    league = league_factory(solo_config(max_job_attempts=2))
    league.fail(league.job())
    league.fail(league.job())
    assert "held back" in league.no_job().reason
    assert isinstance(league.coord.get_job("actor", WorkerRole.ACTOR, "", wait_s=0.3), NoJob)
    status = league.coord.status()
    assert status.counters.jobs_issued == 2 and status.counters.jobs_given_up == 1


def test_retry_policy_delays_and_validation():
    policy = JobRetryPolicy(max_attempts=2, backoff_s=1.0, max_backoff_s=5.0)
    assert [policy.delay_s(n) for n in range(7)] == [0.0, 0.0, 1.0, 2.0, 4.0, 5.0, 5.0]
    assert policy.delay_s(10**6) == 5.0
    with pytest.raises(ValueError, match="max_attempts"):
        JobRetryPolicy(max_attempts=0)
    with pytest.raises(ValueError, match="max_backoff_s"):
        JobRetryPolicy(backoff_s=10.0, max_backoff_s=1.0)
    with pytest.raises(ValueError, match="backoff_s"):
        JobRetryPolicy(backoff_s=math.inf)


@pytest.mark.parametrize(("coordinator", "field"), [
    ({"max_job_attempts": 0}, "coordinator.max_job_attempts"),
    ({"job_retry_backoff_s": -1.0}, "coordinator.job_retry_backoff_s"),
    ({"job_retry_backoff_s": 10.0, "max_job_retry_backoff_s": 5.0}, "coordinator.max_job_retry_backoff_s"),
])
def test_bad_retry_settings_name_the_field(coordinator, field):
    with pytest.raises(ConfigError, match=field):
        solo_config(**coordinator)


def test_long_errors_keep_their_first_line_and_their_end():
    text = "EnvError: env 0 failed\n" + "x" * 5000 + "\nValueError: the real cause"
    cut = bounded_error(text, 300)
    assert len(cut) == 300
    assert cut.startswith("EnvError: env 0 failed") and cut.endswith("ValueError: the real cause")
    assert bounded_error("short") == "short"


def test_a_backoff_holds_back_every_job_of_the_player_in_each_of_its_slots(league_factory):
    """The backoff held only the jobs offered after it began: with two launch slots the job offered before in the
    other slot went out at once, so a broken player cost an attempt per slot per backoff period (a review)."""
    league = league_factory(solo_config(slots=2))
    a, b = league.job(), league.job()
    league.fail(a)
    league.fail(b)
    retry = league.job()  # one of the two retries, offered at once
    league.fail(retry)  # the third failure in a row: the backoff begins
    books = league.books()
    assert books.failures_in_a_row == 3 and books.held_until == league.clock.now + 10.0
    assert "held back after repeated failures" in league.no_job().reason  # the other retry waits too
    league.clock.now += 10.0
    league.job()
