"""Group commit: the coordinator's changes reach SQLite in batches, and no reply leaves before its batch is durable.

Why: one transaction per request (plus a league-state snapshot per FinishJob) costs more than the request
itself; with many workers, one transaction for everything that changed since the last commit costs about the
same as one. Correctness is the usual group-commit argument:
- changes are recorded under the coordinator's lock, in order; a commit takes all of them *and* the league's
  state under that lock, so a batch is a state the coordinator really was in;
- a request replies only after everything recorded before its reply (not just its own change) is committed, so
  nothing a worker was told can be lost in a crash — e.g. a retried FinishJob answered "duplicate" while the
  original's commit is still in flight waits for that commit.

Who writes (leader/follower): a request that waits for durability writes the batch itself when no commit is
under way (the leader; it lets go of the lock while SQLite works), and otherwise waits for the commit under
way and then, if its changes were not in it, leads the next one — which takes everything recorded meanwhile.
So an uncontended request costs no thread hand-off, and under load one commit serves many requests. Changes
that nobody waits for (an expiry found by the timer thread, a snapshot) are written by the committer thread,
which is woken only for those: `record(..., waited=True)` promises a `wait_durable()` (or `wait_until`) right
after. `wait_until(ticket)` waits without the coordinator's lock: a reply that needs nothing more of the state
does not queue for the lock again once its commit is done. Each such waiter waits at its own gate, and the end
of a commit opens only the gates of the tickets it made durable, and one more, whose waiter leads the next
commit: with many requests in flight, a commit does not wake them all to send most back to sleep.

Deferred replies (`Coordinator.defer_durability`, used by the grpc.aio server): the coordinator's calls then
record and return without waiting, and the server holds each reply until `is_committed(ticket)` with the
ticket taken after the call, committing with `wait_until` once per turn of its event loop for all the calls of
that turn. The barrier is the same (no reply before everything recorded before it is durable); only who waits
changes.

Lazy changes (workers' last-seen times, which change with every call) promise no reply anything, so none waits
for them and none is written by itself: `note_lazy()` says there are some, and they go with the first commit
at least `lazy_interval_s` later (a request's, or the committer thread's own when none comes), so they reach
the disk within about that time at one write per interval, however many calls changed them.
"""

from __future__ import annotations

import _thread
import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from common.durable_files import full_disk_note
from league_service.errors import StateWriteError
from league_service.job_retries import PlayerJobFailures
from league_service.league_state import LeagueStateChanges
from league_service.leases import JobEnd, Lease, WorkerInfo
from league_service.store import Counters, LeagueStore

log = logging.getLogger(__name__)

SLOW_WRITE_S = 1.0
"""A write's time beyond this (an fsync on a stalled disk, NFS) holds up the server's replies, heartbeats
included: leases are postponed by it (`take_stalled_s`), as it goes on, instead of expiring on workers whose
heartbeats wait unanswered. Shorter writes delay a heartbeat by less than a second."""

# Called under the coordinator's lock: (the league state, or what changed in it, when asked for, else None;
# counters), as of now.
Snapshot = Callable[[bool], tuple[dict[str, Any] | LeagueStateChanges | None, Counters]]
# Called under the coordinator's lock when lazy changes are due: the worker rows to write, as of now.
LazyRows = Callable[[], Sequence[tuple[WorkerInfo, float]]]


@dataclass
class _Batch:
    workers: dict[str, tuple[WorkerInfo, float]] = field(default_factory=dict)
    forgotten_workers: set[str] = field(default_factory=set)
    leases: list[Lease[Any]] = field(default_factory=list)
    ends: list[JobEnd] = field(default_factory=list)
    job_failures: dict[str, PlayerJobFailures] = field(default_factory=dict)
    league_state: bool = False


class GroupCommitter:
    """Records changes (under `lock`); `wait_durable` is the reply barrier and commits as the leader."""

    def __init__(
        self, store: LeagueStore, lock: threading.Lock, snapshot: Snapshot, *,
        lazy_rows: LazyRows | None = None, lazy_interval_s: float = 2.0,
    ) -> None:
        self._store = store
        self._lock = lock
        self._snapshot = snapshot
        self._lazy_rows = lazy_rows
        self._lazy_interval_s = lazy_interval_s
        self._lazy_due: float | None = None  # time.monotonic() from which noted lazy changes go with a commit
        self._due = threading.Condition(lock)  # the committer thread waits here for unattended changes
        self._committed_cond = threading.Condition(lock)
        self._committed_waiters = 0  # `wait_durable` callers waiting on _committed_cond (notified only if any)
        # Waiters that hold no lock (`wait_until`): (ticket, arrival, gate) in a heap; a gate is a held lock its
        # waiter blocks on until the end of a commit releases it. Guarded by `_gates_lock`, under which a commit
        # also ends (`_committing` goes False), so a waiter sees either the commit under way or its end.
        self._gates_lock = threading.Lock()
        self._gates: list[tuple[int, int, _thread.LockType]] = []
        self._arrivals = itertools.count()
        self._batch = _Batch()
        self._recorded = 0  # changes recorded so far
        self._committed = 0  # changes durable so far
        self._committing = False  # a commit is writing (with the lock let go)
        self._write_started: float | None = None  # time.monotonic() the write under way began (None: none)
        self._write_taken_s = 0.0  # of the write under way, the stalled time already taken
        self._stalled_s = 0.0  # stalled time of finished writes not yet taken
        self._unattended = False  # the batch holds changes no request waits for
        self._stopping = False
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="group-commit", daemon=True)
        self._thread.start()

    @property
    def failure(self) -> BaseException | None:
        return self._failure

    def take_stalled_s(self) -> float:
        """Seconds of writes beyond SLOW_WRITE_S each, since the last call, including the write under way (call
        with the lock held): time in which the server's replies, heartbeats included, waited for the disk, by
        which leases are postponed."""
        stalled, self._stalled_s = self._stalled_s, 0.0
        if self._write_started is not None:
            so_far = max(0.0, time.monotonic() - self._write_started - SLOW_WRITE_S)
            stalled += so_far - self._write_taken_s
            self._write_taken_s = so_far
        return stalled

    def record(
        self,
        *,
        leases: Iterable[Lease[Any]] = (),
        ends: Iterable[JobEnd] = (),
        workers: Iterable[tuple[WorkerInfo, float]] = (),
        forgotten_workers: Iterable[str] = (),
        job_failures: Iterable[PlayerJobFailures] = (),
        league_state: bool = False,
        waited: bool = False,
    ) -> None:
        """Queue changes for the next commit (hold the lock). Leases before ends keeps each job's order.

        `waited`: the caller waits for these changes right after (`wait_durable`, or `wait_until` with the
        `ticket` it takes before letting go of the lock), so the committer thread need not be woken for them.
        """
        batch = self._batch
        for worker_id in forgotten_workers:
            batch.workers.pop(worker_id, None)
            batch.forgotten_workers.add(worker_id)
        for info, last_seen in workers:  # a worker registering again after it was forgotten: its row wins
            batch.workers[info.worker_id] = (info, last_seen)
            batch.forgotten_workers.discard(info.worker_id)
        batch.leases.extend(leases)
        batch.ends.extend(ends)
        for record in job_failures:
            batch.job_failures[record.player_id] = record
        batch.league_state |= league_state
        self._recorded += 1
        if not waited and not self._unattended:
            self._unattended = True
            self._due.notify()

    def wait_durable(self) -> None:
        """Return once everything recorded so far is committed, committing it here when no commit is under
        way. Hold the lock (it is let go while SQLite writes or while waiting for another commit)."""
        target = self._recorded
        while self._committed < target:
            if self._failure is not None:
                raise StateWriteError() from self._failure
            if self._committing:
                self._committed_waiters += 1
                try:
                    self._committed_cond.wait()
                finally:
                    self._committed_waiters -= 1
                continue
            try:
                self._commit_locked()
            except Exception as exc:
                raise StateWriteError() from exc

    def note_lazy(self) -> None:
        """There are lazy changes (hold the lock): `lazy_rows` goes with the first commit `lazy_interval_s`
        from the first note since the last time they went."""
        if self._lazy_due is None and self._lazy_rows is not None:
            self._lazy_due = time.monotonic() + self._lazy_interval_s
            self._due.notify()  # the committer thread now waits until then at most

    def ticket(self) -> int:
        """The changes recorded so far, for `wait_until` after the lock is let go. Hold the lock, or call it
        on the thread that recorded the changes the ticket must cover, after recording them."""
        return self._recorded

    def is_committed(self, ticket: int) -> bool:
        """Whether the changes up to `ticket` are committed (no lock: the count only grows)."""
        if self._failure is not None:
            raise StateWriteError() from self._failure
        return self._committed >= ticket

    def wait_until(self, ticket: int) -> None:
        """`wait_durable` for a caller that holds no lock: return once the changes up to `ticket` are committed,
        committing them here when no commit is under way.

        A reply that needs nothing more of the coordinator's state waits like this, so under load the requests
        that share a commit do not all queue for the coordinator's lock again just to return.
        """
        while True:
            gate = None
            with self._gates_lock:
                if self._failure is not None:
                    raise StateWriteError() from self._failure
                if self._committed >= ticket:
                    return
                if self._committing:  # its end opens our gate: it covered us, or we lead the next commit
                    gate = _thread.allocate_lock()
                    gate.acquire()
                    heapq.heappush(self._gates, (ticket, next(self._arrivals), gate))
            if gate is not None:
                gate.acquire()
                continue
            with self._lock:
                if self._committed >= ticket or self._committing or self._failure is not None:
                    continue
                try:
                    self._commit_locked()
                except Exception as exc:
                    raise StateWriteError() from exc

    def close(self) -> None:
        """Commit what is recorded, then stop the thread (idempotent)."""
        with self._lock:
            self._stopping = True
            self._due.notify()
        self._thread.join()
        if self._failure is not None:
            raise StateWriteError() from self._failure

    def _run(self) -> None:
        """The committer thread: commits changes that no request waits for, lazy changes once due (if no request
        took them first), and what is left at close."""
        with self._lock:
            while True:
                while self._committing or not (self._stopping or self._unattended or self._lazy_is_due()):
                    self._due.wait(None if self._lazy_due is None else max(self._lazy_due - time.monotonic(), 0.001))
                if self._failure is not None:
                    return
                if self._recorded > self._committed or self._lazy_is_due() or (self._stopping and self._lazy_due):
                    try:
                        self._commit_locked()
                    except BaseException:  # recorded in _failure: every waiting and later request raises it
                        return
                elif self._stopping:
                    return

    def _lazy_is_due(self) -> bool:
        return self._lazy_due is not None and time.monotonic() >= self._lazy_due

    def _commit_locked(self) -> None:
        """Commit everything recorded so far (called with the lock held; lets go of it while writing)."""
        self._committing = True
        batch, self._batch = self._batch, _Batch()
        target = self._recorded
        self._unattended = False
        try:
            if self._lazy_rows is not None and self._lazy_due is not None and (
                self._stopping or time.monotonic() >= self._lazy_due
            ):
                self._lazy_due = None
                # Taken now, so they are as new as anything recorded: they win over the batch's rows.
                batch.workers.update((info.worker_id, (info, seen)) for info, seen in self._lazy_rows())
            state, counters = self._snapshot(batch.league_state)
            started = self._write_started = time.monotonic()
            self._lock.release()
            try:
                self._write(batch, state, counters)
            finally:
                self._lock.acquire()
                self._stalled_s += max(0.0, time.monotonic() - started - SLOW_WRITE_S) - self._write_taken_s
                self._write_started, self._write_taken_s = None, 0.0
            self._committed = target
        except BaseException as exc:
            # (Named with its disk's state: SQLite says "disk I/O error" of a spent quota, with no path.)
            log.exception("committing the coordinator's state to %s failed%s", self._store.path,
                          full_disk_note(self._store.path))
            self._failure = exc
            raise
        finally:
            with self._gates_lock:
                self._committing = False
                gates = self._gates
                while gates and (gates[0][0] <= self._committed or self._failure is not None):
                    heapq.heappop(gates)[2].release()
                if gates:  # recorded after this commit took its batch: the earliest of them leads the next
                    heapq.heappop(gates)[2].release()
            if self._committed_waiters:
                self._committed_cond.notify_all()
            if self._unattended or self._stopping or self._failure is not None:
                self._due.notify()

    def _write(self, batch: _Batch, state: dict[str, Any] | LeagueStateChanges | None, counters: Counters) -> None:
        if batch.leases and not (
            batch.ends or batch.workers or batch.forgotten_workers or batch.job_failures or state is not None
        ):
            # Jobs granted and nothing else: the counters are not written with them (only jobs_issued changed,
            # and a restart counts the jobs issued from the ended and in-flight jobs), so it is one statement.
            self._store.put_leases_alone(batch.leases)
            return
        with self._store.transaction() as tx:
            tx.delete_workers(sorted(batch.forgotten_workers))
            tx.put_workers(list(batch.workers.values()))
            tx.put_leases(batch.leases)
            tx.put_ends(batch.ends)
            for record in batch.job_failures.values():
                tx.put_job_failures(record)
            tx.put_state(state, counters)
