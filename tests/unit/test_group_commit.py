"""Group commit: a waiting request commits as the leader, unattended changes reach the disk anyway, many
concurrent requests share commits, and a failed write fails every waiting and later request."""

from __future__ import annotations

import threading

import pytest

from league_service.group_commit import GroupCommitter
from league_service.leases import WorkerInfo, WorkerRole
from league_service.store import Counters, LeagueStore


class _League:
    """What the coordinator gives the committer: its lock and a snapshot callback; records who committed."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.committed_by: list[str] = []
        self.committed = threading.Condition()
        self.fail = False

    def snapshot(self, league_state: bool) -> tuple[dict | None, Counters]:
        if self.fail:
            raise OSError("disk on fire")
        with self.committed:
            self.committed_by.append(threading.current_thread().name)
            self.committed.notify_all()
        return ({"players": []} if league_state else None), Counters(jobs_issued=len(self.committed_by))


@pytest.fixture
def setup(tmp_path):
    store = LeagueStore(tmp_path / "state.sqlite")
    store.initialise("digest", now=1.0)
    league = _League()
    commits = GroupCommitter(store, league.lock, league.snapshot)
    try:
        yield store, league, commits
    finally:
        try:
            commits.close()
        finally:
            store.close()


def _worker(i: int) -> tuple[WorkerInfo, float]:
    return WorkerInfo(f"actor-{i}", WorkerRole.ACTOR, "host", "", float(i)), float(i)


def _stored_workers(store: LeagueStore) -> set[str]:
    state = store.load()
    assert state is not None
    return {info.worker_id for info, _ in state.workers}


def test_a_waiting_request_commits_its_changes_itself(setup):
    store, league, commits = setup
    with league.lock:
        commits.record(workers=[_worker(1)], waited=True)
        commits.wait_durable()
    assert league.committed_by == [threading.current_thread().name]
    assert _stored_workers(store) == {"actor-1"}


def test_changes_nobody_waits_for_are_committed_by_the_committer_thread(setup):
    store, league, commits = setup
    with league.lock:
        commits.record(workers=[_worker(1)], league_state=True)
    with league.committed:
        assert league.committed.wait_for(lambda: league.committed_by, timeout=30)
    assert league.committed_by == ["group-commit"]
    with league.lock:
        commits.wait_durable()  # the thread's commit is complete once this returns
    assert _stored_workers(store) == {"actor-1"}
    assert store.load().league_state == {"players": []}


def test_concurrent_requests_share_commits_and_all_are_durable(setup):
    store, league, commits = setup
    n = 40
    start = threading.Barrier(n)
    not_durable: list[int] = []

    def request(i: int) -> None:
        start.wait()
        with league.lock:
            commits.record(workers=[_worker(i)], waited=True)
            commits.wait_durable()
            if f"actor-{i}" not in _stored_workers(store):  # what was recorded before the reply is on disk
                not_durable.append(i)

    threads = [threading.Thread(target=request, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not not_durable
    assert _stored_workers(store) == {f"actor-{i}" for i in range(n)}
    assert 1 <= len(league.committed_by) <= n
    assert "group-commit" not in league.committed_by  # every change was waited for: the thread slept


def test_waiting_without_the_lock_shares_commits_too(setup):
    """`wait_until(ticket)` after letting go of the lock: durable on return, committed by some request."""
    store, league, commits = setup
    n = 40
    start = threading.Barrier(n)
    not_durable: list[int] = []

    def request(i: int) -> None:
        start.wait()
        with league.lock:
            commits.record(workers=[_worker(i)], waited=True)
            ticket = commits.ticket()
        commits.wait_until(ticket)
        if f"actor-{i}" not in _stored_workers(store):
            not_durable.append(i)

    threads = [threading.Thread(target=request, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not not_durable
    assert 1 <= len(league.committed_by) <= n
    assert "group-commit" not in league.committed_by
    commits.wait_until(0)  # nothing to wait for


def test_close_commits_what_is_left(tmp_path):
    store = LeagueStore(tmp_path / "state.sqlite")
    store.initialise("digest", now=1.0)
    league = _League()
    commits = GroupCommitter(store, league.lock, league.snapshot)
    with league.lock:
        commits.record(workers=[_worker(7)], waited=True)  # a promise nobody kept: close still commits it
    commits.close()
    commits.close()
    assert _stored_workers(store) == {"actor-7"}
    store.close()


def test_a_failed_commit_fails_the_waiting_and_every_later_request(tmp_path):
    store = LeagueStore(tmp_path / "state.sqlite")
    league = _League()
    commits = GroupCommitter(store, league.lock, league.snapshot)
    league.fail = True
    with league.lock:
        commits.record(workers=[_worker(1)], waited=True)
        with pytest.raises(RuntimeError, match="could not write its state") as err:
            commits.wait_durable()
        assert isinstance(err.value.__cause__, OSError)
        league.fail = False
        commits.record(workers=[_worker(2)], waited=True)
        with pytest.raises(RuntimeError, match="could not write its state"):
            commits.wait_durable()
    with pytest.raises(RuntimeError, match="could not write its state"):
        commits.wait_until(1)
    assert isinstance(commits.failure, OSError)
    with pytest.raises(RuntimeError, match="could not write its state"):
        commits.close()
    store.close()
