"""Workers' last-seen times are durable without a write per call: they go with the first commit at least
`lazy_interval_s` after they changed (a request's, or the committer thread's own), and a restarted coordinator
shows them as they were."""

from __future__ import annotations

import sqlite3
import threading

import pytest

from league_service.coordinator import Coordinator, CoordinatorSettings
from league_service.coordinator_testing import small_league_config
from league_service.group_commit import GroupCommitter
from league_service.leases import WorkerInfo, WorkerRole
from league_service.store import Counters, LeagueStore
from tests.manual_clock import ManualClock
from tests.polling import wait_until


class _Seen:
    """What the coordinator gives the committer: its lock, a snapshot, and the workers seen (lazy rows)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: dict[str, float] = {}

    def snapshot(self, league_state: bool) -> tuple[None, Counters]:
        return None, Counters()

    def take_seen(self) -> list[tuple[WorkerInfo, float]]:
        seen, self.seen = self.seen, {}
        return [(WorkerInfo(w, WorkerRole.ACTOR, "host", "", 1.0), t) for w, t in sorted(seen.items())]


def _stored_last_seen(path) -> dict[str, float]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return dict(conn.execute("SELECT worker_id, last_seen FROM workers"))
    finally:
        conn.close()


def _settings(tmp_path, lease_timeout_s: float) -> CoordinatorSettings:
    return CoordinatorSettings(shared_root=tmp_path, lease_timeout_s=lease_timeout_s, needs_learner=False, rng_seed=0)


def _coordinator(settings: CoordinatorSettings, clock: ManualClock) -> Coordinator:
    """The small league's coordinator on `settings`, on a clock the test moves (no expiry thread)."""
    return Coordinator(small_league_config(), settings, clock=clock, expiry_thread=False)


@pytest.fixture
def store(tmp_path):
    store = LeagueStore(tmp_path / "state.sqlite")
    store.initialise("digest", now=1.0)
    try:
        yield store
    finally:
        store.close()


def test_last_seen_times_wait_for_their_interval_then_ride_along_or_flush_at_close(store):
    seen = _Seen()
    commits = GroupCommitter(store, seen.lock, seen.snapshot, lazy_rows=seen.take_seen, lazy_interval_s=3600.0)
    try:
        with seen.lock:
            for t in range(100):  # a hundred calls of one worker: noted, nothing written
                seen.seen["actor-1"] = float(t)
                commits.note_lazy()
            commits.record(workers=[(WorkerInfo("actor-2", WorkerRole.ACTOR, "host", "", 2.0), 2.0)], waited=True)
            commits.wait_durable()  # a request's commit before the interval passed: it does not take them
        assert _stored_last_seen(store.path) == {"actor-2": 2.0}
    finally:
        commits.close()  # ... but a clean stop writes them
    assert _stored_last_seen(store.path) == {"actor-1": 99.0, "actor-2": 2.0}


def test_the_committer_thread_flushes_last_seen_times_when_no_request_commits(store):
    seen = _Seen()
    commits = GroupCommitter(store, seen.lock, seen.snapshot, lazy_rows=seen.take_seen, lazy_interval_s=0.05)
    try:
        with seen.lock:
            seen.seen["actor-1"] = 7.0
            commits.note_lazy()
        wait_until("the committer thread to write the last-seen time",
                   lambda: _stored_last_seen(store.path) == {"actor-1": 7.0}, timeout_s=30)
        with seen.lock:  # a request after the interval passed takes the next ones with its own commit
            seen.seen["actor-1"] = 8.0
            commits.note_lazy()
        wait_until("the next interval's write", lambda: _stored_last_seen(store.path) == {"actor-1": 8.0},
                   timeout_s=30)
    finally:
        commits.close()


def test_a_restarted_coordinator_shows_the_last_heartbeats_it_had_written(tmp_path):
    """No clean stop is needed: the times are on disk within the flush interval, before any close."""
    clock = ManualClock()
    settings = _settings(tmp_path, lease_timeout_s=0.3)
    first = _coordinator(settings, clock)
    first.start()
    try:
        first.register_worker("actor-1", WorkerRole.ACTOR, "host", "")
        first.register_worker("actor-2", WorkerRole.ACTOR, "host", "")
        clock.now = 1_050.0
        first.heartbeat("actor-1", ())
        state = settings.resolved_state_path
        wait_until("actor-1's heartbeat to reach the store",
                   lambda: _stored_last_seen(state) == {"actor-1": 1_050.0, "actor-2": 1_000.0}, timeout_s=30)
    finally:
        first.close()

    clock.now = 1_100.0
    second = _coordinator(settings, clock)
    try:
        workers = {w.worker_id: w for w in second.status().workers}
        assert workers["actor-1"].last_heartbeat == 1_050.0
        assert workers["actor-2"].last_heartbeat == 1_000.0
        assert not workers["actor-1"].alive  # 50 s ago, with a 0.3 s lease: it has to heartbeat again
    finally:
        second.close()


def test_workers_silent_past_forget_workers_after_s_and_holding_no_job_are_forgotten_for_good(tmp_path):
    """Every actor process that starts registers a new worker id: the registry (and every status reply) must
    not keep the ones that are gone. One holding a job stays until its lease ends; one that comes back
    registers again."""
    clock = ManualClock()
    cfg = small_league_config({"coordinator": {"forget_workers_after_s": 600.0}})
    settings = CoordinatorSettings(shared_root=tmp_path, lease_timeout_s=900.0, needs_learner=False, rng_seed=0)
    first = Coordinator(cfg, settings, clock=clock, expiry_thread=False)
    first.start()
    try:
        for worker in ("gone", "busy", "alive"):
            first.register_worker(worker, WorkerRole.ACTOR, "host", "")
        job = first.get_job("busy", WorkerRole.ACTOR, "", 5.0)
        assert not hasattr(job, "retry_after_s"), job  # a job: "busy" holds a lease
        for clock.now in (1_250.0, 1_500.0):
            first.heartbeat("busy", (job.job_id,))  # keeps its lease (900 s: until 2,400), and is seen
        clock.now = 1_590.0
        first.heartbeat("alive", ())
        clock.now = 1_700.0  # "gone" silent for 700 s (checks run at most once a minute)
        first.expire_due()
        assert {w.worker_id for w in first.status().workers} == {"busy", "alive"}
        clock.now = 2_200.0  # "busy" went silent too (700 s), but it holds a lease: kept this time ...
        first.expire_due()
        assert {w.worker_id for w in first.status().workers} == {"busy"}
        wait_until("the forgotten rows to leave the store",
                   lambda: set(_stored_last_seen(settings.resolved_state_path)) == {"busy"}, timeout_s=30)
    finally:
        first.close()

    second = Coordinator(cfg, settings, clock=clock, expiry_thread=False)  # a restart does not bring them back
    second.start()
    try:
        assert {w.worker_id for w in second.status().workers} == {"busy"}
        with pytest.raises(Exception, match="unknown worker 'gone'"):
            second.heartbeat("gone", ())
        second.register_worker("gone", WorkerRole.ACTOR, "host", "")  # ... and a worker that comes back rejoins
        assert {w.worker_id for w in second.status().workers} == {"busy", "gone"}
    finally:
        second.close()


def test_forget_workers_after_s_is_checked():
    with pytest.raises(ValueError, match="forget_workers_after_s"):
        small_league_config({"coordinator": {"forget_workers_after_s": 10.0}})  # below the 30 s lease
    small_league_config({"coordinator": {"forget_workers_after_s": 0}})  # never


def test_a_worker_that_says_it_is_leaving_leaves_the_registry_at_once_unless_it_holds_a_lease(tmp_path):
    """A worker that exited cleanly stayed listed as alive for a lease more (a reviewer's actor after
    --max-jobs). Its last Heartbeat now says it is leaving; one still holding a lease stays until it ends."""
    clock = ManualClock()
    settings = _settings(tmp_path, lease_timeout_s=300.0)
    first = _coordinator(settings, clock)
    first.start()
    try:
        for worker in ("done", "busy"):
            first.register_worker(worker, WorkerRole.ACTOR, "host", "")
        job = first.get_job("busy", WorkerRole.ACTOR, "", 5.0)
        first.heartbeat("done", (), leaving=True)
        first.heartbeat("busy", (job.job_id,), leaving=True)
        assert {w.worker_id for w in first.status().workers} == {"busy"}
        assert not first.heartbeat("busy", (job.job_id,)).revoked_job_ids  # its lease goes on
        wait_until("the leaving worker's row to leave the store",
                   lambda: set(_stored_last_seen(settings.resolved_state_path)) <= {"busy"}, timeout_s=30)
    finally:
        first.close()
    second = _coordinator(settings, clock)
    second.start()
    try:
        assert {w.worker_id for w in second.status().workers} == {"busy"}
    finally:
        second.close()


def test_a_leaving_worker_releases_the_leases_it_does_not_name(tmp_path):
    """A GetJob reply lost to the actor's stop left a lease nobody knew of: it expired a lease later and counted
    as a failed attempt of a job that never ran. Leaving releases it now: no results, no failed attempt."""
    clock = ManualClock()
    settings = _settings(tmp_path, lease_timeout_s=300.0)
    coordinator = _coordinator(settings, clock)
    coordinator.start()
    try:
        coordinator.register_worker("a", WorkerRole.ACTOR, "host", "")
        lost = coordinator.get_job("a", WorkerRole.ACTOR, "", 5.0)  # the reply that never arrived
        coordinator.heartbeat("a", (), leaving=True)
        status = coordinator.status()
        assert lost.job_id not in [j.job_id for j in status.jobs]
        assert status.counters.jobs_finished == 1 and status.counters.jobs_failed == 0
        assert status.counters.jobs_expired == 0 and status.counters.episodes == 0
        assert "a" not in {w.worker_id for w in status.workers}  # and it left the registry
        clock.now += 600.0
        coordinator.expire_due()
        assert coordinator.status().counters.jobs_expired == 0
    finally:
        coordinator.close()
