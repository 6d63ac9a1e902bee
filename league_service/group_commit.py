"""Group commit: the coordinator's changes reach SQLite in batches, and no reply leaves before its batch is durable.

Why: one transaction per request (plus a league-state snapshot per FinishJob) costs more than the request
itself; with many workers, one transaction for everything that changed since the last commit costs about the
same as one. Correctness is the usual group-commit argument:
- changes are recorded under the coordinator's lock, in order; the committer takes all of them *and* the
  league's state under that lock, so a batch is a state the coordinator really was in;
- a request replies only after everything recorded before its reply (not just its own change) is committed, so
  nothing a worker was told can be lost in a crash — e.g. a retried FinishJob answered "duplicate" while the
  original's commit is still in flight waits for that commit.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from league_service.leases import JobEnd, Lease, WorkerInfo
from league_service.store import Counters, LeagueStore

log = logging.getLogger(__name__)

# Called under the coordinator's lock: (league state when asked for, else None; counters), as of now.
Snapshot = Callable[[bool], tuple[dict[str, Any] | None, Counters]]


@dataclass
class _Batch:
    workers: dict[str, tuple[WorkerInfo, float]] = field(default_factory=dict)
    leases: list[Lease[Any]] = field(default_factory=list)
    ends: list[JobEnd] = field(default_factory=list)
    league_state: bool = False


class GroupCommitter:
    """Records changes (under `lock`) and commits them on its own thread; `wait_durable` is the reply barrier."""

    def __init__(self, store: LeagueStore, lock: threading.Lock, snapshot: Snapshot) -> None:
        self._store = store
        self._lock = lock
        self._snapshot = snapshot
        self._due = threading.Condition(lock)
        self._committed_cond = threading.Condition(lock)
        self._batch = _Batch()
        self._recorded = 0  # changes recorded so far
        self._committed = 0  # changes durable so far
        self._stopping = False
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="group-commit", daemon=True)
        self._thread.start()

    @property
    def failure(self) -> BaseException | None:
        return self._failure

    def record(
        self,
        *,
        leases: Iterable[Lease[Any]] = (),
        ends: Iterable[JobEnd] = (),
        workers: Iterable[tuple[WorkerInfo, float]] = (),
        league_state: bool = False,
    ) -> None:
        """Queue changes for the next commit (hold the lock). Leases before ends keeps each job's order."""
        batch = self._batch
        for info, last_seen in workers:
            batch.workers[info.worker_id] = (info, last_seen)
        batch.leases.extend(leases)
        batch.ends.extend(ends)
        batch.league_state |= league_state
        self._recorded += 1
        self._due.notify()

    def wait_durable(self) -> None:
        """Block (releasing the lock) until everything recorded so far is committed. Hold the lock."""
        target = self._recorded
        while self._committed < target:
            if self._failure is not None:
                raise RuntimeError("the coordinator could not write its state") from self._failure
            self._committed_cond.wait()

    def close(self) -> None:
        """Commit what is recorded, then stop the thread (idempotent)."""
        with self._lock:
            self._stopping = True
            self._due.notify()
        self._thread.join()
        if self._failure is not None:
            raise RuntimeError("the coordinator could not write its state") from self._failure

    def _run(self) -> None:
        while True:
            with self._lock:
                self._due.wait_for(lambda: self._stopping or self._recorded > self._committed)
                if self._recorded == self._committed:
                    return  # stopping, nothing left
                batch, self._batch = self._batch, _Batch()
                target = self._recorded
                state, counters = self._snapshot(batch.league_state)
            try:
                with self._store.transaction() as tx:
                    for info, last_seen in batch.workers.values():
                        tx.put_worker(info, last_seen)
                    for lease in batch.leases:
                        tx.put_lease(lease)
                    for end in batch.ends:
                        tx.put_end(end)
                    if state is not None:
                        tx.put_league_state(state)
                    tx.put_counters(counters)
            except BaseException as exc:  # every waiting and later request raises it
                log.exception("committing the coordinator's state failed")
                with self._lock:
                    self._failure = exc
                    self._committed_cond.notify_all()
                return
            with self._lock:
                self._committed = target
                self._committed_cond.notify_all()
